"""The leader's answer to a ReplicationRequest.

Not a protobuf, so that log entries travel exactly as stored: envelope header
(type REPLICATION_RESPONSE), leader epoch (uint64), high watermark (int64), the leader's clock
reading as it answered (float64 seconds of its monotonic clock; bascule's, not Liftbridge's: the
follower echoes it, see ReplicationRequest.leaderTime), then zero or more raw entries (see
bascule.wire.entry), all big-endian.

An entry too big for one NATS message (a plain NATS publish of max_payload bytes is one, once
stored with its headers) travels in pieces: envelope type REPLICATION_FRAGMENT, leader epoch,
HW, the leader's clock reading, the whole entry's size (uint64) and the piece's first byte in it
(uint64), then the piece.
The follower asks for the next piece with ``fragmentStart`` and checks the entry once whole.
"""

from __future__ import annotations

import math
import struct
from typing import NamedTuple

from bascule.wire.envelope import EnvelopeError, MsgType, decode_header, header

_HEADER = struct.Struct(">Qqd")  # leader epoch, HW, leader time
_FRAGMENT = struct.Struct(">QqdQQ")  # the same, then the entry's size and the first byte of this piece


class ReplicateResponse(NamedTuple):
    leader_epoch: int
    hw: int
    leader_time: float
    entries: memoryview  # unvalidated: the follower checks them entry by entry
    # For a piece of one big entry: the whole entry's size, and where in it the piece starts.
    fragment_of: int | None = None
    fragment_start: int = 0


def encode_response(leader_epoch: int, hw: int, leader_time: float, entries: bytes | memoryview) -> bytes:
    # No envelope CRC: every entry carries its own, and the follower checks
    # the epoch against the one it expects.
    prefix = header(MsgType.REPLICATION_RESPONSE) + _HEADER.pack(leader_epoch, hw, leader_time)
    return b"".join((prefix, entries))  # the one copy of entries


def encode_fragment(
    leader_epoch: int, hw: int, leader_time: float, entry_size: int, start: int, piece: bytes | memoryview
) -> bytes:
    prefix = header(MsgType.REPLICATION_FRAGMENT) + _FRAGMENT.pack(leader_epoch, hw, leader_time, entry_size, start)
    return b"".join((prefix, piece))


def decode_response(data: bytes | memoryview) -> ReplicateResponse:
    msg_type, payload_start = decode_header(data)
    if msg_type == MsgType.REPLICATION_FRAGMENT:
        return _decode_fragment(data, payload_start)
    if msg_type != MsgType.REPLICATION_RESPONSE:
        raise EnvelopeError(f"expected a REPLICATION_RESPONSE envelope, got {msg_type.name}")
    entries_start = payload_start + _HEADER.size
    if len(data) < entries_start:
        raise EnvelopeError(
            f"replicate response too short: {len(data)} bytes, needs at least {entries_start}"
        )
    leader_epoch, hw, leader_time = _HEADER.unpack_from(data, payload_start)
    return ReplicateResponse(leader_epoch, hw, _clock_reading(leader_time), memoryview(data)[entries_start:])


def _decode_fragment(data: bytes | memoryview, payload_start: int) -> ReplicateResponse:
    piece_start = payload_start + _FRAGMENT.size
    if len(data) < piece_start:
        raise EnvelopeError(f"replication fragment too short: {len(data)} bytes, needs at least {piece_start}")
    leader_epoch, hw, leader_time, entry_size, start = _FRAGMENT.unpack_from(data, payload_start)
    piece = memoryview(data)[piece_start:]
    if not piece or start + len(piece) > entry_size:
        raise EnvelopeError(
            f"replication fragment of {len(piece)} bytes at {start} does not fit an entry of {entry_size}"
        )
    return ReplicateResponse(leader_epoch, hw, _clock_reading(leader_time), piece, entry_size, start)


def _clock_reading(value: float) -> float:
    """A leader clock reading as sent, or 0.0 (none) for one no clock gives (NaN, infinite,
    negative): echoed back, it could only confuse the leader's lease."""
    return value if 0.0 <= value < math.inf else 0.0
