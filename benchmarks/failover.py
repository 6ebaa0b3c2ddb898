"""Failover: SIGKILL of a partition (stream) leader in a 3-node cluster, and the time until an ack-ALL
publish succeeds again."""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
from collections.abc import Awaitable, Callable
from typing import Any

from benchmarks.harness import BASCULE, JETSTREAM, STREAM_SUBJECT_PREFIX, BenchError, Context, log, now
from benchmarks.report import format_value
from benchmarks.systems import BasculeSystem, JetStreamProbe, JetStreamSystem
from benchmarks.trials import run_trials

# A publish with ack ALL: when its ack arrived, or None if none did within the timeout.
AckedPublish = Callable[[str, bytes, float], Awaitable[float | None]]


async def run_failover(ctx: Context, system: str) -> list[dict[str, Any]]:
    if system == BASCULE:
        return await _failover_bascule(ctx)
    return await _failover_jetstream(ctx)


async def _failover_bascule(ctx: Context) -> list[dict[str, Any]]:
    timeout = ctx.args.failover_timeout
    # The failure-detection defaults a user keeps (clustering.replica.max.leader.timeout and the rest).
    async with BasculeSystem(ctx, "failover-bascule", 3, {}) as sys_:

        async def kill_leader(stream: str, subject: str) -> tuple[dict[str, Any], int]:
            leader = await sys_.leader_of(stream)
            index = sys_.index_of(leader)
            seconds = await time_to_recover(sys_.acked_publish, subject, lambda: sys_.cluster.kill(index), timeout)
            return {"killed": leader, "new_leader": await sys_.leader_of(stream), "seconds": seconds}, index

        async def bring_back(stream: str, index: int) -> None:
            await asyncio.to_thread(sys_.cluster.restart, index, graceful=False)
            await sys_.wait_full_isr(stream, 3, timeout * 3)

        async def trial(n: int, profiled: bool) -> dict[str, Any]:
            stream, subject = f"fo{n}", f"{STREAM_SUBJECT_PREFIX}.fo{n}"
            await sys_.create_stream(stream, subject, 3)
            summary = await _kills(ctx, BASCULE, lambda: kill_leader(stream, subject),
                                   lambda index: bring_back(stream, index))
            await sys_.client().delete_stream(stream)
            return summary

        return await run_trials(ctx, "failover", BASCULE, trial)


async def _failover_jetstream(ctx: Context) -> list[dict[str, Any]]:
    timeout = ctx.args.failover_timeout
    async with JetStreamSystem(ctx, "failover-jetstream", 3) as sys_:

        async def kill_leader(stream: str, subject: str) -> tuple[dict[str, Any], int]:
            leader = (await sys_.js.stream_info(stream)).cluster.leader
            index = int(leader.removeprefix("js"))
            await sys_.connect((index + 1) % 3)  # a prober that survives the kill
            probe = JetStreamProbe(sys_.nc)
            await probe.start()
            pid = sys_.server_pids()[index]
            seconds = await time_to_recover(probe.acked_publish, subject, lambda: os.kill(pid, signal.SIGKILL),
                                            timeout)
            await sys_.servers[index].kill()  # reap it
            await asyncio.sleep(0.1)
            new_leader = (await sys_.js.stream_info(stream)).cluster.leader
            return {"killed": leader, "new_leader": new_leader, "seconds": seconds}, index

        async def bring_back(stream: str, index: int) -> None:
            await sys_.servers[index].start()
            await sys_.connect()
            await sys_.wait_current(stream, timeout * 3)

        async def trial(n: int, profiled: bool) -> dict[str, Any]:
            stream, subject = f"fo{n}", f"{STREAM_SUBJECT_PREFIX}.fo{n}"
            await sys_.create_stream(stream, subject, 3)
            summary = await _kills(ctx, JETSTREAM, lambda: kill_leader(stream, subject),
                                   lambda index: bring_back(stream, index))
            await sys_.js.delete_stream(stream)
            return summary

        return await run_trials(ctx, "failover", JETSTREAM, trial)


async def _kills(ctx: Context, system: str, kill_leader: Callable[[], Awaitable[tuple[dict[str, Any], int]]],
                 bring_back: Callable[[int], Awaitable[None]]) -> dict[str, Any]:
    """`--kills` leader kills, one after the other, each once the cluster is whole again."""
    details = []
    for k in range(ctx.counts["kills"]):
        detail, index = await kill_leader()
        log(f"failover / {system}: kill {k + 1}: {detail['killed']} -> {detail['new_leader']} in "
            f"{format_value(detail['seconds'])} s")
        details.append(detail)
        await bring_back(index)
        await asyncio.sleep(1.0)
    times = [d["seconds"] for d in details]
    return {"failover_median_s": statistics.median(times), "failover_worst_s": max(times), "kills": details}


async def time_to_recover(acked_publish: AckedPublish, subject: str, kill: Callable[[], Any], timeout: float,
                          interval: float = 0.01, probe_timeout: float = 2.0) -> float:
    """Probe every `interval` s; kill; the time from the kill to the first ack of a publish sent after it."""
    if await acked_publish(subject, b"before", 5.0) is None:
        raise BenchError(f"no ack on {subject} before the kill")
    recovered: asyncio.Future[float] = asyncio.get_running_loop().create_future()
    pending: set[asyncio.Task[None]] = set()

    async def one() -> None:
        acked = await acked_publish(subject, b"failover-probe", probe_timeout)
        if acked is not None and not recovered.done():
            recovered.set_result(acked)

    t_kill = now()
    kill()
    deadline = t_kill + timeout
    try:
        while not recovered.done():
            if now() > deadline:
                raise BenchError(f"no ack-ALL publish on {subject} succeeded within {timeout} s of the kill")
            task = asyncio.create_task(one())
            pending.add(task)
            task.add_done_callback(pending.discard)
            await asyncio.sleep(interval)
        return recovered.result() - t_kill
    finally:
        for task in list(pending):
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
