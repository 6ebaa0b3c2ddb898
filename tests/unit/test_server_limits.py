"""What the composition root makes of the process's limit of open files, and how it reports a stop that
takes too long (bascule.server)."""

from __future__ import annotations

import asyncio
import logging
import resource

import pytest

from bascule import server
from bascule.h2grpc import GrpcLimits
from bascule.server import report_a_slow_stop


@pytest.fixture
def open_files(monkeypatch):
    """The process's (soft, hard) limit of open files, as the code under test sees and sets it."""
    limit = [1024, 4096]
    monkeypatch.setattr(resource, "getrlimit", lambda which: tuple(limit))
    monkeypatch.setattr(resource, "setrlimit", lambda which, value: limit.__setitem__(slice(None), value))
    return limit


def test_the_soft_limit_of_open_files_is_raised_to_the_hard_one(open_files):
    server.raise_open_files_limit()
    assert open_files == [4096, 4096]


def test_an_unlimited_hard_limit_raises_the_soft_one_to_a_million(open_files):
    open_files[1] = resource.RLIM_INFINITY
    server.raise_open_files_limit()
    assert open_files[0] == 1 << 20


def test_grpc_connections_are_held_to_half_the_open_files(open_files, caplog):
    assert server.grpc_limits_for_open_files(GrpcLimits(max_connections=100)) == GrpcLimits(max_connections=100)
    assert server.grpc_limits_for_open_files(GrpcLimits(max_connections=4096)).max_connections == 512
    assert "at most 512 gRPC connections" in caplog.text


# ---- a stop that hangs says where ---------------------------------------------------------------


@pytest.mark.anyio
async def test_a_stop_still_running_after_its_time_logs_every_thread_and_task(caplog):
    caplog.set_level(logging.WARNING, logger="bascule")
    loop = asyncio.get_running_loop()

    async def stuck_in_closing() -> None:
        await asyncio.sleep(10)

    closing = asyncio.create_task(stuck_in_closing())
    timer = report_a_slow_stop(loop, after=0.05)
    try:
        for _ in range(100):
            if sum("still stopping" in record.getMessage() for record in caplog.records) == 2:
                break
            await asyncio.sleep(0.01)
    finally:
        timer.cancel()
        closing.cancel()
    threads, tasks = [r.getMessage() for r in caplog.records if "still stopping" in r.getMessage()]
    assert "each thread is at" in threads and "MainThread" in threads
    assert "each task is at" in tasks and "stuck_in_closing" in tasks


@pytest.mark.anyio
async def test_a_stop_done_in_time_logs_nothing(caplog):
    caplog.set_level(logging.WARNING, logger="bascule")
    report_a_slow_stop(asyncio.get_running_loop(), after=0.05).cancel()
    await asyncio.sleep(0.15)
    assert not [r for r in caplog.records if "still stopping" in r.getMessage()]
