"""The measured phase of a trial: workers started and READY, GO, and the clock runs until the system
has taken (or served) every message; rates, latencies and the servers' CPU time per message."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from benchmarks.harness import BenchError, Context, now
from benchmarks.metrics import CpuMeter
from benchmarks.workers import workers


def publisher_specs(url: str, subjects: list[str], total: int, publishers: int, size: int) -> list[dict[str, Any]]:
    per = [total // publishers + (1 if i < total % publishers else 0) for i in range(publishers)]
    return [{"url": url, "subjects": subjects, "count": n, "size": size} for n in per]


def per_subject_counts(specs: list[dict[str, Any]], subjects: int) -> list[int]:
    """How many messages the publishers of `specs` send to each subject (they go round-robin)."""
    counts = [0] * subjects
    for spec in specs:
        n = spec["count"]
        for k in range(subjects):
            counts[k] += n // subjects + (1 if k < n % subjects else 0)
    return counts


async def timed_publish(ctx: Context, url: str, subjects: list[str], count: int, name: str,
                        wait: Callable[[], Awaitable[float]], cpu_pids: list[int | None],
                        publishers: int | None = None) -> dict[str, Any]:
    """Publishers in worker processes, GO, and `wait` until the system committed; rates and CPU cost."""
    specs = publisher_specs(url, subjects, count, publishers or ctx.args.publishers, ctx.payload_size)
    async with workers(ctx, "nats_pub", specs, name) as pubs:
        cpu = CpuMeter(cpu_pids).start()
        t0 = now()
        for w in pubs:
            w.go()
        committed = await wait()
        cpu.stop()
        results = await asyncio.gather(*(w.result(60) for w in pubs))
    publish_end = max(r["end"] for r in results)
    return {
        "rate": count / (committed - t0),
        "publish_rate": count / (publish_end - t0),
        "server_cpu_us_per_msg": 1e6 * cpu.seconds / count,
        "seconds": committed - t0,
    }


async def acked_run(ctx: Context, kind: str, spec: dict[str, Any], count: int, name: str,
                    cpu_pids: list[int | None], prefix: str = "") -> dict[str, Any]:
    """One acked-publish worker of `kind`, GO, until it has every ack."""
    async with workers(ctx, kind, [spec], name) as (worker,):
        cpu = CpuMeter(cpu_pids).start()
        t0 = now()
        worker.go()
        # a cap against hangs, not a pace: fsync-bound acked publishes can run at a few hundred a second
        result = await worker.result(timeout=ctx.args.stall_timeout + count / 100)
        cpu.stop()
    metrics = _latency_metrics(result, t0, count, prefix)
    metrics[f"{prefix}cpu_us_per_msg"] = 1e6 * cpu.seconds / count
    return metrics


def _latency_metrics(result: dict[str, Any], t0: float, count: int, prefix: str) -> dict[str, Any]:
    if result.get("errors"):
        raise BenchError(f"{result['errors']} publishes failed; first error: {result.get('first_error')}")
    return {
        f"{prefix}rate": count / (result["end"] - t0),
        f"{prefix}p50_ms": result["p50_ms"],
        f"{prefix}p99_ms": result["p99_ms"],
        f"{prefix}max_ms": result["max_ms"],
    }


async def consume_run(ctx: Context, kind: str, spec: dict[str, Any], count: int, name: str,
                      cpu_pids: list[int | None]) -> dict[str, Any]:
    """One reading worker of `kind`, GO, until it has read `count` messages."""
    async with workers(ctx, kind, [spec], name) as (worker,):
        cpu = CpuMeter(cpu_pids).start()
        t0 = now()
        worker.go()
        result = await worker.result(timeout=ctx.args.stall_timeout + count / 1000)
        cpu.stop()
    if result["received"] != count:
        raise BenchError(f"read {result['received']} messages, expected {count}")
    return {
        "rate": count / (result["end"] - t0),
        "first_ms": 1000 * (result["first"] - t0),
        "server_cpu_us_per_msg": 1e6 * cpu.seconds / count,
    }


@contextlib.asynccontextmanager
async def grpc_floor_server(ctx: Context, count: int, name: str) -> AsyncIterator[tuple[str, int | None]]:
    """A gRPC server that does nothing but answer (a prebuilt message for Subscribe, an ack per
    PublishAsync request): what grpc.aio costs per message, whatever the server does. Yields its
    address and pid."""
    from bascule.testing import free_port

    port = free_port()
    spec = {"port": port, "count": count, "size": ctx.payload_size}
    async with workers(ctx, "grpc_floor_server", [spec], f"{name}-server") as (server,):
        server.go()
        yield f"127.0.0.1:{port}", server.pid
