"""Liftbridge's envelope: the framing of every protobuf sent over plain NATS.

Layout (big-endian): magic B9 0E 43 B4, version (0), header length (8, or 12
with a CRC), flags (bit 0: CRC-32C of the payload in bytes 8-11), message type,
[CRC], payload.

The CRC covers the payload only: a damaged type byte can turn one known type
into another, which is why decode_message checks the type it expects.
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import Any, TypeVar

import crc32c
import msgpack
from google.protobuf.message import DecodeError, Message

MAGIC = b"\xb9\x0e\x43\xb4"
VERSION = 0
HEADER_LENGTH = 8
HEADER_LENGTH_WITH_CRC = 12
FLAG_CRC = 0x01

_HEADER = struct.Struct(">4sBBBB")  # magic, version, header length, flags, type
_CRC = struct.Struct(">I")


class EnvelopeError(ValueError):
    """The bytes are not a well-formed envelope (or not of the expected type)."""


class MsgType(IntEnum):
    PUBLISH = 0  # payload: api Message
    ACK = 1  # payload: api Ack
    REPLICATION_REQUEST = 2
    REPLICATION_RESPONSE = 3
    RAFT_JOIN_REQUEST = 4
    RAFT_JOIN_RESPONSE = 5
    LEADER_EPOCH_OFFSET_REQUEST = 6
    LEADER_EPOCH_OFFSET_RESPONSE = 7
    PROPAGATED_REQUEST = 8
    PROPAGATED_RESPONSE = 9
    SERVER_INFO_REQUEST = 10
    SERVER_INFO_RESPONSE = 11
    PARTITION_STATUS_REQUEST = 12
    PARTITION_STATUS_RESPONSE = 13
    PARTITION_NOTIFICATION = 14
    # bascule's own, far from Liftbridge's numbers: a piece of one entry too big for one NATS message.
    REPLICATION_FRAGMENT = 100
    # bascule's own: "not the leader of the epoch you asked": an empty payload, so that a follower
    # retries at once instead of waiting out a request timeout (a deposed or not yet leading node).
    NOT_LEADER = 101
    # bascule's own: a fetch session's round and its reply (``wire.sessions``).
    FETCH_SESSION_REQUEST = 102
    FETCH_SESSION_RESPONSE = 103
    # bascule's own: every partition a leader node notified one follower node of in one turn.
    PARTITION_NOTIFICATIONS = 104
    # bascule's own: an incremental fetch session's round and its answer (``wire.sessions``).
    FETCH_SESSION_ROUND = 105
    FETCH_SESSION_ANSWER = 106
    # bascule's own: the fetches a follower node makes of a leader node in one turn (``wire.fetchmux``).
    FETCH_MUX_REQUEST = 107
    FETCH_MUX_ANSWER = 108


_KNOWN_TYPES = frozenset(MsgType)
PbMessage = TypeVar("PbMessage", bound=Message)


def header(msg_type: MsgType, payload_crc: int | None = None) -> bytes:
    """The header alone, for writers that put the payload after it themselves.

    payload_crc is the payload's CRC-32C, if the header should carry one.
    """
    if payload_crc is None:
        return _HEADER.pack(MAGIC, VERSION, HEADER_LENGTH, 0, msg_type)
    return _HEADER.pack(
        MAGIC, VERSION, HEADER_LENGTH_WITH_CRC, FLAG_CRC, msg_type
    ) + _CRC.pack(payload_crc)


_PLAIN_HEADERS = {msg_type: header(msg_type) for msg_type in MsgType}
NOT_LEADER_REPLY = _PLAIN_HEADERS[MsgType.NOT_LEADER]  # the whole message


def encode(msg_type: MsgType, payload: bytes | memoryview, with_crc: bool = False) -> bytes:
    payload_crc = crc32c.crc32c(payload) if with_crc else None
    return header(msg_type, payload_crc) + payload


def is_envelope(data: bytes | memoryview) -> bool:
    """Whether data starts like an envelope; a plain NATS publish does not."""
    return data[:4] == MAGIC


def decode_header(data: bytes | memoryview) -> tuple[MsgType, int]:
    """Check data's header (and CRC) and return its type and payload start."""
    if len(data) < HEADER_LENGTH:
        raise EnvelopeError(f"envelope too short: {len(data)} bytes, header needs {HEADER_LENGTH}")
    magic, version, header_length, flags, type_code = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise EnvelopeError(f"bad envelope magic {bytes(magic).hex()}, expected {MAGIC.hex()}")
    if version != VERSION:
        raise EnvelopeError(f"unknown envelope version {version}")
    # Unknown flags may change the meaning of what follows, so refuse them
    # rather than guess.
    if flags & ~FLAG_CRC:
        raise EnvelopeError(f"unknown envelope flags {flags:#04x}")
    if type_code not in _KNOWN_TYPES:
        raise EnvelopeError(f"unknown envelope message type {type_code}")
    expected_length = HEADER_LENGTH_WITH_CRC if flags & FLAG_CRC else HEADER_LENGTH
    if header_length != expected_length:
        raise EnvelopeError(
            f"bad envelope header length {header_length} for flags {flags:#04x},"
            f" expected {expected_length}"
        )
    if len(data) < header_length:
        raise EnvelopeError(f"envelope too short: {len(data)} bytes, header needs {header_length}")
    if flags & FLAG_CRC:
        (expected_crc,) = _CRC.unpack_from(data, HEADER_LENGTH)
        actual_crc = crc32c.crc32c(memoryview(data)[header_length:])
        if actual_crc != expected_crc:
            raise EnvelopeError(
                f"envelope CRC mismatch: header says {expected_crc:#010x},"
                f" payload has {actual_crc:#010x}"
            )
    return MsgType(type_code), header_length


def decode(data: bytes | memoryview) -> tuple[MsgType, memoryview]:
    """Split an envelope into its type and payload (a view, not a copy)."""
    msg_type, payload_start = decode_header(data)
    return msg_type, memoryview(data)[payload_start:]


def encode_message(pb_msg: Message, msg_type: MsgType, with_crc: bool = False) -> bytes:
    return encode(msg_type, pb_msg.SerializeToString(), with_crc)


def decode_packed(data: bytes | memoryview, expected_type: MsgType) -> Any:
    """The msgpack body of an envelope of ``expected_type`` (bascule's own kinds), unchecked beyond
    being msgpack: its reader checks its shape."""
    msg_type, payload = decode(data)
    if msg_type != expected_type:
        raise EnvelopeError(f"expected a {expected_type.name} envelope, got {msg_type.name}")
    try:
        return msgpack.unpackb(payload, raw=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise EnvelopeError(f"malformed {expected_type.name}: {exc}") from exc


def decode_message(
    data: bytes | memoryview, expected_type: MsgType, pb_cls: type[PbMessage]
) -> PbMessage:
    # Most envelopes carry no CRC: one comparison with the exact header checks all of it.
    if data[:HEADER_LENGTH] == _PLAIN_HEADERS[expected_type]:
        payload = memoryview(data)[HEADER_LENGTH:]
    else:
        msg_type, payload = decode(data)
        if msg_type != expected_type:
            raise EnvelopeError(f"expected a {expected_type.name} envelope, got {msg_type.name}")
    try:
        # protobuf parses any buffer, whatever its stubs say: bytes(payload) would only add a copy.
        return pb_cls.FromString(payload)  # type: ignore[arg-type]
    # protobuf's pure-Python implementation reports bad UTF-8 in a string
    # field as a UnicodeDecodeError rather than a DecodeError.
    except (DecodeError, UnicodeDecodeError) as error:
        raise EnvelopeError(
            f"bad {pb_cls.DESCRIPTOR.full_name} payload in {expected_type.name} envelope: {error}"
        ) from error
