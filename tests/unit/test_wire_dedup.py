"""Message ids as every write path reads them (bascule.wire.dedup)."""

import hashlib

import pytest
from garbled_requests import garbled, outcome
from hypothesis import given
from hypothesis import strategies as st

from bascule.wire import capture, dedup
from bascule.wire.dedup import (
    MESSAGE_ID_HEADER,
    decode_with_id_python,
    headers_with_id,
    message_id,
    message_id_field_size,
    message_ids,
    record_with_id_python,
    split_message_id_python,
    stored_message_ids,
    window_key,
    window_keys,
)
from bascule.wire.entry import Record, decode_entries, encode_entries, encode_headers
from bascule.wire.pb import api_pb2


def test_an_absent_or_empty_header_is_no_id():
    assert message_id({}) is None and message_id({MESSAGE_ID_HEADER: b""}) is None
    assert message_id({"nats-msg-id": b"a"}) is None  # names are exact, as JetStream's
    assert message_id({MESSAGE_ID_HEADER: b"a"}) == b"a"


def test_a_batch_without_ids_costs_a_none():
    assert message_ids([Record(b"v"), Record(b"w")]) is None
    assert message_ids([Record(b"v"), Record(b"w", headers={MESSAGE_ID_HEADER: b"x"})]) == [None, b"x"]


def test_long_ids_are_kept_by_their_digest():
    assert window_key(b"a" * 64) == b"a" * 64
    assert window_key(b"a" * 65) == hashlib.sha256(b"a" * 65).digest()


@given(st.binary(min_size=1, max_size=300), st.text(max_size=40), st.text(max_size=10))
def test_the_id_in_front_of_a_shared_block_encodes_as_encode_headers_would(raw_id, subject, reply):
    shared, block = capture.stored_headers(subject, reply)
    headers, encoded = headers_with_id(raw_id, shared, block)
    assert headers == {MESSAGE_ID_HEADER: raw_id, **shared}
    assert encoded == encode_headers(headers)


def test_the_blocks_kept_around_ids_stay_within_their_bound_and_encode_alike_past_it():
    """A publisher with a new subject or reply per message must not grow the cache of shared
    blocks without bound: past it the cache starts again, and every encoding stays right."""
    for n in range(dedup._AROUND_ID_CACHE_SIZE * 2 + 10):
        shared, block = capture.stored_headers(f"subject.{n}", f"reply.{n}")
        headers, encoded = headers_with_id(b"id-%d" % n, shared, block)
        assert len(dedup._around_id) <= dedup._AROUND_ID_CACHE_SIZE
        if n % 997 == 0:
            assert encoded == encode_headers(headers)


_HEADER_NAMES = st.sampled_from([MESSAGE_ID_HEADER, "subject", "reply", "h", "Nats-Msg-Id-x", "nats-msg-id"])


@st.composite
def records(draw):
    headers = draw(st.dictionaries(_HEADER_NAMES, st.binary(max_size=20), max_size=4))
    if draw(st.booleans()) and MESSAGE_ID_HEADER in headers:  # first, as bascule's writers put it
        headers = {MESSAGE_ID_HEADER: headers.pop(MESSAGE_ID_HEADER), **headers}
    value = draw(st.one_of(st.binary(max_size=30), st.just(MESSAGE_ID_HEADER.encode())))
    return Record(value, draw(st.none() | st.binary(max_size=5)), headers)


@given(st.lists(records(), max_size=12))
def test_stored_ids_are_what_decoding_the_entries_finds(batch):
    data, _ = encode_entries(7, 1, batch, 10**18)
    expected = [(entry.offset, entry.timestamp, message_id(entry.headers)) for entry in decode_entries(data)
                if message_id(entry.headers)]
    assert list(stored_message_ids(data)) == expected


# --- a PublishAsync request's id, taken out before protobuf reads it (split_message_id) ------------

publish_requests = st.builds(
    api_pb2.PublishRequest,
    key=st.binary(max_size=5), value=st.binary(max_size=40), stream=st.text(max_size=8),
    partition=st.integers(-(2**31), 2**31 - 1), ackInbox=st.text(max_size=5), correlationId=st.text(max_size=8),
    ackPolicy=st.sampled_from([0, 1, 2]), expectedOffset=st.integers(-(2**63), 2**63 - 1),
    headers=st.dictionaries(_HEADER_NAMES, st.binary(max_size=200), max_size=3)
    | st.builds(lambda raw: {MESSAGE_ID_HEADER: raw}, st.binary(max_size=300)),
)


def decoded_again(rest: bytes, raw_id: bytes) -> api_pb2.PublishRequest:
    request = api_pb2.PublishRequest.FromString(rest)
    request.headers[MESSAGE_ID_HEADER] = raw_id
    return request


@given(publish_requests)
def test_a_request_whose_one_header_is_its_id_decodes_alike_without_it(request):
    data = request.SerializeToString()
    split = split_message_id_python(data)
    if dict(request.headers) != {MESSAGE_ID_HEADER: request.headers.get(MESSAGE_ID_HEADER)} \
            or not request.headers[MESSAGE_ID_HEADER]:
        assert split is None  # other headers, no header or an empty id: protobuf reads them all
        assert decode_with_id_python(api_pb2.PublishRequest.FromString, data) == (request, None)
        return
    rest, raw_id = split
    assert raw_id == request.headers[MESSAGE_ID_HEADER]
    assert decoded_again(rest, raw_id) == request
    assert not api_pb2.PublishRequest.FromString(rest).headers
    assert api_pb2.PublishRequest.FromString(rest).ByteSize() + message_id_field_size(raw_id) == request.ByteSize()
    decoded, taken = decode_with_id_python(api_pb2.PublishRequest.FromString, data)
    assert taken == raw_id and decoded == api_pb2.PublishRequest.FromString(rest)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _varint(number: int) -> bytes:
    out = bytearray()
    while number >= 0x80:
        out.append(number & 0x7F | 0x80)
        number >>= 7
    return bytes(out + bytes([number]))


ID_ENTRY = _field(1, MESSAGE_ID_HEADER.encode()) + _field(2, b"abc")


@pytest.mark.parametrize("data", [
    _field(5, _field(2, b"abc") + _field(1, MESSAGE_ID_HEADER.encode())),  # value before key
    _field(5, ID_ENTRY + _field(3, b"x")),  # a field a map entry has not
    _field(5, ID_ENTRY) + _field(5, ID_ENTRY),  # twice: protobuf keeps the last
    _field(5, ID_ENTRY) + _field(5, _field(1, b"h") + _field(2, b"v")),  # another header
    _field(5, _field(1, b"nats-msg-id") + _field(2, b"abc")),  # names are exact
    _field(5, _field(1, MESSAGE_ID_HEADER.encode()) + _field(2, b"")),  # an empty id is none
    _field(5, _field(1, MESSAGE_ID_HEADER.encode())),  # no value
    _field(3, b"s") + b"\x28\x01" + _field(5, ID_ENTRY),  # field 5 as a varint too
    _field(5, ID_ENTRY) + b"\x0b\x0c",  # a group: not walked
    _field(5, ID_ENTRY) + b"\x1a\x05ab",  # a field overrunning the bytes
    _field(5, ID_ENTRY) + b"\x08" + b"\xff" * 10 + b"\x01",  # a varint of 11 bytes
    _field(5, ID_ENTRY) + b"\x00\x01",  # field number 0
    _field(5, ID_ENTRY) + b"\x80\x80\x80\x80\x10\x01",  # a tag of 2**32
    b"",
])
def test_what_is_not_one_id_written_as_protobuf_writes_it_is_left_to_protobuf(data):
    assert split_message_id_python(data) is None


def test_an_id_written_as_protobuf_writes_it_is_taken_wherever_its_field_is():
    data = _field(3, b"s") + _field(5, ID_ENTRY) + _field(7, b"c") + b"\x48\x05"  # expectedOffset 5
    assert split_message_id_python(data) == (_field(3, b"s") + _field(7, b"c") + b"\x48\x05", b"abc")
    # Lengths written longer than they need be are read as protobuf reads them.
    long_length = b"\x2a" + b"\x93\x00" + _field(1, MESSAGE_ID_HEADER.encode()) + b"\x12\x83\x00abc"
    assert split_message_id_python(long_length) == (b"", b"abc")
    assert decoded_again(b"", b"abc") == api_pb2.PublishRequest.FromString(long_length)


def damaged_requests():
    flips = st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), max_size=3)
    return st.tuples(publish_requests, flips, st.integers(0, 10_000) | st.none())


@given(damaged_requests())
def test_garbage_decodes_alike_with_its_id_taken_out_or_not(damaged):
    data = garbled(*damaged)
    split = split_message_id_python(data)
    whole = outcome(lambda: api_pb2.PublishRequest.FromString(data))
    if split is not None:
        assert outcome(lambda: decoded_again(*split)) == whole
    assert outcome(lambda: decode_with_id_python(api_pb2.PublishRequest.FromString, data)[0]) == \
        (whole if split is None else outcome(lambda: api_pb2.PublishRequest.FromString(split[0])))


@given(st.binary(max_size=300))
def test_random_bytes_never_fail_the_split(data):
    split = split_message_id_python(data)
    assert split is None or (len(split[0]) < len(data) and split[1] and split[1] in data)


@given(st.binary(max_size=300), st.binary(max_size=5) | st.none(), st.binary(min_size=1, max_size=300),
       st.text(max_size=40), st.text(max_size=10))
def test_a_record_with_an_id_is_the_one_headers_with_id_makes(value, key, raw_id, subject, reply):
    shared, block = capture.stored_headers(subject, reply)
    record = record_with_id_python(Record, value, key, raw_id, shared, block)
    headers, with_id = headers_with_id(raw_id, shared, block)
    assert record == Record(value, key, headers, 0, with_id)


@given(st.lists(st.none() | st.binary(max_size=70), max_size=6))
def test_window_keys_are_each_ids_window_key(ids):
    assert list(window_keys(ids)) == [None if key is None else window_key(key) for key in ids]
    if all(key is None or len(key) <= 64 for key in ids):
        assert window_keys(ids) is ids  # nothing to digest: no copy
