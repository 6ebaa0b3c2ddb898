import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bascule.wire.envelope import (
    MAGIC,
    EnvelopeError,
    MsgType,
    decode,
    decode_message,
    encode,
    encode_message,
    is_envelope,
)
from bascule.wire.pb import api_pb2, internal_pb2

msg_types = st.sampled_from(list(MsgType))


def test_types_match_liftbridge_numbering():
    bascule_own = [t for t in MsgType if t.value >= 100]  # clear of Liftbridge's numbers
    assert [t.value for t in MsgType if t not in bascule_own] == list(range(15))
    assert [t.value for t in bascule_own] == list(range(100, 109))
    assert MsgType.REPLICATION_FRAGMENT == 100 and MsgType.NOT_LEADER == 101
    assert MsgType.FETCH_SESSION_REQUEST == 102 and MsgType.PARTITION_NOTIFICATIONS == 104
    assert MsgType.FETCH_SESSION_ROUND == 105 and MsgType.FETCH_SESSION_ANSWER == 106
    assert MsgType.FETCH_MUX_REQUEST == 107 and MsgType.FETCH_MUX_ANSWER == 108
    assert MsgType.PUBLISH == 0 and MsgType.ACK == 1
    assert MsgType.REPLICATION_RESPONSE == 3
    assert MsgType.LEADER_EPOCH_OFFSET_REQUEST == 6
    assert MsgType.PARTITION_NOTIFICATION == 14


def test_layout_without_crc():
    assert encode(MsgType.ACK, b"xyz") == b"\xb9\x0e\x43\xb4\x00\x08\x00\x01xyz"


def test_layout_with_crc():
    data = encode(MsgType.PUBLISH, b"xyz", with_crc=True)
    assert data[:8] == b"\xb9\x0e\x43\xb4\x00\x0c\x01\x00"
    assert int.from_bytes(data[8:12], "big") == crc32c.crc32c(b"xyz")
    assert data[12:] == b"xyz"


@given(msg_types, st.binary(max_size=300), st.booleans())
def test_round_trip(msg_type: MsgType, payload: bytes, with_crc: bool):
    decoded_type, decoded_payload = decode(encode(msg_type, payload, with_crc))
    assert decoded_type is msg_type
    assert bytes(decoded_payload) == payload


def test_decode_accepts_memoryview_and_returns_a_view():
    data = encode(MsgType.PUBLISH, b"payload")
    _, payload = decode(memoryview(data))
    assert isinstance(payload, memoryview) and payload.obj is data


def test_is_envelope():
    assert is_envelope(encode(MsgType.PUBLISH, b""))
    assert is_envelope(memoryview(MAGIC + b"anything"))
    assert not is_envelope(b"plain NATS payload")
    assert not is_envelope(MAGIC[:3])
    assert not is_envelope(b"")


@pytest.mark.parametrize(
    ("data", "complaint"),
    [
        (b"", "too short"),
        (MAGIC + b"\x00\x08\x00", "too short"),
        (b"\xb9\x0e\x43\xb5\x00\x08\x00\x00", "magic"),
        (b"plain NATS payload", "magic"),
        (MAGIC + b"\x01\x08\x00\x00", "version"),
        (MAGIC + b"\x00\x09\x00\x00", "header length"),
        (MAGIC + b"\x00\x0c\x00\x00xxxx", "header length"),
        (MAGIC + b"\x00\x08\x01\x00", "header length"),
        (MAGIC + b"\x00\x0c\x01\x00\x00\x00", "too short"),
        (MAGIC + b"\x00\x0c\x01\x00\x00\x00\x00\x01", "CRC mismatch"),
        (MAGIC + b"\x00\x08\x02\x00", "flags"),
        (MAGIC + b"\x00\x08\x00\x0f", "type 15"),
        (MAGIC + b"\x00\x08\x00\xff", "type 255"),
    ],
)
def test_decode_errors(data: bytes, complaint: str):
    with pytest.raises(EnvelopeError, match=complaint):
        decode(data)


def test_crc_mismatch_in_payload():
    data = bytearray(encode(MsgType.ACK, b"payload", with_crc=True))
    data[-1] ^= 0x01
    with pytest.raises(EnvelopeError, match="CRC mismatch"):
        decode(bytes(data))


def test_envelope_error_is_a_value_error():
    assert issubclass(EnvelopeError, ValueError)


def test_message_round_trip():
    ack = api_pb2.Ack(stream="s", offset=7, ackError=api_pb2.Ack.Error.TOO_LARGE)
    for with_crc in (False, True):
        data = encode_message(ack, MsgType.ACK, with_crc)
        assert decode_message(data, MsgType.ACK, api_pb2.Ack) == ack


def test_decode_message_rejects_another_type():
    notification = internal_pb2.PartitionNotification(stream="s")
    data = encode_message(notification, MsgType.PARTITION_NOTIFICATION)
    with pytest.raises(EnvelopeError, match="expected a PUBLISH envelope"):
        decode_message(data, MsgType.PUBLISH, api_pb2.Message)


@pytest.mark.parametrize("payload", [b"\xff", b"\x0a\x05ab", b"\x3a\x02\xff\xfe"])
def test_decode_message_turns_protobuf_errors_into_envelope_errors(payload: bytes):
    with pytest.raises(EnvelopeError, match="proto.Message"):
        decode_message(encode(MsgType.PUBLISH, payload), MsgType.PUBLISH, api_pb2.Message)


@given(st.binary(max_size=64))
def test_decode_of_random_bytes_raises_only_envelope_error(data: bytes):
    try:
        decode(data)
    except EnvelopeError:
        pass


@given(st.binary(max_size=8), st.binary(max_size=64))
def test_decode_of_random_bytes_after_magic_raises_only_envelope_error(head: bytes, tail: bytes):
    # Reaches past the magic check, which plain random bytes almost never do.
    try:
        decode(MAGIC + b"\x00" + head + tail)
    except EnvelopeError:
        pass


@given(st.binary(max_size=64))
def test_decode_message_of_random_payload_raises_only_envelope_error(payload: bytes):
    try:
        decode_message(encode(MsgType.PUBLISH, payload), MsgType.PUBLISH, api_pb2.Message)
    except EnvelopeError:
        pass


def _flipped(data: bytes, bit: int) -> bytes:
    damaged = bytearray(data)
    damaged[bit // 8] ^= 1 << (bit % 8)
    return bytes(damaged)


@given(msg_types, st.binary(max_size=40))
def test_every_single_bit_flip_is_detected(msg_type: MsgType, payload: bytes):
    # The CRC covers only the payload; a flip in the type byte can yield
    # another known type, which a reader that expects a type still rejects.
    data = encode(msg_type, payload, with_crc=True)
    for bit in range(len(data) * 8):
        try:
            damaged_type, _ = decode(_flipped(data, bit))
        except EnvelopeError:
            continue
        assert damaged_type != msg_type, f"flip of bit {bit} went unnoticed"


@given(st.binary(max_size=40))
def test_every_single_bit_flip_is_detected_by_decode_message(value: bytes):
    data = encode_message(api_pb2.Message(value=value), MsgType.PUBLISH, with_crc=True)
    for bit in range(len(data) * 8):
        with pytest.raises(EnvelopeError):
            decode_message(_flipped(data, bit), MsgType.PUBLISH, api_pb2.Message)
