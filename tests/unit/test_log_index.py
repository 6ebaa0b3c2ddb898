import struct

import pytest

from bascule.partition.log.index import InvalidIndex, SparseIndex


def index_with_entries(entry_sizes: list[int], interval: int) -> SparseIndex:
    index = SparseIndex(interval)
    position = 0
    for relative_offset, size in enumerate(entry_sizes):
        index.add_entry(relative_offset, position, position + size)
        position += size
    return index


def test_a_point_marks_the_first_entry_past_each_interval():
    index = index_with_entries([40] * 10, interval=100)
    # entries start at 0, 40, 80, 120, ...; points once 100 bytes went unindexed
    points = list(struct.iter_unpack(">II", index.encode()))
    assert points == [(3, 120), (6, 240), (9, 360)]


def test_big_entries_get_a_point_each():
    index = index_with_entries([500] * 4, interval=100)
    assert list(struct.iter_unpack(">II", index.encode())) == [(1, 500), (2, 1000), (3, 1500)]


def test_floor():
    index = index_with_entries([40] * 10, interval=100)
    assert index.floor(0) == (0, 0)
    assert index.floor(2) == (0, 0)
    assert index.floor(3) == (3, 120)
    assert index.floor(5) == (3, 120)
    assert index.floor(100) == (9, 360)


def test_decode_round_trip_and_partial_point():
    index = index_with_entries([40] * 10, interval=100)
    data = index.encode()
    decoded = SparseIndex.decode(data + b"\x01\x02", 100, 400)
    assert decoded.encode() == data
    assert decoded.encode(1) == data[8:]
    assert len(decoded) == 3


def test_decode_rejects_points_out_of_order():
    with pytest.raises(InvalidIndex):
        SparseIndex.decode(struct.pack(">IIII", 5, 100, 4, 200), 100, 1000)
    with pytest.raises(InvalidIndex):
        SparseIndex.decode(struct.pack(">IIII", 5, 100, 6, 100), 100, 1000)


def test_decoded_index_continues_adding_points_like_the_original():
    sizes = [30, 70, 20, 90, 10, 10, 10, 60, 80]
    whole = index_with_entries(sizes, interval=100)
    first_part = index_with_entries(sizes[:5], interval=100)
    resumed = SparseIndex.decode(first_part.encode(), 100, sum(sizes[:5]))
    position = sum(sizes[:5])
    for relative_offset, size in enumerate(sizes[5:], start=5):
        resumed.add_entry(relative_offset, position, position + size)
        position += size
    assert resumed.encode() == whole.encode()


def test_truncate_forgets_later_points():
    index = index_with_entries([40] * 10, interval=100)
    index.truncate(6, 240)
    assert list(struct.iter_unpack(">II", index.encode())) == [(3, 120)]
    assert index.truncate_beyond(120) == 1
    assert len(index) == 0


def test_floor_by_finds_the_last_point_before_a_condition_flips():
    index = index_with_entries([40] * 10, interval=100)
    assert index.floor_by(lambda offset, _: offset < 7) == (6, 240)
    assert index.floor_by(lambda offset, _: False) == (0, 0)
    assert index.floor_by(lambda offset, _: True) == (9, 360)
