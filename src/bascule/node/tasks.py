"""The tasks of a running node, each in the server's task group.

A long-lived task (a periodic job, a follower loop) has nothing to fail on that its own body does
not handle: when one fails anyway it takes the server down, so the failure is seen and the process
restarted, rather than a node that silently stopped part of its work. A one-shot task (a report to
the metadata leader, a notification) may fail for reasons a node lives with (NATS down, no
metadata leader): its failure is logged, and nothing else.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)
# How long a cancelled task gets to end before it is cancelled again.
RECANCEL_AFTER = 0.5


class Tasks:
    def __init__(self, group: asyncio.TaskGroup) -> None:
        self._group = group
        self._running: set[asyncio.Task[Any]] = set()
        self.closing = False

    def start(self, work: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any] | None:
        """A long-lived task; None once the node is closing (``work`` is then discarded)."""
        if self.closing:
            work.close()
            return None
        try:
            task = self._group.create_task(work, name=name)
        except RuntimeError:  # the group is shutting down: its owner was cancelled (a node killed in the simulator)
            work.close()
            return None
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return task

    def spawn(self, work: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any] | None:
        """A one-shot task whose failure is logged; None once the node is closing."""
        if self.closing:
            work.close()  # closing the wrapper below would leave ``work`` never awaited
            return None
        task = self.start(self._logged(work, name), name)
        if task is None:
            work.close()
        else:
            # A task cancelled before its first step (the node stopping) never awaits ``work``.
            task.add_done_callback(lambda _: work.close())
        return task

    async def _logged(self, work: Coroutine[Any, Any, Any], name: str) -> None:
        try:
            await work
        except Exception:
            if not self.closing:
                log.exception("%s failed", name)

    async def close(self) -> None:
        """Cancel every task and wait until they are done. A task that swallowed its cancellation
        is cancelled again (Python 3.11's asyncio.wait_for loses a cancel that lands as its inner
        future completes; a follower loop caught that way kept fetching, and rejoined the ISR of
        a node that was stopping)."""
        self.closing = True
        running = list(self._running)
        pending = set(running)
        while pending:
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=RECANCEL_AFTER)
        await asyncio.gather(*running, return_exceptions=True)  # collects their outcomes
