"""bascule.spark.arrow: messages read -> Arrow record batches, rows written -> messages to publish
(no Spark session, no brokers)."""

import datetime

import pytest

pytest.importorskip("pyspark", reason="PySpark is not installed (pip install -e '.[spark]')")
pa = pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install -e '.[spark]')")

from pyspark.sql import Row  # noqa: E402

from bascule.client import Message  # noqa: E402
from bascule.spark.arrow import OutgoingMessages, SinkColumns, outgoing, record_batch, row_chunks  # noqa: E402
from bascule.spark.errors import BasculeSparkError  # noqa: E402
from bascule.spark.schema import SCHEMA, arrow_schema  # noqa: E402

ARROW_SCHEMA = arrow_schema(SCHEMA)
NS = 1_700_000_000_123_456_789  # a timestamp in ns with digits below the µs


def message(offset: int, headers: dict | None = None, key: bytes | None = None) -> Message:
    return Message("s", 1, offset, NS + offset, key, b"v%d" % offset, "s.in", {} if headers is None else headers)


# ---- reading -------------------------------------------------------------------------------------


def test_a_record_batch_holds_every_column_of_the_messages():
    batch = record_batch([message(7, {"a": b"1"}, key=b"k"), message(8)], "s", 1, ARROW_SCHEMA)
    assert batch.schema == ARROW_SCHEMA
    c = batch.to_pydict()
    assert (c["stream"], c["partition"], c["offset"], c["key"], c["value"]) == (
        ["s", "s"], [1, 1], [7, 8], [b"k", None], [b"v7", b"v8"]
    )
    assert (c["subject"], c["headers"]) == (["s.in", "s.in"], [[("a", b"1")], []])


def test_timestamps_are_bascules_nanoseconds_truncated_to_sparks_microseconds():
    ts = record_batch([message(0)], "s", 1, ARROW_SCHEMA).column("timestamp")[0].as_py()
    assert ts == datetime.datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=datetime.UTC)


def test_messages_sharing_one_headers_dict_each_get_its_headers():
    shared = {"h": b"x", "i": b""}
    batch = record_batch([message(0, shared), message(1, shared), message(2, {"j": b"y"})], "s", 1, ARROW_SCHEMA)
    assert batch.column("headers").to_pylist() == [[("h", b"x"), ("i", b"")]] * 2 + [[("j", b"y")]]


def test_a_subset_of_the_columns_in_the_order_asked_and_no_messages():
    schema = pa.schema([ARROW_SCHEMA.field("value"), ARROW_SCHEMA.field("offset")])
    batch = record_batch([message(3)], "s", 1, schema)
    assert (batch.schema.names, batch.to_pydict()) == (["value", "offset"], {"value": [b"v3"], "offset": [3]})
    empty = record_batch([], "s", 1, ARROW_SCHEMA)
    assert (empty.num_rows, empty.schema) == (0, ARROW_SCHEMA)


# ---- writing -------------------------------------------------------------------------------------

BYTES = SinkColumns(value="binary", key="binary", headers="map", partition=True, stream=True)


def from_columns(columns: SinkColumns, data: dict, stream: str | None = None) -> OutgoingMessages:
    return columns.messages(list(data), lambda name: data[name], stream)


def test_columns_become_messages():
    data = {
        "value": [b"v0", b"v1"], "key": [b"k", None], "headers": [[("h", b"x")], None],
        "partition": [2, None], "stream": ["a", "b"],
    }
    assert from_columns(BYTES, data) == OutgoingMessages(
        ["a", "b"], [2, None], [b"k", None], [b"v0", b"v1"], [{"h": b"x"}, None]
    )


def test_strings_are_utf8_and_absent_columns_are_none():
    text = SinkColumns(value="string", key="string", headers=None, partition=False, stream=False)
    out = from_columns(text, {"value": ["é", "b"], "key": ["k", None]}, stream="s")
    assert out == OutgoingMessages(["s", "s"], [None, None], [b"k", None], ["é".encode(), b"b"], [None, None])


def test_column_names_are_matched_whatever_their_case():
    columns = SinkColumns(value="binary", key=None, headers=None, partition=True, stream=False)
    assert from_columns(columns, {"VALUE": [b"v"], "Partition": [1]}, stream="s").partitions == [1]


def test_the_stream_option_overrides_the_stream_column():
    assert from_columns(BYTES, {"value": [b"v"], "key": [None], "headers": [None], "partition": [None],
                                "stream": [None]}, stream="out").streams == ["out"]


def test_null_values_and_null_streams_are_refused():
    with pytest.raises(BasculeSparkError, match="a row to write has a null 'value'"):
        from_columns(SinkColumns("string", None, None, False, False), {"value": ["a", None]}, stream="s")
    with pytest.raises(BasculeSparkError, match="null 'stream' and no 'stream' option is set"):
        from_columns(SinkColumns("binary", None, None, False, True), {"value": [b"a"], "stream": [None]})


def test_headers_as_a_map_or_as_kafkas_array_null_values_empty_null_names_left_out():
    as_map = SinkColumns("binary", None, "map", False, False)
    rows = [[("a", b"1"), ("b", None), (None, b"x"), ("c", "text")], {"d": b"2"}, []]
    assert from_columns(as_map, {"value": [b"v"] * 3, "headers": rows}, "s").headers == [
        {"a": b"1", "b": b"", "c": b"text"}, {"d": b"2"}, {}
    ]
    as_array = SinkColumns("binary", None, "array", False, False)
    pairs = [[{"key": "a", "value": b"1"}, {"key": "b", "value": None}]]
    assert from_columns(as_array, {"value": [b"v"], "headers": pairs}, "s").headers == [{"a": b"1", "b": b""}]


def test_outgoing_reads_arrow_batches_and_lists_of_rows_and_skips_empty_ones():
    columns = SinkColumns("string", None, None, False, False)
    batch = pa.RecordBatch.from_pydict({"value": ["a", "b"]})
    empty = pa.RecordBatch.from_pydict({"value": pa.array([], pa.string())})
    out = list(outgoing([empty, batch, [], [Row(value="c")]], columns, "s"))
    assert [o.values for o in out] == [[b"a", b"b"], [b"c"]]
    assert list(outgoing([], columns, "s")) == []


def test_row_chunks():
    assert list(row_chunks(iter(range(5)), size=2)) == [[0, 1], [2, 3], [4]]
    assert list(row_chunks(iter([]), size=2)) == []
    assert list(row_chunks(iter(range(4)), size=2)) == [[0, 1], [2, 3]]
