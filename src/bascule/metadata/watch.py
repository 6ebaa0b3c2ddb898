"""Waiting on the metadata without polling: a predicate evaluated now and again after each change.

The Raft shell notifies at every applied command and when its leader or readiness changes; the node
notifies when a reconcile changed its replicas' roles. A waiter costs nothing between changes, and a
change reaches it within the event loop's next turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class MetadataWatch:
    """Change notifications on the event loop; ``notify`` only from the loop's thread."""

    def __init__(self) -> None:
        self._changed = asyncio.Event()

    def notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def until(self, predicate: Callable[[], T], timeout: float | None) -> T:
        """``predicate()``'s first truthy value, evaluated now and after every change; its value
        when ``timeout`` seconds (None: no limit) have passed without one."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            changed = self._changed  # taken first: a change while the predicate runs is not missed
            value = predicate()
            remaining = None if deadline is None else deadline - loop.time()
            if value or (remaining is not None and remaining <= 0):
                return value
            try:
                async with asyncio.timeout(remaining):
                    await changed.wait()
            except TimeoutError:
                return predicate()
