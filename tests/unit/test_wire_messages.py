"""Subscribe's Message bytes, written straight from stored entries, against the protobuf library."""

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bascule.h2grpc.messages import MessageReader
from bascule.wire.entry import CorruptEntry, Entry, Record, decode_entries, encode_entries, intact_prefix
from bascule.wire.messages import MessageEncoder, varint
from bascule.wire.pb import api_pb2


def reference(stream: str, partition: int, entry: Entry) -> api_pb2.Message:
    """What the API sent before the encoder: the Message built field by field by protobuf."""
    headers = entry.headers
    return api_pb2.Message(
        offset=entry.offset, key=entry.key or b"", value=entry.value, timestamp=entry.timestamp,
        stream=stream, partition=partition,
        subject=headers.get("subject", b"").decode(errors="replace"),
        replySubject=headers.get("reply", b"").decode(errors="replace"),
        headers=headers,
    )


def messages(encoded: bytes) -> list[api_pb2.Message]:
    return [api_pb2.Message.FromString(message) for message in MessageReader(1 << 30).feed(encoded)]


header_names = st.sampled_from(["subject", "reply", "x", "ünï", ""]) | st.text(max_size=8)
records = st.builds(
    Record,
    value=st.binary(max_size=300),
    key=st.none() | st.binary(max_size=20),
    headers=st.dictionaries(header_names, st.binary(max_size=20) | st.just(b"\xff\xfe"), max_size=4),
    timestamp=st.integers(0, 2**63 - 1),
)


@settings(max_examples=300, deadline=None)
@given(
    batch=st.lists(records, min_size=1, max_size=8),
    first_offset=st.integers(0, 2**62) | st.integers(0, 20_000),
    stream=st.text(max_size=10),
    partition=st.integers(0, 2**31 - 1),
)
def test_the_encoded_messages_are_what_protobuf_builds(batch, first_offset, stream, partition):
    data, _ = encode_entries(first_offset, 1, batch, 1)
    expected = [reference(stream, partition, entry) for entry in decode_entries(data)]
    encoder = MessageEncoder(stream, partition)
    for _ in range(2):  # again, from the caches
        length, count, error, framed = encoder.walk(data, first_offset, len(batch))
        assert (length, count, error) == (len(data), len(batch), None)
        assert messages(framed) == expected


@pytest.mark.parametrize("number", [0, 1, 127, 128, 16383, 16384, 2**21, 2**28 - 1, 2**28, 2**63 - 1, -1, -(2**63)])
def test_varint_matches_protobuf(number):
    assert api_pb2.Message.FromString(b"\x08" + varint(number)).offset == number


def test_a_body_whose_lengths_overrun_it_is_corrupt():
    data, _ = encode_entries(0, 1, [Record(value=b"abc", key=b"k", headers={})], 1)
    body = 32
    for damaged in (
        data[:body] + struct.pack(">i", 1000) + data[body + 4:],  # key length past the body
        data[:body + 5] + struct.pack(">I", 1000) + data[body + 9:],  # value length past the body
    ):
        length, count, error, framed = MessageEncoder("s", 0).walk(damaged, 0, 1, check_crc=False)
        assert (length, count, framed) == (0, 0, b"") and isinstance(error, CorruptEntry)
        assert MessageEncoder("s", 0).walk(damaged, 0, 1)[2] is not None  # and the CRC, checked, says so too


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(st.binary(max_size=50), min_size=1, max_size=10),
    damage=st.tuples(st.integers(0, 10_000), st.integers(1, 255)) | st.none(),
    cut=st.integers(0, 10_000) | st.none(),
    max_entries=st.integers(1, 12),
    expected_first=st.sampled_from([5, 6]),
)
def test_the_walk_keeps_exactly_the_entries_intact_prefix_keeps(values, damage, cut, max_entries, expected_first):
    """Subscribe reads through the encoder's walk: it must stop where the log's own check stops
    (torn, damaged or out-of-sequence entries, the entry limit) and encode exactly those before."""
    buf = bytearray(encode_entries(5, 1, [Record(value=v, headers={"subject": b"s"}) for v in values], 7)[0])
    if damage is not None:
        buf[damage[0] % len(buf)] ^= damage[1]
    if cut is not None:
        del buf[cut % (len(buf) + 1):]
    buf = bytes(buf)
    length, count, error = intact_prefix(buf, expected_first, max_entries)
    walked_length, walked_count, walked_error, framed = MessageEncoder("s", 0).walk(buf, expected_first, max_entries)
    assert (walked_length, walked_count) == (length, count)
    assert (walked_error is None) == (error is None)
    assert messages(framed) == [reference("s", 0, entry) for entry in decode_entries(buf[:length])]
