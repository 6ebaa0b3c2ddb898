"""One simulated run from a seed: a cluster, a writer acking with ALL, a schedule of faults, the
invariants checked throughout, then every fault healed and the cluster left to converge.

Everything random (the cluster's shape, the faults and when they come, the bus's drops, duplicates
and delays, the metadata's delays and elections, disk delays, clock rates) is drawn from
``random.Random(seed)``, and the run is on virtual time, so a seed replays step for step (in another
process too, with the same PYTHONHASHSEED: ``make simulate`` fixes it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import shutil
import tempfile
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from bascule.config import load_config
from bascule.metadata.raft import MetadataError, NoMetadataLeader
from bascule.node.capture import when_ackable
from bascule.partition.replica import Outcome, PartitionReplica
from bascule.simulation.cluster import SimNode, drifting_clock
from bascule.simulation.disk import DiskFaults
from bascule.simulation.invariants import Invariants, Key, Violation
from bascule.simulation.metadata import MetadataLog
from bascule.testing import virtual_time
from bascule.testing.bus import Faults, MemoryBus
from bascule.wire import capture
from bascule.wire.entry import Record

STREAM = "sim"
TRACE_LINES = 400
CHECK_EVERY = 0.02
# Within the lease's bound (lease.LEASE_FRACTION): rates apart by at most twice this.
MAX_CLOCK_DRIFT = 0.03
FAULT_KINDS = (
    "kill", "power_cut", "restart", "isolate", "cut_bus", "cut_one_way", "cut_metadata", "lossy_network",
    "move_metadata_leader", "slow_disk", "disk_full", "fsync_error",
)


@dataclass(frozen=True)
class Shape:
    """A run's cluster and schedule, drawn from its seed."""

    nodes: int
    partitions: int
    min_isr: int
    sync: str  # streams.sync: "never" or "always"
    faults: int
    fault_time: float  # virtual seconds the faults come in
    settle_time: float = 60.0  # virtual seconds the healed cluster gets to converge

    @classmethod
    def draw(cls, source: random.Random, faults: int | None = None) -> Shape:
        nodes = source.choice((3, 3, 5))
        return cls(
            nodes=nodes, partitions=source.choice((1, 1, 2)), min_isr=source.choice((1, 2)),
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
            lines.append(f"  replay: make simulate SEEDS={self.seed}")
        return "\n".join(lines)


def simulate(seed: int, faults: int | None = None) -> RunOutcome:
    """Run the simulation of ``seed`` (with ``faults`` faults instead of a drawn number)."""
    source = random.Random(seed)
    shape = Shape.draw(source, faults)
    started = time.monotonic()
    with _scratch() as root, _quiet():
        simulation = Simulation(seed, source, shape, root)
        error = None
        try:
            with simulation.disks.installed():
                virtual_time.run(simulation.run, executor_delay=simulation.disk_delay)
        except Exception as exc:  # a bug anywhere is a failed run too, with its traceback in the trace
            violation = _violation(exc)
            if violation is not None:
                error = str(violation)
            else:
                error = "".join(traceback.format_exception_only(exc)).strip()
                simulation.trace(traceback.format_exc())
    return RunOutcome(
        seed, shape, error, list(simulation.trace_lines), sum(len(a) for a in simulation.invariants.acked.values()),
        simulation.invariants.exempt_acks, simulation.now, time.monotonic() - started, simulation.fault_log,
    )


class Simulation:
    def __init__(self, seed: int, source: random.Random, shape: Shape, root: Path) -> None:
        self.seed = seed
        self.random = source
        self.shape = shape
        self._loop: asyncio.AbstractEventLoop | None = None
        self.trace_lines: deque[str] = deque(maxlen=TRACE_LINES)
        self.fault_log: list[str] = []
        self.bus = MemoryBus(seed=source.randrange(1 << 32))
        self.metadata = MetadataLog(
            random.Random(source.randrange(1 << 32)), self.trace, apply_delay=(0.001, 0.05),
            election_delay=(0.2, 1.5), lost_answer=0.02,
        )
        self.invariants = Invariants(lambda: self.now)
        self.violation: Violation | None = None
        self.disks = DiskFaults()
        self._disk_delay = 0.0
        self._disk_random = random.Random(source.randrange(1 << 32))
        config = load_config(None, {
            "data.dir": str(root), "clustering.min.insync.replicas": shape.min_isr,
            "clustering.replica.max.lag.time": 1.0, "clustering.replica.max.leader.timeout": 1.0,
            "clustering.replica.max.idle.wait": 0.2, "clustering.replica.fetch.timeout": 0.3,
            "streams.sync": shape.sync, "cursors.stream.partitions": 0,
        })
        self.nodes = {
            node_id: SimNode(node_id, root / node_id, config, self.bus, self.metadata, self.live,
                             *drifting_clock(source, MAX_CLOCK_DRIFT), self.trace)
            for node_id in (f"n{i}" for i in range(shape.nodes))
        }
        self._sequence = 0

    @property
    def now(self) -> float:
        return 0.0 if self._loop is None else self._loop.time()

    def trace(self, line: str) -> None:
        self.trace_lines.append(f"{self.now:8.3f} {line}")

    def live(self) -> list[str]:
        return sorted(node_id for node_id, node in self.nodes.items() if node.up)

    def disk_delay(self) -> float:
        """When a thread's job (an fsync, a log opening) is seen done: at once, or later on a slow disk."""
        return self._disk_random.uniform(0.0, self._disk_delay) if self._disk_delay else 0.0

    @property
    def keys(self) -> list[Key]:
        return [(STREAM, p) for p in range(self.shape.partitions)]

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        for node in self.nodes.values():
            node.start()
        await self._create_stream()
        async with asyncio.TaskGroup() as group:
            checker = group.create_task(self._check())
            writer = group.create_task(self._write())
            await self._faults(group)
            self._heal()
            writer.cancel()
            await self._settle()
            checker.cancel()
        self._final()

    async def _create_stream(self) -> None:
        async def created() -> None:
            while STREAM not in self.metadata.state.streams:
                leader = self.metadata.leader
                node = self.nodes.get(leader) if leader else None
                brokers = self.metadata.state.brokers
                if node is not None and node.core is not None and len(brokers) == len(self.nodes):
                    try:
                        await node.core.metadata.call(
                            "create_stream", name=STREAM, subject=STREAM, group="",
                            replication_factor=len(self.nodes), partitions=self.shape.partitions, settings={},
                        )
                    except (MetadataError, NoMetadataLeader) as exc:
                        self.trace(f"create_stream: {exc}")
                await asyncio.sleep(0.1)

        await asyncio.wait_for(created(), 30.0)

    # ---- the writer -------------------------------------------------------------------------

    async def _write(self) -> None:
        """Publish unique values with ack policy ALL to each partition's leader, as the API does."""
        while True:
            await asyncio.sleep(self.random.uniform(0.002, 0.03))
            partition = self.random.randrange(self.shape.partitions)
            replica = self._leading_replica(partition)
            if replica is None:
                continue
            self._sequence += 1
            value = b"v%d" % self._sequence
            node = replica.leader
            try:
                replica.submit([Record(value)], self._written(replica, node, value), 0.0005)
            except Exception:  # NotLeader, a failed or closed replica: the publisher retries elsewhere
                continue

    def _leading_replica(self, partition: int) -> PartitionReplica | None:
        current = self.metadata.state.partition(STREAM, partition)
        node = self.nodes.get(current.leader) if current is not None and current.leader else None
        if node is None or not node.up or node.core is None:
            return None
        local = node.core.partitions.get(STREAM, partition)
        return local.replica if local is not None and local.replica.is_leader else None

    def _written(self, replica: PartitionReplica, node: str, value: bytes) -> Outcome:
        key = (replica.stream, replica.partition)

        def acked(offset: int | None, error: BaseException | None) -> None:
            if error is None and offset is not None:
                try:
                    self.invariants.ack(key, offset, value, node, replica.leader_epoch)
                except Violation as exc:
                    self.violation = self.violation or exc

        def written(offset: int | None, error: BaseException | None) -> None:
            if error is None and offset is not None:
                when_ackable(replica, capture.ALL, offset, acked)

        return written

    # ---- the checker ------------------------------------------------------------------------

    async def _check(self) -> None:
        while True:
            self.check()
            await asyncio.sleep(CHECK_EVERY)

    def check(self) -> None:
        if self.violation is not None:
            raise self.violation
        for node in self.nodes.values():
            if node.failure is not None:
                raise Violation(f"a task of {node.incarnation} failed: {node.failure!r}")
            if not node.up or node.core is None:
                continue
            for (stream, partition), local in node.core.partitions.items():
                replica = local.replica
                if replica.closed or replica.failed is not None:
                    continue
                self.invariants.observe(
                    node.incarnation, (stream, partition), replica.high_watermark,
                    replica.leader_epoch if replica.is_leader else None, _reader(replica),
                )

    # ---- faults -----------------------------------------------------------------------------

    async def _faults(self, group: asyncio.TaskGroup) -> None:
        shape = self.shape
        plan = sorted(
            (self.random.uniform(0.5, shape.fault_time), self.random.choice(FAULT_KINDS),
             self.random.choice(sorted(self.nodes)), self.random.uniform(0.2, 4.0))
            for _ in range(shape.faults)
        )
        self.fault_log = [f"{kind} {node} at {at:.2f} for {duration:.2f}" for at, kind, node, duration in plan]
        faults = [group.create_task(self._fault(at, kind, node, duration)) for at, kind, node, duration in plan]
        await asyncio.sleep(shape.fault_time)
        await asyncio.gather(*faults)

    async def _fault(self, at: float, kind: str, node_id: str, duration: float) -> None:
        await asyncio.sleep(at)
        node = self.nodes[node_id]
        self.trace(f"fault: {kind} {node_id} for {duration:.2f} s")
        if kind in ("kill", "power_cut"):
            if not node.up:
                return
            if kind == "power_cut":
                self.disks.repair(node.data_dir)  # it boots again on a disk that works
            node.crash(power_cut=kind == "power_cut")
            if kind == "power_cut":
                self._forget_lost()
            await asyncio.sleep(duration)
            if not node.up:
                node.start()
        elif kind == "restart":
            await node.stop()
            await asyncio.sleep(min(duration, 0.5))
            if not node.up:
                node.start()
        elif kind == "isolate":
            others = set(self.nodes) - {node_id}
            self.bus.partition({node_id}, others)
            self.metadata.cut(node_id)
            await asyncio.sleep(duration)
            self.bus.heal()
            self.metadata.reconnect()
        elif kind == "cut_bus":
            self.bus.partition({node_id}, set(self.nodes) - {node_id})
            await asyncio.sleep(duration)
            self.bus.heal()
        elif kind == "cut_one_way":
            other = self.random.choice(sorted(set(self.nodes) - {node_id}))
            self.bus.cut_one_way(node_id, other)
            await asyncio.sleep(duration)
            self.bus.heal()
        elif kind == "cut_metadata":
            self.metadata.cut(node_id)
            await asyncio.sleep(duration)
            self.metadata.reconnect()
        elif kind == "lossy_network":
            self.bus.faults = Faults(drop=self.random.uniform(0.0, 0.3), duplicate=self.random.uniform(0.0, 0.2),
                                     delay=(0.0, self.random.uniform(0.0, 0.05)))
            await asyncio.sleep(duration)
            self.bus.faults = Faults()
        elif kind == "move_metadata_leader":
            self.metadata.move_leader()
        elif kind in ("disk_full", "fsync_error"):
            faulty = self.disks.full if kind == "disk_full" else self.disks.fsync_failing
            streams = node.data_dir / "streams"
            faulty.add(streams)
            await asyncio.sleep(duration)
            faulty.discard(streams)
        elif kind == "slow_disk":
            self._disk_delay = self.random.uniform(0.01, 0.5)
            await asyncio.sleep(duration)
            self._disk_delay = 0.0

    def _forget_lost(self) -> None:
        """After a power cut: entries no ISR member holds any more were lost to power, not to a bug."""
        for stream, partition in self.keys:
            lost = self.invariants.forget_lost((stream, partition), partial(self._held, stream, partition))
            if lost:
                self.trace(f"{stream}/{partition}: offsets {lost} lost with every copy to power cuts")

    def _held(self, stream: str, partition: int, offset: int, value: bytes) -> bool:
        """Whether an ISR member still holds ``value`` at ``offset``. A replica out of the ISR may
        hold it too, but may never lead: with every ISR copy lost to power cuts the entry is gone,
        as under Kafka's rules (without fsync, acked means held in the ISR's memory)."""
        current = self.metadata.state.partition(stream, partition)
        isr = current.isr if current is not None else ()
        return any(self.nodes[member].held(self._directory, stream, partition, offset, value) for member in isr)

    def _directory(self, node_id: str, partition: int) -> Path | None:
        stream = self.metadata.state.streams.get(STREAM)
        core = self.nodes[node_id].core
        return None if stream is None or core is None else core.partitions.directory(stream, partition)

    # ---- the end ----------------------------------------------------------------------------

    def _heal(self) -> None:
        self.trace("healing every fault")
        self.bus.heal()
        self.bus.faults = Faults()
        self.metadata.reconnect()
        self._disk_delay = 0.0
        self.disks.full.clear()
        self.disks.fsync_failing.clear()
        for node in self.nodes.values():
            if not node.up:
                node.start()

    async def _settle(self) -> None:
        deadline = asyncio.get_running_loop().time() + self.shape.settle_time
        while not self._converged():
            if asyncio.get_running_loop().time() > deadline:
                raise Violation(f"the healed cluster did not converge in {self.shape.settle_time:g} s: "
                                f"{self._describe()}")
            await asyncio.sleep(0.1)

    def _converged(self) -> bool:
        state = self.metadata.state
        for stream, partition in self.keys:
            current = state.partition(stream, partition)
            leading = self._leading_replica(partition)
            if current is None or leading is None or leading.leader_epoch != current.leader_epoch:
                return False
            end = leading.log.next_offset
            if leading.high_watermark != end - 1:
                return False
            for replica_id in current.replicas:
                node = self.nodes[replica_id]
                local = node.core.partitions.get(stream, partition) if node.up and node.core else None
                if local is None or (local.replica.log.next_offset, local.replica.high_watermark) != (end, end - 1):
                    return False
        return True

    def _describe(self) -> str:
        parts = [f"metadata leader {self.metadata.leader}"]
        state = self.metadata.state
        for stream, partition in self.keys:
            current = state.partition(stream, partition)
            if current is None:
                parts.append(f"{stream}/{partition}: none")
                continue
            replicas = []
            for replica_id in current.replicas:
                node = self.nodes[replica_id]
                local = node.core.partitions.get(stream, partition) if node.up and node.core else None
                replicas.append(f"{replica_id}: " + ("-" if local is None else
                                f"end {local.replica.log.next_offset} hw {local.replica.high_watermark} "
                                f"{'leads' if local.replica.is_leader else 'follows'} e{local.replica.leader_epoch}"))
            parts.append(f"{stream}/{partition}: leader {current.leader} e{current.leader_epoch} "
                         f"isr {sorted(current.isr)} unclean {sorted(current.unclean)}; " + "; ".join(replicas))
        return " | ".join(parts)

    def _final(self) -> None:
        self.check()
        for stream, partition in self.keys:
            leading = self._leading_replica(partition)
            assert leading is not None
            self.invariants.final((stream, partition), _reader(leading), leading.log.next_offset)


def _violation(error: BaseException) -> Violation | None:
    """The invariant broken, when ``error`` is (or a task group's error holds) a Violation."""
    if isinstance(error, Violation):
        return error
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            found = _violation(inner)
            if found is not None:
                return found
    return None


def _reader(replica: PartitionReplica) -> Callable[[int, int], list[tuple[int, bytes]]]:
    def read(start: int, count: int) -> list[tuple[int, bytes]]:
        pairs: list[tuple[int, bytes]] = []
        while count > 0:
            entries = replica.log.read(start, max_entries=count)
            if not entries:
                break
            pairs += [(entry.offset, entry.value) for entry in entries]
            start, count = entries[-1].offset + 1, count - len(entries)
        return pairs

    return read


@contextlib.contextmanager
def _scratch() -> Iterator[Path]:
    """A directory for the nodes' data, in memory where the machine has /dev/shm."""
    shm = Path("/dev/shm")
    root = Path(tempfile.mkdtemp(prefix="bascule-sim-", dir=shm if shm.is_dir() else None))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The nodes' logging is for real nodes; a run tells its story in its trace."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(previous)
