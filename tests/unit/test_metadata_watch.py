"""bascule.metadata.watch: waiting on a predicate, woken by changes instead of a poll."""

from __future__ import annotations

import asyncio

import pytest

from bascule.metadata.watch import MetadataWatch

pytestmark = pytest.mark.anyio


async def test_a_true_predicate_returns_at_once_without_a_change():
    assert await MetadataWatch().until(lambda: "now", timeout=0) == "now"


async def test_a_waiter_is_woken_by_the_change_that_makes_its_predicate_true():
    watch, state = MetadataWatch(), {"leader": None}
    waiter = asyncio.create_task(watch.until(lambda: state["leader"], timeout=None))
    await asyncio.sleep(0)
    watch.notify()  # a change that does not make it true: it waits on
    await asyncio.sleep(0)
    assert not waiter.done()
    state["leader"] = "a"
    watch.notify()
    assert await asyncio.wait_for(waiter, 1) == "a"


async def test_every_waiter_sees_one_change():
    watch, state = MetadataWatch(), {"v": 0}
    waiters = [asyncio.create_task(watch.until(lambda: state["v"], timeout=None)) for _ in range(3)]
    await asyncio.sleep(0)
    state["v"] = 7
    watch.notify()
    assert await asyncio.wait_for(asyncio.gather(*waiters), 1) == [7, 7, 7]


async def test_the_timeout_returns_the_predicates_value_then():
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await MetadataWatch().until(lambda: 0, timeout=0.05) == 0
    assert loop.time() - started >= 0.05


async def test_a_change_between_the_check_and_the_wait_is_not_missed():
    """The predicate is evaluated before the waiter takes the current event: a change made in that
    gap sets an event the waiter has not taken yet, and it checks again after it."""
    watch, state = MetadataWatch(), {"v": 0}

    def predicate():
        value = state["v"]
        if not value:
            state["v"] = 1
            watch.notify()  # as if another task changed it right after this check
        return value

    assert await asyncio.wait_for(watch.until(predicate, timeout=None), 1) == 1
