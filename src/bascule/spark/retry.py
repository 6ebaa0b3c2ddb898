"""When the Spark source and sink try a failed call again: a pure policy (which errors, how many
attempts, how long a pause) and the loop that follows it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc

from bascule.client import BasculeError

log = logging.getLogger("bascule.spark")

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    retriable: frozenset[grpc.StatusCode]
    attempts: int
    first_delay: float = 0.2  # seconds; doubled after each failure

    def retries(self, code: grpc.StatusCode, failures: int) -> bool:
        """Whether to try again after `failures` (1 and up) failed attempts, the last with `code`."""
        return code in self.retriable and failures < self.attempts

    def delay(self, failures: int) -> float:
        """The pause before the attempt after `failures` failed ones."""
        return self.first_delay * 2 ** (failures - 1)


# Reads and metadata calls, each attempt on a fresh client (a new leader lookup): the leader moved,
# a node restarted, or nothing answered in time.
READ_RETRY = RetryPolicy(
    frozenset({
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
    }),
    attempts=5,
)
# A publish batch again (at least once) after a leader moved or a broker restarted; not after a
# refused message (an async error, UNKNOWN), which is final.
PUBLISH_RETRY = RetryPolicy(frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION}), attempts=3)


async def retried(policy: RetryPolicy, call: Callable[[], Awaitable[T]], what: str) -> T:
    """`call()` again, after a pause, for as long as `policy` retries its failures; the last
    failure's `BasculeError` is raised. `what` names the call in the log."""
    failures = 0
    while True:
        try:
            return await call()
        except BasculeError as exc:
            failures += 1
            if not policy.retries(exc.code, failures):
                raise
            delay = policy.delay(failures)
            log.info("%s: %s; trying again in %.1f s", what, exc, delay)
        await asyncio.sleep(delay)
