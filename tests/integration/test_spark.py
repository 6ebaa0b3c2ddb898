"""bascule.spark: PySpark 4 batch and streaming reads and writes against a real bascule node.

One SparkSession and one bascule node (a real process) serve every test here: a session starts in
about 5 s, so it is shared (test_spark_docs.py and test_spark_exactly_once.py use it too). It runs
local[2,2]: two threads, and each task tried twice, as on a cluster (where the default is four
tries), since test_spark_exactly_once.py's first attempts fail on purpose. Tests that need the JVM
are marked `spark` and skipped, saying so, when there is no `java`; the others check the readers'
and writers' planning against the node directly, with no Spark session. The pure rules (offsets,
options, conversions, retries) are checked in tests/unit/test_spark_*.py.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import shutil
import sys
import time
from collections import Counter

import pytest

pyspark = pytest.importorskip("pyspark", reason="PySpark is not installed (pip install -e '.[spark]')")
pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install -e '.[spark]')")

import nats  # noqa: E402

from bascule.client import Client, partition_by_key  # noqa: E402
from bascule.spark import BasculeDataSource, BasculeSparkError  # noqa: E402
from bascule.spark.planning import OffsetRange  # noqa: E402
from bascule.testing.local import LocalCluster  # noqa: E402


def spark_test(test):
    """Needs the JVM: marked `spark`, skipped (saying why) without Java."""
    no_java = pytest.mark.skipif(shutil.which("java") is None, reason="Spark 4 needs Java 17: no `java` on PATH")
    return pytest.mark.spark(no_java(test))


PER_PARTITION = 10_000
# The tests' JVMs run for seconds to a minute: without C2's compilations (C1 only) and GC threads they
# spend a fifth less CPU starting up and running small jobs on two cores; what Spark does is the same.
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


# ---- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def spark():
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.errors import PySparkRuntimeError
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[2,2]")
        .appName("bascule-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .config("spark.driver.extraJavaOptions", JVM_OPTIONS)
    )
    # pyspark starts its JVM with a preexec_fn, which is not safe in a process with threads: the suite's earlier
    # tests leave gRPC threads behind, and a child that dies between fork and exec exits without a word (a
    # fresh-clone run lost every test of this module to JAVA_GATEWAY_EXITED). Collected, then tried again.
    gc.collect()
    try:
        session = builder.getOrCreate()
    except PySparkRuntimeError as error:
        if error.getCondition() != "JAVA_GATEWAY_EXITED":
            raise
        gc.collect()
        session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(BasculeDataSource)
    yield session
    session.stop()


@pytest.fixture(scope="module")
def cluster():
    # Retention checked every 200 ms, for the data-loss test.
    with LocalCluster(1, embedded_nats=True, config={"streams": {"cleaner.interval": "200ms"}}) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def broker(cluster) -> str:
    return cluster.brokers[0]


def run(coroutine):
    return asyncio.run(coroutine)


async def create(broker: str, name: str, subject: str, partitions: int = 1, **settings) -> None:
    async with Client(broker) as client:
        await client.create_stream(name, subject, partitions=partitions, **settings)


async def wait_hw(broker: str, stream: str, partition: int, hw: int, timeout: float = 30.0) -> None:
    async with Client(broker) as client:
        deadline = time.monotonic() + timeout
        while (await client.fetch_partition_metadata(stream, partition)).high_watermark < hw:
            assert time.monotonic() < deadline, f"{stream}/{partition} never reached HW {hw}"
            await asyncio.sleep(0.05)


async def publish_nats(url: str, subjects: list[str], count: int, prefix: str = "") -> None:
    nc = await nats.connect(url)
    try:
        for i in range(count):
            for p, subject in enumerate(subjects):
                await nc.publish(subject, f"{prefix}p{p}-{i}".encode())
        await nc.flush()
    finally:
        await nc.drain()


async def publish_client(broker: str, stream: str, partition: int, values: list[bytes], keys=None) -> None:
    async with Client(broker) as client:
        for begin in range(0, len(values), 1000):
            await client.publish_many(
                stream, values[begin : begin + 1000], keys=keys[begin : begin + 1000] if keys else None,
                partition=partition, ack_policy="all",
            )


def reader(spark, broker: str, **options):
    r = spark.read.format("bascule").option("brokers", broker)
    for name, value in options.items():
        r = r.option(name, value)
    return r.load()


# ---- batch reads ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def batch_stream(cluster, broker):
    """30,000 plain NATS messages on a 3-partition stream: "p{partition}-{i}" at offset i."""
    subjects = ["orders.in", "orders.in.1", "orders.in.2"]
    run(create(broker, "orders", "orders.in", partitions=3))
    before = time.time_ns()
    run(publish_nats(cluster.nats_url, subjects, PER_PARTITION))
    for p in range(3):
        run(wait_hw(broker, "orders", p, PER_PARTITION - 1))
    return subjects, before, time.time_ns()


@pytest.fixture(scope="module")
def orders_table(spark, broker, batch_stream):
    """The whole of "orders", read by Spark as one Arrow table."""
    return reader(spark, broker, stream="orders").toArrow()


@spark_test
def test_a_batch_read_returns_every_committed_message_with_every_column(spark, broker, batch_stream, orders_table):
    subjects, before, after = batch_stream
    df = reader(spark, broker, stream="orders")
    assert df.schema.simpleString() == (
        "struct<stream:string,partition:int,offset:bigint,key:binary,value:binary,timestamp:timestamp,"
        "subject:string,headers:map<string,binary>>"
    )
    assert df.rdd.getNumPartitions() == 3  # one Spark partition per stream partition
    table = orders_table
    assert table.num_rows == 3 * PER_PARTITION
    columns = table.to_pydict()
    rows = sorted(zip(*(columns[name] for name in table.column_names)), key=lambda r: (r[1], r[2]))
    last_ts = {}
    for stream, partition, offset, key, value, ts, subject, headers in rows:
        assert stream == "orders"
        assert value == f"p{partition}-{offset}".encode()
        assert key is None
        assert subject == subjects[partition]
        assert dict(headers) == {"subject": subjects[partition].encode(), "reply": b""}
        micros = ts.timestamp() * 1e6
        assert before // 1000 - 1 <= micros <= after // 1000 + 1
        assert micros >= last_ts.get(partition, 0)  # timestamps never go back within a partition
        last_ts[partition] = micros
    assert [(r[1], r[2]) for r in rows] == [(p, o) for p in range(3) for o in range(PER_PARTITION)]

    # Timestamps exactly as the bascule client sees them (ns truncated to Spark's µs), for a sample.
    async def sample():
        async with Client(broker) as client:
            return [m async for m in client.subscribe("orders", 1, offset=5000, stop_offset=5099)]

    by_offset = {(r[1], r[2]): r[5] for r in rows}
    for message in run(sample()):
        ts = by_offset[1, message.offset]
        assert int(ts.timestamp()) * 1_000_000 + ts.microsecond == message.timestamp // 1000


@spark_test
def test_offset_ranges_timestamps_and_min_partitions(spark, broker, orders_table):
    from pyspark.sql import functions as F

    df = reader(
        spark, broker, stream="orders", minPartitions="8", readISRReplica="true",
        startingOffsets=json.dumps({"orders": {"0": 100, "1": -2}}),
        endingOffsets=json.dumps({"orders": {"0": 200, "2": 50}}),
    )
    assert df.rdd.getNumPartitions() >= 8  # the 10,000-message range of partition 1 split up
    stats = df.groupBy("partition").agg(F.count("*"), F.min("offset"), F.max("offset")).collect()
    assert {r[0]: tuple(r[1:]) for r in stats} == {
        0: (100, 100, 199), 1: (PER_PARTITION, 0, PER_PARTITION - 1), 2: (50, 0, 49)
    }

    # startingTimestamp (ms): each partition from its first message at or after that time.
    columns = orders_table.select(["partition", "timestamp"]).to_pydict()
    micros = [int(t.timestamp()) * 1_000_000 + t.microsecond for t in columns["timestamp"]]
    start_ms = sorted(micros)[len(micros) // 2] // 1000
    expected = Counter(p for p, us in zip(columns["partition"], micros) if us >= start_ms * 1000)
    got = reader(spark, broker, stream="orders", startingTimestamp=str(start_ms)).groupBy("partition").count()
    assert {r["partition"]: r["count"] for r in got.collect()} == dict(expected)


@spark_test
def test_option_errors_reach_the_user_clearly(spark, broker, batch_stream):
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    errors = (PySparkException, Py4JJavaError)
    with pytest.raises(errors, match="startingOffsets must be 'earliest', 'latest' or JSON"):
        reader(spark, broker, stream="orders", startingOffsets="{not json").count()
    with pytest.raises(errors, match="stream 'nope' does not exist"):
        reader(spark, broker, stream="nope").count()
    with pytest.raises(errors, match="give exactly one of .*; got stream, subscribe"):
        reader(spark, broker, stream="orders", subscribe="orders").count()
    with pytest.raises(errors, match="unknown option 'colour'"):
        reader(spark, broker, stream="orders", colour="blue").count()
    with pytest.raises(errors, match="take no path here"):
        spark.read.format("bascule").option("brokers", broker).option("stream", "orders").load("orders").count()
    no_headers = reader(spark, broker, subscribe="orders", includeHeaders="false")
    assert "headers" not in no_headers.columns and no_headers.count() == 3 * PER_PARTITION


def plan(broker: str, **options) -> list[OffsetRange]:
    """What the batch reader plans, without Spark: the ranges of its input partitions."""
    source = BasculeDataSource({"brokers": broker, **options})
    return [p.range for p in source.reader(source.schema()).partitions()]


def read_plain(broker: str, **options) -> list[tuple[str, int, int, bytes]]:
    """Every row the batch reader's tasks would give, without Spark: (stream, partition, offset, value)."""
    source = BasculeDataSource({"brokers": broker, **options})
    batch_reader = source.reader(source.schema())
    rows = []
    for partition in batch_reader.partitions():
        for batch in batch_reader.read(partition):
            c = batch.to_pydict()
            rows += zip(c["stream"], c["partition"], c["offset"], c["value"])
    return rows


def test_planning_against_the_brokers(broker, batch_stream):
    latest = PER_PARTITION
    assert plan(broker, stream="orders", endingOffsets='{"orders": {"1": 7}}') == [
        OffsetRange("orders", 0, 0, latest, False), OffsetRange("orders", 1, 0, 7, False),
        OffsetRange("orders", 2, 0, latest, False),
    ]
    assert plan(broker, assign='{"orders": [2]}', startingOffsets='{"orders": {"2": 9990}}') == [
        OffsetRange("orders", 2, 9990, latest)
    ]
    assert plan(broker, streamPattern="no-such-.*") == []
    cases = [
        ({"stream": "orders", "endingOffsets": '{"orders": {"7": 1}}'},
         r"names partitions \[7\] of stream 'orders', which has partitions 0\.\.2"),
        ({"stream": "orders", "startingOffsets": '{"orders": {"0": 10001}}'},
         "offset 10001 of orders/0 is beyond its last committed message"),
        ({"stream": "orders", "startingOffsets": '{"orders": {"0": 50}}', "endingOffsets": '{"orders": {"0": 40}}'},
         "the starting offset 50 of orders/0 is after its ending offset 40"),
        ({"stream": "orders", "startingTimestamp": str(time.time_ns() // 1_000_000 + 3_600_000)},
         r"no message of orders/\d has a timestamp at or after"),
        ({"assign": '{"orders": [0, 5]}'}, r"assign names partitions \[5\] of stream 'orders'"),
        ({"stream": "orders,nope,nope2"}, "streams 'nope', 'nope2' do not exist"),
        # Nothing listens there: the client waits out its deadline for a connection (30 s by default).
        ({"brokers": "127.0.0.1:1", "stream": "orders", "requestTimeoutMs": "1000"}, "no broker answered"),
    ]
    for options, message in cases:
        with pytest.raises(BasculeSparkError, match=message):
            plan(options.pop("brokers", broker), **options)
    # startingOffsetsByTimestampStrategy latest: start at the end instead.
    future = str(time.time_ns() // 1_000_000 + 3_600_000)
    assert plan(broker, stream="orders", startingTimestamp=future, startingOffsetsByTimestampStrategy="latest") == []


def test_a_range_beyond_the_log_times_out_as_data_loss(broker, batch_stream):
    from bascule.spark.source import BasculeInputPartition

    def read(**options) -> list[int]:
        source = BasculeDataSource({"brokers": broker, "stream": "orders", "pollTimeoutMs": "300", **options})
        batch_reader = source.reader(source.schema())
        beyond = BasculeInputPartition(OffsetRange("orders", 0, PER_PARTITION - 5, PER_PARTITION + 5))
        return [o for batch in batch_reader.read(beyond) for o in batch.column("offset").to_pylist()]

    with pytest.raises(BasculeSparkError, match=r"offsets 10000\.\.10004 are gone \(the log now ends before them"):
        read()
    assert read(failOnDataLoss="false") == list(range(PER_PARTITION - 5, PER_PARTITION))


@spark_test
def test_reading_nothing(spark, broker):
    run(create(broker, "empty", "empty.in", partitions=2))
    assert plan(broker, stream="empty") == []
    assert reader(spark, broker, stream="empty").count() == 0  # Spark reads its stand-in partition


@spark_test
def test_fail_on_data_loss(spark, cluster, broker):
    run(create(broker, "short", "short.in", retention_max_messages=100, segment_max_bytes=2048))
    run(publish_client(broker, "short", 0, [b"m%d" % i for i in range(2000)]))

    async def oldest() -> int:
        async with Client(broker) as client:
            deadline = time.monotonic() + 20
            while True:
                async for message in client.subscribe("short", 0, start="earliest", stop_latest=True):
                    if message.offset > 0 or time.monotonic() > deadline:
                        return message.offset
                    break
                await asyncio.sleep(0.1)

    first = run(oldest())
    assert 0 < first < 2000, "retention removed nothing"  # it keeps at most the newest 100
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    needs_removed = {"stream": "short", "startingOffsets": json.dumps({"short": {"0": 0}})}
    lost = r"data loss in stream 'short' partition 0: offsets 0\.\."
    with pytest.raises((PySparkException, Py4JJavaError), match=lost):
        reader(spark, broker, **needs_removed).count()
    # Skipping ahead, or starting at "earliest" (which is no loss), reads what is left.
    skipped = read_plain(broker, failOnDataLoss="false", **needs_removed)
    assert [r[2] for r in skipped] == list(range(skipped[0][2], 2000)) and skipped[0][2] >= first
    from_earliest = read_plain(broker, stream="short")
    assert [r[2] for r in from_earliest] == list(range(from_earliest[0][2], 2000))


KV_KEYED, KV_KEYLESS = 200, 20


@pytest.fixture(scope="module")
def compacted_stream(broker) -> list[int]:
    """"kv", compacted by key in small segments: ten keys twenty times over (offsets 0..199), then
    twenty messages without a key, one at a time (segments roll between appends, so that the
    active segment, which compaction leaves alone, holds none with a key). Once the cleaner has
    compacted it, the offsets left: the newest of each key, 190..199, and the keyless 200..219."""
    run(create(broker, "kv", "kv.in", compact_enabled=True, segment_max_bytes=300))
    keyed = range(KV_KEYED)
    run(publish_client(broker, "kv", 0, [b"v%d" % o for o in keyed], keys=[b"k%d" % (o % 10) for o in keyed]))
    for _ in range(KV_KEYLESS):
        run(publish_client(broker, "kv", 0, [b"end"]))
    expected = list(range(KV_KEYED - 10, KV_KEYED + KV_KEYLESS))

    async def until_compacted() -> list[int]:
        async with Client(broker) as client:
            deadline = time.monotonic() + 30
            while True:
                left = [m.offset async for m in client.subscribe("kv", start="earliest", stop_latest=True)]
                if left == expected or time.monotonic() > deadline:
                    return left
                await asyncio.sleep(0.2)

    assert run(until_compacted()) == expected, "the cleaner did not compact the stream"
    return expected


def test_a_compacted_stream_is_planned_as_such_and_a_log_ending_early_is_still_loss(broker, compacted_stream):
    from bascule.spark.source import BasculeInputPartition

    async def compaction_said() -> list[bool]:
        async with Client(broker) as client:
            return [p["compacted"] for p in await client.partitions("kv", metadata_only=True)]

    assert run(compaction_said()) == [True]
    end = KV_KEYED + KV_KEYLESS
    assert plan(broker, stream="kv") == [OffsetRange("kv", 0, compacted_stream[0], end, False, compacted=True)]
    source = BasculeDataSource({"brokers": broker, "stream": "kv", "pollTimeoutMs": "300"})
    micro_batch = source.streamReader(source.schema()).partitions({"kv": {"0": 5}}, {"kv": {"0": end}})
    assert [p.range for p in micro_batch] == [OffsetRange("kv", 0, 5, end, compacted=True)]
    beyond = BasculeInputPartition(OffsetRange("kv", 0, end - 5, end + 5, compacted=True))
    with pytest.raises(BasculeSparkError, match=r"offsets 220\.\.224 are gone \(the log now ends before them"):
        list(source.reader(source.schema()).read(beyond))


@spark_test
def test_a_compacted_stream_reads_over_its_gaps_with_fail_on_data_loss(spark, broker, compacted_stream):
    # From offset 0 (compacted away, so a strict start), in four ranges of which three hold only
    # gaps; failOnDataLoss at its default, true.
    df = reader(spark, broker, stream="kv", startingOffsets='{"kv": {"0": 0}}', minPartitions="4")
    assert df.rdd.getNumPartitions() == 4
    rows = sorted((r["offset"], r["key"] and bytes(r["key"]), bytes(r["value"])) for r in df.collect())
    assert rows == [
        (o, b"k%d" % (o % 10), b"v%d" % o) if o < KV_KEYED else (o, None, b"end") for o in compacted_stream
    ]


# ---- streaming -----------------------------------------------------------------------------------


def test_stream_offsets_and_data_loss_without_spark(broker):
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    run(create(broker, "gone", "gone.in", partitions=2))
    run(publish_client(broker, "gone", 0, [b"x"] * 10))

    def stream_reader(**options):
        source = BasculeDataSource({"brokers": broker, "stream": "gone", **options})
        return source.streamReader(source.schema())

    r = stream_reader(startingOffsets="earliest", maxMessagesPerTrigger="4")
    start = r.initialOffset()
    assert start == {"gone": {"0": 0, "1": 0}}
    assert r.getDefaultReadLimit() == ReadMaxRows(4)
    end = r.latestOffset(start, ReadMaxRows(4))
    assert end == {"gone": {"0": 4, "1": 0}}
    assert [p.range for p in r.partitions(start, end)] == [OffsetRange("gone", 0, 0, 4)]
    r.prepareForTriggerAvailableNow()  # later messages wait for the next run
    run(publish_client(broker, "gone", 1, [b"y"] * 5))
    assert r.latestOffset(end, ReadAllAvailable()) == {"gone": {"0": 10, "1": 0}}
    assert stream_reader(startingOffsets="latest").initialOffset() == {"gone": {"0": 10, "1": 5}}

    async def delete() -> None:
        async with Client(broker) as client:
            await client.delete_stream("gone")

    checkpointed = {"gone": {"0": 10, "1": 5}}
    run(delete())
    with pytest.raises(BasculeSparkError, match="data loss: stream 'gone' was deleted"):
        stream_reader().latestOffset(checkpointed, ReadAllAvailable())
    assert stream_reader(failOnDataLoss="false").latestOffset(checkpointed, ReadAllAvailable()) == {}
    run(create(broker, "gone", "gone.in", partitions=1))  # created again, shorter
    run(publish_client(broker, "gone", 0, [b"z"] * 3))
    with pytest.raises(BasculeSparkError, match=r"partitions \[1\] of stream 'gone' no longer exist"):
        stream_reader().latestOffset(checkpointed, ReadAllAvailable())
    truncated = "stream 'gone' partition 0 now ends at offset 2, but the query already read up to offset 9"
    with pytest.raises(BasculeSparkError, match=truncated):
        stream_reader().latestOffset({"gone": {"0": 10}}, ReadAllAvailable())
    lenient = stream_reader(failOnDataLoss="false")
    end = lenient.latestOffset(checkpointed, ReadAllAvailable())
    assert end == {"gone": {"0": 3}}
    assert [p.range for p in lenient.partitions(checkpointed, end)] == [OffsetRange("gone", 0, 0, 3, False)]



def test_min_offsets_per_trigger_without_spark(broker):
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMinRows

    run(create(broker, "few", "few.in", partitions=2))
    run(publish_client(broker, "few", 0, [b"x"] * 3))
    source = BasculeDataSource(
        {"brokers": broker, "stream": "few", "startingOffsets": "earliest", "minOffsetsPerTrigger": "5",
         "maxOffsetsPerTrigger": "2", "maxTriggerDelay": "1h"}
    )
    r = source.streamReader(source.schema())
    start = r.initialOffset()
    assert r.getDefaultReadLimit() == ReadMinRows(5)
    first = r.latestOffset(start, ReadMinRows(5))  # the first trigger goes, with at most 2 messages
    assert first == {"few": {"0": 2, "1": 0}}
    run(publish_client(broker, "few", 1, [b"y"] * 3))
    assert r.latestOffset(first, ReadMinRows(5)) == first  # 4 new: held back
    assert r.reportLatestOffset() == {"few": {"0": 3, "1": 3}}
    assert r.latestOffset(first, ReadAllAvailable()) == {"few": {"0": 3, "1": 3}}
    run(publish_client(broker, "few", 1, [b"z"]))
    second = r.latestOffset(first, ReadMinRows(5))
    assert second == {"few": {"0": 3, "1": 1}}  # 5 new, 2 of them read
    r.prepareForTriggerAvailableNow()  # 3 new, but such a run never waits
    assert r.latestOffset(second, ReadMinRows(5)) == {"few": {"0": 3, "1": 3}}


@spark_test
def test_min_offsets_per_trigger_and_the_lag_in_progress(spark, broker):
    from bascule.spark import offsets_behind_latest

    run(create(broker, "drip", "drip.in", partitions=2))
    run(publish_client(broker, "drip", 0, [b"a"] * 10))
    batches: list[tuple[float, int]] = []
    query = (
        spark.readStream.format("bascule").option("brokers", broker).option("stream", "drip")
        .option("startingOffsets", "earliest").option("minOffsetsPerTrigger", "50").option("maxTriggerDelay", "8s")
        .load().writeStream.foreachBatch(lambda batch, _: batches.append((time.monotonic(), batch.count())))
        .trigger(processingTime="200 milliseconds").start()
    )
    try:
        until(lambda: batches, "the first batch")  # never held back, as in Kafka's source
        run(publish_client(broker, "drip", 1, [b"b"] * 20))
        time.sleep(2)
        assert [n for _, n in batches] == [10], "20 new messages, fewer than minOffsetsPerTrigger, went"
        until(lambda: len(batches) == 2, "the batch maxTriggerDelay lets through")
        assert batches[1][1] == 20 and batches[1][0] - batches[0][0] > 4  # 8 s after the first one planned
        published = time.monotonic()
        run(publish_client(broker, "drip", 0, [b"c"] * 60))
        until(lambda: sum(n for _, n in batches[2:]) == 60, "the 60 new messages")
        assert batches[2][1] >= 50 and batches[2][0] - published < 5  # enough: no waiting for the delay
    finally:
        query.stop()

    # The lag: Kafka's metrics, from the latest offsets the source reports beside each batch's end.
    run(create(broker, "backlog", "backlog.in", partitions=2))
    for p in range(2):
        run(publish_client(broker, "backlog", p, [b"m"] * 150))
    lagging = (
        spark.readStream.format("bascule").option("brokers", broker).option("stream", "backlog")
        .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "100").load()
        .writeStream.format("noop").trigger(availableNow=True).start()
    )
    lagging.awaitTermination(60)
    first = lagging.recentProgress[0]["sources"][0]
    assert json.loads(first["endOffset"]) == {"backlog": {"0": 50, "1": 50}}
    assert json.loads(first["latestOffset"]) == {"backlog": {"0": 150, "1": 150}}
    assert first["metrics"] == {}  # what a Python source cannot fill in (docs/spark.md)
    assert offsets_behind_latest(first) == {
        "minOffsetsBehindLatest": "100", "maxOffsetsBehindLatest": "100", "avgOffsetsBehindLatest": "100.0",
    }


def until(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.1)


@spark_test
def test_a_restarted_streaming_query_reads_every_message_exactly_once(spark, cluster, broker, tmp_path):
    run(create(broker, "evt-a", "evt.a", partitions=2))
    for p in range(2):
        run(publish_client(broker, "evt-a", p, [b"a%d-%d" % (p, i) for i in range(600)]))
    checkpoint = str(tmp_path / "checkpoint")
    rows = []

    def run_query() -> list[int]:
        """One run, from the checkpoint; foreachBatch collects every micro-batch's rows here."""
        stream = (
            spark.readStream.format("bascule")
            .option("brokers", broker)
            .option("streamPattern", "evt-.*")
            .option("startingOffsets", "earliest")
            .option("maxMessagesPerTrigger", "1000")
            .load()
        )
        query = (
            stream.select("stream", "partition", "offset", "value").writeStream
            .foreachBatch(lambda batch, batch_id: rows.extend(batch.collect()))
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True).start()
        )
        query.awaitTermination(120)
        assert not query.isActive
        assert query.exception() is None
        return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]

    assert run_query() == [1000, 200]  # maxMessagesPerTrigger: 500 from each partition, then the rest

    # More messages, and a new stream the pattern matches; the query resumes from its checkpoint.
    for p in range(2):
        run(publish_client(broker, "evt-a", p, [b"a%d-%d" % (p, i) for i in range(600, 800)]))
    run(create(broker, "evt-b", "evt.b", partitions=1))
    run(publish_client(broker, "evt-b", 0, [b"b0-%d" % i for i in range(300)]))
    assert sum(run_query()) == 400 + 300

    seen = Counter((r["stream"], r["partition"], r["offset"]) for r in rows)
    assert max(seen.values()) == 1, "a message was read twice"
    expected = {("evt-a", p, i) for p in range(2) for i in range(800)} | {("evt-b", 0, i) for i in range(300)}
    assert set(seen) == expected
    for r in rows:
        letter = r["stream"][-1]
        assert r["value"] == f"{letter}{r['partition']}-{r['offset']}".encode()


# ---- writing -------------------------------------------------------------------------------------


@spark_test
def test_a_write_lands_in_order_per_partition_and_reads_back_equal(spark, broker):
    from pyspark.sql import functions as F

    run(create(broker, "sink", "sink.in", partitions=3))
    rows = 10_000
    df = spark.range(0, rows, 1, numPartitions=2).select(  # two tasks: ids 0-4999 and 5000-9999
        F.concat(F.lit("value-"), F.col("id").cast("string")).cast("binary").alias("value"),
        F.concat(F.lit("key-"), (F.col("id") % 13).cast("string")).alias("key"),
        F.create_map(F.lit("n"), F.col("id").cast("string").cast("binary")).alias("headers"),
        (F.col("id") % 3).cast("int").alias("partition"),
    )
    df.write.format("bascule").mode("append").option("brokers", broker).option("stream", "sink").save()

    back = reader(spark, broker, stream="sink").toArrow().to_pydict()
    assert len(back["offset"]) == rows
    by_partition: dict[int, list] = {}
    for partition, offset, key, value, headers in zip(
        back["partition"], back["offset"], back["key"], back["value"], back["headers"]
    ):
        ident = int(value.decode().removeprefix("value-"))
        assert ident % 3 == partition
        assert key == f"key-{ident % 13}".encode()
        assert dict(headers)["n"] == str(ident).encode()
        by_partition.setdefault(partition, []).append((offset, ident))
    for partition, pairs in by_partition.items():
        pairs.sort()
        assert [o for o, _ in pairs] == list(range(len(pairs)))
        # Each task's rows keep their order within the partition (the two tasks interleave).
        for task in (range(0, 5000), range(5000, rows)):
            idents = [i for _, i in pairs if i in task]
            assert idents == sorted(idents), f"partition {partition} out of order"
    assert sorted(i for pairs in by_partition.values() for _, i in pairs) == list(range(rows))


def write(df, broker: str, stream: str) -> None:
    df.write.format("bascule").mode("append").option("brokers", broker).option("stream", stream).save()


@spark_test
def test_the_sink_partitions_as_kafkas_a_partition_column_then_the_key_then_round_robin(spark, broker):
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    run(create(broker, "spread", "spread.in", partitions=3))
    keyless = spark.range(0, 300, 1, numPartitions=2).selectExpr("concat('n', id) as value")
    write(keyless, broker, "spread")
    keyed = spark.createDataFrame([(f"k{i}", f"v{i}") for i in range(60)], "key string, value string")
    write(keyed, broker, "spread")
    chosen = spark.createDataFrame([("k1", "c1", 2), (None, "c2", 1)], "key string, value string, partition int")
    write(chosen, broker, "spread")

    back = reader(spark, broker, stream="spread").toArrow().to_pydict()
    placed = dict(zip((v.decode() for v in back["value"]), back["partition"]))
    spread = Counter(p for v, p in placed.items() if v.startswith("n"))
    assert len(placed) == 362 and spread == {0: 100, 1: 100, 2: 100}  # each task's 150 rows in turn
    assert {v: p for v, p in placed.items() if v.startswith("v")} == {
        f"v{i}": partition_by_key("spread", f"k{i}".encode(), b"", 3) for i in range(60)
    }
    assert (placed["c1"], placed["c2"]) == (2, 1)
    beyond = spark.createDataFrame([("x", 3)], "value string, partition int")
    with pytest.raises((PySparkException, Py4JJavaError), match=r"cannot write to partition 3 of stream 'spread'"):
        write(beyond, broker, "spread")


@spark_test
def test_a_failed_ack_fails_the_write_with_the_reason(spark, broker):
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    run(create(broker, "refusing", "refusing.in"))  # its own, one partition: where a keyless row goes is known
    huge = spark.createDataFrame([(b"x" * (1024 * 1024 + 10),)], "value binary")
    refused = r"publishing to stream 'refusing' partition 0 failed: .*exceeds the limit of \d+"
    with pytest.raises((PySparkException, Py4JJavaError), match=refused):
        huge.write.format("bascule").mode("append").option("brokers", broker).option("stream", "refusing").save()


def test_write_errors_without_spark(broker):
    from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

    from bascule.spark.arrow import OutgoingMessages
    from bascule.spark.writing import Publisher

    options = {"brokers": broker, "stream": "sink"}
    source = BasculeDataSource(options)
    with pytest.raises(BasculeSparkError, match="needs a 'value' column"):
        source.writer(StructType([StructField("partition", IntegerType())]), False)
    with pytest.raises(BasculeSparkError, match="column 'value' must be binary or string, not bigint"):
        source.writer(StructType([StructField("value", LongType())]), False)
    with pytest.raises(BasculeSparkError, match="streams are append-only"):
        source.writer(StructType([StructField("value", StringType())]), True)
    with pytest.raises(BasculeSparkError, match="the option 'stream', or a 'stream' column"):
        BasculeDataSource({"brokers": broker}).writer(StructType([StructField("value", StringType())]), False)

    async def publish(stream: str, partition: int | None) -> None:
        async with Client(broker) as client:
            publisher = Publisher(client, "all", 100, "key")
            await publisher.publish(OutgoingMessages([stream], [partition], [None], [b"v"], [None]))

    run(create(broker, "sink-errors", "sink.errors", partitions=3))
    no_such_partition = "cannot write to partition 5 of stream 'sink-errors': it has partitions 0..2"
    with pytest.raises(BasculeSparkError, match=no_such_partition):
        run(publish("sink-errors", 5))
    with pytest.raises(BasculeSparkError, match="cannot write to stream 'missing': it does not exist"):
        run(publish("missing", None))


@spark_test
def test_a_streaming_pipeline_writes_to_another_stream(spark, broker, tmp_path):
    from pyspark.sql import functions as F

    run(create(broker, "pipe-in", "pipe.in", partitions=2))
    run(create(broker, "pipe-out", "pipe.out", partitions=2))
    for p in range(2):
        values, keys = [b"m%d-%d" % (p, i) for i in range(300)], [b"k%d" % i for i in range(300)]
        run(publish_client(broker, "pipe-in", p, values, keys))
    source = (
        spark.readStream.format("bascule").option("brokers", broker).option("stream", "pipe-in")
        .option("startingOffsets", "earliest").load()
    )
    upper = source.select(
        "key", "partition", F.upper(F.col("value").cast("string")).alias("value"),
        F.map_concat(
            "headers", F.create_map(F.lit("from"), F.col("offset").cast("string").cast("binary"))
        ).alias("headers"),
    )
    query = (
        upper.writeStream.format("bascule").option("brokers", broker).option("stream", "pipe-out")
        .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    out = reader(spark, broker, stream="pipe-out").toArrow().to_pydict()
    origins = [dict(h)["from"] for h in out["headers"]]
    got = sorted(zip(out["partition"], out["offset"], out["key"], out["value"], origins))
    assert got == [(p, i, b"k%d" % i, b"M%d-%d" % (p, i), str(i).encode()) for p in range(2) for i in range(300)]
