"""The partition replicas this node runs, kept in step with the metadata.

The node never acts inside a Raft apply. Every metadata change schedules one reconcile on the
event loop, which compares the state machine with the replicas this node runs and opens, leads,
follows, pauses or removes them to match; replaying the journal after a restart therefore
rebuilds exactly the same set.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bascule.config import Config
from bascule.metadata.election import Role, replica_role
from bascule.metadata.raft import MetadataError, NoMetadataLeader
from bascule.metadata.replicated import ReplicatedMetadata
from bascule.metadata.service import MetadataService
from bascule.metadata.state import MetadataState, Partition, Stream
from bascule.natsio.transport import Transport, TransportMessage
from bascule.node.reports import MetadataBatches
from bascule.node.tasks import Tasks
from bascule.partition.encryption import MasterKey, stream_encrypted
from bascule.partition.fetchmux import FetchMux, FetchMuxes, MuxEndpoint
from bascule.partition.follower import FollowerLoop, FollowerSettings
from bascule.partition.leader import LeaderEndpoint
from bascule.partition.log import CommitLog, LogConfig
from bascule.partition.replica import PartitionReplica, SyncPolicy
from bascule.partition.replication.dedup import DedupLimits
from bascule.partition.session import FetchSession, FetchSessions, Notifications, SessionEndpoint
from bascule.wire import envelope
from bascule.wire.names import directory_name, partition_subject
from bascule.wire.sessions import decode_notifications
from bascule.wire.settings import effective_settings
from bascule.wire.subjects import Subjects

log = logging.getLogger(__name__)

RETURN_RETRY = 0.5
# Partitions a reconcile brings up at once: their NATS round trips (subscriptions in place, a follower
# loop stopped) overlap, so a node given the partitions of a failed one leads them all in a few. Each
# waits some turns of the loop, which a failover makes long: at 64 at a time a survivor of a SIGKILL at
# 10,000 partitions took some 45 s to re-point the 3,333 followers of the dead node's partitions, which
# asked it for fetches 20 times a second each meanwhile (issue 32); at 512, some 10 s.
RECONCILE_CONCURRENCY = 512


@dataclass
class LocalPartition:
    replica: PartitionReplica
    subject: str
    group: str
    created: int = 0  # its stream's creation time (``Stream.created``): which incarnation of the stream its files are
    capture: int | None = None  # subscription id on the capture connection
    endpoint: LeaderEndpoint | None = None
    follower: FollowerLoop | None = None
    pause_requested: bool = False
    started: bool = False  # its role and capture are set up (reported to admin queries from then on)


# Told, after each reconcile of a partition, whether this node should capture its subject now;
# returns once the NATS server has the change.
CaptureSwitch = Callable[[LocalPartition, bool], Awaitable[None]]


class Partitions:
    def __init__(
        self, config: Config, data_dir: Path, server_id: str, incarnation: str, nc: Transport,
        subjects: Subjects, raft: ReplicatedMetadata, metadata: MetadataService, tasks: Tasks, master_key: MasterKey,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clock = clock  # the replicas' (their leases, lag and idle times)
        self.config = config
        self.data_dir = data_dir
        self.server_id = server_id
        self.incarnation = incarnation
        self.nc = nc
        self.subjects = subjects
        self.raft = raft
        self.metadata = metadata
        self.tasks = tasks
        self.master_key = master_key
        self.sync_policy = SyncPolicy.parse(config.streams.sync)
        # Reports of silent leaders, returns and ISR changes, each kind sent in batches (node.reports).
        self.batches = MetadataBatches(metadata.call, lambda: nc.max_payload, tasks.spawn)
        self.switch_capture: CaptureSwitch = _no_capture
        self._local: dict[tuple[str, int], LocalPartition] = {}
        self._reconcile_scheduled = False
        self._reconcile_lock = asyncio.Lock()
        self._withdrawn = False
        self.closed_sound = True  # every log closed so far was sound: synced, not failed
        self._returning: set[tuple[str, int, int]] = set()  # (stream, partition, leader epoch) being handed back
        # Leader epochs a replica of this run lost entries under (its fsync failed): handed back, never resumed.
        self._not_resumed: set[tuple[str, int, int]] = set()
        self._recovering: dict[tuple[str, int], int] = {}  # reopened replicas' synced ends, to cut back to
        # What the last removal of unassigned directories kept: (stream, its creation time, partition).
        self._assigned: set[tuple[str, int, int]] | None = None
        self._wanted_of: MetadataState | None = None
        self._wanted_here: dict[tuple[str, int], tuple[Stream, Partition]] = {}
        # The partition metadata and stream settings each replica was last brought up as (reconcile skips it
        # while they stay the same objects).
        self._applied: dict[tuple[str, int], tuple[Partition, Mapping[str, Any]]] = {}
        clustering = config.clustering
        self._follower_settings = FollowerSettings(
            clustering.replica_fetch_timeout, clustering.replica_max_leader_timeout, clustering.replica_max_idle_wait
        )
        # Caught-up followers fetch no more often than the machine's idle wait: nor do the rounds.
        interval = self._follower_settings.machine_config().max_idle_wait
        request_timeout = self._follower_settings.request_timeout
        self.sessions = FetchSessions(
            lambda leader: FetchSession(nc, subjects, server_id, leader, interval, request_timeout, clock), tasks.start,
        )
        self._session_endpoint = SessionEndpoint(nc, subjects, server_id, self._leading_replica, clock)
        self.muxes = FetchMuxes(lambda leader: FetchMux(nc, subjects, server_id, leader, tasks.spawn, clock))
        self._mux_endpoint = MuxEndpoint(nc, subjects, server_id, self._leader_endpoint)
        self._notifications = Notifications(nc, subjects, tasks.spawn)

    async def start(self) -> None:
        await self.nc.subscribe(self.subjects.notify(self.server_id), cb=self._on_notification)
        await self._session_endpoint.start()
        await self._mux_endpoint.start()

    def _leader_endpoint(self, stream: str, partition: int) -> LeaderEndpoint | None:
        local = self._local.get((stream, partition))
        return None if local is None else local.endpoint

    def _leading_replica(self, stream: str, partition: int) -> PartitionReplica | None:
        local = self._local.get((stream, partition))
        return None if local is None else local.replica

    async def close(self) -> None:
        for key in list(self._local):
            replica = self._local[key].replica
            await self._close(key, delete=False)
            if replica.failed is not None:
                self.closed_sound = False

    async def withdraw(self) -> None:
        """Stop every partition here for good (a node that handed its leaderships off and is about
        to stop): no more captures, fetches served or followed, and no reconcile brings one back,
        so a follower loop cannot rejoin an ISR this node just left."""
        async with self._reconcile_lock:
            self._withdrawn = True
            await self.close()

    def registered(self) -> bool:
        """Whether the metadata knows this incarnation (and so whether its replicas are unclean):
        until then, their positions must not reach an election."""
        broker = self.raft.state.brokers.get(self.server_id)
        return broker is not None and broker.incarnation == self.incarnation

    def get(self, stream: str, partition: int) -> LocalPartition | None:
        return self._local.get((stream, partition))

    def all(self) -> list[LocalPartition]:
        return list(self._local.values())

    def items(self) -> list[tuple[tuple[str, int], LocalPartition]]:
        return list(self._local.items())

    def unopened(self) -> list[tuple[str, int]]:
        """The (stream, partition) pairs the metadata assigns to this node that are not up in their
        role yet: a reconcile is on its way, or could not bring them up."""
        return sorted(
            key for key in self._wanted(self.raft.state)
            if (local := self._local.get(key)) is None or not local.started
        )

    async def until_leading(self, stream: str, partition: int) -> LocalPartition | None:
        """The partition once this node leads it, when the metadata names it leader but it does
        not lead yet (just started, or handing back an epoch of an earlier run); None once the
        metadata names another leader. The replica as it is after a leader timeout."""

        def settled() -> tuple[LocalPartition | None] | None:
            local = self.get(stream, partition)
            if getattr(self.raft.state.partition(stream, partition), "leader", None) != self.server_id:
                return (None,)
            return (local,) if local is not None and local.replica.is_leader else None

        found = await self.raft.watch.until(settled, self.config.clustering.replica_max_leader_timeout)
        return self.get(stream, partition) if found is None else found[0]

    async def until_resumed(self, stream: str, partition: int) -> None:
        """Once this node's replica of the partition has applied its resume (the metadata's, which
        a publish just awaited), or after a leader timeout: what is appended then comes after the
        resume, for its subscribers and in its event times."""

        def resumed() -> bool:
            local = self.get(stream, partition)
            return local is None or not local.replica.paused

        await self.raft.watch.until(resumed, self.config.clustering.replica_max_leader_timeout)

    # ---- reconcile ---------------------------------------------------------------------------

    def schedule_reconcile(self) -> None:
        if self._reconcile_scheduled or self.tasks.closing:
            return
        self._reconcile_scheduled = True
        self.tasks.spawn(self._reconcile(), "reconcile")

    async def _reconcile(self) -> None:
        # A journal being replayed passes through old states (a stream not yet created, a
        # leader epoch long gone): act only on a state that has caught up with the group.
        await self.raft.watch.until(lambda: self.raft.ready, None)
        async with self._reconcile_lock:
            self._reconcile_scheduled = False
            if self._withdrawn:
                return
            wanted = self._wanted(self.raft.state)
            # Bounded: an epoch not to resume matters only while the metadata still names it.
            self._not_resumed = {
                (s, p, epoch) for s, p, epoch in self._not_resumed
                if (s, p) in wanted and wanted[s, p][1].leader_epoch == epoch
            }
            # Gone, or of a stream deleted and created again under its name (both seen in one reconcile).
            for key in [k for k, local in self._local.items()
                        if k not in wanted or local.created != wanted[k][0].created]:
                await self._close(key, delete=True)
            await self._remove_unassigned(wanted)
            # Only the partitions whose metadata changed since they were brought up (a state shares every
            # unchanged partition with the one before), all of them at once, those this node leads first:
            # their followers on the other nodes are coming up too, and report a leader they cannot reach
            # for a leader timeout.
            self._applied = {key: applied for key, applied in self._applied.items() if key in wanted}
            changed = [(key, stream, partition) for key, (stream, partition) in wanted.items()
                       if not self._up_to_date(key, stream, partition)]
            changed.sort(key=lambda entry: self._role(entry[2]) is not Role.LEAD)
            for start in range(0, len(changed), RECONCILE_CONCURRENCY):
                await asyncio.gather(*(self._bring_up(*entry) for entry in changed[start:][:RECONCILE_CONCURRENCY]))
        self.raft.watch.notify()  # roles and flags changed: until_leading, until_resumed

    def _up_to_date(self, key: tuple[str, int], stream: Stream, partition: Partition) -> bool:
        """Whether the replica is up as this very partition metadata and stream settings want it."""
        local, applied = self._local.get(key), self._applied.get(key)
        return (local is not None and local.started and applied is not None and applied[0] is partition
                and applied[1] is stream.settings)

    async def _bring_up(self, key: tuple[str, int], stream: Stream, partition: Partition) -> None:
        try:
            await self._apply(stream, partition)
        except Exception:
            self._applied.pop(key, None)
            log.exception("could not bring up partition %s/%s", *key)
        else:
            self._applied[key] = (partition, stream.settings)

    def _wanted(self, state: MetadataState) -> Mapping[tuple[str, int], tuple[Stream, Partition]]:
        # Asked every second by the maintenance walk too: worked out once per metadata state (an
        # immutable value, replaced by every command).
        if state is not self._wanted_of:
            self._wanted_of = state
            self._wanted_here = {
                (s.name, p.id): (s, p)
                for s in state.streams.values()
                for p in s.partitions.values()
                if self.server_id in p.replicas
            }
        return self._wanted_here

    async def _remove_unassigned(self, wanted: Mapping[tuple[str, int], tuple[Stream, Partition]]) -> None:
        """The directories of partitions not assigned here go, whenever what is assigned (a stream's
        incarnation and partition) changed, and at the first reconcile. Not at every reconcile: every
        metadata command brings one, and at 10,000 partitions the paths alone took 0.2-0.3 s of CPU
        (issue 32)."""
        assigned = {(stream.name, stream.created, partition.id) for stream, partition in wanted.values()}
        if assigned == self._assigned:
            return
        directories = {self.directory(stream, partition.id) for stream, partition in wanted.values()}
        await asyncio.to_thread(self._remove_unassigned_directories, directories)
        self._assigned = assigned

    def _remove_unassigned_directories(self, assigned: set[Path]) -> None:
        """Partition directories the metadata no longer assigns here (a stream deleted while this
        node was down, an old incarnation of a recreated stream) go: nothing may ever serve them."""
        streams = self.data_dir / "streams"
        if not streams.is_dir():
            return
        for stream_dir in streams.iterdir():
            for partition_dir in [d for d in stream_dir.iterdir() if d not in assigned] if stream_dir.is_dir() else []:
                log.info("removing %s: not assigned to this node", partition_dir)
                shutil.rmtree(partition_dir, ignore_errors=True)
            if stream_dir.is_dir() and not any(stream_dir.iterdir()):
                stream_dir.rmdir()

    async def _apply(self, stream: Stream, partition: Partition) -> None:
        key = (stream.name, partition.id)
        local = self._local.get(key)
        if local is None:
            local = self._local[key] = await self._open(stream, partition)
        role = self._role(partition)
        if role is Role.FOLLOW:
            await self._follow(local, partition)
        elif role is Role.LEAD:
            await self._lead(local, stream, partition)
        else:
            await self._hand_back(local, partition)
        local.replica.set_flags(partition.paused, partition.readonly)
        await self.switch_capture(local, local.replica.is_leader and not partition.paused and not partition.readonly)
        local.started = True

    async def _lead(self, local: LocalPartition, stream: Stream, partition: Partition) -> None:
        if local.follower is not None:
            await local.follower.stop()
            local.follower = None
        clustering = self.config.clustering
        min_isr = effective_settings(stream.name, stream.settings, self.config.stream_defaults).min_isr
        local.replica.become_leader(
            self.server_id, partition.leader_epoch, partition.epoch, list(partition.replicas), list(partition.isr),
            min_isr, clustering.replica_max_lag_time, clustering.replica_max_leader_timeout, partition.unclean,
        )
        if local.endpoint is None:
            local.endpoint = LeaderEndpoint(self.nc, self.subjects, local.replica, clustering.replication_max_bytes)
            await local.endpoint.start()

    async def _follow(self, local: LocalPartition, partition: Partition) -> None:
        if local.endpoint is not None:
            await local.endpoint.stop()
            local.endpoint = None
        follower = local.follower
        following = None if follower is None else (follower.leader, follower.leader_epoch)
        if following == (partition.leader, partition.leader_epoch):
            return
        if follower is not None:
            await follower.stop()
        local.replica.become_follower(partition.leader, partition.leader_epoch)
        local.follower = FollowerLoop(
            self.nc, self.subjects, local.replica, self.server_id, self._follower_settings, self._report_leader,
            self.tasks.start, self.sessions.to(partition.leader) if partition.leader else None,
            self.muxes.to(partition.leader) if partition.leader else None,
        )
        local.follower.start()

    async def _hand_back(self, local: LocalPartition, partition: Partition) -> None:
        """The metadata names this node leader of an epoch given to an earlier run of it: the
        log may have lost its unsynced tail since, so that epoch is not resumed. Until the
        metadata leader elects again (this node with a new epoch, or another ISR member), the
        replica neither leads nor follows."""
        if local.follower is not None:
            await local.follower.stop()
            local.follower = None
        if local.endpoint is not None:
            await local.endpoint.stop()
            local.endpoint = None
        local.replica.become_follower("", partition.leader_epoch)
        key = (partition.stream, partition.id, partition.leader_epoch)
        if key not in self._returning:
            self._returning.add(key)
            self.tasks.spawn(self._report_return(local.replica, key), f"return {key}")

    async def _report_return(self, replica: PartitionReplica, key: tuple[str, int, int]) -> None:
        stream, partition, leader_epoch = key
        log.info("%s/%s: this node led epoch %d before it restarted: asking for an election",
                 stream, partition, leader_epoch)
        try:
            while not replica.closed and self._still_returning(key):
                if not self.registered():
                    await self.raft.watch.until(self.registered, RETURN_RETRY)
                    continue
                last_epoch, log_end_offset = replica.position()
                try:
                    await self.batches.leader_returned(
                        stream, partition, self.server_id, leader_epoch, last_epoch, log_end_offset,
                    )
                except (MetadataError, NoMetadataLeader) as exc:
                    log.info("%s/%s: election after return not done yet: %s", stream, partition, exc)
                await asyncio.sleep(RETURN_RETRY)
        finally:
            self._returning.discard(key)

    def _still_returning(self, key: tuple[str, int, int]) -> bool:
        stream, partition, leader_epoch = key
        current = self.raft.state.partition(stream, partition)
        return current is not None and current.leader_epoch == leader_epoch and self._role(current) is Role.HAND_BACK

    def _role(self, partition: Partition) -> Role:
        role = replica_role(partition.leader, partition.leader_incarnation, self.server_id, self.incarnation)
        if role is Role.LEAD and (partition.stream, partition.id, partition.leader_epoch) in self._not_resumed:
            return Role.HAND_BACK
        return role

    async def _report_leader(self, replica: PartitionReplica, leader: str, leader_epoch: int) -> None:
        if not self.registered():
            log.info("%s/%s: leader %s (epoch %d) is silent; reporting it once this node is registered",
                     replica.stream, replica.partition, leader, leader_epoch)
            return
        log.warning("%s/%s: leader %s (epoch %d) is silent, reporting it",
                    replica.stream, replica.partition, leader, leader_epoch)
        try:
            await self.batches.report_leader(replica.stream, replica.partition, leader, leader_epoch, self.server_id)
        except (MetadataError, NoMetadataLeader) as exc:
            log.warning("leader report for %s/%s failed: %s", replica.stream, replica.partition, exc)

    # ---- failed logs ---------------------------------------------------------------------------

    async def recover(self, stream: str, partition: int) -> None:
        """Reopen a replica whose log failed (an fsync error), cut back to what its last good fsync
        covered, so that it fetches the rest again, as Kafka brings a failed log dir back. Pages a
        failed fsync could not write may still be readable and never reach the disk, so until it
        catches up the metadata counts it unclean; a leadership it had is handed back, never
        resumed. Raises MetadataError or NoMetadataLeader when the mark cannot be made yet."""
        key = (stream, partition)
        current = self.raft.state.partition(stream, partition)
        local = self._local.get(key)
        if current is None or local is None or local.replica.failed is None:
            return
        if self.server_id in current.isr and self.server_id not in current.unclean:
            await self.metadata.call("mark_unclean", name=stream, partition=partition, replica=self.server_id)
        async with self._reconcile_lock:
            local = self._local.get(key)
            if local is None or local.replica.failed is None:
                return
            log.warning("%s/%s: reopening its failed log", stream, partition)
            current = self.raft.state.partition(stream, partition)
            if current is not None and current.leader == self.server_id:
                self._not_resumed.add((stream, partition, current.leader_epoch))
            self._recovering[key] = local.replica.log.synced_end
            await self._close(key, delete=False)
        self.schedule_reconcile()

    # ---- opening and closing -----------------------------------------------------------------

    async def _open(self, stream: Stream, partition: Partition) -> LocalPartition:
        # Opening recovers the log: it may cut a torn tail and fsync, so not on the event loop.
        commit_log = await asyncio.to_thread(
            CommitLog.open, self.directory(stream, partition.id), self._log_config(stream)
        )
        synced_end = self._recovering.get((stream.name, partition.id))
        if synced_end is not None:
            try:
                await asyncio.to_thread(_cut_back, commit_log, synced_end)
            except BaseException:
                with contextlib.suppress(OSError):
                    await asyncio.to_thread(commit_log.close)
                raise
            del self._recovering[(stream.name, partition.id)]
        values = None
        if stream_encrypted(stream.name, stream.settings):
            values = self.master_key.values()
            if values.problem is not None:
                log.warning("%s/%s is encrypted and this node has no valid encryption key (%s): it replicates"
                            " the partition but refuses its writes and reads", stream.name, partition.id,
                            values.problem)
        settings = effective_settings(stream.name, stream.settings, self.config.stream_defaults)
        replica = PartitionReplica(
            stream.name, partition.id, commit_log, self.sync_policy, self.clock, self._notifications.notify,
            settings.concurrency_control, values, DedupLimits(settings.dedup_window, settings.dedup_max_messages),
        )
        return LocalPartition(replica, partition_subject(stream.subject, partition.id), stream.group, stream.created)

    def directory(self, stream: Stream, partition: int) -> Path:
        """Keyed by the stream's incarnation (its creation time), so that a stream deleted and
        created again while this node was down never sees the old one's files."""
        return self.data_dir / "streams" / f"{directory_name(stream.name)}@{stream.created}" / str(partition)

    async def _close(self, key: tuple[str, int], delete: bool) -> None:
        local = self._local.pop(key)
        if local.follower is not None:
            await local.follower.stop()
        if local.endpoint is not None:
            await local.endpoint.stop()
        await self.switch_capture(local, False)
        local.replica.stop()
        try:
            await asyncio.to_thread(local.replica.close)  # it syncs the log
        except Exception:
            # A full disk, say: the checkpoint or the sync failed, the files are closed all the same.
            # The other partitions still close; this one was not closed sound.
            log.exception("%s/%s: closing the log failed", *key)
            self.closed_sound = False
        if delete:
            await asyncio.to_thread(_remove_partition_directory, local.replica.log.directory)

    def _log_config(self, stream: Stream) -> LogConfig:
        settings = effective_settings(stream.name, stream.settings, self.config.stream_defaults)
        return LogConfig(
            segment_max_bytes=settings.segment_max_bytes, segment_max_age=settings.segment_max_age,
            retention_max_bytes=settings.retention_max_bytes, retention_max_messages=settings.retention_max_messages,
            retention_max_age=settings.retention_max_age,
        )

    # ---- notifications -----------------------------------------------------------------------

    async def _on_notification(self, msg: TransportMessage) -> None:
        try:
            notified = decode_notifications(msg.data)
        except envelope.EnvelopeError as exc:
            log.warning("dropping malformed partition notification: %s", exc)
            return
        for stream, partition in notified:
            local = self.get(stream, partition)
            if local is not None and local.follower is not None:
                local.follower.notify()


async def _no_capture(local: LocalPartition, capturing: bool) -> None:
    pass


def _cut_back(commit_log: CommitLog, synced_end: int) -> None:
    """A reopened log without what its last good fsync did not cover; raises while the disk
    still fails a durable write (the HW checkpoint is one, even when nothing was cut)."""
    if commit_log.next_offset > synced_end:
        log.warning("%s: cutting the log back to %d, the end its last good fsync covered", commit_log.directory,
                    synced_end)
        commit_log.truncate(synced_end)
        commit_log.sync()
    commit_log.rewrite_high_watermark_checkpoint()


def _remove_partition_directory(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    stream_dir = directory.parent
    if stream_dir.exists() and not any(stream_dir.iterdir()):
        stream_dir.rmdir()
