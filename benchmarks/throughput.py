"""The scenarios that measure rates: capture, acked publishes, consume, durable (fsync before ack), the
Python receive ceiling and capture over many partitions."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from benchmarks import node_client
from benchmarks.harness import BASCULE, JETSTREAM, STREAM_SUBJECT_PREFIX, BenchError, Context, log, now
from benchmarks.measure import (
    acked_run,
    consume_run,
    grpc_floor_server,
    per_subject_counts,
    publisher_specs,
    timed_publish,
)
from benchmarks.systems import BasculeSystem, JetStreamSystem
from benchmarks.trials import maybe_profile, run_trials
from benchmarks.workers import workers


def _sync_config(sync_always: bool) -> dict[str, Any]:
    return {"streams.sync": "always" if sync_always else "never"}


async def capture_scenario(ctx: Context, system: str, replicas: int, scenario: str,
                           sync_always: bool = False, count: int | None = None) -> list[dict[str, Any]]:
    """Plain NATS publishes into a stream; the rate is messages committed (bascule) or stored
    (JetStream) over the time since GO."""
    count = count or ctx.counts["capture"]
    if system == BASCULE:
        return await _capture_bascule(ctx, replicas, scenario, sync_always, count)
    return await _capture_jetstream(ctx, replicas, scenario, sync_always, count)


async def _capture_bascule(ctx: Context, replicas: int, scenario: str, sync_always: bool,
                           count: int) -> list[dict[str, Any]]:
    stall = ctx.args.stall_timeout
    async with BasculeSystem(ctx, f"{scenario}-bascule", replicas, _sync_config(sync_always)) as sys_:

        async def trial(n: int, profiled: bool) -> dict[str, Any]:
            stream, subject = f"cap{n}", f"{STREAM_SUBJECT_PREFIX}.cap{n}"
            base = await sys_.create_stream(stream, subject, replicas)
            targets = {0: base[0] + count}
            async with maybe_profile(ctx, scenario, sys_.node_pids(), profiled):
                metrics = await timed_publish(
                    ctx, sys_.nats_url, [subject], count, f"{scenario}-{n}",
                    lambda: sys_.wait_committed(stream, targets, stall), sys_.server_pids(),
                )
            await sys_.client().delete_stream(stream)
            return metrics

        return await run_trials(ctx, scenario, BASCULE, trial)


async def _capture_jetstream(ctx: Context, replicas: int, scenario: str, sync_always: bool,
                             count: int) -> list[dict[str, Any]]:
    stall = ctx.args.stall_timeout
    async with JetStreamSystem(ctx, f"{scenario}-jetstream", replicas, sync_always) as sys_:

        async def trial(n: int, profiled: bool) -> dict[str, Any]:
            stream, subject = f"cap{n}", f"{STREAM_SUBJECT_PREFIX}.cap{n}"
            base = await sys_.create_stream(stream, subject, replicas)
            metrics = await timed_publish(
                ctx, sys_.nats_url, [subject], count, f"{scenario}-{n}",
                lambda: sys_.wait_stored(stream, base + count, stall), sys_.server_pids(),
            )
            await sys_.js.delete_stream(stream)
            return metrics

        return await run_trials(ctx, scenario, JETSTREAM, trial)


async def run_capture_r1(ctx: Context, system: str) -> list[dict[str, Any]]:
    return await capture_scenario(ctx, system, 1, "capture_r1")


async def run_capture_r3(ctx: Context, system: str) -> list[dict[str, Any]]:
    return await capture_scenario(ctx, system, 3, "capture_r3")


async def acked_scenario(ctx: Context, system: str, replicas: int, scenario: str,
                         sync_always: bool = False, count: int | None = None,
                         variants: Sequence[str] = ("grpc", "nats"), grpc_floor: bool = False) -> list[dict[str, Any]]:
    """Pipelined ack-ALL publishes, `--window` in flight: bascule through each of `variants` (gRPC
    PublishAsync from grpc.aio, envelopes over NATS, "node_grpc": PublishAsync from the Node client,
    "raw_grpc": from benchmarks/raw_publish.py, "raw_grpc_ids": the same with a message id on each
    publish, which the partition leader deduplicates: what idempotence costs),
    JetStream through js.publish_async."""
    count = count or ctx.counts["acked"]
    if system == BASCULE:
        return await _acked_bascule(ctx, replicas, scenario, sync_always, count, variants, grpc_floor)
    return await _acked_jetstream(ctx, replicas, scenario, sync_always, count)


async def _acked_bascule(ctx: Context, replicas: int, scenario: str, sync_always: bool, count: int,
                         variants: Sequence[str], grpc_floor: bool) -> list[dict[str, Any]]:
    window, size = ctx.args.window, ctx.payload_size
    node = await node_client.prepare() if "node_grpc" in variants else None
    if node is not None and not node.ok:
        variants = [v for v in variants if v != "node_grpc"]  # prepare() said why
    async with BasculeSystem(ctx, f"{scenario}-bascule", replicas, _sync_config(sync_always)) as sys_:

        async def run_variant(n: int, profiled: bool, variant: str) -> dict[str, Any]:
            stream, subject = f"ack{n}{variant}", f"{STREAM_SUBJECT_PREFIX}.ack{n}{variant}"
            await sys_.create_stream(stream, subject, replicas)
            leader = await sys_.leader_of(stream)
            if variant == "node_grpc":
                assert node is not None
                async with maybe_profile(ctx, f"{scenario}-{variant}", sys_.node_pids(), profiled):
                    result = await node_client.node_publish(
                        node, sys_.address_of(leader), stream, count, window, size, "ALL", sys_.server_pids(),
                        timeout=ctx.args.stall_timeout + count / 100)
                await sys_.client().delete_stream(stream)
                return {"node_grpc_rate": result["rate"], "node_grpc_p50_ms": result["p50_ms"],
                        "node_grpc_p99_ms": result["p99_ms"], "node_grpc_max_ms": result["max_ms"],
                        "node_grpc_cpu_us_per_msg": result["server_cpu_us_per_msg"],
                        "node_grpc_client_cpu_us_per_msg": result["client_cpu_us_per_msg"]}
            if variant in ("raw_grpc", "raw_grpc_ids"):
                async with maybe_profile(ctx, f"{scenario}-{variant}", sys_.node_pids(), profiled):
                    result = await node_client.raw_publish(
                        sys_.address_of(leader), stream, count, window, size, "ALL", sys_.server_pids(),
                        timeout=ctx.args.stall_timeout + count / 100, ids=variant == "raw_grpc_ids",
                        leader_pid=sys_.node_pids().get(leader))
                await sys_.client().delete_stream(stream)
                return {f"{variant}_rate": result["rate"], f"{variant}_p50_ms": result["p50_ms"],
                        f"{variant}_p99_ms": result["p99_ms"],
                        f"{variant}_cpu_us_per_msg": result["server_cpu_us_per_msg"],
                        f"{variant}_leader_cpu_us_per_msg": result.get("leader_cpu_us_per_msg"),
                        f"{variant}_client_cpu_us_per_msg": result["client_cpu_us_per_msg"]}
            if variant == "grpc":
                kind = "bascule_acked_grpc"
                spec = {"address": sys_.address_of(leader), "stream": stream, "partition": 0}
            else:
                kind = "bascule_acked_nats"
                spec = {"url": sys_.nats_url, "subject": subject}
            spec.update(count=count, window=window, size=size)
            async with maybe_profile(ctx, f"{scenario}-{variant}", sys_.node_pids(), profiled):
                metrics = await acked_run(ctx, kind, spec, count, f"{scenario}-{n}-{variant}",
                                          sys_.server_pids(), prefix=f"{variant}_")
            await sys_.client().delete_stream(stream)
            return metrics

        async def trial(n: int, profiled: bool) -> dict[str, Any]:
            metrics: dict[str, Any] = {}
            for variant in variants:
                metrics.update(await run_variant(n, profiled, variant))
            if grpc_floor:
                metrics.update(await _acked_grpc_floor(ctx, count, f"{scenario}-{n}-grpc-floor"))
            return metrics

        return await run_trials(ctx, scenario, BASCULE, trial)


async def _acked_grpc_floor(ctx: Context, count: int, name: str) -> dict[str, Any]:
    async with grpc_floor_server(ctx, count, name) as (address, pid):
        spec = {"address": address, "stream": "floor", "partition": 0, "count": count,
                "window": ctx.args.window, "size": ctx.payload_size}
        floor = await acked_run(ctx, "bascule_acked_grpc", spec, count, name, [pid])
    return {"grpc_floor_rate": floor["rate"], "grpc_floor_cpu_us_per_msg": floor["cpu_us_per_msg"]}


async def _acked_jetstream(ctx: Context, replicas: int, scenario: str, sync_always: bool,
                           count: int) -> list[dict[str, Any]]:
    async with JetStreamSystem(ctx, f"{scenario}-jetstream", replicas, sync_always) as sys_:

        async def trial(n: int, profiled: bool) -> dict[str, Any]:
            stream, subject = f"ack{n}", f"{STREAM_SUBJECT_PREFIX}.ack{n}"
            await sys_.create_stream(stream, subject, replicas)
            spec = {"url": sys_.nats_url, "subject": subject, "count": count, "window": ctx.args.window,
                    "size": ctx.payload_size}
            metrics = await acked_run(ctx, "js_acked", spec, count, f"{scenario}-{n}", sys_.server_pids())
            metrics["server_cpu_us_per_msg"] = metrics.pop("cpu_us_per_msg")
            await sys_.js.delete_stream(stream)
            return metrics

        return await run_trials(ctx, scenario, JETSTREAM, trial)


ACKED_R3_VARIANTS = ("grpc", "nats", "node_grpc", "raw_grpc", "raw_grpc_ids")


async def run_acked_r3(ctx: Context, system: str) -> list[dict[str, Any]]:
    chosen = [name for name in getattr(ctx.args, "acked_variants", "").split(",") if name]
    unknown = set(chosen) - {*ACKED_R3_VARIANTS, "grpc_floor"}
    if unknown:
        raise SystemExit(f"--acked-variants: no variant {', '.join(sorted(unknown))}")
    return await acked_scenario(ctx, system, 3, "acked_r3",
                                variants=[name for name in ACKED_R3_VARIANTS if not chosen or name in chosen],
                                grpc_floor=not chosen or "grpc_floor" in chosen)


async def run_consume_r3(ctx: Context, system: str) -> list[dict[str, Any]]:
    """Read a prefilled R3 stream from the start."""
    if system == BASCULE:
        return await _consume_bascule(ctx, "consume_r3")
    return await _consume_jetstream(ctx, "consume_r3")


async def _consume_bascule(ctx: Context, scenario: str) -> list[dict[str, Any]]:
    count, stall = ctx.counts["consume"], ctx.args.stall_timeout
    node = await node_client.prepare()
    async with BasculeSystem(ctx, f"{scenario}-bascule", 3, {}) as sys_:
        stream, subject = "consume", f"{STREAM_SUBJECT_PREFIX}.consume"
        base = await sys_.create_stream(stream, subject, 3)
        log(f"{scenario} / bascule: prefilling {count} messages")
        await timed_publish(ctx, sys_.nats_url, [subject], count, f"{scenario}-fill",
                            lambda: sys_.wait_committed(stream, {0: base[0] + count}, stall), [])
        leader = await sys_.leader_of(stream)
        total = base[0] + count + 1  # the probe, then the prefill

        async def trial(n: int, profiled: bool) -> dict[str, Any]:
            spec = {"address": sys_.address_of(leader), "stream": stream, "partition": 0, "count": total}
            async with maybe_profile(ctx, scenario, sys_.node_pids(), profiled):
                metrics = await consume_run(ctx, "bascule_consume", spec, total, f"{scenario}-{n}",
                                            sys_.server_pids())
            async with maybe_profile(ctx, f"{scenario}-grpc", sys_.node_pids(), profiled):
                grpc_metrics = await consume_run(ctx, "bascule_consume_grpc", spec, total,
                                                 f"{scenario}-{n}-grpc", sys_.server_pids())
            node_metrics: dict[str, Any] = {}
            if node.ok:
                async with maybe_profile(ctx, f"{scenario}-node-grpc", sys_.node_pids(), profiled):
                    result = await node_client.node_subscribe(
                        node, sys_.address_of(leader), stream, total, sys_.server_pids(),
                        timeout=stall + total / 1000)
                node_metrics = {"node_grpc_rate": result["rate"], "node_grpc_first_ms": result["first_ms"],
                                "node_grpc_server_cpu_us_per_msg": result["server_cpu_us_per_msg"],
                                "node_grpc_client_cpu_us_per_msg": result["client_cpu_us_per_msg"]}
            async with grpc_floor_server(ctx, total, f"{scenario}-{n}-grpc-floor") as (address, pid):
                reader = {"address": address, "stream": "floor", "partition": 0, "count": total}
                floor = await consume_run(ctx, "bascule_consume_grpc", reader, total,
                                          f"{scenario}-{n}-grpc-floor", [pid])
            return {**metrics, **{f"grpc_{name}": value for name, value in grpc_metrics.items()}, **node_metrics,
                    "grpc_floor_rate": floor["rate"], "grpc_floor_cpu_us_per_msg": floor["server_cpu_us_per_msg"]}

        return await run_trials(ctx, scenario, BASCULE, trial)


async def _consume_jetstream(ctx: Context, scenario: str) -> list[dict[str, Any]]:
    count, stall = ctx.counts["consume"], ctx.args.stall_timeout
    async with JetStreamSystem(ctx, f"{scenario}-jetstream", 3) as sys_:
        stream, subject = "consume", f"{STREAM_SUBJECT_PREFIX}.consume"
        base = await sys_.create_stream(stream, subject, 3)
        log(f"{scenario} / jetstream: prefilling {count} messages")
        await timed_publish(ctx, sys_.nats_url, [subject], count, f"{scenario}-fill",
                            lambda: sys_.wait_stored(stream, base + count, stall), [])
        total = base + count

        async def trial(n: int, profiled: bool) -> dict[str, Any]:
            spec = {"url": sys_.nats_url, "subject": subject, "count": total}
            return await consume_run(ctx, "js_consume", spec, total, f"{scenario}-{n}", sys_.server_pids())

        return await run_trials(ctx, scenario, JETSTREAM, trial)


async def run_durable_r1(ctx: Context, system: str) -> list[dict[str, Any]]:
    """Capture and acked (window) rates with fsync before acks, one replica."""
    count = ctx.counts["durable"]
    capture = await capture_scenario(ctx, system, 1, "durable_r1", sync_always=True, count=count)
    acked = await acked_scenario(ctx, system, 1, "durable_r1", sync_always=True, count=count)
    return [_durable_row(system, cap, ack) for cap, ack in zip(capture, acked)]


def _durable_row(system: str, cap: dict[str, Any], ack: dict[str, Any]) -> dict[str, Any]:
    """One trial's capture and acked figures as one row."""
    row: dict[str, Any] = {}
    if "error" in cap or "error" in ack:
        row["error"] = "; ".join(x["error"] for x in (cap, ack) if "error" in x)
    row["capture_rate"] = cap.get("rate")
    row["capture_cpu_us_per_msg"] = cap.get("server_cpu_us_per_msg")
    # bascule's acked figures keep their grpc_/nats_ prefixes; JetStream's get an acked_ one
    for key, value in ack.items():
        if key in ("loadavg", "wall_s", "profiled", "error"):
            continue
        if system == JETSTREAM:
            key = "acked_" + ("cpu_us_per_msg" if key == "server_cpu_us_per_msg" else key)
        row[key] = value
    row["loadavg"], row["wall_s"] = ack.get("loadavg"), (cap.get("wall_s") or 0) + (ack.get("wall_s") or 0)
    if cap.get("profiled"):
        row["profiled"] = True
    return {k: v for k, v in row.items() if v is not None}


async def run_ceiling(ctx: Context, system: str) -> list[dict[str, Any]]:
    """One nats-py process receiving from another through one nats-server: no stream at all."""
    from bascule.natsio.server import EmbeddedNats

    count = ctx.counts["ceiling"]
    config = ctx.dir / "ceiling-nats.conf"
    ctx.dir.mkdir(parents=True, exist_ok=True)
    # The publisher outruns the subscriber by design: the backlog must fit in the server's buffer for
    # the subscriber's connection (64 MiB by default, beyond which it is cut off as a slow consumer).
    config.write_text("max_pending: 2GB\n")
    server = EmbeddedNats(host="127.0.0.1", port=0, config_file=config, log_dir=ctx.dir / "ceiling-nats")
    await server.start()
    try:

        async def trial(n: int, profiled: bool) -> dict[str, Any]:
            subject = f"{STREAM_SUBJECT_PREFIX}.ceiling{n}"
            sub_spec = {"url": server.url, "subject": subject, "count": count}
            async with workers(ctx, "nats_sub", [sub_spec], f"ceiling-{n}-sub") as (sub,):
                pub_specs = publisher_specs(server.url, [subject], count, 1, ctx.payload_size)
                async with workers(ctx, "nats_pub", pub_specs, f"ceiling-{n}-pub") as (pub,):
                    sub.go()
                    t0 = now()
                    pub.go()
                    received = await sub.result(timeout=ctx.args.stall_timeout + count / 20_000)
                    sent = await pub.result(timeout=60)
            if received["received"] != count:
                raise BenchError(f"received {received['received']} of {count} (slow consumer?)")
            return {"rate": count / (received["end"] - t0), "publish_rate": count / (sent["end"] - t0)}

        return await run_trials(ctx, "ceiling", system, trial)
    finally:
        await server.stop()


async def run_scale(ctx: Context, system: str) -> list[dict[str, Any]]:
    """bascule capture rate over 1, 10 and 100 partitions (publishers round-robin over partition subjects)."""
    from bascule.wire.names import partition_subject

    count = ctx.counts["scale"]
    replicas = ctx.args.scale_replicas
    nodes = max(3, replicas) if ctx.args.scale_nodes is None else ctx.args.scale_nodes
    stall = ctx.args.stall_timeout
    async with BasculeSystem(ctx, "scale-bascule", nodes, {}) as sys_:

        async def capture_into(n: int, profiled: bool, partitions: int) -> dict[str, Any]:
            stream, subject = f"scale{n}p{partitions}", f"{STREAM_SUBJECT_PREFIX}.scale{n}p{partitions}"
            base = await sys_.create_stream(stream, subject, replicas, partitions)
            subjects = [partition_subject(subject, p) for p in range(partitions)]
            specs = publisher_specs(sys_.nats_url, subjects, count, ctx.args.scale_publishers, ctx.payload_size)
            per = per_subject_counts(specs, partitions)
            targets = {p: base[p] + per[p] for p in range(partitions)}
            async with maybe_profile(ctx, f"scale-p{partitions}", sys_.node_pids(), profiled):
                m = await timed_publish(
                    ctx, sys_.nats_url, subjects, count, f"scale-{n}-p{partitions}",
                    lambda: sys_.wait_committed(stream, targets, stall), sys_.server_pids(),
                    publishers=ctx.args.scale_publishers,
                )
            await sys_.client().delete_stream(stream)
            return {f"p{partitions}_rate": m["rate"], f"p{partitions}_cpu_us_per_msg": m["server_cpu_us_per_msg"]}

        async def trial(n: int, profiled: bool) -> dict[str, Any]:
            metrics: dict[str, Any] = {}
            for partitions in ctx.args.scale_partitions:
                metrics.update(await capture_into(n, profiled, partitions))
                await asyncio.sleep(1.0)
            return metrics

        return await run_trials(ctx, "scale", system, trial)
