"""The leader's answer to a ReplicationRequest.

Not a protobuf, so that log entries travel exactly as stored: envelope header
(type REPLICATION_RESPONSE), leader epoch (uint64), high watermark (int64),
then zero or more raw entries (see bascule.wire.entry), all big-endian.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from bascule.wire.envelope import EnvelopeError, MsgType, decode_header, header

_EPOCH_AND_HW = struct.Struct(">Qq")


class ReplicateResponse(NamedTuple):
    leader_epoch: int
    hw: int
    entries: memoryview  # unvalidated: the follower checks them entry by entry


def encode_response(leader_epoch: int, hw: int, entries: bytes | memoryview) -> bytes:
    # No envelope CRC: every entry carries its own, and the follower checks
    # the epoch against the one it expects.
    prefix = header(MsgType.REPLICATION_RESPONSE) + _EPOCH_AND_HW.pack(leader_epoch, hw)
    return b"".join((prefix, entries))  # the one copy of entries


def decode_response(data: bytes | memoryview) -> ReplicateResponse:
    msg_type, payload_start = decode_header(data)
    if msg_type != MsgType.REPLICATION_RESPONSE:
        raise EnvelopeError(f"expected a REPLICATION_RESPONSE envelope, got {msg_type.name}")
    entries_start = payload_start + _EPOCH_AND_HW.size
    if len(data) < entries_start:
        raise EnvelopeError(
            f"replicate response too short: {len(data)} bytes, needs at least {entries_start}"
        )
    leader_epoch, hw = _EPOCH_AND_HW.unpack_from(data, payload_start)
    return ReplicateResponse(leader_epoch, hw, memoryview(data)[entries_start:])
