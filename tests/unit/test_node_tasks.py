"""The node's task owner: closing it ends every task, even one that swallowed its first cancel."""

import asyncio

import pytest

from bascule.node import tasks as tasks_module
from bascule.node.tasks import Tasks

pytestmark = pytest.mark.anyio


async def test_close_cancels_again_a_task_that_swallowed_its_cancellation(monkeypatch):
    monkeypatch.setattr(tasks_module, "RECANCEL_AFTER", 0.05)
    cancels = 0

    async def stubborn() -> None:
        nonlocal cancels
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                cancels += 1
                if cancels == 1:
                    continue  # as asyncio.wait_for in 3.11 can lose a cancel
                raise

    async with asyncio.TaskGroup() as group:
        owner = Tasks(group)
        task = owner.start(stubborn(), "stubborn")
        await asyncio.sleep(0)
        await asyncio.wait_for(owner.close(), 5)
    assert task is not None and task.cancelled() and cancels == 2
    assert owner.start(stubborn(), "late") is None


async def test_a_one_shot_task_cancelled_before_it_ran_leaves_no_coroutine_unawaited():
    ran = False

    async def report() -> None:
        nonlocal ran
        ran = True

    work = report()
    async with asyncio.TaskGroup() as group:
        owner = Tasks(group)
        owner.spawn(work, "report")
        await owner.close()  # before the task's first step
    assert not ran and work.cr_frame is None  # closed: no "was never awaited" when it is collected
