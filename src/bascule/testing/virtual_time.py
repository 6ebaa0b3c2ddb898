"""An asyncio event loop on virtual time, for running real asyncio code deterministically.

``VirtualTimeLoop`` is a selector event loop whose clock (``loop.time()``) only moves when nothing is
ready to run: it then jumps to the next timer at once. Sleeps, timeouts and ``call_later`` behave as
they do on the real clock, but a run of a minute of virtual time costs only the work done in it.
It does no real I/O: a loop on virtual time has no sockets (an in-memory transport, such as
``bascule.testing.bus.MemoryBus``, stands in for the network), and work handed to executors
(``run_in_executor``, ``asyncio.to_thread``) runs inline, on the loop's thread, as it is submitted;
its result arrives after a delay the loop's ``executor_delay`` draws (0 by default: the next turn),
which is how a slow disk looks to the caller.

Given the same code and the same seeds, a run takes the same steps in the same order: ready callbacks
run first in, first out, and timers due at the same instant in an order their scheduling fixes
(asyncio's heap order, not necessarily the order they were set). Only
iteration over sets of strings depends on the process (PYTHONHASHSEED); fix it to replay a run in
another process.

A run in which every task waits on something no timer will ever bring raises ``Stalled``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import selectors
from collections.abc import Callable
from typing import Any


class Stalled(RuntimeError):
    """Nothing is ready and no timer is scheduled: the run can never make progress."""


class _NoIO(selectors.BaseSelector):
    """A selector that watches nothing: waiting for events is waiting for the next timer."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        self._loop = loop
        self._keys: dict[Any, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = selectors.SelectorKey(fileobj, selectors._fileobj_to_fd(fileobj), events, data)  # type: ignore[attr-defined]
        self._keys[fileobj] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._keys.pop(fileobj)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise Stalled("every task waits and no timer is scheduled")
        self._loop.advance(timeout)
        return []

    def get_map(self) -> dict[Any, selectors.SelectorKey]:
        return self._keys

    def close(self) -> None:
        self._keys.clear()


class _InlineExecutor(concurrent.futures.ThreadPoolExecutor):
    """Runs each job as it is submitted, and so never starts a thread (asyncio takes only a thread
    pool as a loop's default executor); the loop's ``executor_delay`` decides when its result lands."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__(max_workers=1)
        self._loop = loop

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_running_or_notify_cancel()
        try:
            result, error = fn(*args, **kwargs), None
        except BaseException as exc:  # handed to the awaiting task, as a thread's failure would be
            result, error = None, exc
        delay = self._loop.executor_delay()
        if delay > 0:
            self._loop.call_later(delay, _settle, future, result, error)
        else:
            _settle(future, result, error)
        return future


def _settle(future: concurrent.futures.Future, result: Any, error: BaseException | None) -> None:
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """``loop.time()`` starts at ``start`` and moves only by jumps to the next due timer."""

    def __init__(self, start: float = 0.0, executor_delay: Callable[[], float] = lambda: 0.0) -> None:
        self._now = start
        self.executor_delay = executor_delay
        super().__init__(_NoIO(self))
        # Timers are due exactly when the clock jumps to them: no rounding slack is needed, but a
        # little does no harm to callbacks scheduled at sums of floats.
        self._clock_resolution = 1e-9
        self.set_default_executor(_InlineExecutor(self))

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds > 0:
            self._now += seconds

    def _write_to_self(self) -> None:
        pass  # nothing sleeps in select to be woken: call_soon_threadsafe's callback is ready already


def run(main: Callable[[], Any], start: float = 0.0, executor_delay: Callable[[], float] = lambda: 0.0) -> Any:
    """Run the coroutine function ``main`` to completion on a fresh ``VirtualTimeLoop``."""
    loop = VirtualTimeLoop(start, executor_delay)
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main())
    finally:
        try:
            _cancel_remaining(loop)
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def _cancel_remaining(loop: VirtualTimeLoop) -> None:
    tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
