"""One simulated run from a seed: a cluster, a writer acking with ALL, a schedule of faults, the
invariants checked throughout, then every fault healed and the cluster left to converge.

Everything random (the cluster's shape, the faults and when they come, the bus's drops, duplicates
and delays, the metadata's delays and elections, disk delays, clock rates) is drawn from
``random.Random(seed)``, and the run is on virtual time, so a seed replays step for step (in another
process too, with the same PYTHONHASHSEED: ``make simulate`` fixes it).
"""

from __future__ import annotations

import asyncio
import random
import time
import traceback
from dataclasses import dataclass, field

from bascule.simulation.cluster import SimCluster, find_violation, run_on_virtual_time, scratch_directory
from bascule.testing.bus import Faults

FAULT_KINDS = (
    "kill", "power_cut", "restart", "isolate", "cut_bus", "split_bus", "cut_one_way", "cut_metadata",
    "lossy_network", "move_metadata_leader", "slow_disk", "disk_full", "fsync_error",
    "leader_dies_follower_loses_power",
)
SETTLE_TIME = 60.0  # virtual seconds the healed cluster gets to converge


@dataclass(frozen=True)
class Shape:
    """A run's cluster and schedule, drawn from its seed."""

    nodes: int
    partitions: int
    min_isr: int
    sync: str  # streams.sync: "never" or "always"
    faults: int
    fault_time: float  # virtual seconds the faults come in

    @classmethod
    def draw(cls, source: random.Random, faults: int | None = None, quick: bool = False) -> Shape:
        """A full run: 3 or 5 nodes, 2-8 faults over 4-12 s. A quick one (many of them in a minute):
        3 nodes, one partition, 1-4 faults over 1-3 s."""
        if quick:
            return cls(
                nodes=3, partitions=1, min_isr=source.choice((1, 2)), sync=source.choice(("never", "never", "always")),
                faults=source.randint(1, 4) if faults is None else faults, fault_time=source.uniform(1.0, 3.0),
            )
        return cls(
            nodes=source.choice((3, 3, 5)), partitions=source.choice((1, 1, 2)), min_isr=source.choice((1, 2)),
            sync=source.choice(("never", "never", "always")),
            faults=source.randint(2, 8) if faults is None else faults, fault_time=source.uniform(4.0, 12.0),
        )


@dataclass
class RunOutcome:
    seed: int
    shape: Shape
    error: str | None
    trace: list[str]
    acked: int = 0
    lost_to_power: int = 0
    virtual_seconds: float = 0.0
    wall_seconds: float = 0.0
    faults: list[str] = field(default_factory=list)
    quick: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None

    def report(self) -> str:
        lines = [f"seed {self.seed}: {'ok' if self.ok else 'FAILED'}: {self.shape}",
                 f"  {self.acked} acked ({self.lost_to_power} lost to power cuts), "
                 f"{self.virtual_seconds:.1f} virtual s in {self.wall_seconds:.2f} s"]
        if not self.ok:
            lines += ["  faults: " + ", ".join(self.faults), f"  error: {self.error}", "  trace (latest last):"]
            lines += [f"    {line}" for line in self.trace]
            lines.append(f"  replay: make simulate SEEDS={self.seed}{' QUICK=1' if self.quick else ''}")
        return "\n".join(lines)


def simulate(seed: int, faults: int | None = None, quick: bool = False) -> RunOutcome:
    """Run the simulation of ``seed`` (with ``faults`` faults instead of a drawn number; ``quick``:
    the short shape, see ``Shape.draw``)."""
    source = random.Random(seed)
    shape = Shape.draw(source, faults, quick)
    started = time.monotonic()
    with scratch_directory() as root:
        cluster = SimCluster(source, root, shape.nodes, shape.partitions, shape.min_isr, shape.sync)
        run = Run(cluster, shape)
        error = None
        try:
            run_on_virtual_time(cluster, run.run)
        except Exception as exc:  # a bug anywhere is a failed run too, with its traceback in the trace
            violation = find_violation(exc)
            if violation is not None:
                error = str(violation)
            else:
                error = "".join(traceback.format_exception_only(exc)).strip()
                cluster.trace(traceback.format_exc())
    invariants = cluster.invariants
    return RunOutcome(
        seed, shape, error, list(cluster.trace_lines), sum(len(acks) for acks in invariants.acked.values()),
        invariants.exempt_acks, cluster.now, time.monotonic() - started, run.fault_log, quick,
    )


class Run:
    def __init__(self, cluster: SimCluster, shape: Shape) -> None:
        self.cluster = cluster
        self.shape = shape
        self.random = cluster.random
        self.fault_log: list[str] = []

    async def run(self) -> None:
        cluster = self.cluster
        await cluster.start()
        async with asyncio.TaskGroup() as group:
            checker = group.create_task(cluster.keep_checking())
            writer = group.create_task(cluster.keep_writing())
            await self._faults(group)
            cluster.heal()
            writer.cancel()
            await cluster.settle(SETTLE_TIME)
            checker.cancel()
        cluster.final()

    async def _faults(self, group: asyncio.TaskGroup) -> None:
        shape, nodes = self.shape, sorted(self.cluster.nodes)
        plan = sorted(
            (self.random.uniform(0.5, shape.fault_time), self.random.choice(FAULT_KINDS),
             self.random.choice(nodes), self.random.uniform(0.2, 4.0))
            for _ in range(shape.faults)
        )
        self.fault_log = [f"{kind} {node} at {at:.2f} for {duration:.2f}" for at, kind, node, duration in plan]
        faults = [group.create_task(self._fault(at, kind, node, duration)) for at, kind, node, duration in plan]
        await asyncio.sleep(shape.fault_time)
        await asyncio.gather(*faults)

    async def _leader_dies_follower_loses_power(self, duration: float) -> None:
        """The compound fault of KIP-966 (the compound-faults issue): the partition's other followers
        are killed, long enough for the ISR to shrink to the leader and one follower; then the
        leader's process dies as that follower loses power, and everyone but the leader comes back
        first."""
        cluster = self.cluster
        partition = self.random.randrange(self.shape.partitions)
        current = cluster.metadata.state.partition("sim", partition)
        if current is None or current.leader is None or not cluster.nodes[current.leader].up:
            return
        leader = cluster.nodes[current.leader]
        followers = sorted(set(current.isr) - {leader.id})
        if not followers:
            return
        follower = cluster.nodes[self.random.choice(followers)]
        others = [cluster.nodes[f] for f in sorted(set(current.replicas) - {leader.id, follower.id})]
        for other in others:
            cluster.kill(other.id)
        await asyncio.sleep(2.0)  # beyond the lag time: the ISR shrinks to the leader and the follower
        if not leader.up or not follower.up:
            return
        cluster.kill(leader.id)
        cluster.power_cut(follower.id)
        await asyncio.sleep(duration / 2)
        for node in (follower, *others):
            if not node.up:
                node.start()
        await asyncio.sleep(duration / 2)
        if not leader.up:
            leader.start()

    async def _fault(self, at: float, kind: str, node_id: str, duration: float) -> None:
        await asyncio.sleep(at)
        cluster, node = self.cluster, self.cluster.nodes[node_id]
        cluster.trace(f"fault: {kind} {node_id} for {duration:.2f} s")
        if kind == "leader_dies_follower_loses_power":
            await self._leader_dies_follower_loses_power(duration)
        elif kind in ("kill", "power_cut"):
            if not node.up:
                return
            cluster.power_cut(node_id) if kind == "power_cut" else cluster.kill(node_id)
            await asyncio.sleep(duration)
            if not node.up:
                node.start()
        elif kind == "restart":
            await node.stop()
            await asyncio.sleep(min(duration, 0.5))
            if not node.up:
                node.start()
        elif kind == "isolate":
            cluster.isolate(node_id)
            await asyncio.sleep(duration)
            cluster.heal_network()
        elif kind == "cut_bus":
            cluster.bus.partition({node_id}, set(cluster.nodes) - {node_id})
            await asyncio.sleep(duration)
            cluster.bus.heal()
        elif kind == "split_bus":
            others = sorted(set(cluster.nodes) - {node_id})
            side = {node_id, *self.random.sample(others, self.random.randrange(len(others)))}
            cluster.bus.partition(side, set(cluster.nodes) - side)
            await asyncio.sleep(duration)
            cluster.bus.heal()
        elif kind == "cut_one_way":
            cluster.bus.cut_one_way(node_id, self.random.choice(sorted(set(cluster.nodes) - {node_id})))
            await asyncio.sleep(duration)
            cluster.bus.heal()
        elif kind == "cut_metadata":
            cluster.metadata.cut(node_id)
            await asyncio.sleep(duration)
            cluster.metadata.reconnect()
        elif kind == "lossy_network":
            cluster.bus.faults = Faults(drop=self.random.uniform(0.0, 0.3), duplicate=self.random.uniform(0.0, 0.2),
                                        delay=(0.0, self.random.uniform(0.0, 0.05)))
            await asyncio.sleep(duration)
            cluster.bus.faults = Faults()
        elif kind == "move_metadata_leader":
            cluster.metadata.move_leader()
        elif kind in ("disk_full", "fsync_error"):
            faulty = cluster.disks.full if kind == "disk_full" else cluster.disks.fsync_failing
            streams = node.data_dir / "streams"
            faulty.add(streams)
            await asyncio.sleep(duration)
            faulty.discard(streams)
        elif kind == "slow_disk":
            cluster.disk_slowness = self.random.uniform(0.01, 0.5)
            await asyncio.sleep(duration)
            cluster.disk_slowness = 0.0
