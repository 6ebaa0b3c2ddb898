"""bascule.spark.options: the data source's options parsed and checked, with errors that name the
option (no Spark session, no brokers)."""

import pytest

pytest.importorskip("pyspark", reason="PySpark is not installed (pip install -e '.[spark]')")

from bascule.spark.errors import BasculeSparkError  # noqa: E402
from bascule.spark.options import EARLIEST, LATEST, parse_read_options, parse_write_options  # noqa: E402

BASE = {"brokers": "h:1", "stream": "s"}  # the least a read needs


@pytest.mark.parametrize(
    "options, message",
    [
        ({"stream": "s"}, "the option 'brokers' is required"),
        ({"brokers": " , ", "stream": "s"}, "the option 'brokers' is required"),
        ({"brokers": "h", "stream": "s"}, "brokers: 'h' is not host:port"),
        ({"brokers": "h:port", "stream": "s"}, "brokers: 'h:port' is not host:port"),
        ({"brokers": "h:1"}, "give exactly one of the options 'stream'"),
        ({**BASE, "streamPattern": "s.*"}, "got stream, streamPattern"),
        ({**BASE, "startingOffsets": "[1]"}, "must be a JSON object of streams"),
        ({**BASE, "startingOffsets": "{}"}, "must be a JSON object of streams"),
        ({**BASE, "startingOffsets": "{not json"}, "must be 'earliest', 'latest' or JSON"),
        ({**BASE, "startingOffsets": '{"s": 3}'}, "the value for stream 's' must be an object"),
        ({**BASE, "startingOffsets": '{"s": {"x": 1}}'}, "partition 'x' of stream 's' is not a number"),
        ({**BASE, "startingOffsets": '{"s": {"-1": 1}}'}, "partition -1 of stream 's' is negative"),
        ({**BASE, "startingOffsets": '{"s": {"0": 1.5}}'}, "the offset for s/0 must be an integer"),
        ({**BASE, "startingOffsets": '{"s": {"0": true}}'}, "the offset for s/0 must be an integer"),
        ({**BASE, "startingOffsets": '{"s": {"0": -3}}'}, "offset -3 for s/0 is invalid"),
        ({**BASE, "startingOffsets": '{"t": {"0": 1}}'}, "name stream 't', which stream s"),
        ({**BASE, "startingOffsets": "latest"}, "startingOffsets cannot be 'latest' here"),
        ({**BASE, "startingOffsets": '{"s": {"0": -1}}'}, r"-1 \(latest\) is not allowed"),
        ({**BASE, "endingOffsets": "earliest"}, "endingOffsets cannot be 'earliest'"),
        ({**BASE, "endingOffsets": '{"s": {"0": -2}}'}, r"-2 \(earliest\) is not allowed"),
        ({**BASE, "startingTimestamp": "yesterday"}, "milliseconds since the epoch"),
        ({**BASE, "startingTimestamp": "-5"}, "milliseconds since the epoch"),
        ({**BASE, "endingTimestamp": "1.5"}, "endingTimestamp must be milliseconds"),
        ({**BASE, "startingOffsetsByTimestamp": '{"s": {"0": -1}}'}, "timestamp -1 for s/0 is negative"),
        ({**BASE, "startingOffsetsByTimestamp": "soon"}, "must be JSON such as"),
        ({"brokers": "h:1", "streamPattern": "("}, "not a valid regular expression"),
        ({"brokers": "h:1", "assign": "[0]"}, 'assign must be JSON such as {"orders": \\[0, 1\\]}'),
        ({"brokers": "h:1", "assign": '{"s": [0, -1]}'}, "the partitions of 's' must be a list of partition numbers"),
        ({"brokers": "h:1", "assign": '{"s": [true]}'}, "the partitions of 's' must be a list of partition numbers"),
        ({"brokers": "h:1", "assign": '{"s": [0]}', "endingOffsets": '{"s": {"1": 5}}'},
         r"name partitions \[1\] of 's', which assign does not"),
        ({**BASE, "failOnDataLoss": "yes"}, "must be 'true' or 'false'"),
        ({**BASE, "minPartitions": "two"}, "minPartitions must be an integer, got 'two'"),
        ({**BASE, "pollTimeoutMs": "-1"}, "pollTimeoutMs must be >= 1, got -1"),
        ({**BASE, "startingOffsetsByTimestampStrategy": "skip"}, "must be one of error, latest"),
        ({**BASE, "startingOffset": "earliest"}, "did you mean 'startingOffsets'"),
        ({**BASE, "colour": "blue"}, r"unknown option 'colour' \(docs/spark.md lists the options\)"),
        ({**BASE, "subscribe": "s"}, "give exactly one of .*; got stream, subscribe"),
        ({**BASE, "subscribePattern": "s.*"}, "got stream, subscribePattern"),
        ({"brokers": "h:1", "subscribe": "s", "assign": '{"s": [0]}'}, "got subscribe, assign"),
        ({**BASE, "includeHeaders": "maybe"}, "includeHeaders must be 'true' or 'false'"),
        ({**BASE, "maxMessagesPerTrigger": "5"}, "maxMessagesPerTrigger is for streaming queries only"),
        ({**BASE, "minOffsetsPerTrigger": "5"}, "minOffsetsPerTrigger is for streaming queries only"),
        ({**BASE, "path": "orders"}, "load\\(\\) and save\\(\\) take no path here: name the stream"),
        ({**BASE, "kafka.bootstrap.servers": "h:9092"}, "has no meaning for bascule: use 'brokers'"),
        ({**BASE, "kafka.security.protocol": "SSL"}, "configures Kafka's client.*'tlsCa'"),
        ({**BASE, "groupIdPrefix": "g"}, "offsets live in Spark's checkpoint, not in a consumer group"),
        ({**BASE, "kafkaConsumer.pollTimeoutMs": "5"}, "use 'pollTimeoutMs'"),
        ({**BASE, "fetchOffset.numRetries": "3"}, "retried on every broker"),
        ({**BASE, "ackPolicy": "all"}, "ackPolicy is an option of writes only"),
    ],
)
def test_read_option_errors(options, message):
    with pytest.raises(BasculeSparkError, match=message):
        parse_read_options(options, streaming=False)


def test_batch_read_defaults():
    o = parse_read_options({"brokers": "a:1", "stream": "s"}, streaming=False)
    assert (o.starting.kind, o.ending.kind, o.fail_on_data_loss, o.poll_timeout_ms, o.request_timeout) == (
        "earliest", "latest", True, 120_000, 30.0
    )


def test_option_names_are_case_insensitive_and_sparks_own_options_pass():
    o = parse_read_options(
        {"BROKERS": "a:1", "STREAM": "s, t ,s", "checkpointLocation": "/tmp/x", "queryName": "q"}, streaming=False
    )
    assert (o.brokers, o.selection.streams) == (("a:1",), ("s", "t"))


def test_kafkas_subscribe_and_subscribe_pattern_are_stream_and_stream_pattern():
    subscribed = parse_read_options({"brokers": "a:1", "subscribe": "s,t"}, streaming=False)
    assert subscribed.selection == parse_read_options({"brokers": "a:1", "stream": "s,t"}, streaming=False).selection
    pattern = parse_read_options({"brokers": "a:1", "subscribePattern": "s.*"}, streaming=True)
    assert pattern.selection.pattern == "s.*"


def test_include_headers_is_true_unless_set_false():
    assert parse_read_options(BASE, streaming=False).include_headers
    assert not parse_read_options({**BASE, "includeHeaders": "FALSE"}, streaming=False).include_headers


def test_trigger_limits_take_kafkas_names_and_times():
    o = parse_read_options({**BASE, "minOffsetsPerTrigger": "100", "maxOffsetsPerTrigger": "500"}, streaming=True)
    assert (o.min_messages_per_trigger, o.max_messages_per_trigger, o.max_trigger_delay_ms) == (100, 500, 900_000)
    for text, ms in [("30s", 30_000), ("2m", 120_000), ("1h", 3_600_000), ("250ms", 250), ("250", 250)]:
        delayed = parse_read_options({**BASE, "minMessagesPerTrigger": "1", "maxTriggerDelay": text}, streaming=True)
        assert delayed.max_trigger_delay_ms == ms


@pytest.mark.parametrize(
    "options, message",
    [
        ({"maxMessagesPerTrigger": "5", "maxOffsetsPerTrigger": "6"}, "are the same option: give one"),
        ({"minMessagesPerTrigger": "5", "minOffsetsPerTrigger": "6"}, "are the same option: give one"),
        ({"minOffsetsPerTrigger": "0"}, "minOffsetsPerTrigger must be >= 1"),
        ({"maxMessagesPerTrigger": "0"}, "maxMessagesPerTrigger must be >= 1"),
        ({"maxTriggerDelay": "5m"}, "maxTriggerDelay bounds the wait for minOffsetsPerTrigger, which is not set"),
        ({"minOffsetsPerTrigger": "5", "maxTriggerDelay": "soon"}, "must be a time such as '15m'"),
        ({"endingOffsets": "latest"}, "endingOffsets is for batch queries only"),
    ],
)
def test_streaming_option_errors(options, message):
    with pytest.raises(BasculeSparkError, match=message):
        parse_read_options({**BASE, **options}, streaming=True)


def test_per_partition_offsets_and_timestamps():
    o = parse_read_options(
        {"brokers": "a:1", "stream": "s", "startingOffsets": '{"s": {"0": -2, "1": 7}}',
         "endingOffsetsByTimestamp": '{"s": {"1": 1700000000000}}'},
        streaming=False,
    )
    assert (o.starting.kind, dict(o.starting.offsets)) == ("offsets", {"s": {0: EARLIEST, 1: 7}})
    assert (o.ending.kind, dict(o.ending.offsets)) == ("timestamps", {"s": {1: 1700000000000}})
    # startingTimestamp wins over the other starting options.
    t = parse_read_options({"brokers": "a:1", "stream": "s", "startingTimestamp": "5", "startingOffsets": "earliest"},
                           streaming=False)
    assert (t.starting.kind, t.starting.timestamp_ms) == ("timestamp", 5)


def test_stream_pattern_leaves_internal_streams_out_and_assign_sorts_partitions():
    o = parse_read_options({"brokers": "a:1", "streamPattern": ".*"}, streaming=True)
    assert o.selection.matches("orders") and not o.selection.matches("__cursors")
    a = parse_read_options({"brokers": "a:1", "assign": '{"s": [2, 0, 2]}'}, streaming=True)
    assert dict(a.selection.assign) == {"s": (0, 2)}


def test_streaming_and_write_options():
    o = parse_read_options({"BROKERS": "a:1,b:2", "stream": "s,t", "maxOffsetsPerTrigger": "5"}, streaming=True)
    assert (o.brokers, o.selection.streams, o.starting.kind, o.max_messages_per_trigger) == (
        ("a:1", "b:2"), ("s", "t"), "latest", 5
    )
    s = parse_read_options({"brokers": "a:1", "stream": "s", "startingOffsets": '{"s": {"0": -1}}'}, streaming=True)
    assert dict(s.starting.offsets) == {"s": {0: LATEST}}
    w = parse_write_options({"brokers": "a:1", "stream": "s", "ackPolicy": "LEADER"})
    assert (w.ack_policy, w.partitioner, w.write_batch_size, w.message_ids) == ("leader", "key", 1000, True)
    assert not parse_write_options({"brokers": "a:1", "stream": "s", "messageIds": "FALSE"}).message_ids
    assert parse_write_options({"brokers": "a:1", "checkpointLocation": "/c", "queryName": "q"}).stream is None


@pytest.mark.parametrize(
    "options, message",
    [
        ({"brokers": "a:1", "ackPolicy": "most"}, "ackPolicy must be one of all, leader, none"),
        ({"brokers": "a:1", "partitioner": "random"}, "partitioner must be one of key, roundrobin"),
        ({"brokers": "a:1", "writeBatchSize": "0"}, "writeBatchSize must be >= 1"),
        ({"brokers": "a:1", "messageIds": "no"}, "messageIds must be 'true' or 'false'"),
        ({"brokers": "a:1", "requestTimeoutMs": "1s"}, "requestTimeoutMs must be an integer"),
        ({"brokers": "a:1", "stream": "a,b"}, "'stream' names several"),
        ({"brokers": "a:1", "ackPolicies": "all"}, "unknown option 'ackpolicies'; did you mean 'ackPolicy'"),
        ({"stream": "s"}, "the option 'brokers' is required"),
        ({"brokers": "a:1", "startingOffsets": "earliest"}, "startingOffsets is an option of reads only"),
        ({"brokers": "a:1", "includeHeaders": "true"}, "includeHeaders is an option of reads only"),
        ({"brokers": "a:1", "topic": "t"}, "has no meaning for bascule: use 'stream'"),
        ({"brokers": "a:1", "path": "/out"}, "take no path here"),
        ({"brokers": "a:1", "kafka.acks": "all"}, "configures Kafka's client"),
    ],
)
def test_write_option_errors(options, message):
    with pytest.raises(BasculeSparkError, match=message):
        parse_write_options(options)


def test_tls_options_name_pem_files_and_a_certificate_needs_its_key():
    from bascule.spark.options import TlsFiles

    base = {"brokers": "h:1", "stream": "s"}
    assert parse_read_options(base, streaming=False).tls is None
    read = parse_read_options({**base, "tlsCa": "ca.pem"}, streaming=False)
    assert read.tls == TlsFiles("ca.pem", None, None)
    write = parse_write_options({**base, "tlsCa": "ca.pem", "tlsCert": "c.pem", "tlsKey": "k.pem"})
    assert write.tls == TlsFiles("ca.pem", "c.pem", "k.pem")
    with pytest.raises(BasculeSparkError, match="tlsCert and tlsKey"):
        parse_write_options({**base, "tlsCert": "c.pem"})
