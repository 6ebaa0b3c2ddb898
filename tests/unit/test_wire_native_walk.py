"""The C loops of bascule.wire._walk against the Python loops they stand in for: the same
lengths, counts, errors and bytes, for intact, damaged, torn and out-of-sequence entries, with
the CRC on SSE 4.2's instruction and on tables."""

import struct
from types import SimpleNamespace

import crc32c
import pytest
from garbled_requests import garbled, outcome
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bascule.h2grpc.messages import MessageReader
from bascule.wire import capture, dedup, entry, envelope
from bascule.wire.dedup import MESSAGE_ID_HEADER, message_id
from bascule.wire.entry import Record, consecutive_prefix, encode_entries, intact_prefix_python
from bascule.wire.messages import MessageEncoder
from bascule.wire.pb import api_pb2

native = entry.native
pytestmark = pytest.mark.skipif(native is None, reason="bascule.wire._walk was not built (no C compiler)")


@pytest.fixture(params=["sse42", "tables"])
def crc_path(request):
    was = native.use_sse42(request.param == "sse42")
    yield request.param
    native.use_sse42(was)


records = st.builds(
    Record,
    value=st.binary(max_size=300) | st.sampled_from([b"x" * 16_383, b"y" * 16_384]),
    key=st.none() | st.binary(max_size=20),
    headers=st.dictionaries(st.sampled_from(["subject", "reply", "h"]), st.binary(max_size=10), max_size=3),
    timestamp=st.integers(-(2**63), 2**63 - 1),
)
chunks = st.tuples(
    st.lists(records, min_size=1, max_size=6),
    st.integers(0, 2**62) | st.integers(0, 300),
    st.tuples(st.integers(0, 100_000), st.integers(1, 255)) | st.none(),  # a flipped byte
    st.integers(0, 100_000) | st.none(),  # a cut
)


def damaged(batch, first_offset, damage, cut) -> bytes:
    buf = bytearray(encode_entries(first_offset, 3, batch, 1)[0])
    if damage is not None:
        buf[damage[0] % len(buf)] ^= damage[1]
    if cut is not None:
        del buf[cut % (len(buf) + 1):]
    return bytes(buf)


def same_error(a, b) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and str(a) == str(b))


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chunk=chunks, max_entries=st.integers(0, 8), check_crc=st.booleans(), shift=st.sampled_from([0, 1]))
def test_intact_prefix_in_c_is_the_python_loop(crc_path, chunk, max_entries, check_crc, shift):
    batch, first_offset, damage, cut = chunk
    buf = damaged(batch, first_offset, damage, cut)
    c_length, c_count, c_error, _ = consecutive_prefix(buf, 0, first_offset + shift, max_entries, check_crc)
    length, count, error = intact_prefix_python(buf, first_offset + shift, max_entries, check_crc)
    assert (c_length, c_count) == (length, count)
    assert same_error(c_error, error)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chunk=chunks, max_entries=st.integers(0, 8), check_crc=st.booleans(), shift=st.sampled_from([0, 1]))
def test_the_messages_walk_in_c_is_the_python_loop_byte_for_byte(crc_path, chunk, max_entries, check_crc, shift):
    batch, first_offset, damage, cut = chunk
    buf = damaged(batch, first_offset, damage, cut)
    try:
        c_walk = MessageEncoder("s", 3).walk_consecutive(buf, 0, first_offset + shift, max_entries, check_crc)
    except entry.CorruptEntry as exc:  # a damaged header block, found as it is encoded
        with pytest.raises(entry.CorruptEntry, match=str(exc)):
            MessageEncoder("s", 3).walk_python(buf, first_offset + shift, max_entries, check_crc)
        return
    python_walk = MessageEncoder("s", 3).walk_python(buf, first_offset + shift, max_entries, check_crc)
    assert (c_walk[0], c_walk[1], c_walk[3]) == (python_walk[0], python_walk[1], python_walk[3])
    assert same_error(c_walk[2], python_walk[2])


def test_lengths_that_overrun_the_body_stop_the_c_loop_and_python_says_why():
    data, _ = encode_entries(0, 1, [Record(value=b"v"), Record(value=b"abc", key=b"k")], 1)
    second = len(encode_entries(0, 1, [Record(value=b"v")], 1)[0])
    body = second + 32
    bad = data[:body] + struct.pack(">i", 1000) + data[body + 4:]
    length, count, error, framed = MessageEncoder("s", 0).walk(bad, 0, 2, check_crc=False)
    assert (length, count) == (second, 1)
    assert "bad key length 1000" in str(error)
    assert framed == MessageEncoder("s", 0).walk_python(data, 0, 1)[3]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=200), value=st.integers(0, 2**32 - 1))
def test_the_crc_is_crc32c(crc_path, data, value):
    assert native.crc32c(data, value) == crc32c.crc32c(data, value)


def test_garbage_never_crashes_the_c_loops():
    for garbage in (b"", b"\x00" * 31, b"\xff" * 64, bytes(range(256)) * 4, b"\x00" * 28 + b"\xff" * 40):
        for check_crc in (True, False):
            length, count, _, _ = consecutive_prefix(garbage, 0, 0, 10, check_crc)
            assert (length, count) == intact_prefix_python(garbage, 0, 10, check_crc)[:2]
            try:
                MessageEncoder("s", 0).walk(garbage, 0, 10, check_crc)
            except entry.CorruptEntry:
                pass


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chunk=chunks, check_crc=st.booleans(), view=st.booleans())
def test_walked_entries_in_c_are_what_scan_yields_up_to_the_first_bad_entry(crc_path, chunk, check_crc, view):
    batch, first_offset, damage, cut = chunk
    buf = damaged(batch, first_offset, damage, cut)
    scanned = []
    try:
        scanned.extend(entry.scan(buf, check_crc))
    except entry.CorruptEntry:
        pass
    assert entry.walked_prefix(memoryview(buf) if view else buf, check_crc) == scanned


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chunk=chunks, start=st.integers(0, 2000), max_entries=st.integers(0, 8), check_crc=st.booleans())
def test_runs_from_a_byte_inside_the_buffer_in_c_are_the_python_loops(crc_path, chunk, start, max_entries, check_crc):
    """After a gap, the walks run again from the entry past it: the C loops on a view of the rest."""
    batch, first_offset, damage, cut = chunk
    buf = damaged(batch, first_offset, damage, cut)
    start %= len(buf) + 1
    c_end, c_count, c_error, _ = consecutive_prefix(buf, start, first_offset, max_entries, check_crc)
    end, count, error = intact_prefix_python(buf, first_offset, max_entries, check_crc, start)
    assert (c_end, c_count) == (end, count) and same_error(c_error, error)
    try:
        c_walk = MessageEncoder("s", 3).walk_consecutive(buf, start, first_offset, max_entries, check_crc)
    except entry.CorruptEntry:
        return
    python_walk = MessageEncoder("s", 3).walk_python(buf, first_offset, max_entries, check_crc, start)
    assert (c_walk[0], c_walk[1], c_walk[3]) == (python_walk[0], python_walk[1], python_walk[3])


appended_records = st.builds(
    Record,
    value=st.binary(max_size=300) | st.builds(bytearray, st.binary(max_size=30)),
    key=st.none() | st.binary(max_size=20),
    headers=st.dictionaries(st.text(max_size=5), st.binary(max_size=10), max_size=3),
    timestamp=st.integers(-(2**63), 2**63 - 1) | st.just(0),
    header_block=st.none() | st.just(b"") | st.sampled_from([entry.encode_headers({"subject": b"a.b", "reply": b""})]),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(appended_records, max_size=8), first_offset=st.integers(0, 2**62),
       epoch=st.integers(0, 2**64 - 1), stamp=st.integers(-(2**63), 2**63 - 1),
       floor=st.none() | st.integers(-(2**63), 2**63 - 1), duck_typed=st.booleans())
def test_entries_encoded_in_c_are_the_python_loops_byte_for_byte(
        crc_path, batch, first_offset, epoch, stamp, floor, duck_typed):
    if duck_typed:  # records of another type are read by their attributes
        batch = [SimpleNamespace(value=r.value, key=r.key, headers=r.headers, timestamp=r.timestamp,
                                 header_block=r.header_block) for r in batch]
    data, walked = encode_entries(first_offset, epoch, batch, stamp, floor)
    assert (data, walked) == entry.encode_entries_python(first_offset, epoch, batch, stamp, floor)
    if floor is not None:
        stamps = [stamp for _, _, stamp, _, _ in walked]
        assert stamps == sorted(stamps) and all(stamp >= floor for stamp in stamps)
    decoded = list(entry.decode_entries(data))
    assert [(e.offset, e.value, e.key) for e in decoded] == [
        (first_offset + i, bytes(r.value), r.key) for i, r in enumerate(batch)]


def test_records_the_c_encoder_cannot_take_fail_as_the_python_loop_does():
    headers = {"x" * 70_000: b"v"}  # a header name longer than an entry holds
    for bad in ([Record(value=b"v", headers=headers)], [Record(value=b"v", header_block=None, headers=headers)]):
        with pytest.raises(ValueError) as in_c:
            encode_entries(0, 0, bad, 1)
        with pytest.raises(ValueError) as in_python:
            entry.encode_entries_python(0, 0, bad, 1)
        assert str(in_c.value) == str(in_python.value)
    for garbage in ([Record(value=5)], [Record(value=b"v", key=7)], [Record(value=b"v", timestamp="now")],
                    [object()], [Record(value=b"v", header_block=3)]):
        with pytest.raises((TypeError, AttributeError)):
            encode_entries(0, 0, garbage, 1)


@settings(max_examples=300, deadline=None)
@given(first_offset=st.integers(0, 2**62), acks=st.lists(st.tuples(st.integers(0, 5000), st.text(max_size=40)),
                                                          max_size=20),
       policy=st.sampled_from([0, 1, 7]), stamps=st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1)))
def test_publish_responses_in_c_are_the_python_loops_and_read_back_as_acks(first_offset, acks, policy, stamps):
    indices, ids = [index for index, _ in acks], [text for _, text in acks]
    framed = capture.publish_responses("s", "s.sub", policy, first_offset, indices, ids, *stamps)
    shared = api_pb2.Ack(stream="s", partitionSubject="s.sub", msgSubject="s.sub", ackPolicy=policy,
                         receptionTimestamp=stamps[0], commitTimestamp=stamps[1]).SerializeToString()
    assert framed == capture.publish_responses_python(first_offset, indices, ids, shared)
    reader = MessageReader(1 << 20)
    responses = [api_pb2.PublishResponse.FromString(message) for message in reader.feed(framed)]
    assert [(r.ack.offset, r.ack.correlationId, r.correlationId, r.ack.ackPolicy, r.ack.stream,
             r.ack.commitTimestamp) for r in responses] == [
        (first_offset + index, text, text, policy, "s", stamps[1]) for index, text in acks]


def test_publish_responses_refuse_what_no_ack_can_say():
    for first_offset, indices, ids in ((0, [-1], ["a"]), (2**63 - 1, [1], ["a"]), (0, [1, 2], ["a"])):
        for encode in (native.publish_responses, capture.publish_responses_python):
            with pytest.raises(ValueError):
                encode(first_offset, indices, ids, b"")
    for garbage in (([1], [b"bytes"]), (["1"], ["a"]), ([2**70], ["a"])):
        with pytest.raises((TypeError, OverflowError)):
            native.publish_responses(0, *garbage, b"")


ENVELOPE_HEADERS = [{}, {"h": b"v"}, {MESSAGE_ID_HEADER: b"own"}, {MESSAGE_ID_HEADER: b"", "h": b"v"},
                    {"subject": b"x", MESSAGE_ID_HEADER: b"own-2"}]


def publish_envelope(value: bytes, inbox: str, headers: dict[str, bytes]) -> bytes:
    message = api_pb2.Message(value=value, key=b"k", ackInbox=inbox, correlationId="c",
                              ackPolicy=api_pb2.AckPolicy.ALL, headers=headers)
    return envelope.encode_message(message, envelope.MsgType.PUBLISH)


envelopes = st.builds(publish_envelope, st.binary(max_size=20), st.sampled_from(["", "in.1", "bad inbox"]),
                      st.sampled_from(ENVELOPE_HEADERS))
payloads = st.one_of(
    st.binary(max_size=40),
    envelopes,
    st.builds(lambda p, cut: p[:cut], envelopes, st.integers(0, 30)),  # torn envelopes, stored as plain values
    st.just(envelope.MAGIC),
)
nats_ids = st.none() | st.sampled_from([b"", b"id-1", b"id-2"]) | st.binary(min_size=1, max_size=70)
deliveries = st.lists(
    st.tuples(st.sampled_from(["s.a", "s.b"]), st.sampled_from(["", "r.1"]), payloads, nats_ids), max_size=12,
)


@given(deliveries)
def test_capture_batch_in_c_builds_the_records_acks_and_ids_of_the_python_loop(burst):
    interned = {name: name for name in ("s.a", "s.b", "", "r.1")}
    burst = [(interned[subject], interned[reply], payload, *([] if nats_id is None else [nats_id]))
             for subject, reply, payload, nats_id in burst]
    in_c, in_python = capture.capture_batch(burst), capture.capture_batch_python(burst)
    assert in_c == in_python
    assert all(type(record) is Record for record in in_c.records)
    ids = [message_id(record.headers) for record in in_c.records]
    assert in_c.ids == (ids if any(ids) else None)
    shared_blocks = {capture.stored_headers(subject, reply)[1] for subject, reply, *_ in burst}
    for record, record_id in zip(in_c.records, ids):  # each block holds its record's headers, its id in them
        assert record.header_block is None or entry.encode_headers(record.headers) == record.header_block
        assert record_id is None or record.header_block not in shared_blocks


def test_capture_batch_in_c_refuses_what_is_not_a_burst_of_deliveries():
    for garbage in (("s", "", "not bytes"), ("s", "", b"v", "not bytes"), ("s", "", b"v", b"id", b"more"), ("s", "")):
        with pytest.raises(TypeError, match="delivery"):
            capture.capture_batch([garbage])
    with pytest.raises(TypeError, match="slots"):
        native.capture_records([], dict, capture.stored_headers, capture._record_from_envelope, envelope.MAGIC)


# --- a PublishAsync request's id (wire.dedup.split_message_id) ------------------------------------

_ID_HEADERS = st.dictionaries(st.sampled_from([MESSAGE_ID_HEADER, "h", "nats-msg-id"]), st.binary(max_size=200),
                              max_size=2) | st.builds(lambda raw: {MESSAGE_ID_HEADER: raw}, st.binary(max_size=300))
publish_requests = st.builds(
    api_pb2.PublishRequest, key=st.binary(max_size=5), value=st.binary(max_size=40), stream=st.text(max_size=8),
    partition=st.integers(-5, 5), correlationId=st.text(max_size=8), ackPolicy=st.sampled_from([0, 1, 2]),
    expectedOffset=st.integers(-(2**63), 2**63 - 1), headers=_ID_HEADERS,
)


@settings(max_examples=400)
@given(request=publish_requests, flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), max_size=3),
       cut=st.integers(0, 10_000) | st.none())
def test_the_id_split_in_c_is_the_python_one_for_requests_whole_or_garbled(request, flips, cut):
    for data in (request.SerializeToString(), garbled(request, flips, cut)):
        assert native.split_message_id(data) == dedup.split_message_id_python(data)
        decode = api_pb2.PublishRequest.FromString
        assert outcome(lambda: native.decode_with_id(decode, data)) == \
            outcome(lambda: dedup.decode_with_id_python(decode, data))  # noqa: B023


@settings(max_examples=400)
@given(data=st.binary(max_size=400))
def test_the_id_split_in_c_is_the_python_one_for_random_bytes(data):
    assert native.split_message_id(data) == dedup.split_message_id_python(data)
    assert native.split_message_id(b"\x2a\x13" + data) == dedup.split_message_id_python(b"\x2a\x13" + data)


def test_the_id_split_in_c_takes_only_bytes_and_passes_decoding_errors_on():
    with pytest.raises(TypeError):
        native.split_message_id(bytearray(b"\x2a\x00"))
    with pytest.raises(TypeError):
        native.decode_with_id(api_pb2.PublishRequest.FromString)
    data = api_pb2.PublishRequest(headers={MESSAGE_ID_HEADER: b"i"}).SerializeToString()

    def refuse(_: bytes) -> None:
        raise DecodeError("no")

    for call in (native.decode_with_id, dedup.decode_with_id_python):
        with pytest.raises(DecodeError):
            call(refuse, data)
        with pytest.raises(DecodeError):
            call(refuse, b"")


@given(value=st.binary(max_size=300), key=st.none() | st.binary(max_size=5), raw_id=st.binary(min_size=1, max_size=300),
       subject=st.text(max_size=40), reply=st.text(max_size=10))
def test_a_record_with_an_id_in_c_is_the_python_one_and_encodes_alike(value, key, raw_id, subject, reply):
    shared, block = capture.stored_headers(subject, reply)
    made = native.record_with_id(Record, value, key, raw_id, shared, block)
    expected = dedup.record_with_id_python(Record, value, key, raw_id, shared, block)
    assert type(made) is Record and made == expected
    assert encode_entries(0, 1, [made], 5)[0] == entry.encode_entries_python(0, 1, [expected], 5)[0]


def test_a_record_with_an_id_in_c_refuses_what_is_not_an_id_beside_shared_headers():
    shared, block = capture.stored_headers("s", "")
    for bad in [("not bytes", shared, block), (b"i", [], block), (b"i", shared, b"\x00"), (b"i", shared, "s")]:
        with pytest.raises(TypeError):
            native.record_with_id(Record, b"v", None, *bad)
    with pytest.raises(TypeError):
        native.record_with_id(dict, b"v", None, b"i", shared, block)
    with pytest.raises(TypeError):
        native.record_with_id(Record, b"v")
    full = struct.pack(">H", 0xFFFF) + block[2:]
    with pytest.raises(ValueError):
        native.record_with_id(Record, b"v", None, b"i", shared, full)
