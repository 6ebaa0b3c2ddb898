"""PublishRequests damaged the ways a network or a hostile client can: bytes flipped, a tail cut."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf.message import DecodeError

from bascule.wire.pb import api_pb2


def garbled(request: api_pb2.PublishRequest, flips: list[tuple[int, int]], cut: int | None) -> bytes:
    """``request``'s bytes with each (position, mask) of ``flips`` XORed in, then cut at ``cut``."""
    data = bytearray(request.SerializeToString())
    for at, mask in flips:
        if data:
            data[at % len(data)] ^= mask
    if cut is not None:
        del data[cut % (len(data) + 1):]
    return bytes(data)


def outcome(call: Callable[[], Any]) -> Any:
    """What ``call`` returns, or "DecodeError" when it raises one: two decoders compared alike."""
    try:
        return call()
    except DecodeError:
        return "DecodeError"
