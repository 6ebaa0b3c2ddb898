"""The virtual-time event loop: time jumps to the next timer, executors run inline, runs replay."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from bascule.testing import virtual_time


def test_an_hour_of_sleeps_and_timeouts_takes_no_real_time() -> None:
    async def main() -> tuple[float, bool]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        await asyncio.sleep(3600)
        timed_out = False
        try:
            async with asyncio.timeout(5):
                await asyncio.Event().wait()
        except TimeoutError:
            timed_out = True
        return loop.time() - start, timed_out

    began = time.monotonic()
    assert virtual_time.run(main) == (3605.0, True)
    assert time.monotonic() - began < 1.0


def test_timers_due_together_run_in_the_same_order_on_every_run() -> None:
    async def main() -> list[int]:
        order: list[int] = []
        loop = asyncio.get_running_loop()
        for i in range(20):
            loop.call_later(1.0 + (i % 3) * 0.5, order.append, i)
        await asyncio.sleep(3)
        return order

    first = virtual_time.run(main)
    assert sorted(first) == list(range(20))
    assert all(virtual_time.run(main) == first for _ in range(5))


def test_executor_jobs_run_inline_on_the_loops_thread_and_land_after_the_drawn_delay() -> None:
    async def main() -> tuple[str, float]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        name = await asyncio.to_thread(lambda: threading.current_thread().name)
        return name, loop.time() - start

    assert virtual_time.run(main, executor_delay=lambda: 0.25) == (threading.current_thread().name, 0.25)


def test_a_failing_job_raises_in_its_awaiter() -> None:
    def fail() -> None:
        raise OSError("disk on fire")

    async def main() -> None:
        await asyncio.get_running_loop().run_in_executor(None, fail)

    with pytest.raises(OSError, match="disk on fire"):
        virtual_time.run(main)


def test_a_run_where_everything_waits_forever_is_stalled_not_hung() -> None:
    async def main() -> None:
        await asyncio.Event().wait()

    with pytest.raises(virtual_time.Stalled):
        virtual_time.run(main)
