"""False failovers: 3 nodes with the failure-detection defaults a user keeps, R3 streams captured at
full rate while a CPU hog takes one of the machine's cores; every leader change and every ISR
member lost during the load is counted. Nothing fails, so each one is a false alarm."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from benchmarks.harness import BASCULE, JETSTREAM, STREAM_SUBJECT_PREFIX, Context
from benchmarks.measure import timed_publish
from benchmarks.systems import BasculeSystem, JetStreamSystem
from benchmarks.trials import run_trials

STREAMS = 4
SAMPLE_INTERVAL = 0.25
# (leader, in-sync members) of each stream, as the system shows it.
Standing = dict[str, tuple[str, frozenset[str]]]


async def run_stability(ctx: Context, system: str) -> list[dict[str, Any]]:
    count = ctx.counts["stability"]

    def streams(n: int) -> dict[str, str]:
        return {f"st{n}-{k}": f"{STREAM_SUBJECT_PREFIX}.st{n}-{k}" for k in range(STREAMS)}

    if system == BASCULE:
        async with BasculeSystem(ctx, "stability-bascule", 3, {}) as bascule:

            async def bascule_trial(n: int, profiled: bool) -> dict[str, Any]:
                subjects = streams(n)
                bases = {name: (await bascule.create_stream(name, subject, 3))[0] for name, subject in subjects.items()}

                async def standing() -> Standing:
                    parts = {name: (await bascule.partitions(name))[0] for name in subjects}
                    return {name: (p.leader, frozenset(p.isr)) for name, p in parts.items()}

                async def committed() -> float:
                    return max([await bascule.wait_committed(name, {0: base + count // STREAMS}, ctx.args.stall_timeout)
                                for name, base in bases.items()])

                metrics = await _loaded(ctx, bascule.nats_url, list(subjects.values()), count, f"stability-{n}",
                                        committed, bascule.server_pids(), standing)
                for name in subjects:
                    await bascule.client().delete_stream(name)
                return metrics

            return await run_trials(ctx, "stability", BASCULE, bascule_trial)

    async with JetStreamSystem(ctx, "stability-jetstream", 3) as jetstream:

        async def jetstream_trial(n: int, profiled: bool) -> dict[str, Any]:
            subjects = streams(n)
            bases = {name: await jetstream.create_stream(name, subject, 3) for name, subject in subjects.items()}

            async def standing() -> Standing:
                result = {}
                for name in subjects:
                    cluster = (await jetstream.js.stream_info(name)).cluster
                    # JetStream's "current" flips under any lag: only replicas gone offline count as lost.
                    current = {r.name for r in cluster.replicas or [] if not r.offline}
                    result[name] = (cluster.leader or "", frozenset({cluster.leader or "", *current}))
                return result

            async def stored() -> float:
                return max([await jetstream.wait_stored(name, base + count // STREAMS, ctx.args.stall_timeout)
                            for name, base in bases.items()])

            metrics = await _loaded(ctx, jetstream.nats_url, list(subjects.values()), count, f"stability-{n}",
                                    stored, jetstream.server_pids(), standing)
            for name in subjects:
                await jetstream.js.delete_stream(name)
            return metrics

        return await run_trials(ctx, "stability", JETSTREAM, jetstream_trial)


async def _loaded(ctx: Context, url: str, subjects: list[str], count: int, name: str,
                  done: Callable[[], Awaitable[float]], pids: list[int | None],
                  standing: Callable[[], Awaitable[Standing]]) -> dict[str, Any]:
    """Publish `count` messages over `subjects` with a CPU hog running, sampling who leads and who is in
    sync; the leader changes and lost in-sync members seen, and the load's figures."""
    changes = {"leader_changes": 0, "isr_losses": 0}
    first = await standing()
    stop = asyncio.Event()

    async def sample() -> None:
        last = first
        while not stop.is_set():
            await asyncio.sleep(SAMPLE_INTERVAL)
            with contextlib.suppress(Exception):  # a sample lost to the load is no failover
                current = await standing()
                for stream, (leader, in_sync) in current.items():
                    was_leader, was_in_sync = last[stream]
                    changes["leader_changes"] += leader != was_leader
                    changes["isr_losses"] += len(was_in_sync - in_sync)
                last = current

    async with _cpu_hog():
        sampler = asyncio.create_task(sample())
        try:
            figures = await timed_publish(ctx, url, subjects, count, name, done, pids)
        finally:
            stop.set()
            await sampler
    return {**changes, "loaded_s": figures["seconds"], "rate": figures["rate"]}


@contextlib.asynccontextmanager
async def _cpu_hog() -> AsyncIterator[None]:
    """A process that keeps one core busy: the machine's other work shares what is left."""
    hog = await asyncio.create_subprocess_exec(sys.executable, "-c", "while True: pass")
    try:
        yield
    finally:
        hog.kill()
        await hog.wait()
