"""Memory and restart of a one-node server: RSS idle with many partitions (streams), while capturing
and reading about 1M messages, and the time from a restart to serving the last of them."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from benchmarks.harness import BASCULE, READY_TIMEOUT, STREAM_SUBJECT_PREFIX, BenchError, Context, now
from benchmarks.measure import consume_run, timed_publish
from benchmarks.metrics import RssSampler, idle_cpu_pct, rss_mib
from benchmarks.systems import BasculeSystem, JetStreamSystem
from benchmarks.trials import run_trials

BIG_STREAM, BIG_SUBJECT = "big", f"{STREAM_SUBJECT_PREFIX}.big"


async def run_restart(ctx: Context, system: str) -> list[dict[str, Any]]:
    async def trial(n: int, profiled: bool) -> dict[str, Any]:
        if system == BASCULE:
            return await _restart_bascule(ctx, n)
        return await _restart_jetstream(ctx, n)

    return await run_trials(ctx, "restart", system, trial)


async def _restart_bascule(ctx: Context, n: int) -> dict[str, Any]:
    async with BasculeSystem(ctx, f"restart-bascule-{n}", 1, {}) as sys_:
        node = sys_.cluster.nodes[0]
        metrics = await _bascule_idle(ctx, sys_, node)
        figures, total = await _bascule_big_stream(ctx, sys_, node, n)
        metrics.update(figures)
        for label, graceful in (("graceful", True), ("kill", False)):
            await asyncio.to_thread(node.stop if graceful else node.kill)
            t0 = now()
            node.start(wait=False)
            metrics[f"restart_{label}_s"] = await _bascule_serves(node, total - 1) - t0
        await asyncio.sleep(1.0)
        metrics["restart_rss_mib"] = rss_mib(node.pid)
    return metrics


async def _bascule_idle(ctx: Context, sys_: BasculeSystem, node: Any) -> dict[str, Any]:
    """RSS at start and with `--idle-partitions` idle partitions, and the CPU those cost."""
    await asyncio.sleep(1.0)
    metrics: dict[str, Any] = {"rss_start_mib": rss_mib(node.pid)}
    await sys_.client().create_stream("idle", f"{STREAM_SUBJECT_PREFIX}.idle", replication_factor=1,
                                      partitions=ctx.args.idle_partitions)
    await sys_.wait_full_isr("idle", 1, 60)
    await asyncio.sleep(2.0)
    metrics["rss_idle_100_mib"] = rss_mib(node.pid)
    metrics["idle_100_cpu_pct"] = await idle_cpu_pct([node.pid])
    await sys_.client().delete_stream("idle")
    await asyncio.sleep(1.0)
    return metrics


async def _bascule_big_stream(ctx: Context, sys_: BasculeSystem, node: Any, n: int) -> tuple[dict[str, Any], int]:
    """Capture and then read the big stream, with the RSS around each; the figures and the messages held."""
    count, stall = ctx.counts["restart"], ctx.args.stall_timeout
    metrics: dict[str, Any] = {}
    base = await sys_.create_stream(BIG_STREAM, BIG_SUBJECT, 1)
    async with RssSampler([node.pid]) as sampler:
        m = await timed_publish(ctx, sys_.nats_url, [BIG_SUBJECT], count, f"restart-{n}-fill",
                                lambda: sys_.wait_committed(BIG_STREAM, {0: base[0] + count}, stall),
                                sys_.server_pids())
    metrics["capture_rate"] = m["rate"]
    metrics["rss_capture_peak_mib"] = sampler.peak
    await asyncio.sleep(2.0)
    metrics["rss_after_capture_mib"] = rss_mib(node.pid)
    total = base[0] + count + 1
    async with RssSampler([node.pid]) as sampler:
        reader = {"address": node.address, "stream": BIG_STREAM, "partition": 0, "count": total}
        read = await consume_run(ctx, "bascule_consume", reader, total, f"restart-{n}-read", sys_.server_pids())
    metrics["read_rate"] = read["rate"]
    metrics["rss_read_peak_mib"] = sampler.peak
    await asyncio.sleep(2.0)
    metrics["rss_after_read_mib"] = rss_mib(node.pid)
    return metrics, total


async def _bascule_serves(node: Any, last: int) -> float:
    """When the restarting `node` first serves offset `last` of the big stream."""
    from bascule.client import BasculeError, Client

    deadline = now() + READY_TIMEOUT * 2
    last_error = "no answer"
    while True:
        if not node.running:
            raise BenchError(f"node exited while restarting:\n{node.log_tail(20)}")
        # Asked only once the API accepts connections, as JetStream's side is: a client that meets a closed
        # port retries UNAVAILABLE with growing backoff, which measured the backoff (up to 0.5 s) instead.
        if not await _accepts(node.address):
            await asyncio.sleep(0.005)
            continue
        async with Client(node.address, timeout=2.0) as client:
            try:
                async for message in client.subscribe(BIG_STREAM, 0, offset=last, stop_offset=last):
                    if message.offset == last:
                        return now()
            except BasculeError as exc:
                last_error = str(exc)
        if now() > deadline:
            raise BenchError(f"offset {last} of {BIG_STREAM} not served {READY_TIMEOUT * 2} s after restart; "
                             f"last: {last_error}\n{node.log_tail(20)}")
        await asyncio.sleep(0.05)


async def _accepts(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        _, writer = await asyncio.open_connection(host, int(port))
    except OSError:
        return False
    writer.close()
    return True


async def _restart_jetstream(ctx: Context, n: int) -> dict[str, Any]:
    async with JetStreamSystem(ctx, f"restart-jetstream-{n}", 1) as sys_:
        server = sys_.servers[0]
        metrics = await _jetstream_idle(ctx, sys_)
        figures, total = await _jetstream_big_stream(ctx, sys_, n)
        metrics.update(figures)
        await sys_.nc.close()
        sys_.nc = None
        for label in ("graceful", "kill"):
            await (server.stop() if label == "graceful" else server.kill())
            t0 = now()
            await server.start()
            metrics[f"restart_{label}_s"] = await _jetstream_serves(server.url, total) - t0
        await asyncio.sleep(1.0)
        metrics["restart_rss_mib"] = rss_mib(sys_.server_pids()[0])
    return metrics


async def _jetstream_idle(ctx: Context, sys_: JetStreamSystem) -> dict[str, Any]:
    """RSS at start and with `--idle-partitions` idle streams, and the CPU those cost."""
    idle_streams = ctx.args.idle_partitions
    await asyncio.sleep(1.0)
    metrics: dict[str, Any] = {"rss_start_mib": rss_mib(sys_.server_pids()[0])}
    for i in range(idle_streams):
        await sys_.js.add_stream(name=f"idle{i}", subjects=[f"{STREAM_SUBJECT_PREFIX}.idle.{i}"], storage="file")
    await asyncio.sleep(2.0)
    metrics["rss_idle_100_mib"] = rss_mib(sys_.server_pids()[0])
    metrics["idle_100_cpu_pct"] = await idle_cpu_pct(sys_.server_pids())
    for i in range(idle_streams):
        await sys_.js.delete_stream(f"idle{i}")
    await asyncio.sleep(1.0)
    return metrics


async def _jetstream_big_stream(ctx: Context, sys_: JetStreamSystem, n: int) -> tuple[dict[str, Any], int]:
    """Capture and then read the big stream, with the RSS around each; the figures and the messages held."""
    count, stall = ctx.counts["restart"], ctx.args.stall_timeout
    metrics: dict[str, Any] = {}
    base = await sys_.create_stream(BIG_STREAM, BIG_SUBJECT, 1)
    async with RssSampler(sys_.server_pids()) as sampler:
        m = await timed_publish(ctx, sys_.nats_url, [BIG_SUBJECT], count, f"restart-{n}-fill",
                                lambda: sys_.wait_stored(BIG_STREAM, base + count, stall), sys_.server_pids())
    metrics["capture_rate"] = m["rate"]
    metrics["rss_capture_peak_mib"] = sampler.peak
    await asyncio.sleep(2.0)
    metrics["rss_after_capture_mib"] = rss_mib(sys_.server_pids()[0])
    total = base + count
    async with RssSampler(sys_.server_pids()) as sampler:
        reader = {"url": sys_.nats_url, "subject": BIG_SUBJECT, "count": total}
        read = await consume_run(ctx, "js_consume", reader, total, f"restart-{n}-read", sys_.server_pids())
    metrics["read_rate"] = read["rate"]
    metrics["rss_read_peak_mib"] = sampler.peak
    await asyncio.sleep(2.0)
    metrics["rss_after_read_mib"] = rss_mib(sys_.server_pids()[0])
    return metrics, total


async def _jetstream_serves(url: str, sequence: int) -> float:
    """When the restarting server at `url` first serves message `sequence` of the big stream."""
    import nats
    from nats.js.api import ConsumerConfig, DeliverPolicy

    deadline = now() + READY_TIMEOUT * 2
    last_error = "no connection"
    while True:
        try:
            nc = await nats.connect(url, connect_timeout=1, max_reconnect_attempts=0, allow_reconnect=False)
        except Exception:  # noqa: BLE001 - not listening yet
            nc = None
        if nc is not None:
            try:
                js = nc.jetstream(timeout=2)
                config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=sequence)
                sub = await js.subscribe(BIG_SUBJECT, stream=BIG_STREAM, ordered_consumer=True, config=config)
                msg = await sub.next_msg(timeout=2)
                if msg.metadata.sequence.stream == sequence:
                    return now()
                last_error = f"got sequence {msg.metadata.sequence.stream}"
            except Exception as exc:  # noqa: BLE001 - JetStream still recovering
                last_error = repr(exc)
            finally:
                with contextlib.suppress(Exception):
                    await nc.close()
        if now() > deadline:
            raise BenchError(f"JetStream: message {sequence} not served {READY_TIMEOUT * 2} s after restart; "
                             f"last: {last_error}")
        await asyncio.sleep(0.05)
