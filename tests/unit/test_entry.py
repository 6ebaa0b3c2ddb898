import contextlib
import struct

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from bascule.wire.entry import (
    ENTRY_HEADER,
    HEADER_SIZE,
    CorruptEntry,
    Entry,
    Record,
    decode_entries,
    encode_entries,
    intact_prefix,
    scan,
    valid_prefix,
)


def sample_batch() -> bytes:
    return encode_entries(
        7,
        3,
        [
            Record(b"first"),
            Record(b"second", key=b"k", headers={"subject": b"a.b", "reply": b""}),
            Record(b"", key=b"", timestamp=99),
        ],
        timestamp=1_000,
    )[0]


def test_header_is_32_bytes():
    assert HEADER_SIZE == 32 == ENTRY_HEADER.size


def test_layout_matches_design():
    buf = encode_entries(5, 2, [Record(b"hi", key=b"K", headers={"h": b"v"})], timestamp=77)[0]
    offset, timestamp, epoch, body_size, crc = ENTRY_HEADER.unpack_from(buf)
    assert (offset, timestamp, epoch) == (5, 77, 2)
    body = buf[HEADER_SIZE:]
    assert body_size == len(body)
    assert crc == crc32c(buf[:28] + body)
    assert body == (
        struct.pack(">i", 1)
        + b"K"
        + struct.pack(">I", 2)
        + b"hi"
        + struct.pack(">H", 1)
        + struct.pack(">H", 1)
        + b"h"
        + struct.pack(">I", 1)
        + b"v"
    )


def test_no_key_is_stored_as_minus_one():
    buf = encode_entries(0, 0, [Record(b"v")], timestamp=1)[0]
    assert struct.unpack_from(">i", buf, HEADER_SIZE)[0] == -1


def test_round_trip():
    entries = decode_entries(sample_batch())
    assert entries == [
        Entry(7, 1_000, 3, None, b"first", {}),
        Entry(8, 1_000, 3, b"k", b"second", {"subject": b"a.b", "reply": b""}),
        Entry(9, 99, 3, b"", b"", {}),
    ]


def test_decode_accepts_memoryview_and_empty_input():
    buf = sample_batch()
    assert decode_entries(memoryview(buf)) == decode_entries(buf)
    assert decode_entries(b"") == []
    assert list(scan(b"")) == []
    assert valid_prefix(b"") == (0, 0)


def test_scan_reports_entry_boundaries():
    buf = sample_batch()
    walked = list(scan(buf))
    assert [w[0] for w in walked] == [7, 8, 9]
    assert [w[1] for w in walked] == [3, 3, 3]
    assert [w[2] for w in walked] == [1_000, 1_000, 99]
    assert walked[0][3] == 0
    assert walked[-1][4] == len(buf)
    assert all(a[4] == b[3] for a, b in zip(walked, walked[1:]))


def test_valid_prefix_stops_at_first_bad_entry():
    buf = sample_batch()
    boundaries = [end for *_, end in scan(buf)]
    damaged = bytearray(buf)
    damaged[boundaries[1] + 40] ^= 0xFF  # inside the third entry
    assert valid_prefix(damaged) == (boundaries[1], 2)
    assert valid_prefix(buf + b"\x00" * 5) == (len(buf), 3)


def test_encode_rejects_out_of_range_numbers():
    with pytest.raises(ValueError):
        encode_entries(-1, 0, [Record(b"x")], timestamp=1)[0]
    with pytest.raises(ValueError):
        encode_entries(0, -1, [Record(b"x")], timestamp=1)[0]


def test_encode_rejects_too_many_headers():
    headers = {str(i): b"" for i in range(70_000)}
    with pytest.raises(ValueError):
        encode_entries(0, 0, [Record(b"x", headers=headers)], timestamp=1)[0]


def test_non_utf8_header_name_is_corrupt():
    body = struct.pack(">iIHH", -1, 0, 1, 1) + b"\xff" + struct.pack(">I", 0)
    header = struct.pack(">qqQI", 0, 0, 0, len(body))
    buf = header + struct.pack(">I", crc32c(body, crc32c(header))) + body
    with pytest.raises(CorruptEntry, match="UTF-8"):
        decode_entries(buf)


def build_entry(body: bytes) -> bytes:
    """An entry with a correct CRC around an arbitrary body, to test the body checks."""
    header = struct.pack(">qqQI", 0, 0, 0, len(body))
    return header + struct.pack(">I", crc32c(body, crc32c(header))) + body


@pytest.mark.parametrize(
    "body",
    [
        b"",  # shorter than the smallest body
        struct.pack(">iIH", -2, 0, 0),  # negative key length other than -1
        struct.pack(">iIH", 50, 0, 0),  # key overruns
        struct.pack(">iIH", -1, 50, 0),  # value overruns
        struct.pack(">iIH", -1, 0, 1),  # missing header
        struct.pack(">iIH", -1, 0, 0) + b"extra",  # trailing bytes
    ],
)
def test_bad_body_lengths_are_corrupt(body):
    with pytest.raises(CorruptEntry):
        decode_entries(build_entry(body))


# --- damage detection -----------------------------------------------------------------------


def test_every_single_byte_flip_is_detected():
    buf = encode_entries(
        12, 4, [Record(b"value", key=b"key", headers={"subject": b"s"})], timestamp=5
    )[0]
    for position in range(len(buf)):
        for flip in (0x01, 0x80, 0xFF):
            damaged = bytearray(buf)
            damaged[position] ^= flip
            with pytest.raises(CorruptEntry):
                decode_entries(damaged)
            assert valid_prefix(damaged) == (0, 0)


def test_truncation_at_every_length_is_detected():
    buf = sample_batch()
    boundaries = {0} | {end for *_, end in scan(buf)}
    for length in range(len(buf)):
        cut = buf[:length]
        whole = max(b for b in boundaries if b <= length)
        assert valid_prefix(cut)[0] == whole
        if length not in boundaries:
            with pytest.raises(CorruptEntry):
                decode_entries(cut)


@given(st.binary(max_size=300))
def test_random_bytes_never_crash(garbage):
    with contextlib.suppress(CorruptEntry):
        decode_entries(garbage)
    length, count = valid_prefix(garbage)
    assert 0 <= length <= len(garbage)
    assert count == 0 or length > 0


@given(st.binary(min_size=1, max_size=100))
def test_random_bytes_after_good_entries_never_crash(garbage):
    buf = sample_batch()
    assert valid_prefix(buf + garbage)[0] >= len(buf)
    with contextlib.suppress(CorruptEntry):
        decode_entries(buf + garbage)


# --- round-trip property --------------------------------------------------------------------

records = st.builds(
    Record,
    value=st.binary(max_size=64),
    key=st.none() | st.binary(max_size=16),
    headers=st.dictionaries(st.text(max_size=8), st.binary(max_size=8), max_size=3),
    timestamp=st.integers(0, (1 << 63) - 1),
)


@settings(max_examples=200)
@given(
    st.integers(0, 1 << 40),
    st.integers(0, (1 << 64) - 1),
    st.lists(records, max_size=8),
    st.integers(1, (1 << 63) - 1),
)
def test_round_trip_property(first_offset, leader_epoch, batch, default_timestamp):
    buf, walked = encode_entries(first_offset, leader_epoch, batch, default_timestamp)
    assert walked == list(scan(buf))
    decoded = decode_entries(buf)
    assert len(decoded) == len(batch)
    for index, (record, entry) in enumerate(zip(batch, decoded)):
        assert entry.offset == first_offset + index
        assert entry.leader_epoch == leader_epoch
        assert entry.timestamp == (record.timestamp or default_timestamp)
        assert (entry.key, entry.value, entry.headers) == (record.key, record.value, record.headers)
    assert valid_prefix(buf) == (len(buf), len(batch))


def _scan_prefix(buf: bytes, first_offset: int, max_entries: int) -> tuple[int, int]:
    """What scan() says about the intact entries at the start of ``buf``, in sequence."""
    length = count = 0
    try:
        for offset, _, _, _, end in scan(buf):
            if offset != first_offset + count or count == max_entries:
                break
            length, count = end, count + 1
    except CorruptEntry:
        pass
    return length, count


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(st.binary(max_size=50), min_size=1, max_size=10),
    damage=st.tuples(st.integers(0, 10_000), st.integers(1, 255)) | st.none(),
    cut=st.integers(0, 10_000) | st.none(),
    max_entries=st.integers(1, 12),
    expected_first=st.sampled_from([5, 6]),
)
def test_intact_prefix_agrees_with_scan(values, damage, cut, max_entries, expected_first):
    buf = bytearray(encode_entries(5, 1, [Record(value=v) for v in values], 7)[0])
    if damage is not None:
        buf[damage[0] % len(buf)] ^= damage[1]
    if cut is not None:
        del buf[cut % (len(buf) + 1):]
    buf = bytes(buf)
    length, count, error = intact_prefix(buf, expected_first, max_entries)
    assert (length, count) == _scan_prefix(buf, expected_first, max_entries)
    assert (error is None) == (length == len(buf) or count == max_entries)
