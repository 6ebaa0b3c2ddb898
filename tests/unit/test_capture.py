from hypothesis import given, strategies as st

from bascule.node.capture import ALL, NONE, record_from_nats
from bascule.wire import envelope
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
