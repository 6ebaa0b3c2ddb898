"""A Jepsen-style nemesis: random faults, one at a time, on a 3-node cluster under ack-ALL load.

Stream "nemesis" (replication factor 3, min ISR 2) takes two continuous ack-ALL loads, both recording only
the acks they actually received: gRPC PublishAsync batches (cluster_checks.Publisher) and envelopes on the
stream's subject over plain NATS (EnvelopePublisher, the capture path); an Observer reads it all along. A
second stream, "churn", is deleted and created again from time to time; each of its generations gets its
own small publisher (gRPC for even generations, NATS envelopes for odd ones) whose values carry the
generation ("churn-g<gen>-<seq>").

The faults come from a seeded random.Random: SIGKILL of the partition leader, of a follower or of any node
(restarted after a short random pause, sometimes at once), SIGSTOP of any node for 0.5-6 s, power cut of the
leader or of a follower (LocalCluster(power_cuts=True)), a restart of the nats-server, SIGKILL of the
metadata (Raft) leader, and delete + create of "churn". Compound faults: two nodes SIGKILLed at once, and
the power cut of a follower at the moment the partition leader's process dies (restarted in either order,
the one that lost power first more often: the case where electing it would lose acks). Disk faults of the
power-cut disk on the partition logs (/streams) of one node for 0.5-6 s: full, failing fsync, slow fsync.
A step of one node's wall clock by a minute to two hours, either way (libfaketime). Each node has a
nats-server of its own, routed to the others through the test's proxies (LocalCluster(nats_cluster=True)),
and for 0.5-6 s the nemesis cuts every route of one server (the metadata Raft leader's, half the time), the
routes between two servers, or one direction between two. The faults that need
FUSE or libfaketime are left out, with the reason printed, where they are not available. Between two
faults the cluster must heal: every node answers, the metadata Raft group has a leader, the nodes agree on
a leader and an ISR of at least two for each stream, and the loads are acked again. A heal that does not
come within HEAL_TIMEOUT is a failure.

Then, faults stopped: all three replicas back in the ISR with one HW; every acked message at its offset,
offsets contiguous from 0, replicas identical (live through readISRReplica, then byte for byte in the
segment files of the stopped nodes below the HW), no offset ever read with two values, and "churn"
holding values of its current generation only (live, and anywhere in the files).

    BASCULE_NEMESIS_FAULTS=300 BASCULE_NEMESIS_SEED=1234 .venv/bin/pytest -s tests/integration/test_nemesis.py

The seed fixes the sequence of fault kinds, pauses and down times and the choice among candidates; which node
is leader when a fault comes still depends on the cluster's timing, so a replay follows the same script but
not always on the same nodes. Every failure message starts with the seed and lists the faults so far; the
cluster's directory (each node's bascule.log and files) is kept after a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field

import grpc
import pytest
from cluster_checks import (
    ALL_NODES,
    FAST,
    EnvelopePublisher,
    InvariantViolation,
    Publisher,
    Stored,
    agreed_partition,
    check_acked,
    check_contiguous,
    check_stored_logs,
    converged,
    create_stream,
    index_of,
    leader_epochs,
    leader_of,
    raft_leader_index,
    read_node,
    restart,
    running_observer,
    running_publisher,
    wait_for,
)

from bascule.client import BasculeError, Client
from bascule.testing.clock import SteppedClock, stepped_clock_unavailable_reason
from bascule.testing.local import LocalCluster
from bascule.testing.powercut import fuse_unavailable_reason
from bascule.wire.entry import decode_entries

# 20 in every `make test` (~3.5 s a fault, most of it the faults' own drawn durations and the restarts);
# `make soak` runs 300.
FAULTS = int(os.environ.get("BASCULE_NEMESIS_FAULTS", "20"))
SEED_ENV = "BASCULE_NEMESIS_SEED"

pytestmark = [pytest.mark.anyio, pytest.mark.cluster, pytest.mark.timeout(180 + 12 * FAULTS)]

STREAM = "nemesis"
CHURN = "churn"
# Mostly idle partitions (a write every QUIET_PAUSE, longer than FAST's idle wait): between writes their
# followers park in the fetch sessions, so every fault meets rounds carrying them too.
QUIET = [f"quiet-{i}" for i in range(4)]
QUIET_PAUSE = 1.5
HEAL_TIMEOUT = 30.0  # from the end of a fault until both streams have a leader and an ISR of 2 or more
CONVERGE_TIMEOUT = 60.0  # after the last fault, until all three replicas are in the ISR
CHURN_VALUE = re.compile(rb"^churn-g(\d+)-\d+$")

# kind -> weight. The power cuts and disk faults are left out without FUSE, clock steps without libfaketime.
KINDS: dict[str, int] = {
    "kill_leader": 3,
    "kill_follower": 2,
    "kill_any": 2,
    "pause": 3,
    "power_cut_leader": 3,
    "power_cut_follower": 2,
    "nats_restart": 1,
    "kill_raft_leader": 2,
    "churn": 2,
    "double_kill": 1,
    "cut_and_kill": 2,
    "disk_full": 1,
    "fsync_error": 1,
    "slow_fsync": 1,
    "clock_step": 2,
    "route_cut": 2,
    "route_cut_pair": 1,
    "route_cut_one_way": 1,
}
NEEDS_FUSE = frozenset({"power_cut_leader", "power_cut_follower", "cut_and_kill", "disk_full", "fsync_error",
                        "slow_fsync"})
NEEDS_FAKETIME = frozenset({"clock_step"})
LOGS = "/streams"  # disk faults hit the partition logs, not the Raft journal beside them


@dataclass
class Fault:
    number: int
    kind: str
    at: float  # seconds since the faults began
    node: str = "-"
    detail: str = ""
    healed_in: float | None = None
    after: str = ""

    def line(self) -> str:
        healed = f"healed in {self.healed_in:.1f} s" if self.healed_in is not None else "NOT HEALED"
        return (f"#{self.number:03d} t={self.at:6.1f}s {self.kind:<18} {self.node:<7} {self.detail}; "
                f"{healed}{'; ' + self.after if self.after else ''}")


@dataclass
class Draw:
    """Every random number a fault may use, drawn up front in a fixed order, so that the sequence of
    draws does not depend on which branch the cluster's state sends the fault down."""

    kind: str
    pick: float  # which candidate node
    down: float  # pause before the restart (0 = at once)
    stopped: float  # SIGSTOP duration, and how long a disk fault lasts
    nats_down: float
    pick2: float  # the second node of a compound fault
    lost_power_first: bool  # which of a compound fault's nodes restarts first
    fsync_delay: float
    clock_offset: int  # seconds

    @classmethod
    def take(cls, rng: random.Random, kinds: dict[str, int]) -> Draw:
        kind = rng.choices(list(kinds), weights=list(kinds.values()))[0]
        pick = rng.random()
        down = 0.0 if rng.random() < 0.3 else round(rng.uniform(0.1, 3.0), 2)
        stopped = round(rng.uniform(0.5, 6.0), 2)
        nats_down = 0.0 if rng.random() < 0.3 else round(rng.uniform(0.1, 2.5), 2)
        pick2 = rng.random()
        lost_power_first = rng.random() < 0.7
        fsync_delay = round(rng.uniform(0.1, 1.0), 2)
        clock_offset = rng.choice((-1, 1)) * rng.randint(60, 7200)
        return cls(kind, pick, down, stopped, nats_down, pick2, lost_power_first, fsync_delay, clock_offset)


@dataclass
class Nemesis:
    cluster: LocalCluster
    seed: int
    rng: random.Random
    kinds: dict[str, int]
    loads: list[Publisher]  # on STREAM: gRPC PublishAsync, and envelopes over NATS (the capture path)
    started: float = field(default_factory=time.monotonic)
    faults: list[Fault] = field(default_factory=list)
    churn_gen: int = 0
    churn_load: Publisher | None = None
    churn_acks: dict[int, int] = field(default_factory=dict)  # generation -> acked values
    churn_conflicts: list[str] = field(default_factory=list)
    cut_bytes: int = 0
    clocks: list[SteppedClock] = field(default_factory=list)  # each node's, with libfaketime

    # -- reporting --
    def history(self, last: int | None = None) -> str:
        shown = self.faults if last is None else self.faults[-last:]
        return "\n".join(f.line() for f in shown)

    def prefix(self) -> str:
        return f"[nemesis seed={self.seed}; replay with {SEED_ENV}={self.seed} BASCULE_NEMESIS_FAULTS={FAULTS}]"

    def fail(self, message: str) -> AssertionError:
        return AssertionError(f"{self.prefix()} {message}\nfaults:\n{self.history()}")

    # -- the churn stream --
    def start_churn_load(self) -> None:
        """Even generations are published through gRPC, odd ones as envelopes on the subject "churn.in",
        which every generation shares (the capture path)."""
        kind = Publisher if self.churn_gen % 2 == 0 else EnvelopePublisher
        self.churn_load = kind(self.cluster, CHURN, batch=2, pause=0.2, tag=f"churn-g{self.churn_gen}").start()

    async def stop_churn_load(self) -> None:
        if self.churn_load is not None:
            await self.churn_load.stop()
            self.churn_acks[self.churn_gen] = len(self.churn_load.acked)
            self.churn_conflicts += [f"gen {self.churn_gen}: {c}" for c in self.churn_load.conflicts]

    # -- node choice --
    async def partition_roles(self) -> tuple[int, list[int]]:
        info = await wait_for(lambda: agreed_partition(self.cluster, STREAM, ALL_NODES), 15,
                              f"{STREAM}: the nodes to agree on a leader", self.cluster)
        leader = index_of(self.cluster, info.leader)
        return leader, [i for i in ALL_NODES if i != leader]

    @staticmethod
    def choose(candidates: list[int], pick: float) -> int:
        return sorted(candidates)[min(int(pick * len(candidates)), len(candidates) - 1)]

    # -- faults --
    async def run(self, count: int) -> None:
        for number in range(1, count + 1):
            draw = Draw.take(self.rng, self.kinds)
            fault = Fault(number, draw.kind, round(time.monotonic() - self.started, 1))
            self.faults.append(fault)
            await self.inject(fault, draw)
            healed_from = time.monotonic()
            fault.after = await self.heal(fault)
            fault.healed_in = time.monotonic() - healed_from
            print(fault.line(), flush=True)

    async def inject(self, fault: Fault, draw: Draw) -> None:
        cluster = self.cluster
        kind = fault.kind
        if kind in ("kill_leader", "kill_follower", "kill_any", "power_cut_leader", "power_cut_follower", "pause"):
            leader, followers = await self.partition_roles()
            if kind.endswith("leader"):
                target = leader
            elif kind.endswith("follower"):
                target = self.choose(followers, draw.pick)
            else:
                target = self.choose(ALL_NODES, draw.pick)
            fault.node = cluster.node(target).server_id
            role = "leader" if target == leader else "follower"
            if kind == "pause":
                await asyncio.to_thread(cluster.pause, target)
                try:
                    await asyncio.sleep(draw.stopped)
                finally:
                    await asyncio.to_thread(cluster.resume, target)
                fault.detail = f"({role}) stopped {draw.stopped:.1f} s"
                return
            if kind.startswith("power_cut"):
                cut = await asyncio.to_thread(cluster.power_cut, target)
                self.cut_bytes += cut.get("bytes_dropped", 0)
                fault.detail = (f"({role}) dropped {cut.get('bytes_dropped', 0)} B "
                                f"({cut.get('files_rolled_back', 0)} files rolled back, "
                                f"{cut.get('files_removed', 0)} removed); ")
            else:
                await asyncio.to_thread(cluster.kill, target)
                fault.detail = f"({role}) "
            await asyncio.sleep(draw.down)
            await restart(cluster, target)
            fault.detail += f"down {draw.down:.1f} s before the restart"
        elif kind == "kill_raft_leader":
            target = await wait_for(lambda: raft_leader_index(cluster), 15, "a metadata Raft leader", cluster)
            leader, _ = await self.partition_roles()
            fault.node = cluster.node(target).server_id
            await asyncio.to_thread(cluster.kill, target)
            await asyncio.sleep(draw.down)
            await restart(cluster, target)
            role = "also partition leader" if target == leader else "partition follower"
            fault.detail = f"({role}) down {draw.down:.1f} s before the restart"
        elif kind in ("double_kill", "cut_and_kill"):
            await self.two_down(fault, draw)
        elif kind in ("disk_full", "fsync_error", "slow_fsync"):
            target = self.choose(ALL_NODES, draw.pick)
            leader, _ = await self.partition_roles()
            fault.node = cluster.node(target).server_id
            faults = {"disk_full": {"full": True}, "fsync_error": {"fsync_error": True},
                      "slow_fsync": {"fsync_delay": draw.fsync_delay}}[kind]
            await asyncio.to_thread(cluster.disk_faults, target, prefix=LOGS, **faults)
            try:
                await asyncio.sleep(draw.stopped)
            finally:
                await asyncio.to_thread(cluster.disk_faults, target)
            role = "leader" if target == leader else "follower"
            fault.detail = f"({role}) {faults} for {draw.stopped:.1f} s"
        elif kind.startswith("route_cut"):
            await self.cut_routes(fault, draw)
        elif kind == "clock_step":
            target = self.choose(ALL_NODES, draw.pick)
            fault.node = cluster.node(target).server_id
            await asyncio.to_thread(self.clocks[target].step, draw.clock_offset)
            fault.detail = f"wall clock now {draw.clock_offset:+d} s from the others'"
        elif kind == "nats_restart":
            await asyncio.to_thread(cluster.restart_nats, draw.nats_down)
            fault.detail = f"down {draw.nats_down:.1f} s"
        elif kind == "churn":
            via = self.choose(ALL_NODES, draw.pick)
            fault.node = cluster.node(via).server_id
            async with Client(cluster.node(via).address, timeout=10) as client:
                await client.delete_stream(CHURN)
                # The old generation's publisher stops only now: publishes of it may be in flight during the
                # delete. None of them is sent after this point, so the new generation must never hold one.
                await self.stop_churn_load()
                acked = self.churn_acks[self.churn_gen]
                self.churn_gen += 1
                try:
                    await client.create_stream(CHURN, f"{CHURN}.in", replication_factor=3, min_isr=2)
                except BasculeError as exc:
                    # A retried create whose first try committed, its answer lost (seen on a loaded machine):
                    # the delete above committed, and nothing else creates churn, so the stream is this one.
                    if exc.code != grpc.StatusCode.ALREADY_EXISTS:
                        raise
            self.start_churn_load()
            fault.detail = f"gen {self.churn_gen - 1} ({acked} acked) deleted, gen {self.churn_gen} created"
        else:
            raise AssertionError(f"unknown fault kind {kind}")

    async def cut_routes(self, fault: Fault, draw: Draw) -> None:
        cluster = self.cluster
        routes = cluster.routes
        assert routes is not None
        first = self.choose(ALL_NODES, draw.pick)
        if fault.kind == "route_cut" and draw.lost_power_first:
            first = await wait_for(lambda: raft_leader_index(cluster), 15, "a metadata Raft leader", cluster)
        second = self.choose([i for i in ALL_NODES if i != first], draw.pick2)
        if fault.kind == "route_cut":
            await asyncio.to_thread(routes.cut_server, first)
            fault.node, fault.detail = cluster.node(first).server_id, "every route of its server"
        elif fault.kind == "route_cut_pair":
            await asyncio.to_thread(routes.cut_pair, first, second)
            fault.node = f"{cluster.node(first).server_id}+{cluster.node(second).server_id}"
            fault.detail = "their route"
        else:
            await asyncio.to_thread(routes.cut_one_way, first, second)
            fault.node = f"{cluster.node(first).server_id}>{cluster.node(second).server_id}"
            fault.detail = "one way"
        try:
            await asyncio.sleep(draw.stopped)
        finally:
            await asyncio.to_thread(routes.heal)
        fault.detail += f" cut for {draw.stopped:.1f} s"

    async def two_down(self, fault: Fault, draw: Draw) -> None:
        """Two nodes at once: both SIGKILLed, or the partition leader SIGKILLed as a follower loses
        power; restarted one after the other."""
        cluster = self.cluster
        leader, followers = await self.partition_roles()
        if fault.kind == "cut_and_kill":
            first, second = self.choose(followers, draw.pick), leader
            cut = await asyncio.gather(asyncio.to_thread(cluster.kill, leader),
                                       asyncio.to_thread(cluster.power_cut, first))
            self.cut_bytes += cut[1].get("bytes_dropped", 0)
            fault.detail = f"leader killed as follower lost power ({cut[1].get('bytes_dropped', 0)} B dropped); "
            if not draw.lost_power_first:
                first, second = second, first
        else:
            first = self.choose(ALL_NODES, draw.pick)
            second = self.choose([i for i in ALL_NODES if i != first], draw.pick2)
            await asyncio.gather(asyncio.to_thread(cluster.kill, first), asyncio.to_thread(cluster.kill, second))
            fault.detail = f"({'leader' if leader in (first, second) else 'followers'}) "
        fault.node = f"{cluster.node(first).server_id}+{cluster.node(second).server_id}"
        await asyncio.sleep(draw.down)
        for index in (first, second):
            node = cluster.node(index)
            node.start(wait=False)
            # Alone, the first cannot be ready (no Raft majority): the second starts soon after.
            await asyncio.sleep(min(draw.down, 1.0))
        for index in (first, second):
            await asyncio.to_thread(cluster.node(index).wait_ready, 30, cluster.running_server_ids)
        fault.detail += f"down {draw.down:.1f} s, {cluster.node(first).server_id} restarted first"

    async def heal(self, fault: Fault) -> str:
        """Until every node answers, Raft has a leader, the nodes agree on a leader and an ISR of at least two
        for both streams, and the loads are acked again. A summary of the state healed to."""
        cluster = self.cluster
        down = [cluster.node(i).server_id for i in ALL_NODES if not cluster.node(i).running]
        if down:
            raise self.fail(f"after fault #{fault.number}, nodes are not running: {down}")
        try:
            raft_leader = await wait_for(lambda: raft_leader_index(cluster), HEAL_TIMEOUT, "a metadata Raft leader",
                                         cluster)
        except AssertionError as exc:
            raise self.fail(f"fault #{fault.number} ({fault.kind}) did not heal: {exc}") from None
        found = {}
        for stream in (STREAM, CHURN):
            async def healthy(stream: str = stream):
                info = await agreed_partition(cluster, stream, ALL_NODES)
                if info is None or info.leader not in info.isr or len(info.isr) < 2:
                    return None
                return info

            try:
                found[stream] = await wait_for(healthy, HEAL_TIMEOUT,
                                               f"{stream}: a leader and an ISR of 2 or more", cluster)
            except AssertionError as exc:
                raise self.fail(f"fault #{fault.number} ({fault.kind}) did not heal: {exc}") from None
        try:
            for load in self.loads:
                await load.wait_acks(2, HEAL_TIMEOUT)
            assert self.churn_load is not None
            await self.churn_load.wait_acks(1, HEAL_TIMEOUT)
        except AssertionError as exc:
            raise self.fail(f"fault #{fault.number} ({fault.kind}): the load did not resume: {exc}") from None
        if fault.kind == "churn":
            await self.check_churn_live(found[CHURN].isr)
        info = found[STREAM]
        return f"leader {info.leader} isr {sorted(info.isr)} raft leader {cluster.node(raft_leader).server_id}"

    async def check_churn_live(self, isr: list[str]) -> None:
        """Every ISR member of the current churn generation serves values of that generation only."""
        for server_id in sorted(isr):
            node = self.cluster.node(index_of(self.cluster, server_id))
            try:
                messages = await read_node(node.address, CHURN)
            except grpc.aio.AioRpcError:
                continue  # it left the ISR meanwhile, or is no longer leader: read at the end
            foreign = foreign_churn_values([(m.offset, m.value) for m in messages], self.churn_gen)
            if foreign:
                raise self.fail(f"{server_id} serves {len(foreign)} values of another generation in churn "
                                f"gen {self.churn_gen}: {foreign[:5]}")


def foreign_churn_values(values: list[tuple[int, bytes]], generation: int) -> list[tuple[int, bytes]]:
    found = []
    for offset, value in values:
        match = CHURN_VALUE.match(value)
        if match is None or int(match.group(1)) != generation:
            found.append((offset, value))
    return found


async def check_live_replicas(cluster: LocalCluster, stream: str, acked: dict[int, bytes]) -> list[Stored]:
    """check_live's checks, with a read timeout for long logs, and on every replica: all three in the ISR with
    one HW; each node's committed messages (the leader's read plainly, the others' with readISRReplica)
    contiguous from 0, holding every acked message, and the same on every node. The leader's messages."""
    info = await wait_for(lambda: converged(cluster, stream, ALL_NODES), CONVERGE_TIMEOUT,
                          f"{stream}: all three replicas in the ISR with one HW", cluster)
    read_timeout = 30 + len(acked) / 1000
    logs: dict[str, list[Stored]] = {}
    for i in ALL_NODES:
        node = cluster.node(i)
        leader = node.server_id == info.leader
        messages = await read_node(node.address, stream, isr_replica=not leader, timeout=read_timeout)
        who = f"{stream} on {'leader ' if leader else ''}{node.server_id}"
        check_contiguous(messages, who)
        check_acked(messages, acked, who)
        logs[node.server_id] = messages
    theirs = logs[info.leader]
    for server_id, mine in logs.items():
        for a, b in zip(mine, theirs):
            if a != b:
                raise InvariantViolation(f"{stream}: {server_id} differs from leader {info.leader} at offset "
                                         f"{a.offset}: {a} != {b}")
        if len(mine) != len(theirs):
            raise InvariantViolation(f"{stream}: {server_id} serves {len(mine)} committed messages, leader "
                                     f"{info.leader} {len(theirs)}, with one HW {info.high_watermark}")
    return theirs


def nemesis_seed() -> int:
    text = os.environ.get(SEED_ENV)
    return int(text) if text else random.SystemRandom().randrange(1 << 32)


async def test_nemesis() -> None:
    seed = nemesis_seed()
    kinds = dict(KINDS)
    reason = fuse_unavailable_reason()
    clock_reason = stepped_clock_unavailable_reason()
    if reason is not None:
        kinds = {k: w for k, w in kinds.items() if k not in NEEDS_FUSE}
    if clock_reason is not None:
        kinds = {k: w for k, w in kinds.items() if k not in NEEDS_FAKETIME}
    print(f"\nnemesis: seed {seed} ({SEED_ENV}={seed} to replay), {FAULTS} faults, kinds {sorted(kinds)}", flush=True)
    if reason is not None:
        print(f"nemesis: no power-cut or disk faults: FUSE unavailable: {reason}", flush=True)
    if clock_reason is not None:
        print(f"nemesis: no clock steps: {clock_reason}", flush=True)
    rng = random.Random(seed)
    began = time.monotonic()
    nemesis: Nemesis | None = None
    cluster = LocalCluster(3, config=FAST, power_cuts=reason is None, nats_cluster=True)
    clocks = [SteppedClock(cluster.base_dir / f".clock-{i}") for i in ALL_NODES] if clock_reason is None else []
    for node, clock in zip(cluster.nodes, clocks):
        node.extra_env.update(clock.env())
    with cluster:
        print(f"nemesis: cluster in {cluster.base_dir} (kept after a failure)", flush=True)
        try:
            for name in (STREAM, CHURN, *QUIET):
                await create_stream(cluster, name)
            async with running_observer(cluster, STREAM) as reader, \
                    running_publisher(cluster, STREAM, batch=10) as load, \
                    running_publisher(cluster, STREAM, kind=EnvelopePublisher, batch=10, pause=0.05,
                                      tag="e") as eload, \
                    contextlib.AsyncExitStack() as quiet_loads:
                quiet = [await quiet_loads.enter_async_context(
                    running_publisher(cluster, name, batch=1, pause=QUIET_PAUSE, tag="q")) for name in QUIET]
                nemesis = Nemesis(cluster, seed, rng, kinds, [load, eload], clocks=clocks)
                nemesis.start_churn_load()
                try:
                    await load.wait_acks(5, 15)
                    await eload.wait_acks(5, 15)
                    await nemesis.run(FAULTS)
                    faulted = time.monotonic() - nemesis.started
                    # Faults stopped: all three back in the ISR with one HW, under load.
                    for stream in (STREAM, CHURN, *QUIET):
                        await wait_for(lambda stream=stream: converged(cluster, stream, ALL_NODES), CONVERGE_TIMEOUT,
                                       f"{stream}: all three replicas in the ISR with one HW", cluster)
                    await load.wait_acks(5, 15)
                    await eload.wait_acks(5, 15)
                finally:
                    await nemesis.stop_churn_load()
            # Load stopped: read everything, live, then from the files.
            acked = dict(load.acked)
            conflicts = load.conflicts + eload.conflicts + nemesis.churn_conflicts
            for offset, value in eload.acked.items():
                if acked.setdefault(offset, value) != value:
                    conflicts.append(f"offset {offset} acked for {acked[offset]!r} (gRPC) and for {value!r} (NATS)")
            if conflicts:
                raise InvariantViolation(f"two acks named one offset: {conflicts[:5]}")
            final = await check_live_replicas(cluster, STREAM, acked)
            reader.check(final)
            churn_final = await check_live_replicas(cluster, CHURN, nemesis.churn_load.acked)
            for name, quiet_load in zip(QUIET, quiet):
                if quiet_load.conflicts:
                    raise InvariantViolation(f"{name}: two acks named one offset: {quiet_load.conflicts[:5]}")
                await check_live_replicas(cluster, name, quiet_load.acked)
            for i in ALL_NODES:
                messages = await read_node(cluster.node(i).address, CHURN, isr_replica=True)
                foreign = foreign_churn_values([(m.offset, m.value) for m in messages], nemesis.churn_gen)
                if foreign:
                    raise InvariantViolation(f"{cluster.node(i).server_id} serves churn values of another generation "
                                             f"than {nemesis.churn_gen}: {foreign[:5]}")
            leader = index_of(cluster, await leader_of(cluster, STREAM))
            epochs = leader_epochs(cluster, leader, STREAM)

            cluster.stop()
            check_stored_logs(cluster, STREAM, acked)
            churn_logs = check_stored_logs(cluster, CHURN, nemesis.churn_load.acked)
            for name, quiet_load in zip(QUIET, quiet):
                check_stored_logs(cluster, name, quiet_load.acked)
            for i, stored in zip(ALL_NODES, churn_logs):
                values = [(o, decode_entries(raw)[0].value) for o, raw in enumerate(stored.entries)]
                foreign = foreign_churn_values(values, nemesis.churn_gen)
                if foreign:
                    raise InvariantViolation(
                        f"{stored.server_id}'s files of churn gen {nemesis.churn_gen} hold {len(foreign)} values of "
                        f"another generation (HW {stored.hw}): {foreign[:5]}")
                incarnations = sorted(p.name for p in (cluster.node(i).stored_dir / "streams").glob(f"{CHURN}@*"))
                if len(incarnations) != 1:
                    raise InvariantViolation(f"{stored.server_id} keeps files of deleted churn generations: "
                                             f"{incarnations}")
        except Exception as exc:
            if nemesis is None:
                raise AssertionError(f"[nemesis seed={seed}] before the first fault: {type(exc).__name__}: {exc}") \
                    from exc
            if isinstance(exc, AssertionError) and str(exc).startswith("[nemesis seed="):
                raise
            raise nemesis.fail(f"{type(exc).__name__}: {exc}") from exc

    kinds_done = Counter(f.kind for f in nemesis.faults)
    print(f"nemesis: seed {seed}: {len(nemesis.faults)} faults in {faulted:.0f} s ({time.monotonic() - began:.0f} s "
          f"in all): {dict(sorted(kinds_done.items()))}", flush=True)
    print(f"nemesis: stream {STREAM}: {len(acked)} acked ({len(load.acked)} of {load.values_sent} sent through gRPC, "
          f"{len(eload.acked)} of {eload.values_sent} over NATS), {len(final)} stored, {load.failures} + "
          f"{eload.failures} failed batches {dict(load.errors + eload.errors)}, "
          f"{len(reader.seen)} read by the observer, "
          f"{len(epochs)} leader epochs; churn: {nemesis.churn_gen + 1} generations, acks per generation "
          f"{nemesis.churn_acks}, {len(churn_final)} stored in the last; quiet streams: "
          f"{[len(q.acked) for q in quiet]} acked; power cuts dropped {nemesis.cut_bytes} B",
          flush=True)
    if load.error_messages:
        print(f"nemesis: first publish errors: {load.error_messages[:5]}", flush=True)
