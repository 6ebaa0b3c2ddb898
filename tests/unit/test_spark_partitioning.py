"""bascule.spark.partitioning: which partition each written row goes to (no Spark session, no brokers)."""

import pytest

pytest.importorskip("pyspark", reason="PySpark is not installed (pip install -e '.[spark]')")

from bascule.client import partition_by_key  # noqa: E402
from bascule.spark.errors import BasculeSparkError  # noqa: E402
from bascule.spark.partitioning import Partitioner  # noqa: E402


def test_a_partition_wins_then_the_keys_hash_then_round_robin_in_row_order():
    # go-liftbridge's key partitioner (CRC-32 % 3): b"a" -> 0, b"b" -> 2, the empty key -> 0.
    assert [partition_by_key("s", k, b"", 3) for k in (b"a", b"b", b"")] == [0, 2, 0]
    partitions = [2, None, None, None, 1, None, None]
    keys = [b"a", b"b", None, b"a", b"c", None, b""]
    groups = Partitioner("key").group(["s"] * 7, partitions, keys, [None] * 7, {"s": 3})
    assert groups == {("s", 2): [0, 1], ("s", 0): [2, 3, 6], ("s", 1): [4, 5]}


def test_keyless_rows_go_round_robin_from_batch_to_batch_from_the_tasks_first_partition():
    partitioner = Partitioner("key", first=5)
    assert partitioner.group(["s"] * 4, [None] * 4, [None] * 4, [None] * 4, {"s": 3}) == {
        ("s", 2): [0, 3], ("s", 0): [1], ("s", 1): [2]
    }
    assert partitioner.group(["s"], [None], [None], [None], {"s": 3}) == {("s", 0): [0]}


def test_a_keyless_row_with_its_own_message_id_goes_where_the_ids_hash_puts_it_wherever_it_is():
    # The ids hashed as keys are (CRC-32 % 3): b"y" -> 1, b"b" -> 2, and the key b"a" -> 0.
    assert [partition_by_key("s", k, b"", 3) for k in (b"y", b"b", b"a")] == [1, 2, 0]
    keys, ids = [None, None, None, b"a"], [b"y", None, b"b", b"y"]
    assert Partitioner("key").group(["s"] * 4, [None] * 4, keys, ids, {"s": 3}) == {
        ("s", 1): [0], ("s", 0): [1, 3], ("s", 2): [2]
    }
    assert Partitioner("roundrobin").group(["s"] * 3, [None] * 3, [b"a"] * 3, [b"b", b"y", b"b"], {"s": 3}) == {
        ("s", 2): [0, 2], ("s", 1): [1]
    }


def test_keyless_rows_spread_evenly():
    groups = Partitioner("key", first=1).group(["s"] * 300, [None] * 300, [None] * 300, [None] * 300, {"s": 3})
    assert {p: len(rows) for (_, p), rows in groups.items()} == {0: 100, 1: 100, 2: 100}


def test_roundrobin_ignores_keys_and_skips_rows_with_a_partition():
    partitioner = Partitioner("roundrobin")
    assert partitioner.group(["s"] * 4, [None, None, 1, None], [b"k"] * 4, [None] * 4, {"s": 2}) == {
        ("s", 0): [0, 3], ("s", 1): [1, 2]
    }


def test_rows_of_several_streams_use_each_streams_partition_count_and_cycle():
    groups = Partitioner("roundrobin").group(["a", "b", "a", "b"], [None] * 4, [None] * 4, [None] * 4, {"a": 1, "b": 5})
    assert groups == {("a", 0): [0, 2], ("b", 0): [1], ("b", 1): [3]}


def test_nothing_to_write():
    assert Partitioner("key").group([], [], [], [], {}) == {}


@pytest.mark.parametrize("partition", [-1, 3, 99])
def test_a_partition_the_stream_does_not_have_is_an_error(partition):
    message = rf"cannot write to partition {partition} of stream 's': it has partitions 0\.\.2"
    with pytest.raises(BasculeSparkError, match=message):
        Partitioner("key").group(["s"], [partition], [None], [None], {"s": 3})
