import pytest
from hypothesis import given
from hypothesis import strategies as st

from bascule.wire import envelope
from bascule.wire.capture import (
    ALL,
    LEADER,
    NONE,
    AckRequest,
    ack_message,
    capture_batch,
    capture_batch_python,
    encode_acks,
    record_from_nats,
    stored_headers,
)
from bascule.wire.dedup import MESSAGE_ID_HEADER
from bascule.wire.entry import decode_entries, encode_entries
from bascule.wire.pb import api_pb2


def test_plain_payload_is_stored_whole_with_subject_and_reply():
    record, ack = record_from_nats(b"hello", "foo", "_INBOX.1")
    assert record.value == b"hello" and record.key is None and ack is None
    assert record.headers == {"subject": b"foo", "reply": b"_INBOX.1"}


def test_envelope_keeps_key_headers_and_ack_request():
    message = api_pb2.Message(key=b"k", value=b"v", headers={"h": b"1"}, ackInbox="in", correlationId="c",
                              ackPolicy=ALL)
    record, ack = record_from_nats(envelope.encode_message(message, envelope.MsgType.PUBLISH), "foo", "")
    assert (record.key, record.value, record.headers["h"], record.headers["subject"]) == (b"k", b"v", b"1", b"foo")
    assert (ack.inbox, ack.correlation_id, ack.policy, ack.msg_subject) == ("in", "c", ALL, "foo")


def test_ack_policy_none_requests_no_ack():
    message = api_pb2.Message(value=b"v", ackInbox="in", ackPolicy=NONE)
    _, ack = record_from_nats(envelope.encode_message(message, envelope.MsgType.PUBLISH), "foo", "")
    assert ack is None


def test_broken_envelope_is_kept_as_plain_value():
    data = envelope.encode_message(api_pb2.Message(value=b"v"), envelope.MsgType.PUBLISH, with_crc=True)
    broken = data[:-1] + bytes([data[-1] ^ 0xFF])
    record, ack = record_from_nats(broken, "foo", "")
    assert record.value == broken and ack is None


def test_truncated_protobuf_in_envelope_is_kept_as_plain_value():
    data = envelope.encode_message(api_pb2.Message(value=b"x" * 50, key=b"k"), envelope.MsgType.PUBLISH)
    truncated = data[:-10]
    record, _ = record_from_nats(truncated, "foo", "")
    assert record.value == truncated


@given(st.binary(max_size=200))
def test_any_payload_becomes_a_record(data):
    record, _ = record_from_nats(b"\xb9\x0e\x43\xb4" + data, "s", "")
    assert isinstance(record.value, bytes)


def _publish(**fields):
    return envelope.encode_message(api_pb2.Message(**fields), envelope.MsgType.PUBLISH)


@pytest.mark.parametrize("inbox", ["has space", "line\r\nPUB evil 1", "tab\there", "\x00"])
def test_an_ack_inbox_that_is_not_a_subject_gets_no_ack_but_the_message_is_kept(inbox):
    record, ack = record_from_nats(_publish(value=b"v", ackInbox=inbox, ackPolicy=ALL), "foo", "")
    assert ack is None and record.value == b"v"


def test_capture_batch_gives_each_record_its_own_subject_and_reply():
    deliveries = [("a", "", b"1"), ("a", "", b"2"), ("b", "", b"3"), ("a", "r", b"4"), ("a", "".join([]), b"5")]
    batch = capture_batch(deliveries)
    assert [(r.headers["subject"], r.headers["reply"]) for r in batch.records] == [
        (b"a", b""), (b"a", b""), (b"b", b""), (b"a", b"r"), (b"a", b"")]
    one_by_one = [record_from_nats(p, s, r)[0] for s, r, p in deliveries]
    assert [r.header_block for r in batch.records] == [record.header_block for record in one_by_one]


def test_capture_batch_pairs_each_ack_with_its_record():
    deliveries = [
        ("s", "", b"plain"),
        ("s", "", _publish(value=b"a", ackInbox="in.a", correlationId="1", ackPolicy=ALL)),
        ("s", "r", _publish(value=b"b")),
        ("s", "", _publish(value=b"c", ackInbox="in.c", correlationId="3", ackPolicy=LEADER)),
    ]
    batch = capture_batch(deliveries)
    assert [r.value for r in batch.records] == [b"plain", b"a", b"b", b"c"]
    assert [(i, a.inbox, a.policy) for i, a in batch.acks] == [(1, "in.a", ALL), (3, "in.c", LEADER)]
    assert batch.records[2].headers == {"subject": b"s", "reply": b"r"}
    assert batch.records[3].headers == {"subject": b"s", "reply": b""}


both_loops = pytest.mark.parametrize("capture", [capture_batch, capture_batch_python], ids=["built", "python"])


@both_loops
def test_a_batch_without_ids_has_none_and_its_records_share_the_subjects_headers(capture):
    own_headers = _publish(value=b"3", headers={"h": b"v"})
    batch = capture([("s", "", b"1"), ("s", "", _publish(value=b"2")), ("s", "", own_headers)])
    shared, block = stored_headers("s", "")
    assert batch.ids is None
    assert all(record.headers is shared and record.header_block is block for record in batch.records[:2])


@both_loops
def test_a_plain_message_id_is_stored_as_a_header_and_listed_in_the_batch(capture):
    batch = capture([("s", "r", b"1"), ("s", "r", b"2", b"id-2"), ("s", "r", b"3", b"")])  # an empty id is none
    assert batch.ids == [None, b"id-2", None]
    assert batch.records[1].headers == {MESSAGE_ID_HEADER: b"id-2", "subject": b"s", "reply": b"r"}
    assert batch.records[2].headers is stored_headers("s", "r")[0]
    stored = decode_entries(encode_entries(0, 1, batch.records, 1)[0])  # what the log keeps, and a new leader reads
    assert [entry.headers.get(MESSAGE_ID_HEADER) for entry in stored] == [None, b"id-2", None]
    assert stored[1].headers == batch.records[1].headers


@both_loops
def test_an_envelope_keeps_its_own_id_which_wins_over_the_nats_one(capture):
    own = _publish(value=b"a", headers={MESSAGE_ID_HEADER: b"own", "h": b"v"})
    empty_own = _publish(value=b"b", headers={MESSAGE_ID_HEADER: b""})
    batch = capture([("s", "", own), ("s", "", own, b"nats"), ("s", "", _publish(value=b"c"), b"nats"),
                     ("s", "", empty_own, b"nats"), ("s", "", empty_own)])
    assert batch.ids == [b"own", b"own", b"nats", b"nats", None]
    assert batch.records[1].headers == {MESSAGE_ID_HEADER: b"own", "h": b"v", "subject": b"s", "reply": b""}
    assert batch.records[2].headers == {MESSAGE_ID_HEADER: b"nats", "subject": b"s", "reply": b""}


@both_loops
def test_a_malformed_envelope_stored_as_a_plain_value_keeps_its_nats_id(capture):
    torn = _publish(value=b"x" * 50, ackInbox="in", ackPolicy=ALL)[:-10]
    batch = capture([("s", "", torn, b"id")])
    assert batch.records[0].value == torn and batch.ids == [b"id"] and batch.acks == []


_names = st.text(st.characters(codec="utf-8", exclude_characters=" "), min_size=1, max_size=30)


@given(
    st.lists(st.tuples(_names, st.text(max_size=20), st.sampled_from([LEADER, ALL]), _names), max_size=20),
    st.integers(0, 2**62), st.integers(0, 2**62), st.integers(0, 2**62),
)
def test_batch_acks_decode_as_the_acks_built_one_by_one(requests, first_offset, reception, commit):
    acks = [(i * 2, AckRequest(*request)) for i, request in enumerate(requests)]
    encoded = encode_acks("stream", "partition.subject", first_offset, acks, reception, commit)
    assert [inbox for inbox, _ in encoded] == [request.inbox for _, request in acks]
    for (index, request), (_, data) in zip(acks, encoded):
        expected = ack_message("stream", "partition.subject", first_offset + index, request, reception, commit)
        assert envelope.decode_message(data, envelope.MsgType.ACK, api_pb2.Ack) == expected
