"""Where a subscription starts and stops: Liftbridge's positions as pure functions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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
        # A negative offset starts at the oldest, as Liftbridge's does (gufo-liftbridge's RESUME
        # with a new cursor asks for -1).
        return min(max(request.startOffset, bounds.oldest), bounds.newest + 1)
    if position == Start.TIMESTAMP:
        return offset_for_timestamp(request.startTimestamp)
    raise PositionError(f"Unknown StartPosition {position}")


def stop_offset(
    request: api_pb2.SubscribeRequest, bounds: LogBounds, latest_offset_at: Callable[[int], int]
) -> int | None:
    """The last offset the subscription sends, None to follow new messages until cancelled.
    Liftbridge resolves every stop position to an offset when the subscription starts: the
    newest offset for STOP_LATEST, the latest offset stamped at or before the time for
    STOP_TIMESTAMP (``latest_offset_at``)."""
    position = request.stopPosition
    if position == Stop.STOP_ON_CANCEL:
        return None
    if position == Stop.STOP_OFFSET:
        if request.stopOffset < 0:
            raise PositionError(f"Invalid stop offset {request.stopOffset}")
        return request.stopOffset
    if position == Stop.STOP_LATEST:
        if bounds.newest < bounds.oldest:
            raise EndOfStream("Stream is empty")
        return bounds.newest
    if position == Stop.STOP_TIMESTAMP:
        last = latest_offset_at(request.stopTimestamp)
        if last < bounds.oldest:
            raise EndOfStream("Stop timestamp is before the beginning of the log")
        return last
    raise PositionError(f"Unknown StopPosition {position}")


def check_range(start: int, last: int | None) -> None:
    """Liftbridge refuses a subscription whose stop offset lies before its start offset (a stop
    resolved from STOP_LATEST or STOP_TIMESTAMP included), as an invalid argument."""
    if last is not None and last < start:
        raise PositionError(f"Stop offset is before start offset: {last} < {start}")
