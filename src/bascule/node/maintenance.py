"""The node's periodic jobs over its replicas: HW checkpoints, the cleaner (retention, then log
compaction), interval fsyncs, ISR changes the leaders ask for, and auto-pause of idle partitions;
and the expiry of the silent members of the consumer groups it coordinates. Disk work runs in
threads."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from bascule.config import Config
from bascule.metadata.raft import MetadataError, NoMetadataLeader
from bascule.metadata.replicated import ReplicatedMetadata
from bascule.metadata.service import MetadataService
from bascule.metadata.state import MetadataState
from bascule.node.groups import GroupCoordinator
from bascule.node.handoff import GatherReports, move_leadership
from bascule.node.partitions import LocalPartition, Partitions
from bascule.node.reports import MetadataBatches
from bascule.node.tasks import Tasks
from bascule.partition.replica import PartitionReplica
from bascule.partition.replication.leader import IsrOutcome, IsrRequest
from bascule.wire.settings import EffectiveSettings, effective_settings

log = logging.getLogger(__name__)

CHECKPOINT_INTERVAL = 5.0
CLEANER_TICK = 1.0  # how often the cleaner looks for partitions due: finer stream intervals wait for it
AUTO_PAUSE_CHECK_INTERVAL = 1.0
MAX_GROUP_LIVENESS_INTERVAL = 1.0


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
            (self._isr_check_interval(), self._maintain_isrs),
            (self._isr_check_interval(), self._tend_failing_logs),
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
        for local in self.partitions.all():
            if not local.replica.closed:
                await local.replica.checkpoint()

    async def _clean(self) -> None:
        """Liftbridge's cleaner: retention, then compaction by key of the streams that have it
        (``compactEnabled``, else ``streams.compact.enabled``; the cursors stream always), every
        ``cleanerInterval`` of the stream (else ``streams.cleaner.interval``). Leaders and
        followers clean on their own. One log at a time, its reading and writing in a thread; a
        log that fails to compact is logged and the others go on."""
        loop = asyncio.get_running_loop()
        replicas = {key: local.replica for key, local in self.partitions.items() if not local.replica.closed}
        intervals = {key: self._cleaner_interval(key[0]) for key in replicas}
        for stream_name, partition in self._cleaning.due(intervals, self.clock()):
            replica = replicas[stream_name, partition]
            if replica.closed:  # closed while an earlier one compacted
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

    def _cleaner_interval(self, stream_name: str) -> float:
        return self._settings(stream_name).cleaner_interval

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
        for local in self.partitions.all():
            if not local.replica.closed and local.replica.failed is None:
                await local.replica.sync()

    def _isr_check_interval(self) -> float:
        return max(0.05, min(1.0, self.config.clustering.replica_max_lag_time / 4))

    async def _maintain_isrs(self) -> None:
        for local in self.partitions.all():
            for request in local.replica.isr_requests():
                self.tasks.spawn(self._change_isr(local.replica, request), "change ISR")

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

    async def _tend_failing_logs(self) -> None:
        """Kafka's log-dir failure handling, per partition: a leader whose writes fail on the disk
        (a full disk) hands leadership to another ISR member, at most once per leader timeout; a
        log that failed for good (an fsync error) is reopened (``Partitions.recover``); a replica
        that could not be opened is tried again."""
        now = self.clock()
        timeout = self.config.clustering.replica_max_leader_timeout
        for key in [k for k, at in self._handed_off_at.items() if now > at + timeout]:
            del self._handed_off_at[key]  # bounded: only hand-offs within the last leader timeout
        for key, local in self.partitions.items():
            replica = local.replica
            if replica.closed or key in self._disk_jobs:
                continue
            if replica.failed is not None:
                self._disk_job(key, self.partitions.recover(*key), "reopen a failed log")
            elif replica.writes_failing and replica.is_leader and now > self._handed_off_at.get(key, 0) + timeout:
                self._handed_off_at[key] = now
                self._disk_job(key, self._hand_off(*key), "hand off a partition whose writes fail")
        if self.partitions.unopened():
            self.partitions.schedule_reconcile()

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
        reports = await self.gather_reports(min(1.0, timeout), others) if others else {}
        chosen = await move_leadership(current, self.server_id, reports, self.metadata.call, timeout)
        if chosen is not None:
            log.warning("%s/%s: writes fail on this node's disk, %s leads now", stream, partition, chosen)

    async def _auto_pause(self) -> None:
        """Pause led partitions that received nothing for their auto-pause time (Liftbridge's
        streams.auto.pause.time); a publish through the API resumes them."""
        for (stream_name, partition), local in self.partitions.items():
            replica = local.replica
            if not replica.is_leader or replica.paused or local.pause_requested:
                continue
            settings = self._settings(stream_name)
            pause_after, unless_subscribed = settings.auto_pause_time, settings.auto_pause_unless_subscribed
            if not pause_after or replica.idle_for() < pause_after or (unless_subscribed and replica.readers):
                continue
            local.pause_requested = True
            self.tasks.spawn(self._pause_idle(local, stream_name, partition), "auto-pause")

    async def _pause_idle(self, local: LocalPartition, stream_name: str, partition: int) -> None:
        log.info("%s/%s: no messages for its auto-pause time, pausing", stream_name, partition)
        try:
            await self.metadata.call("pause", name=stream_name, partitions=[partition], resume_all=False,
                                     at=time.time_ns())
        except (MetadataError, NoMetadataLeader) as exc:
            log.warning("auto-pause of %s/%s failed: %s", stream_name, partition, exc)
        finally:
            local.pause_requested = False


class CleanerSchedule:
    """When each partition is next cleaned: an interval after it was first seen, then after each
    clean; partitions no longer there are forgotten."""

    def __init__(self) -> None:
        self._next: dict[tuple[str, int], float] = {}

    def due(self, intervals: dict[tuple[str, int], float], now: float) -> list[tuple[str, int]]:
        """The partitions of ``intervals`` (partition -> its interval) due at ``now``, in order."""
        for gone in self._next.keys() - intervals.keys():
            del self._next[gone]
        due = []
        for key, interval in intervals.items():
            if now >= self._next.setdefault(key, now + interval):
                due.append(key)
                self._next[key] = now + interval
        return due


async def _every(interval: float, job: Callable[[], Awaitable[None]]) -> None:
    """Run ``job`` every ``interval`` seconds; a failed run is logged and the next one comes."""
    while True:
        await asyncio.sleep(interval)
        try:
            await job()
        except Exception:
            log.exception("periodic %s failed", job.__name__)
