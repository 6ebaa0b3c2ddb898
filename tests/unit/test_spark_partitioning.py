"""bascule.spark.partitioning: which partition each written row goes to (no Spark session, no brokers)."""

import zlib

import pytest

pytest.importorskip("pyspark", reason="PySpark is not installed (pip install -e '.[spark]')")

from bascule.spark.errors import BasculeSparkError  # noqa: E402
from bascule.spark.partitioning import Partitioner, key_partition  # noqa: E402


def test_key_partition_is_liftbridges_crc32_of_the_key():
    assert key_partition(b"k1", 3) == zlib.crc32(b"k1") % 3
    assert key_partition(None, 7) == key_partition(b"", 7) == 0  # no key hashes as the empty key
    assert key_partition(b"anything", 1) == 0
    assert key_partition(b"anything", 0) == 0  # no partitions: nothing to choose among


def test_rows_with_a_partition_keep_it_and_the_others_go_by_key_in_row_order():
    # CRC-32 % 3: b"a" -> 0, b"b" -> 2, no key -> 0.
    groups = Partitioner("key").group(["s"] * 5, [2, None, None, None, 1], [b"a", b"b", None, b"a", b"c"], {"s": 3})
    assert groups == {("s", 2): [0, 1], ("s", 0): [2, 3], ("s", 1): [4]}


def test_round_robin_goes_on_from_batch_to_batch_and_skips_rows_with_a_partition():
    partitioner = Partitioner("roundrobin")
    assert partitioner.group(["s"] * 4, [None, None, 1, None], [b"k"] * 4, {"s": 2}) == {
        ("s", 0): [0, 3], ("s", 1): [1, 2]
    }
    assert partitioner.group(["s"], [None], [None], {"s": 2}) == {("s", 1): [0]}


def test_rows_of_several_streams_use_each_streams_partition_count():
    groups = Partitioner("roundrobin").group(["a", "b", "a", "b"], [None] * 4, [None] * 4, {"a": 1, "b": 5})
    assert groups == {("a", 0): [0, 2], ("b", 1): [1], ("b", 3): [3]}


def test_nothing_to_write():
    assert Partitioner("key").group([], [], [], {}) == {}


@pytest.mark.parametrize("partition", [-1, 3, 99])
def test_a_partition_the_stream_does_not_have_is_an_error(partition):
    message = rf"cannot write to partition {partition} of stream 's': it has partitions 0\.\.2"
    with pytest.raises(BasculeSparkError, match=message):
        Partitioner("key").group(["s"], [partition], [None], {"s": 3})
