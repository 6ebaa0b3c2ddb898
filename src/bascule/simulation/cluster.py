"""A simulated bascule cluster: real node glue (``NodeCore``: partitions, leader and follower
machines and their appliers, the metadata service and its elections, maintenance) on real commit
logs in a scratch directory, over the in-memory bus and the modelled metadata log, on the loop's
virtual time.

A node crashes as a killed process does (its connection and tasks end at once, its files keep
what was written), loses power (the same, and then each log loses what it had not synced), or stops
cleanly (and starts again clean). ``SimCluster`` holds the nodes and what they share, the faults a
run or a scenario applies to them, a writer's acks and the invariants (``invariants``), checked as
it runs; ``scenario`` runs a scripted one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import shutil
import tempfile
import traceback
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from pathlib import Path

from bascule.config import Config, load_config
from bascule.metadata import levels
from bascule.metadata.raft import MetadataError, NoMetadataLeader
from bascule.node.capture import when_ackable
from bascule.node.core import NodeCore
from bascule.node.tasks import Tasks
from bascule.partition.encryption import MasterKey
from bascule.partition.log import CommitLog, PartitionLog
from bascule.partition.replica import PartitionReplica, Placement, WriteOutcome, placed_offsets
from bascule.simulation.disk import Disks
from bascule.simulation.invariants import Invariants, Key, Violation
from bascule.simulation.metadata import MetadataLog
from bascule.testing import virtual_time
from bascule.testing.bus import Faults, MemoryBus
from bascule.wire import capture
from bascule.wire.dedup import MESSAGE_ID_HEADER
from bascule.wire.entry import Record
from bascule.wire.subjects import Subjects

HOST = "127.0.0.1"
WRITE_TIMEOUT = 5.0  # virtual seconds the writer waits for an ack before it tries the write again
STREAM = "sim"
TRACE_LINES = 400
CHECK_EVERY = 0.02
# Within the lease's bound (lease.LEASE_FRACTION): rates apart by at most twice this.
MAX_CLOCK_DRIFT = 0.03


class SimNode:
    def __init__(
        self, node_id: str, data_dir: Path, config: Config, bus: MemoryBus, metadata: MetadataLog, disks: Disks,
        live: Callable[[], list[str]], clock_rate: float, clock_offset: float, trace: Callable[[str], None],
    ) -> None:
        self.id = node_id
        self.data_dir = data_dir
        self.disks = disks
        self.config = config
        self.bus = bus
        self.metadata = metadata
        self.live = live
        self.clock_rate = clock_rate
        self.clock_offset = clock_offset
        self.trace = trace
        self.generation = 0
        # The metadata level its runs state in their incarnations (metadata.levels): 0 states what an
        # earlier version does, so that no metadata leader journals batches while it is a voter. Changed
        # while the node is down.
        self.metadata_level = levels.LEVEL
        self.clean = True  # its last run stopped cleanly (a fresh node is clean)
        self.core: NodeCore | None = None
        self.failure: BaseException | None = None  # a task of a running node failed: a bug
        self._life: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._registered = False

    def clock(self) -> float:
        """This node's monotonic clock: its own origin, and a rate a little off the true one."""
        return asyncio.get_running_loop().time() * self.clock_rate + self.clock_offset

    @property
    def up(self) -> bool:
        return self._life is not None

    @property
    def incarnation(self) -> str:
        return levels.incarnation(f"{self.id}.{self.generation}", self.metadata_level)

    def start(self) -> None:
        self.generation += 1
        clean_start, self.clean = self.clean, False  # the marker goes before any log opens
        self._registered = False
        self._stop = asyncio.Event()
        self._life = asyncio.get_running_loop().create_task(self._run(clean_start), name=f"node {self.incarnation}")
        self._life.add_done_callback(self._ended)
        self.trace(f"{self.incarnation} starts ({'clean' if clean_start else 'unclean'})")

    async def _run(self, clean_start: bool) -> None:
        async with asyncio.TaskGroup() as group:
            tasks = Tasks(group)
            member = self.metadata.join(self.id, self._metadata_changed)
            core = self.core = NodeCore(
                self.config, self.data_dir, self.id, self.incarnation, self.bus.node(self.id),
                Subjects(self.config.clustering.namespace), member, tasks, MasterKey.from_environment({}),
                self.live, self.clock,
            )
            await core.start()
            tasks.spawn(self._register(core, clean_start), "register broker")
            core.maintenance.start()
            assert self._stop is not None
            await self._stop.wait()
            await tasks.close()
            await core.partitions.close()
            self.clean = self._registered and core.partitions.closed_sound

    async def _register(self, core: NodeCore, clean_start: bool) -> None:
        await core.register(HOST, 0, self.id, clean_start)
        self._registered = True

    def _metadata_changed(self) -> None:
        if self.core is not None:
            self.core.partitions.schedule_reconcile()

    def _ended(self, life: asyncio.Task[None]) -> None:
        if self._life is life and not life.cancelled() and life.exception() is not None:
            self.failure = life.exception()
            for line in traceback.format_exception(self.failure):
                self.trace(line.rstrip())

    async def stop(self) -> None:
        """A clean stop: every log synced and closed."""
        life, stop = self._life, self._stop
        if life is None or stop is None:
            return
        self.trace(f"{self.incarnation} stops")
        stop.set()
        await asyncio.wait({life})
        self._gone()

    def crash(self, power_cut: bool) -> None:
        """Killed now: nothing more goes out, no task runs on, the files keep what was written. With
        ``power_cut``, the files then lose what no fsync covered (``Disks.power_cut``)."""
        life = self._life
        if life is None:
            return
        self.trace(f"{self.incarnation} {'loses power' if power_cut else 'is killed'}")
        self._gone()
        if self.core is not None:
            for local in self.core.partitions.all():
                local.replica.stop()
                local.replica.log.abandon()
        life.cancel()
        if power_cut:
            self.disks.repair(self.data_dir)  # it boots again on a disk that works
            lost = self.disks.power_cut(self.data_dir)
            self.trace(f"{self.id}: {lost} bytes not fsynced lost to the power cut")

    def _gone(self) -> None:
        self._life = None
        self.bus.disconnect(self.id)
        self.metadata.leave(self.id)

    @contextlib.contextmanager
    def holdings(self, directory_of: Callable[[str, int], Path | None], stream: str,
                 partition: int) -> Iterator[Callable[[int, bytes], bool]]:
        """``held(offset, value)``: whether this node's log of the partition holds ``value`` at
        ``offset`` (up or down). A down node's log is opened at the first question and kept open for
        the others (a power cut asks one for each committed offset), then abandoned."""
        local = self.core.partitions.get(stream, partition) if self.up and self.core is not None else None
        if local is not None and not local.replica.closed:
            yield partial(_holds, local.replica.log)
            return
        opened: list[CommitLog | None] = []

        def held(offset: int, value: bytes) -> bool:
            if not opened:
                directory = directory_of(self.id, partition)
                if directory is None or not directory.exists():
                    opened.append(None)
                else:
                    with self.disks.suspended():
                        opened.append(CommitLog.open(directory))
            return opened[0] is not None and _holds(opened[0], offset, value)

        try:
            yield held
        finally:
            if opened and opened[0] is not None:
                opened[0].abandon()


def _holds(log: PartitionLog | CommitLog, offset: int, value: bytes) -> bool:
    entries = log.read(offset, max_entries=1) if offset < log.next_offset else []
    return bool(entries) and entries[0].offset == offset and entries[0].value == value


def drifting_clock(random_source: random.Random, max_drift: float) -> tuple[float, float]:
    """A node's clock (rate, origin): rates within ``max_drift`` of the true one, unrelated origins."""
    return 1.0 + random_source.uniform(-max_drift, max_drift), random_source.uniform(0.0, 1e6)


class SimCluster:
    """``nodes`` nodes replicating stream ``sim`` (``partitions`` partitions, each on every node),
    everything random drawn from ``source``."""

    def __init__(
        self, source: random.Random, root: Path, nodes: int = 3, partitions: int = 1, min_isr: int = 2,
        sync: str = "never", lost_answers: float = 0.02, replication_factor: int | None = None,
    ) -> None:
        self.random = source
        self.partitions = partitions
        self.replication_factor = replication_factor or nodes
        node_ids = [f"n{i}" for i in range(nodes)]
        self._loop: asyncio.AbstractEventLoop | None = None
        self.trace_lines: deque[str] = deque(maxlen=TRACE_LINES)
        self.bus = MemoryBus(seed=source.randrange(1 << 32))
        self.metadata = MetadataLog(
            node_ids, random.Random(source.randrange(1 << 32)), self.trace, apply_delay=(0.001, 0.05),
            election_delay=(0.2, 1.5), lost_answer=lost_answers,
        )
        self.invariants = Invariants(lambda: self.now)
        self.violation: Violation | None = None
        self.disks = Disks()
        self.disk_slowness = 0.0  # the longest a thread's job (an fsync, a log opening) is seen late
        self._disk_random = random.Random(source.randrange(1 << 32))
        config = load_config(None, {
            "data.dir": str(root), "clustering.min.insync.replicas": min_isr,
            "clustering.replica.max.lag.time": 1.0, "clustering.replica.max.leader.timeout": 1.0,
            "clustering.replica.max.idle.wait": 0.2, "clustering.replica.fetch.timeout": 0.3,
            "streams.sync": sync, "cursors.stream.partitions": 0,
        })
        self.nodes = {
            node_id: SimNode(node_id, root / node_id, config, self.bus, self.metadata, self.disks, self.live,
                             *drifting_clock(source, MAX_CLOCK_DRIFT), self.trace)
            for node_id in node_ids
        }
        self._sequence = 0
        self._unacked: deque[tuple[int, bytes]] = deque()  # (partition, value) of writes to try again

    @property
    def now(self) -> float:
        return 0.0 if self._loop is None else self._loop.time()

    def trace(self, line: str) -> None:
        self.trace_lines.append(f"{self.now:8.3f} {line}")

    def live(self) -> list[str]:
        return sorted(node_id for node_id, node in self.nodes.items() if node.up)

    def disk_delay(self) -> float:
        """When a thread's job is seen done: at once, or later on a slow disk (the loop's executor delay)."""
        return self._disk_random.uniform(0.0, self.disk_slowness) if self.disk_slowness else 0.0

    @property
    def keys(self) -> list[Key]:
        return [(STREAM, p) for p in range(self.partitions)]

    async def start(self) -> None:
        """Start every node and create the stream once all are registered; the checker runs from here."""
        self._loop = asyncio.get_running_loop()
        for node in self.nodes.values():
            node.start()
        await asyncio.wait_for(self._create_stream(), 30.0)

    async def _create_stream(self) -> None:
        while STREAM not in self.metadata.state.streams:
            leader = self.metadata.leader
            node = self.nodes.get(leader) if leader else None
            if node is not None and node.core is not None and len(self.metadata.state.brokers) == len(self.nodes):
                try:
                    await node.core.metadata.call(
                        "create_stream", name=STREAM, subject=STREAM, group="",
                        replication_factor=self.replication_factor, partitions=self.partitions, settings={},
                    )
                except (MetadataError, NoMetadataLeader) as exc:
                    self.trace(f"create_stream: {exc}")
            await asyncio.sleep(0.1)

    # ---- writing --------------------------------------------------------------------------------

    def leading_replica(self, partition: int) -> PartitionReplica | None:
        """The replica of the node the metadata names leader, if it leads now."""
        leader = self.leader(partition)
        replica = self.replica(leader, partition) if leader is not None else None
        return replica if replica is not None and replica.is_leader else None

    def write(
        self, partition: int, value: bytes, replica: PartitionReplica | None = None,
        outcome: asyncio.Future[int | None] | None = None, message_id: bytes | None = None,
    ) -> bool:
        """Publish ``value`` with ack policy ALL to ``replica`` (the partition's leader by default), as
        the API does, with ``message_id`` as its Nats-Msg-Id if given; its ack is recorded for the
        invariants, and ``outcome`` gets the offset acked (None: the write failed). False when there was
        no leader to take it."""
        replica = replica or self.leading_replica(partition)
        if replica is None:
            return False
        record = Record(value, headers={} if message_id is None else {MESSAGE_ID_HEADER: message_id})
        if message_id is not None:
            self.invariants.with_ids.add(value)
        try:
            replica.submit([record], self._written(replica, replica.leader, value, outcome), 0.0005,
                           ids=None if message_id is None else [message_id])
        except Exception:  # NotLeader, a failed or closed replica: the publisher retries elsewhere
            return False
        return True

    async def publish(self, partition: int, value: bytes, timeout: float = 5.0,
                      replica: PartitionReplica | None = None) -> int | None:
        """``write``, awaited: the offset acked, or None (no leader, failed, or no ack within ``timeout``)."""
        outcome: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        if not self.write(partition, value, replica, outcome):
            return None
        try:
            return await asyncio.wait_for(outcome, timeout)
        except TimeoutError:
            return None

    def _written(
        self, replica: PartitionReplica, node: str, value: bytes, outcome: asyncio.Future[int | None] | None,
    ) -> WriteOutcome:
        key = (replica.stream, replica.partition)

        def settle(offset: int | None) -> None:
            if outcome is not None and not outcome.done():
                outcome.set_result(offset)

        def acked(offset: int | None, error: BaseException | None) -> None:
            if error is None and offset is not None:
                try:
                    self.invariants.ack(key, offset, value, node, replica.leader_epoch)
                except Violation as exc:
                    self.violation = self.violation or exc
            settle(offset if error is None else None)

        def written(placement: Placement | None, error: BaseException | None) -> None:
            if error is None and placement is not None:
                when_ackable(replica, capture.ALL, placed_offsets(placement, 1)[0], acked)
            else:
                settle(None)

        return written

    async def keep_writing(self, every: tuple[float, float] = (0.002, 0.03)) -> None:
        """Unique values, one at a time, to a random partition's leader, forever, each with itself as
        its message id; every other write retries one that failed or went unacked for WRITE_TIMEOUT,
        as an idempotent client does: each value must be stored once (``Invariants.final``)."""
        loop = asyncio.get_running_loop()
        retry = False
        while True:
            await asyncio.sleep(self.random.uniform(*every))
            retry = not retry
            if retry and self._unacked:
                partition, value = self._unacked.popleft()
            else:
                self._sequence += 1
                partition, value = self.random.randrange(self.partitions), b"v%d" % self._sequence
            outcome: asyncio.Future[int | None] = loop.create_future()
            if not self.write(partition, value, outcome=outcome, message_id=value):
                self._unacked.append((partition, value))
                continue
            timeout = loop.call_later(WRITE_TIMEOUT, outcome.cancel)
            outcome.add_done_callback(partial(self._retry_unless_acked, partition, value, timeout))

    def _retry_unless_acked(
        self, partition: int, value: bytes, timeout: asyncio.TimerHandle, outcome: asyncio.Future[int | None],
    ) -> None:
        timeout.cancel()
        if outcome.cancelled() or outcome.result() is None:
            self._unacked.append((partition, value))

    async def until(self, what: str, predicate: Callable[[], object], timeout: float = 30.0) -> None:
        """Until ``predicate()`` holds (checked every 10 ms of virtual time); Violation after ``timeout``."""
        deadline = asyncio.get_running_loop().time() + timeout
        while not predicate():
            if asyncio.get_running_loop().time() > deadline:
                raise Violation(f"timed out waiting for {what}: {self.describe()}")
            await asyncio.sleep(0.01)

    def leader(self, partition: int = 0) -> str | None:
        """The node the metadata names leader of the partition."""
        current = self.metadata.state.partition(STREAM, partition)
        return None if current is None else current.leader

    # ---- checking -------------------------------------------------------------------------------

    async def keep_checking(self) -> None:
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

    # ---- faults ---------------------------------------------------------------------------------

    def kill(self, node_id: str) -> None:
        self.nodes[node_id].crash(power_cut=False)

    def power_cut(self, node_id: str) -> None:
        """The node loses power; entries no ISR member holds any more are lost to power, not to a bug."""
        node = self.nodes[node_id]
        if not node.up:
            return
        node.crash(power_cut=True)
        for stream, partition in self.keys:
            with self._held(stream, partition) as held:
                lost = self.invariants.forget_lost((stream, partition), held)
            if lost:
                self.trace(f"{stream}/{partition}: offsets {_ranges(lost)} lost with every ISR copy to power cuts")

    @contextlib.contextmanager
    def _held(self, stream: str, partition: int) -> Iterator[Callable[[int, bytes], bool]]:
        """``held(offset, value)``: whether an ISR member still holds ``value`` at ``offset``. A
        replica out of the ISR may hold it too, but may never lead: with every ISR copy lost to power
        cuts the entry is gone, as under Kafka's rules (without fsync, acked means held in the ISR's
        memory). The ISR and the logs do not change while it answers (it is asked without awaiting)."""
        current = self.metadata.state.partition(stream, partition)
        isr = current.isr if current is not None else ()
        with contextlib.ExitStack() as stack:
            members = [stack.enter_context(self.nodes[member].holdings(self._directory, stream, partition))
                       for member in isr]
            yield lambda offset, value: any(held(offset, value) for held in members)

    def _directory(self, node_id: str, partition: int) -> Path | None:
        stream = self.metadata.state.streams.get(STREAM)
        core = self.nodes[node_id].core
        return None if stream is None or core is None else core.partitions.directory(stream, partition)

    def isolate(self, node_id: str) -> None:
        """Cut the node off from the others, over NATS and from the metadata group."""
        self.bus.partition({node_id}, set(self.nodes) - {node_id})
        self.metadata.cut(node_id)

    def heal_network(self) -> None:
        self.bus.heal()
        self.bus.faults = Faults()
        self.metadata.reconnect()

    def heal(self) -> None:
        """Every fault ends, and every node that is down starts."""
        self.trace("healing every fault")
        self.heal_network()
        self.disk_slowness = 0.0
        self.disks.full.clear()
        self.disks.fsync_failing.clear()
        for node in self.nodes.values():
            if not node.up:
                node.start()

    # ---- the end --------------------------------------------------------------------------------

    async def settle(self, timeout: float = 60.0) -> None:
        """Until every partition has a leader and every replica holds exactly its log, committed."""
        deadline = asyncio.get_running_loop().time() + timeout
        while not self.converged():
            if asyncio.get_running_loop().time() > deadline:
                raise Violation(f"the healed cluster did not converge in {timeout:g} s: {self.describe()}")
            await asyncio.sleep(0.1)

    def converged(self) -> bool:
        state = self.metadata.state
        for stream, partition in self.keys:
            current = state.partition(stream, partition)
            leading = self.leading_replica(partition)
            if current is None or leading is None or leading.leader_epoch != current.leader_epoch:
                return False
            end = leading.log.next_offset
            if leading.high_watermark != end - 1:
                return False
            for replica_id in current.replicas:
                replica = self.replica(replica_id, partition)
                if replica is None or (replica.log.next_offset, replica.high_watermark) != (end, end - 1):
                    return False
        return True

    def replica(self, node_id: str, partition: int) -> PartitionReplica | None:
        node = self.nodes[node_id]
        local = node.core.partitions.get(STREAM, partition) if node.up and node.core is not None else None
        return None if local is None else local.replica

    def describe(self) -> str:
        parts = [f"metadata leader {self.metadata.leader}"]
        state = self.metadata.state
        for stream, partition in self.keys:
            current = state.partition(stream, partition)
            if current is None:
                parts.append(f"{stream}/{partition}: none")
                continue
            replicas = []
            for replica_id in current.replicas:
                replica = self.replica(replica_id, partition)
                replicas.append(f"{replica_id}: " + ("-" if replica is None else
                                f"end {replica.log.next_offset} hw {replica.high_watermark} "
                                f"{'leads' if replica.is_leader else 'follows'} e{replica.leader_epoch}"))
            parts.append(f"{stream}/{partition}: leader {current.leader} e{current.leader_epoch} "
                         f"isr {sorted(current.isr)} unclean {sorted(current.unclean)}; " + "; ".join(replicas))
        return " | ".join(parts)

    def final(self) -> None:
        """The last checks, on a converged cluster: every acked entry not lost to power is in the
        leader's log, and every replica holds exactly that log."""
        self.check()
        for stream, partition in self.keys:
            leading = self.leading_replica(partition)
            current = self.metadata.state.partition(stream, partition)
            assert leading is not None and current is not None
            others = {node: self.replica(node, partition) for node in current.replicas if node != current.leader}
            self.invariants.final((stream, partition), _reader(leading), leading.log.next_offset, {
                node: _reader(replica) for node, replica in others.items() if replica is not None
            })


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


def _ranges(offsets: list[int]) -> str:
    """``[1, 2, 3, 7]`` as ``1..3, 7``."""
    spans: list[list[int]] = []
    for offset in offsets:
        if spans and offset == spans[-1][1] + 1:
            spans[-1][1] = offset
        else:
            spans.append([offset, offset])
    return ", ".join(f"{a}..{b}" if a != b else str(a) for a, b in spans)


def run_on_virtual_time(cluster: SimCluster, main: Callable[[], Awaitable[None]]) -> None:
    """Run ``main`` on a fresh virtual-time loop with the cluster's disk faults and delays."""
    with cluster.disks.installed(), _quiet():
        virtual_time.run(main, executor_delay=cluster.disk_delay)


def scenario(
    script: Callable[[SimCluster], Awaitable[None]], seed: int = 0, **shape: object,
) -> SimCluster:
    """Run a scripted scenario on a new cluster (``shape``: SimCluster's keywords): start it, run
    ``script`` with the checker running beside it, heal, settle and check the end. Raises Violation
    with the trace when an invariant breaks; returns the cluster for the script's own checks."""
    with scratch_directory() as root:
        cluster = SimCluster(random.Random(seed), root, **shape)  # type: ignore[arg-type]

        async def main() -> None:
            await cluster.start()
            async with asyncio.TaskGroup() as group:
                checker = group.create_task(cluster.keep_checking())
                await script(cluster)
                cluster.heal()
                await cluster.settle()
                checker.cancel()
            cluster.final()

        try:
            run_on_virtual_time(cluster, main)
        except Exception as exc:
            violation = find_violation(exc)
            trace = "\n".join(cluster.trace_lines)
            if violation is None:
                raise
            raise Violation(f"{violation}\ntrace:\n{trace}") from exc
    return cluster


def find_violation(error: BaseException) -> Violation | None:
    """The invariant broken, when ``error`` is (or a task group's error holds) a Violation."""
    if isinstance(error, Violation):
        return error
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            found = find_violation(inner)
            if found is not None:
                return found
    return None


@contextlib.contextmanager
def scratch_directory() -> Iterator[Path]:
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
