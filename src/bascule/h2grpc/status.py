"""gRPC status codes as numbers, and the error a handler raises to end its call with one."""

from __future__ import annotations

import enum
from typing import Any


class Status(enum.IntEnum):
    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


def status_of(code: Any) -> Status:
    """A Status from a number, a Status, or grpcio's StatusCode (whose value is (number, name))."""
    value = getattr(code, "value", code)
    return Status(value[0] if isinstance(value, tuple) else value)


class Abort(Exception):
    """Ends the call with ``status`` and ``details`` (what ``context.abort`` raises)."""

    def __init__(self, status: Status, details: str) -> None:
        super().__init__(status, details)
        self.status, self.details = status, details


class Ended(Abort):
    """Ends the call with a status other than OK that its protocol uses for a normal end (Liftbridge
    ends reads so, and its clients depend on the codes): the client sees ``status``, the server's
    observer is told the call ended as it should."""
