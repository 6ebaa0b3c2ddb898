"""The node's periodic jobs over its replicas: HW checkpoints, the cleaner (retention, then log
compaction), interval fsyncs, ISR changes the leaders ask for, and auto-pause of idle partitions;
and the expiry of the silent members of the consumer groups it coordinates. Disk work runs in
threads.

The jobs run every second or so over every partition of the node, so their cost per partition is
what a node pays at rest (issue 32: at 10,000 partitions, four full walks a second took 60% of a
node's loop). Each walk looks only at the partitions its job can concern (the leaders for ISR
changes, the streams that auto-pause, the partitions the cleaner is due for), and yields to the
loop every ``WALK_SLICE`` partitions, so that no walk holds the loop for long at once.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from collections.abc import Set as AbstractSet
from typing import TypeVar

from bascule.config import Config
from bascule.metadata.election import IsrChangeKind, validate_isr_change
from bascule.metadata.raft import MetadataError, NoMetadataLeader
from bascule.metadata.replicated import ReplicatedMetadata
from bascule.metadata.service import MetadataService
from bascule.metadata.state import MetadataState, Partition
from bascule.node.groups import GroupCoordinator
from bascule.node.handoff import GatherReports, move_leadership
from bascule.node.partitions import LocalPartition, Partitions
from bascule.node.reports import MetadataBatches
from bascule.node.tasks import Tasks
from bascule.partition.replica import PartitionReplica
from bascule.partition.replication.leader import IsrOutcome, IsrRequest
from bascule.wire.settings import EffectiveSettings, effective_settings

log = logging.getLogger(__name__)
T = TypeVar("T")

CHECKPOINT_INTERVAL = 5.0
CLEANER_TICK = 1.0  # how often the cleaner looks for partitions due: finer stream intervals wait for it
AUTO_PAUSE_CHECK_INTERVAL = 1.0
MAX_GROUP_LIVENESS_INTERVAL = 1.0
# Partitions a walk handles in one turn of the loop before it lets the others run: a few ms of work.
WALK_SLICE = 500


class Maintenance:
    def __init__(
        self, config: Config, server_id: str, raft: ReplicatedMetadata, metadata: MetadataService,
        partitions: Partitions, tasks: Tasks, groups: GroupCoordinator, gather_reports: GatherReports,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clock = clock
        self.config = config
        self.gather_reports = gather_reports
        self._disk_jobs: set[tuple[str, int]] = set()  # partitions a failing-disk job is under way for
        self._handed_off_at: dict[tuple[str, int], float] = {}
        self.groups = groups
        self.server_id = server_id
        self.raft = raft
        self.metadata = metadata
        self.partitions = partitions
        self.tasks = tasks
        self._cleaning = CleanerSchedule()
        # The leaders' ISR changes go in batches (node.reports): one request per pass, not one per partition.
        self.batches = MetadataBatches(metadata.call, lambda: metadata.nc.max_payload, tasks.spawn)
        self._settings_of: MetadataState | None = None
        self._stream_settings: dict[str, EffectiveSettings] = {}

    def start(self) -> None:
        jobs: list[tuple[float, Callable[[], Awaitable[None]]]] = [
            (CHECKPOINT_INTERVAL, self._checkpoint_partitions),
            (min(CLEANER_TICK, self.config.streams.cleaner_interval), self._clean),
            (self._isr_check_interval(), self._tend_partitions),
            (AUTO_PAUSE_CHECK_INTERVAL, self._auto_pause),
            # a member expires within a tenth of the timeout of its due time (a second at most)
            (min(MAX_GROUP_LIVENESS_INTERVAL, self.config.groups.consumer_timeout / 10), self.groups.expire_idle),
        ]
        sync_interval = self.partitions.sync_policy.interval
        if sync_interval:
            jobs.append((sync_interval, self._sync_partitions))
        for interval, job in jobs:
            self.tasks.start(_every(interval, job), job.__name__)

    async def _checkpoint_partitions(self) -> None:
        async for local in _sliced(self.partitions.all()):
            if not local.replica.closed:
                await local.replica.checkpoint()

    async def _clean(self) -> None:
        """Liftbridge's cleaner: retention, then compaction by key of the streams that have it
        (``compactEnabled``, else ``streams.compact.enabled``; the cursors stream always), every
        ``cleanerInterval`` of the stream (else ``streams.cleaner.interval``). Leaders and
        followers clean on their own. One log at a time, its reading and writing in a thread; a
        log that fails to compact is logged and the others go on."""
        loop = asyncio.get_running_loop()
        local = dict(self.partitions.items())
        for stream_name, partition in self._cleaning.due(local.keys(), self._partition_cleaner_interval, self.clock()):
            found = local.get((stream_name, partition))
            replica = None if found is None else found.replica
            if replica is None or replica.closed:  # closed while an earlier one compacted
                continue
            replica.log.enforce_retention()
            if replica.failed is not None or not self._compacts(stream_name):
                continue
            job = replica.log.begin_compaction()
            if job is None:
                continue
            try:
                await loop.run_in_executor(None, job.prepare)
                await loop.run_in_executor(None, replica.log.finish_compaction(job))
            except OSError:
                log.exception("%s/%s: compaction failed", stream_name, partition)

    def _partition_cleaner_interval(self, key: tuple[str, int]) -> float:
        return self._settings(key[0]).cleaner_interval

    def _compacts(self, stream_name: str) -> bool:
        return self._settings(stream_name).compacted

    def _settings(self, stream_name: str) -> EffectiveSettings:
        # Each job walks every partition every second: a stream's settings are worked out once
        # per metadata state (an immutable value, replaced by every command), not per partition.
        state = self.raft.state
        if state is not self._settings_of:
            self._settings_of, self._stream_settings = state, {}
        found = self._stream_settings.get(stream_name)
        if found is None:
            stream = state.streams.get(stream_name)
            found = self._stream_settings[stream_name] = effective_settings(
                stream_name, stream.settings if stream is not None else {}, self.config.stream_defaults
            )
        return found

    async def _sync_partitions(self) -> None:
        async for local in _sliced(self.partitions.all()):
            if not local.replica.closed and local.replica.failed is None:
                await local.replica.sync()

    def _isr_check_interval(self) -> float:
        return max(0.05, min(1.0, self.config.clustering.replica_max_lag_time / 4))

    async def _tend_partitions(self) -> None:
        """Every ISR check, one walk: the ISR changes the leaders ask for, and the failing logs
        (``_tend_failing_log``); then a reconcile if a partition could not be brought up."""
        now = self.clock()
        timeout = self.config.clustering.replica_max_leader_timeout
        for key in [k for k, at in self._handed_off_at.items() if now > at + timeout]:
            del self._handed_off_at[key]  # bounded: only hand-offs within the last leader timeout
        async for key, local in _sliced(self.partitions.items()):
            replica = local.replica
            if replica.closed:
                continue
            if local.endpoint is not None:  # only a leader asks for ISR changes: a third of them, RF=3
                for request in replica.isr_requests():
                    self._ask_isr_change(key, replica, request)
            if key not in self._disk_jobs and (replica.writes_failing or replica.failed is not None):
                self._tend_failing_log(key, replica, now, timeout)
        if self.partitions.unopened():
            self.partitions.schedule_reconcile()

    def _ask_isr_change(self, key: tuple[str, int], replica: PartitionReplica, request: IsrRequest) -> None:
        """Ask for ``request``, unless this node's metadata refuses it already: then the metadata leader,
        whose metadata is at least as new, would refuse it too. A leader learns that its ISR changed
        when its node's reconcile reaches the partition; until then it asks again every ISR check, on
        the partition epoch it had, and each refusal went through the metadata leader and into a Raft
        command, whose apply brought every node another reconcile (issue 32: 37,000 refusals after a
        SIGKILL at 10,000 partitions)."""
        reason = _refusal(self.raft.state.partition(*key), self.server_id, request)
        if reason is not None:
            log.debug("%s/%s: not asking for an ISR change the metadata refuses (%s)", *key, reason)
            replica.isr_request_done(request, IsrOutcome.REFUSED)
            return
        self.tasks.spawn(self._change_isr(replica, request), "change ISR")

    async def _change_isr(self, replica: PartitionReplica, request: IsrRequest) -> None:
        add, replica_id = request.add, request.replica_id
        log.info("%s/%s: %s %s %s the ISR", replica.stream, replica.partition,
                 "adding" if add else "removing", replica_id, "to" if add else "from")
        outcome = IsrOutcome.UNKNOWN
        try:
            await self.batches.change_isr(
                replica.stream, replica.partition, replica_id, add, self.server_id, request.leader_epoch,
                request.partition_epoch,
            )
            outcome = IsrOutcome.ACCEPTED
        except MetadataError as exc:
            log.warning("ISR change of %s/%s refused: %s", replica.stream, replica.partition, exc)
            outcome = IsrOutcome.REFUSED
        except NoMetadataLeader as exc:
            log.warning("ISR change of %s/%s: outcome unknown: %s", replica.stream, replica.partition, exc)
        finally:
            replica.isr_request_done(request, outcome)

    def _tend_failing_log(self, key: tuple[str, int], replica: PartitionReplica, now: float, timeout: float) -> None:
        """Kafka's log-dir failure handling, per partition: a leader whose writes fail on the disk
        (a full disk) hands leadership to another ISR member, at most once per leader timeout; a
        log that failed for good (an fsync error) is reopened (``Partitions.recover``). (A replica
        that could not be opened is tried again by the reconcile ``_tend_partitions`` schedules.)"""
        if replica.failed is not None:
            self._disk_job(key, self.partitions.recover(*key), "reopen a failed log")
        elif replica.writes_failing and replica.is_leader and now > self._handed_off_at.get(key, 0) + timeout:
            self._handed_off_at[key] = now
            self._disk_job(key, self._hand_off(*key), "hand off a partition whose writes fail")

    def _disk_job(self, key: tuple[str, int], work: Awaitable[None], name: str) -> None:
        async def run() -> None:
            try:
                await work
            finally:
                self._disk_jobs.discard(key)

        self._disk_jobs.add(key)
        if self.tasks.spawn(run(), f"{name} {key}") is None:
            self._disk_jobs.discard(key)

    async def _hand_off(self, stream: str, partition: int) -> None:
        current = self.raft.state.partition(stream, partition)
        if current is None or current.leader != self.server_id:
            return
        timeout = self.config.clustering.replica_max_leader_timeout
        others = set(current.isr) - {self.server_id}
        reports = await self.gather_reports(min(1.0, timeout), others, [f"{stream}/{partition}"]) if others else {}
        chosen = await move_leadership(current, self.server_id, reports, self.metadata.call, timeout)
        if chosen is not None:
            log.warning("%s/%s: writes fail on this node's disk, %s leads now", stream, partition, chosen)

    async def _auto_pause(self) -> None:
        """Pause led partitions that received nothing for their auto-pause time (Liftbridge's
        streams.auto.pause.time); a publish through the API resumes them."""
        pausing = self._auto_pausing()
        if not pausing:
            return
        async for (stream_name, partition), local in _sliced(self.partitions.items()):
            replica = local.replica
            if stream_name not in pausing or not replica.is_leader or replica.paused or local.pause_requested:
                continue
            settings = self._settings(stream_name)
            pause_after, unless_subscribed = settings.auto_pause_time, settings.auto_pause_unless_subscribed
            if not pause_after or replica.idle_for() < pause_after or (unless_subscribed and replica.readers):
                continue
            local.pause_requested = True
            self.tasks.spawn(self._pause_idle(local, stream_name, partition), "auto-pause")

    def _auto_pausing(self) -> set[str]:
        """The streams with an auto-pause time (none by default; the cursors stream has one)."""
        return {name for name in self.raft.state.streams if self._settings(name).auto_pause_time}

    async def _pause_idle(self, local: LocalPartition, stream_name: str, partition: int) -> None:
        log.info("%s/%s: no messages for its auto-pause time, pausing", stream_name, partition)
        try:
            await self.metadata.call("pause", name=stream_name, partitions=[partition], resume_all=False,
                                     at=time.time_ns())
        except (MetadataError, NoMetadataLeader) as exc:
            log.warning("auto-pause of %s/%s failed: %s", stream_name, partition, exc)
        finally:
            local.pause_requested = False


def _refusal(partition: Partition | None, leader: str, request: IsrRequest) -> str | None:
    """Why ``partition`` (this node's metadata) refuses ``request`` of this leader, as the metadata's
    apply of it would (``metadata.election.validate_isr_change``); None when it may go."""
    if partition is None:
        return "no such partition"
    decision = validate_isr_change(
        IsrChangeKind.EXPAND if request.add else IsrChangeKind.SHRINK, request.replica_id, leader,
        request.leader_epoch, leader=partition.leader, epoch=partition.leader_epoch, replicas=partition.replicas,
        isr=partition.isr, request_partition_epoch=request.partition_epoch, partition_epoch=partition.epoch,
        unclean=partition.unclean,
    )
    return None if decision.accepted else decision.reason


class CleanerSchedule:
    """When each partition is next cleaned: an interval after it was first seen, then after each
    clean; partitions no longer there are forgotten. A tick costs what the partitions it sees come
    and go and those due cost, not one step per partition: due times wait in a heap."""

    def __init__(self) -> None:
        self._next: dict[tuple[str, int], float] = {}
        # (due, key) of each partition in _next, and stale entries of partitions since gone or
        # cleaned, dropped when they reach the top. Bound: rebuilt past twice _next's size.
        self._heap: list[tuple[float, tuple[str, int]]] = []

    def due(
        self, partitions: AbstractSet[tuple[str, int]], interval: Callable[[tuple[str, int]], float], now: float,
    ) -> list[tuple[str, int]]:
        """The ``partitions`` (a set, or a dict's keys) due at ``now``, the soonest first;
        ``interval`` gives a partition's interval."""
        known = self._next.keys()
        for gone in known - partitions:
            del self._next[gone]
        for key in partitions - known:
            self._schedule(key, now + interval(key))
        if len(self._heap) > 2 * len(self._next) + 64:
            self._heap = [(when, key) for key, when in self._next.items()]
            heapq.heapify(self._heap)
        due: dict[tuple[str, int], None] = {}
        while self._heap and self._heap[0][0] <= now:
            when, key = heapq.heappop(self._heap)
            if self._next.get(key) == when:  # else stale: gone, or moved since
                due[key] = None
        for key in due:  # after the pops: an interval of 0 is due once a tick, as before
            self._schedule(key, now + interval(key))
        return list(due)

    def _schedule(self, key: tuple[str, int], when: float) -> None:
        self._next[key] = when
        heapq.heappush(self._heap, (when, key))


async def _sliced(items: Iterable[T]) -> AsyncIterator[T]:
    """``items``, letting the loop run others' work after each ``WALK_SLICE`` of them."""
    for index, item in enumerate(items):
        if index and not index % WALK_SLICE:
            await asyncio.sleep(0)
        yield item


async def _every(interval: float, job: Callable[[], Awaitable[None]]) -> None:
    """Run ``job`` every ``interval`` seconds; a failed run is logged and the next one comes."""
    while True:
        await asyncio.sleep(interval)
        try:
            await job()
        except Exception:
            log.exception("periodic %s failed", job.__name__)
