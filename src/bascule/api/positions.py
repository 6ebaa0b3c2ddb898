"""Where a subscription starts and stops: Liftbridge's positions as pure functions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bascule.wire.entry import scan
from bascule.wire.pb import api_pb2

Start = api_pb2.StartPosition
Stop = api_pb2.StopPosition


class PositionError(ValueError):
    """An invalid start or stop request (InvalidArgument)."""


class EndOfStream(Exception):
    """The subscription is over before it starts (ResourceExhausted)."""


@dataclass(frozen=True)
class LogBounds:
    oldest: int
    newest: int  # -1 when empty
    high_watermark: int


@dataclass(frozen=True)
class StopRule:
    offset: int | None = None  # last offset to send
    timestamp: int | None = None  # send messages up to this time (ns)

    def done_before(self, offset: int, timestamp: int) -> bool:
        if self.timestamp is not None and timestamp > self.timestamp:
            return True
        return self.offset is not None and offset > self.offset

    def done_after(self, offset: int) -> bool:
        return self.offset is not None and offset >= self.offset

    def cut(self, chunk: bytes, last: int) -> bytes:
        """The leading entries of stored ``chunk`` (ending with offset ``last``) this rule still
        lets through."""
        if self.timestamp is None and (self.offset is None or last <= self.offset):
            return chunk
        for offset, _, timestamp, start, _ in scan(chunk, check_crc=False):
            if self.done_before(offset, timestamp):
                return chunk[:start]
        return chunk


def start_offset(
    request: api_pb2.SubscribeRequest, bounds: LogBounds, offset_for_timestamp: Callable[[int], int]
) -> int:
    position = request.startPosition
    if position == Start.NEW_ONLY:
        return bounds.newest + 1
    if position == Start.EARLIEST:
        return bounds.oldest
    if position == Start.LATEST:
        return max(bounds.newest, bounds.oldest)
    if position == Start.OFFSET:
        if request.startOffset < 0:
            raise PositionError(f"Invalid start offset {request.startOffset}")
        return min(max(request.startOffset, bounds.oldest), bounds.newest + 1)
    if position == Start.TIMESTAMP:
        return offset_for_timestamp(request.startTimestamp)
    raise PositionError(f"Unknown StartPosition {position}")


def stop_rule(request: api_pb2.SubscribeRequest, bounds: LogBounds) -> StopRule:
    position = request.stopPosition
    if position == Stop.STOP_ON_CANCEL:
        return StopRule()
    if position == Stop.STOP_OFFSET:
        if request.stopOffset < 0:
            raise PositionError(f"Invalid stop offset {request.stopOffset}")
        return StopRule(offset=request.stopOffset)
    if position == Stop.STOP_LATEST:
        if bounds.high_watermark < bounds.oldest:
            raise EndOfStream("Stream is empty")
        return StopRule(offset=bounds.high_watermark)
    if position == Stop.STOP_TIMESTAMP:
        return StopRule(timestamp=request.stopTimestamp)
    raise PositionError(f"Unknown StopPosition {position}")
