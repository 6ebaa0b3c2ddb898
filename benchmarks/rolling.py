"""Rolling restart (issue 16): each node of a 3-node cluster stopped and started again in turn under a
steady ack-ALL probe load; the longest time without an ack, and whether every acked probe is still in
the stream afterwards.

bascule runs it twice on one cluster: with SIGTERM (controlled shutdown: the stopping node hands the
partitions it leads to other ISR members and leaves the ISRs it follows) and with SIGKILL (no
controlled shutdown: the followers wait out the leader timeout), its own baseline. JetStream runs it
with SIGTERM (a stopping nats-server steps down the Raft groups it leads). Each round restarts the
partition (stream) leader first, then the two others in node order, whoever leads by then.

The probes: one publish every PROBE_INTERVAL s, each waiting up to PROBE_TIMEOUT for its ack while the
next ones go out. bascule's are Liftbridge envelopes with ack ALL over the cluster's own nats-server,
which is not restarted; JetStream's go through a connection to a server not being restarted at the time.
JetStream acks a publish once a quorum (2 of 3) stored it, bascule's ack ALL once the whole ISR did.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from bascule.config.model import ClusteringConfig
from bascule.server import HANDOFF_TIMEOUT
from benchmarks.harness import BASCULE, STREAM_SUBJECT_PREFIX, BenchError, Context, log, now
from benchmarks.report import format_value
from benchmarks.systems import BasculeSystem, JetStreamProbe, JetStreamSystem
from benchmarks.trials import run_trials

# A publish with ack ALL: when its ack arrived, or None if none did within the timeout.
AckedPublish = Callable[[str, bytes, float], Awaitable[float | None]]

# clustering.replica.max.leader.timeout: the default, as in the failover scenario.
LEADER_TIMEOUT = ClusteringConfig().replica_max_leader_timeout
PROBE_INTERVAL = 0.005
PROBE_TIMEOUT = 5.0
SETTLE = 1.0  # seconds of load before the first restart, after each node is back, and at the end
JETSTREAM_STOP_TIMEOUT = 30.0  # SIGTERM to SIGKILL; a graceful stop never comes near it


class ProbeLoad:
    """An ack-ALL publish every PROBE_INTERVAL s through `publish` (the caller may switch it between
    restarts), each with its own timeout; records when each probe's ack came."""

    def __init__(self, publish: AckedPublish, subject: str, tag: str, size: int) -> None:
        self.publish = publish
        self.subject = subject
        self.tag = tag
        self.size = size
        self.sent = 0
        self.errors = 0
        self.acked: dict[bytes, float] = {}
        self.started = self.stopped = 0.0
        self._in_flight: set[asyncio.Task[None]] = set()
        self._sender: asyncio.Task[None] | None = None

    async def __aenter__(self) -> ProbeLoad:
        self.started = now()
        self._sender = asyncio.create_task(self._send())
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        assert self._sender is not None
        self._sender.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._sender
        self.stopped = now()
        if exc_type is not None:
            for task in self._in_flight:
                task.cancel()
        # The probes in flight end within their timeout: their acks count, their values are checked.
        await asyncio.gather(*self._in_flight, return_exceptions=True)

    async def _send(self) -> None:
        while True:
            self.sent += 1
            value = f"{self.tag}-{self.sent:08d}".encode().ljust(self.size, b".")
            task = asyncio.create_task(self._one(value))
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)
            await asyncio.sleep(max(0.0, self.started + self.sent * PROBE_INTERVAL - now()))

    async def _one(self, value: bytes) -> None:
        try:
            acked = await self.publish(self.subject, value, PROBE_TIMEOUT)
        except Exception:  # noqa: BLE001 - a publish that fails is a probe without an ack
            self.errors += 1
            return
        if acked is not None:
            self.acked[value] = acked

    async def ack_after(self, moment: float, deadline: float) -> None:
        """Until a probe is acked after `moment`."""
        while max(self.acked.values(), default=0.0) <= moment:
            if now() > deadline:
                raise BenchError(f"{self.tag}: no probe acked for {now() - moment:.1f} s")
            await asyncio.sleep(0.01)

    def ack_times(self) -> list[float]:
        return sorted(self.acked.values())


def ack_gaps(acks: list[float], start: float, end: float) -> list[tuple[float, float]]:
    """The intervals of [start, end] without an ack completing: from the start to the first ack,
    between consecutive acks, from the last ack to the end."""
    points = [start, *(a for a in acks if start < a < end), end]
    return list(zip(points, points[1:]))


def longest_gap(gaps: list[tuple[float, float]], begin: float, end: float) -> tuple[float, float]:
    """The longest of the gaps that ended in (begin, end]: a stall belongs to the restart during which
    writes went on again (it may have begun a probe interval before that restart's signal)."""
    return max(((a, b) for a, b in gaps if begin < b <= end), key=_length, default=(begin, begin))


def _length(gap: tuple[float, float]) -> float:
    return gap[1] - gap[0]


@dataclass
class Step:
    """One node's restart: the times are seconds from its signal (stop: the process exited; ready: its
    API answered again; back: in the ISR, replicas current, and a probe acked after that)."""

    node: str
    role: str  # the partition's leader or a follower when signalled
    signal: str
    stop_s: float = 0.0
    ready_s: float = 0.0
    back_s: float = 0.0
    exit: int | None = None  # the stopped process's exit status (-9: killed, after its grace time too)
    leader_after: str = ""
    stall_ms: float = 0.0
    stall_from_s: float = 0.0  # where the longest stall began
    at: float = 0.0  # when signalled (the clock of `now`)


def round_figures(load: ProbeLoad, steps: list[Step], stored: set[bytes], lost: int) -> dict[str, Any]:
    """The table's figures of one rolling restart; each step gets the longest stall that ended between
    its signal and the next one's (the last: the end of the load), the steady figure the longest that
    ended after the first ack and before the first signal."""
    acks = load.ack_times()
    gaps = ack_gaps(acks, load.started, load.stopped)
    bounds = [s.at for s in steps] + [load.stopped]
    for step, end in zip(steps, bounds[1:]):
        stall = longest_gap(gaps, step.at, end)
        step.stall_ms, step.stall_from_s = round(1000 * _length(stall), 1), round(stall[0] - step.at, 3)
    by_role = {role: [s.stall_ms for s in steps if s.role == role] for role in ("leader", "follower")}
    figures: dict[str, Any] = {
        "stall_max_ms": max(s.stall_ms for s in steps),
        "forced_stops": sum(1 for s in steps if s.signal == "SIGTERM" and s.exit == -signal.SIGKILL),
        "stall_leader_ms": max(by_role["leader"], default=None),
        "stall_follower_ms": max(by_role["follower"], default=None),
        "steady_gap_ms": 1000 * _length(longest_gap(gaps, acks[0], steps[0].at)),
        "unacked": load.sent - len(load.acked),
        "lost": lost,
        "sent": load.sent,
        "stored": sum(1 for v in stored if v.startswith(load.tag.encode() + b"-")),
        "errors": load.errors,
        "steps": [{k: v for k, v in asdict(s).items() if k != "at"} for s in steps],
    }
    return figures


def log_round(system: str, label: str, figures: dict[str, Any]) -> None:
    log(f"rolling_restart / {system} ({label}): longest stall {format_value(figures['stall_max_ms'])} ms "
        f"(steady load before: {format_value(figures['steady_gap_ms'])} ms), {figures['unacked']} of "
        f"{figures['sent']} probes unacked ({figures['errors']} of them failed), {figures['stored']} in the "
        f"stream, {figures['lost']} acked and lost")
    for step in figures["steps"]:
        log(f"  {step['signal']} {step['node']} ({step['role']}): exited in {format_value(step['stop_s'])} s "
            f"(status {step['exit']}), API after {format_value(step['ready_s'])} s, back in the ISR after "
            f"{format_value(step['back_s'])} s; stall {format_value(step['stall_ms'])} ms from "
            f"{format_value(step['stall_from_s'])} s; leader now {step['leader_after']}")
        if step["signal"] == "SIGTERM" and step["exit"] == -signal.SIGKILL:
            log(f"!!! rolling_restart / {system}: {step['node']} did not exit after SIGTERM within its grace "
                f"time and was SIGKILLed")


def check_lost(system: str, load: ProbeLoad, stored: set[bytes]) -> int:
    """How many acked probes the stream does not hold; said loudly when any."""
    missing = sorted(v for v in load.acked if v not in stored)
    if missing:
        log(f"!!! rolling_restart / {system}: {len(missing)} ACKED PROBES LOST (acked, not in the stream): "
            + ", ".join(v.rstrip(b".").decode() for v in missing[:10]))
    return len(missing)


async def run_rolling_restart(ctx: Context, system: str) -> list[dict[str, Any]]:
    if system == BASCULE:
        return await _rolling_bascule(ctx)
    return await _rolling_jetstream(ctx)


# ---- bascule --------------------------------------------------------------------------------------


async def _rolling_bascule(ctx: Context) -> list[dict[str, Any]]:
    settings = {"clustering.replica.max.leader.timeout": LEADER_TIMEOUT, "handoff_timeout_s": HANDOFF_TIMEOUT}
    log(f"rolling_restart / bascule: clustering.replica.max.leader.timeout {LEADER_TIMEOUT:g} s (the default), "
        f"replica.max.lag.time at its default, HANDOFF_TIMEOUT {HANDOFF_TIMEOUT} s; probes: envelopes with "
        f"ack ALL every {PROBE_INTERVAL * 1000:g} ms, {PROBE_TIMEOUT:g} s timeout each, over the cluster's "
        f"nats-server (not restarted); the partition leader restarts first")
    async with BasculeSystem(ctx, "rolling-bascule", 3, {}) as sys_:

        async def trial(n: int, profiled: bool) -> dict[str, Any]:
            metrics: dict[str, Any] = {"settings": settings}
            for label, prefix, stream in (("SIGTERM", "", f"rr{n}term"), ("SIGKILL", "kill_", f"rr{n}kill")):
                figures = await _bascule_round(ctx, sys_, stream, label == "SIGTERM")
                log_round(BASCULE, label, figures)
                metrics.update({prefix + k: v for k, v in figures.items()})
            lost = metrics["lost"] + metrics["kill_lost"]
            if lost:
                metrics["error"] = (f"{lost} acked probes lost (SIGTERM {metrics['lost']}, "
                                    f"SIGKILL {metrics['kill_lost']})")
            return metrics

        return await run_trials(ctx, "rolling_restart", BASCULE, trial)


async def _bascule_round(ctx: Context, sys_: BasculeSystem, stream: str, graceful: bool) -> dict[str, Any]:
    subject = f"{STREAM_SUBJECT_PREFIX}.{stream}"
    timeout = ctx.args.failover_timeout * 3
    await sys_.create_stream(stream, subject, 3)
    leader = await sys_.leader_of(stream)
    order = [leader, *(node.server_id for node in sys_.cluster.nodes if node.server_id != leader)]
    steps = []
    async with ProbeLoad(sys_.acked_publish, subject, stream, ctx.payload_size) as load:
        await load.ack_after(now(), now() + timeout)
        await asyncio.sleep(SETTLE)
        for server_id in order:
            steps.append(await _bascule_restart(sys_, stream, server_id, graceful, load, now() + timeout))
            await asyncio.sleep(SETTLE)
    stored = await _bascule_values(sys_, stream)
    figures = round_figures(load, steps, stored, check_lost(BASCULE, load, stored))
    await sys_.client().delete_stream(stream)
    return figures


async def _bascule_restart(sys_: BasculeSystem, stream: str, server_id: str, graceful: bool, load: ProbeLoad,
                           deadline: float) -> Step:
    """Stop one node (SIGTERM, or SIGKILL), start it again, and wait until it is back in the ISR."""
    index = sys_.index_of(server_id)
    node = sys_.cluster.nodes[index]
    # Metadata from a node that stays up: a restarted one answers from its own view, perhaps behind.
    witness = sys_.client(sys_.cluster.nodes[(index + 1) % len(sys_.cluster.nodes)].address)
    role = "leader" if (await _bascule_partition(witness, stream)).leader == server_id else "follower"
    step = Step(server_id, role, "SIGTERM" if graceful else "SIGKILL", at=now())
    await asyncio.to_thread(node.stop if graceful else node.kill)
    step.stop_s = now() - step.at
    step.exit = node.returncode
    await asyncio.to_thread(node.start, wait=False)
    await asyncio.to_thread(node.wait_ready, max(1.0, deadline - now()))
    step.ready_s = now() - step.at
    while server_id not in (await _bascule_partition(witness, stream)).isr:
        if now() > deadline:
            raise BenchError(f"{stream}: {server_id} not back in the ISR {now() - step.at:.0f} s after its restart")
        await asyncio.sleep(0.05)
    await load.ack_after(now(), deadline)  # ack ALL: every ISR member, the restarted one too, has it
    step.back_s = now() - step.at
    step.leader_after = (await _bascule_partition(witness, stream)).leader
    return step


async def _bascule_partition(client: Any, stream: str) -> Any:
    metadata = await client.fetch_metadata(stream)
    info = metadata.streams.get(stream)
    if info is None or not info.exists or 0 not in info.partitions:
        raise BenchError(f"{client.address} does not know {stream}")
    return info.partitions[0]


async def _bascule_values(sys_: BasculeSystem, stream: str) -> set[bytes]:
    """Every value of the stream, read from its leader up to its HW."""
    from bascule.client import Client

    high_watermark = (await sys_.high_watermarks(stream))[0]
    values = set()
    async with Client(sys_.cluster.brokers[0], timeout=10.0) as client:
        async for message in client.subscribe(stream, 0, start="earliest", stop_offset=high_watermark):
            values.add(message.value)
    return values


# ---- JetStream ------------------------------------------------------------------------------------


async def _rolling_jetstream(ctx: Context) -> list[dict[str, Any]]:
    import nats

    log(f"rolling_restart / jetstream: SIGTERM of each nats-server in turn (stream leader first); probes: "
        f"js publishes every {PROBE_INTERVAL * 1000:g} ms, {PROBE_TIMEOUT:g} s timeout each, through a "
        f"server not being restarted")
    async with JetStreamSystem(ctx, "rolling-jetstream", 3) as sys_:
        # One connection per server, to that server alone: the probes go through one that stays up.
        connections = [await nats.connect(servers=[s.url], max_reconnect_attempts=-1, reconnect_time_wait=0.2,
                                          error_cb=_expected_errors) for s in sys_.servers]
        try:
            probes = [JetStreamProbe(nc) for nc in connections]
            for probe in probes:
                await probe.start()

            async def trial(n: int, profiled: bool) -> dict[str, Any]:
                metrics = await _jetstream_round(ctx, sys_, connections, probes, f"rr{n}")
                log_round("jetstream", "SIGTERM", metrics)
                if metrics["lost"]:
                    metrics["error"] = f"{metrics['lost']} acked probes lost"
                return metrics

            return await run_trials(ctx, "rolling_restart", "jetstream", trial)
        finally:
            for nc in connections:
                with contextlib.suppress(Exception):
                    await nc.close()


async def _jetstream_round(ctx: Context, sys_: JetStreamSystem, connections: list[Any],
                           probes: list[JetStreamProbe], stream: str) -> dict[str, Any]:
    subject = f"{STREAM_SUBJECT_PREFIX}.{stream}"
    timeout = ctx.args.failover_timeout * 3
    await sys_.create_stream(stream, subject, 3)
    leader = _server_index((await sys_.js.stream_info(stream)).cluster.leader)
    order = [leader, *(i for i in range(sys_.size) if i != leader)]
    steps = []
    async with ProbeLoad(probes[(leader + 1) % sys_.size].acked_publish, subject, stream, ctx.payload_size) as load:
        await load.ack_after(now(), now() + timeout)
        await asyncio.sleep(SETTLE)
        for index in order:
            witness = (index + 1) % sys_.size
            await _connected(connections[witness], now() + timeout)
            load.publish = probes[witness].acked_publish
            steps.append(await _jetstream_restart(sys_, connections[witness], stream, index, load, now() + timeout))
            await asyncio.sleep(SETTLE)
    stored = await _jetstream_values(sys_, stream, subject)
    figures = round_figures(load, steps, stored, check_lost("jetstream", load, stored))
    await sys_.js.delete_stream(stream)
    return figures


async def _jetstream_restart(sys_: JetStreamSystem, witness: Any, stream: str, index: int, load: ProbeLoad,
                             deadline: float) -> Step:
    """SIGTERM one nats-server, start it again, and wait until its replica of the stream is current."""
    js = witness.jetstream(timeout=2)
    name = f"js{index}"
    role = "leader" if (await js.stream_info(stream)).cluster.leader == name else "follower"
    step = Step(name, role, "SIGTERM", at=now())
    step.exit = await sys_.stop_server(index, JETSTREAM_STOP_TIMEOUT)
    step.stop_s = now() - step.at
    await sys_.servers[index].start()
    step.ready_s = now() - step.at
    while True:
        try:
            info = await js.stream_info(stream)
            replicas = info.cluster.replicas or []
            if info.cluster.leader and len(replicas) == 2 and all(r.current and not r.offline for r in replicas):
                break
        except Exception:  # noqa: BLE001 - no stream leader for a moment
            pass
        if now() > deadline:
            raise BenchError(f"JetStream {stream}: {name}'s replica not current {now() - step.at:.0f} s "
                             "after its restart")
        await asyncio.sleep(0.05)
    await load.ack_after(now(), deadline)
    step.back_s = now() - step.at
    step.leader_after = (await js.stream_info(stream)).cluster.leader
    return step


async def _expected_errors(exc: Exception) -> None:
    """A connection's server stops and refuses it until it is back: nats-py's default would print each."""


def _server_index(name: str) -> int:
    return int(name.removeprefix("js"))


async def _connected(nc: Any, deadline: float) -> None:
    while not nc.is_connected:
        if now() > deadline:
            raise BenchError("a probe connection did not reconnect to its restarted server")
        await asyncio.sleep(0.05)


async def _jetstream_values(sys_: JetStreamSystem, stream: str, subject: str) -> set[bytes]:
    """Every value of the stream, through an ordered consumer from its first message to its last."""
    from nats.js.api import ConsumerConfig, DeliverPolicy

    last = (await sys_.js.stream_info(stream)).state.last_seq
    sub = await sys_.js.subscribe(subject, stream=stream, ordered_consumer=True,
                                  config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL))
    values = set()
    try:
        while True:
            msg = await sub.next_msg(timeout=5)
            values.add(msg.data)
            if msg.metadata.sequence.stream >= last:
                return values
    finally:
        await sub.unsubscribe()
