"""A bascule node: embedded NATS, metadata Raft, partition replicas and the gRPC API, wired together.

The node never acts inside a Raft apply. Every metadata change schedules one
reconcile on the event loop, which compares the state machine with the replicas
this node runs and opens, promotes, pauses or removes them to match; replaying the
journal after a restart therefore rebuilds exactly the same set.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import socket
import time
import uuid
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from collections.abc import Collection
from typing import Any, Callable

import msgpack
import nats
from nats.aio.msg import Msg

from bascule import durable
from bascule.metadata.election import Position, Role, replica_role
from bascule.metadata.raft import MetadataError, MetadataRaft, NoMetadataLeader
from bascule.metadata.service import MetadataService, join_cluster
from bascule.metadata.state import ALREADY_EXISTS, INVALID_ARGUMENT, MetadataState, Partition, Stream
from bascule.node import capture
from bascule.node.config import Config
from bascule.node.embedded_nats import EmbeddedNats
from bascule.node.nats_capture import CaptureConnection, Delivery
from bascule.wire.names import CURSORS_STREAM, directory_name, partition_subject, stream_name_error, subject_error
from bascule.partition.follower import FollowerLoop, FollowerSettings
from bascule.partition.leader import LeaderEndpoint, encode_notification
from bascule.partition.log import CommitLog, LogConfig
from bascule.partition.replica import NotLeader, Outcome, PartitionClosed, PartitionReplica, SyncPolicy, settle
from bascule.partition.replication.leader import IsrOutcome, IsrRequest
from bascule.partition.subjects import Subjects
from bascule.wire.pb import internal_pb2
from bascule.wire import envelope
from bascule.wire.entry import Record
from bascule.wire.pb import api_pb2

log = logging.getLogger(__name__)

HW_CHECKPOINT_INTERVAL = 5.0
REMOTE_ACK_TIMEOUT = 30.0
NATS_DEFAULT_PORT = 4222
REGISTRATION_WAIT = 10.0
ADMIN_TIMEOUT = 2.0
STREAM_START_WAIT = 5.0
AUTO_PAUSE_CHECK_INTERVAL = 1.0
RAFT_READY_POLL = 0.05
RETURN_RETRY = 0.5
LEADERSHIP_POLL = 0.02
# Envelope header (12), the ack inbox field around the prefix (tag, length, ".<sequence>"), ack policy.
PUBLISH_ENVELOPE_OVERHEAD = 64
# gRPC delivers pipelined publishes one per event-loop turn; waiting this long lets one write,
# one fsync and one replication round serve a whole window of them instead of one each.
API_WRITE_LINGER = 0.0005


@dataclass
class LocalPartition:
    replica: PartitionReplica
    subject: str
    group: str
    capture: int | None = None  # subscription id on the capture connection
    endpoint: LeaderEndpoint | None = None
    follower: FollowerLoop | None = None
    pause_requested: bool = False
    started: bool = False  # its role and capture are set up (reported to admin queries from then on)


class Node:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.data_dir = Path(config.data_dir).resolve()
        self.server_id = ""
        self.api_port = 0
        self.nats: nats.NATS | None = None
        self.capture_connection: CaptureConnection | None = None
        self.raft: MetadataRaft | None = None
        self.metadata: MetadataService | None = None
        self.subjects = Subjects(config.clustering.namespace)
        self.partitions: dict[tuple[str, int], LocalPartition] = {}
        self._embedded: EmbeddedNats | None = None
        self._reconcile_scheduled = False
        self._reconcile_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()
        self._stopping = asyncio.Event()
        self._ack_prefix = ""
        self._ack_waiters: dict[str, asyncio.Future[api_pb2.Ack]] = {}
        self._ack_sequence = 0
        # This process's incarnation: a leader epoch given to an earlier one is never resumed.
        self.incarnation = uuid.uuid4().hex
        self._returning: set[tuple[str, int, int]] = set()  # (stream, partition, leader epoch) being handed back

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self, api_port: int) -> None:
        self.api_port = api_port
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.server_id = self._server_id()
        nats_url = await self._start_nats()
        self.nats = await nats.connect(
            nats_url,
            name=f"bascule-{self.server_id}",
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            error_cb=self._nats_error,
        )
        self.capture_connection = CaptureConnection(nats_url, f"bascule-{self.server_id}-capture")
        await self.capture_connection.connect()
        self._ack_prefix = f"_INBOX.bascule.{self.server_id}.{uuid.uuid4().hex[:8]}"
        await self.nats.subscribe(self._ack_prefix + ".*", cb=self._on_ack)
        await self.nats.subscribe(self.subjects.notify(self.server_id), cb=self._on_notification)
        raft_address = self._raft_address()
        self.raft = MetadataRaft(
            raft_address,
            await self._raft_peers(raft_address),
            self.data_dir,
            self.config.clustering.raft_password,
            self._schedule_reconcile,
        )
        self.metadata = MetadataService(
            self.raft, self.nats, self.subjects, self.config.clustering.replica_max_leader_timeout,
            self._gather_positions,
        )
        await self.metadata.start()
        await self.nats.subscribe(self.subjects.admin_status, cb=self._on_status_request)
        await self.nats.subscribe(self.subjects.admin_replicas, cb=self._on_replicas_request)
        registration = self._spawn(self._register_broker(raft_address))
        # Serve once this broker is known to the cluster, so the first CreateStream can place on it;
        # without a metadata leader in sight, serve anyway and answer "no known metadata leader".
        await asyncio.wait({registration}, timeout=REGISTRATION_WAIT)
        self._spawn(self._periodic(HW_CHECKPOINT_INTERVAL, self._checkpoint_high_watermarks))
        self._spawn(self._periodic(self.config.streams.cleaner_interval, self._enforce_retention))
        self._spawn(self._periodic(self._isr_check_interval(), self._maintain_isrs))
        self._spawn(self._periodic(AUTO_PAUSE_CHECK_INTERVAL, self._auto_pause))
        sync_interval = self._sync_policy().interval
        if sync_interval:
            self._spawn(self._periodic(sync_interval, self._sync_partitions))
        log.info("node %s started: nats %s, raft %s", self.server_id, nats_url, raft_address)

    async def stop(self) -> None:
        self._stopping.set()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for key in list(self.partitions):
            await self._close_partition(key, delete=False)
        if self.raft is not None:
            self.raft.close()
        if self.capture_connection is not None:
            await self.capture_connection.close()
        if self.nats is not None and not self.nats.is_closed:
            await self.nats.close()
        if self._embedded is not None:
            await self._embedded.stop()

    async def _start_nats(self) -> list[str]:
        nats_config = self.config.nats
        if not nats_config.embedded:
            return list(nats_config.servers)
        config_file = nats_config.embedded_config or None
        # Like Liftbridge, the embedded server takes NATS's usual port unless its config file says otherwise.
        self._embedded = EmbeddedNats(
            port=None if config_file else NATS_DEFAULT_PORT,
            config_file=config_file,
            log_dir=self.data_dir,
        )
        await self._embedded.start()
        return [self._embedded.url]

    def _server_id(self) -> str:
        configured = self.config.clustering.server_id
        id_file = self.data_dir / "server-id"
        if configured:
            return configured
        # A generated id must survive restarts: partitions name their replicas by it.
        if id_file.exists():
            return id_file.read_text().strip()
        generated = uuid.uuid4().hex[:16]
        durable.write_atomically(id_file, generated + "\n")
        return generated

    def _raft_address(self) -> str:
        host, port = self.config.clustering.raft_listen.rsplit(":", 1)
        if int(port):
            return f"{host}:{port}"
        address_file = self.data_dir / "raft-address"
        if address_file.exists():
            return address_file.read_text().strip()
        with socket.socket() as probe:
            probe.bind((host, 0))
            address = f"{host}:{probe.getsockname()[1]}"
        durable.write_atomically(address_file, address + "\n")
        return address

    async def _raft_peers(self, raft_address: str) -> list[str]:
        """The other voters to start Raft with: bootstrap peers, the group this node joined
        earlier, none for a seed, or the members the metadata leader returns to a join request."""
        clustering = self.config.clustering
        peers_file = self.data_dir / "raft" / "peers"
        if clustering.raft_bootstrap_peers:
            return [p for p in clustering.raft_bootstrap_peers if p != raft_address]
        if peers_file.exists():
            return [p for p in peers_file.read_text().split() if p != raft_address]
        if clustering.raft_bootstrap_seed or (self.data_dir / "raft" / "journal").exists():
            return []
        members = await join_cluster(self.nats, self.subjects, raft_address, self._stopping)
        peers_file.parent.mkdir(parents=True, exist_ok=True)
        durable.write_atomically(peers_file, "\n".join(members) + "\n")
        return [m for m in members if m != raft_address]

    def _spawn(self, coro: Any) -> asyncio.Task:
        """A task the node owns: cancelled at stop, its failure logged."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None and not self._stopping.is_set():
            log.error("task %s failed", task.get_coro().__qualname__, exc_info=task.exception())

    async def _periodic(self, interval: float, action: Any) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                action()
            except Exception:
                log.exception("periodic %s failed", action.__name__)

    async def _nats_error(self, error: Exception) -> None:
        # Slow-consumer drops on a capture subscription lose plain publishes: say so loudly.
        log.error("NATS error: %r", error)

    async def _register_broker(self, raft_address: str) -> None:
        host, port = self.config.advertised_host, self.api_port
        while not self._stopping.is_set():
            registered = self.read(lambda s: s.brokers.get(self.server_id))
            wanted = (host, port, raft_address, self.incarnation)
            if registered and (registered.host, registered.port, registered.raft, registered.incarnation) == wanted:
                break
            try:
                await self.metadata.call(
                    "register_broker", id=self.server_id, host=host, port=port, raft=raft_address,
                    incarnation=self.incarnation,
                )
            except NoMetadataLeader:
                await asyncio.sleep(0.2)
        await self._ensure_cursor_stream()

    async def _ensure_cursor_stream(self) -> None:
        partitions = self.config.cursors.stream_partitions
        while partitions and not self._stopping.is_set():
            if self.read(lambda s: CURSORS_STREAM in s.streams):
                return
            try:
                await self.metadata.call(
                    "create_stream", name=CURSORS_STREAM, subject=CURSORS_STREAM, group="",
                    replication_factor=self.config.cursors.stream_replication_factor,
                    partitions=partitions, settings={},
                )
            except MetadataError as exc:
                if exc.code != ALREADY_EXISTS:  # else another node created it first
                    log.error("could not create the cursor stream: %s", exc.message)
                return
            except NoMetadataLeader:
                await asyncio.sleep(0.2)

    # ---- metadata ----------------------------------------------------------------------------

    def read(self, reader: Any) -> Any:
        return self.raft.read(reader)

    async def create_stream(
        self, name: str, subject: str, group: str, replication_factor: int, partitions: int,
        settings: dict[str, Any],
    ) -> None:
        for problem in (stream_name_error(name), subject_error(subject)):
            if problem:
                raise MetadataError(INVALID_ARGUMENT, problem)
        if partitions < 0:
            raise MetadataError(INVALID_ARGUMENT, "partitions must be >= 0")
        # a partition whose ISR can never reach its min ISR would never commit anything
        min_isr = settings.get("min_isr") or self.config.clustering.min_insync_replicas
        if replication_factor > 0 and min_isr > replication_factor:
            origin = "" if settings.get("min_isr") else " (clustering.min.insync.replicas)"
            raise MetadataError(
                INVALID_ARGUMENT, f"min ISR {min_isr}{origin} exceeds the replication factor {replication_factor}"
            )
        await self.metadata.call(
            "create_stream", name=name, subject=subject, group=group,
            replication_factor=replication_factor, partitions=partitions or 1, settings=settings,
        )
        await self._wait_until_led(name)

    async def _wait_until_led(self, stream: str) -> None:
        """Until each partition's leader has started it (its subject captured), so a publish right
        after CreateStream is not lost; Raft commit alone does not mean the leaders applied it."""
        deadline = time.monotonic() + STREAM_START_WAIT
        while time.monotonic() < deadline:
            leaders = self.read(
                lambda s: {p.id: p.leader for p in s.streams[stream].partitions.values()} if stream in s.streams else {}
            )
            remote = set(leaders.values()) - {self.server_id}
            reports = await self.gather_replica_reports(ADMIN_TIMEOUT) if remote else {}
            reports[self.server_id] = self.replica_report()
            if leaders and all(f"{stream}/{pid}" in reports.get(leader, {}) for pid, leader in leaders.items()):
                return
            await asyncio.sleep(0.02)
        log.warning("stream %s: not every partition leader started within %.0f s", stream, STREAM_START_WAIT)

    # ---- reconcile ---------------------------------------------------------------------------

    def _schedule_reconcile(self) -> None:
        if self._reconcile_scheduled or self._stopping.is_set():
            return
        self._reconcile_scheduled = True
        self._spawn(self._reconcile())

    async def _reconcile(self) -> None:
        # A journal being replayed passes through old states (a stream not yet created, a
        # leader epoch long gone): act only on a state that has caught up with the group.
        while not self.raft.ready:
            await asyncio.sleep(RAFT_READY_POLL)
        async with self._reconcile_lock:
            self._reconcile_scheduled = False
            wanted = self.read(self._wanted_partitions)
            for key in [k for k in self.partitions if k not in wanted]:
                await self._close_partition(key, delete=True)
            self._remove_unassigned_directories({self._partition_dir(s, p.id) for s, p in wanted.values()})
            for key, (stream, partition) in wanted.items():
                try:
                    await self._apply_partition(stream, partition)
                except Exception:
                    log.exception("could not bring up partition %s/%s", *key)

    def _wanted_partitions(self, state: MetadataState) -> dict[tuple[str, int], tuple[Stream, Partition]]:
        return {
            (s.name, p.id): (s, _copy_partition(p))
            for s in state.streams.values()
            for p in s.partitions.values()
            if self.server_id in p.replicas
        }

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

    async def _apply_partition(self, stream: Stream, partition: Partition) -> None:
        key = (stream.name, partition.id)
        local = self.partitions.get(key)
        if local is None:
            local = self._open_partition(stream, partition)
            self.partitions[key] = local
        role = replica_role(partition.leader, partition.leader_incarnation, self.server_id, self.incarnation)
        if role is Role.FOLLOW:
            await self._follow(local, partition)
        elif role is Role.LEAD:
            await self._lead(local, stream, partition)
        else:
            await self._hand_back(local, partition)
        local.replica.set_flags(partition.paused, partition.readonly)
        capturing = local.replica.is_leader and not partition.paused and not partition.readonly
        if capturing and local.capture is None:
            local.capture = self.capture_connection.subscribe(local.subject, local.group, self._capture_handler(local))
            await self.capture_connection.flush()
        elif not capturing and local.capture is not None:
            self.capture_connection.unsubscribe(local.capture)
            local.capture = None
        local.started = True

    async def _lead(self, local: LocalPartition, stream: Stream, partition: Partition) -> None:
        if local.follower is not None:
            await local.follower.stop()
            local.follower = None
        clustering = self.config.clustering
        min_isr = stream.settings.get("min_isr") or clustering.min_insync_replicas
        local.replica.become_leader(
            self.server_id, partition.leader_epoch, partition.epoch, partition.replicas, partition.isr,
            min_isr, clustering.replica_max_lag_time,
        )
        if local.endpoint is None:
            local.endpoint = LeaderEndpoint(self.nats, self.subjects, local.replica, clustering.replication_max_bytes)
            await local.endpoint.start()

    async def _follow(self, local: LocalPartition, partition: Partition) -> None:
        if local.endpoint is not None:
            await local.endpoint.stop()
            local.endpoint = None
        follower = local.follower
        if follower is not None and (follower.leader, follower.leader_epoch) == (partition.leader, partition.leader_epoch):
            return
        if follower is not None:
            await follower.stop()
        local.replica.become_follower(partition.leader, partition.leader_epoch)
        clustering = self.config.clustering
        settings = FollowerSettings(
            clustering.replica_fetch_timeout, clustering.replica_max_leader_timeout, clustering.replica_max_idle_wait
        )
        local.follower = FollowerLoop(
            self.nats, self.subjects, local.replica, self.server_id, settings, self._report_leader
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
            self._spawn(self._report_return(local.replica, key))

    async def _report_return(self, replica: PartitionReplica, key: tuple[str, int, int]) -> None:
        stream, partition, leader_epoch = key
        log.info("%s/%s: this node led epoch %d before it restarted: asking for an election",
                 stream, partition, leader_epoch)
        try:
            while not self._stopping.is_set() and not replica.closed and self._still_returning(key):
                last_epoch, log_end_offset = replica.position()
                try:
                    await self.metadata.call(
                        "leader_returned", stream=stream, partition=partition, leader=self.server_id,
                        leader_epoch=leader_epoch, last_epoch=last_epoch, log_end_offset=log_end_offset,
                    )
                except (MetadataError, NoMetadataLeader) as exc:
                    log.info("%s/%s: election after return not done yet: %s", stream, partition, exc)
                await asyncio.sleep(RETURN_RETRY)
        finally:
            self._returning.discard(key)

    def _still_returning(self, key: tuple[str, int, int]) -> bool:
        stream, partition, leader_epoch = key
        current = self.read(lambda s: s.partition(stream, partition))
        return (
            current is not None and current.leader_epoch == leader_epoch
            and replica_role(current.leader, current.leader_incarnation, self.server_id, self.incarnation)
            is Role.HAND_BACK
        )

    async def _gather_positions(self, stream: str, partition: int, brokers: Collection[str]) -> dict[str, Position]:
        if not brokers:
            return {}
        reports = await self.gather_replica_reports(ADMIN_TIMEOUT, set(brokers))
        key = f"{stream}/{partition}"
        return {
            broker: Position(report[key][2], report[key][0])
            for broker, report in reports.items() if broker in brokers and key in report
        }

    def _open_partition(self, stream: Stream, partition: Partition) -> LocalPartition:
        path = self._partition_dir(stream, partition.id)
        commit_log = CommitLog.open(path, self._log_config(stream.settings))
        replica = PartitionReplica(
            stream.name, partition.id, commit_log, self._sync_policy(), time.monotonic, self._notify_followers
        )
        return LocalPartition(
            replica=replica,
            subject=partition_subject(stream.subject, partition.id),
            group=stream.group,
        )

    def _partition_dir(self, stream: Stream, partition: int) -> Path:
        """Keyed by the stream's incarnation (its creation time), so that a stream deleted and
        created again while this node was down never sees the old one's files."""
        return self.data_dir / "streams" / f"{directory_name(stream.name)}@{stream.created}" / str(partition)

    async def _close_partition(self, key: tuple[str, int], delete: bool) -> None:
        local = self.partitions.pop(key)
        if local.follower is not None:
            await local.follower.stop()
        if local.endpoint is not None:
            await local.endpoint.stop()
        if local.capture is not None:
            self.capture_connection.unsubscribe(local.capture)
        local.replica.close()
        if delete:
            shutil.rmtree(local.replica.log.directory, ignore_errors=True)
            stream_dir = local.replica.log.directory.parent
            if stream_dir.exists() and not any(stream_dir.iterdir()):
                stream_dir.rmdir()

    def _log_config(self, settings: dict[str, Any]) -> LogConfig:
        defaults = self.config.streams
        return LogConfig(
            segment_max_bytes=settings.get("segment_max_bytes") or defaults.segment_max_bytes,
            segment_max_age=settings.get("segment_max_age") or defaults.segment_max_age,
            retention_max_bytes=settings.get("retention_max_bytes") or defaults.retention_max_bytes,
            retention_max_messages=settings.get("retention_max_messages") or defaults.retention_max_messages,
            retention_max_age=settings.get("retention_max_age") or defaults.retention_max_age,
        )

    def _sync_policy(self) -> SyncPolicy:
        return SyncPolicy.parse(self.config.streams.sync)

    def _checkpoint_high_watermarks(self) -> None:
        for local in self.partitions.values():
            local.replica.log.checkpoint_high_watermark()

    def _enforce_retention(self) -> None:
        for local in self.partitions.values():
            local.replica.log.enforce_retention()

    def _sync_partitions(self) -> None:
        for local in self.partitions.values():
            local.replica.sync()

    # ---- replication -------------------------------------------------------------------------

    def _notify_followers(self, replica: PartitionReplica, followers: list[str]) -> None:
        notification = encode_notification(replica.stream, replica.partition)
        for follower in followers:
            self._spawn(self.nats.publish(self.subjects.notify(follower), notification))

    async def _on_notification(self, msg: Msg) -> None:
        try:
            note = envelope.decode_message(
                msg.data, envelope.MsgType.PARTITION_NOTIFICATION, internal_pb2.PartitionNotification
            )
        except envelope.EnvelopeError as exc:
            log.warning("dropping malformed partition notification: %s", exc)
            return
        local = self.partitions.get((note.stream, note.partition))
        if local is not None and local.follower is not None:
            local.follower.notify()

    async def _report_leader(self, replica: PartitionReplica, leader: str, leader_epoch: int) -> None:
        log.warning("%s/%s: leader %s (epoch %d) is silent, reporting it",
                    replica.stream, replica.partition, leader, leader_epoch)
        last_epoch, log_end_offset = replica.position()
        try:
            await self.metadata.call(
                "report_leader", stream=replica.stream, partition=replica.partition, leader=leader,
                leader_epoch=leader_epoch, reporter=self.server_id,
                last_epoch=last_epoch, log_end_offset=log_end_offset,
            )
        except (MetadataError, NoMetadataLeader) as exc:
            log.warning("leader report for %s/%s failed: %s", replica.stream, replica.partition, exc)

    def _isr_check_interval(self) -> float:
        return max(0.05, min(1.0, self.config.clustering.replica_max_lag_time / 4))

    def _maintain_isrs(self) -> None:
        for local in self.partitions.values():
            for request in local.replica.isr_requests():
                self._spawn(self._change_isr(local.replica, request))

    def _auto_pause(self) -> None:
        """Pause led partitions that received nothing for their auto-pause time (Liftbridge's
        streams.auto.pause.time); a publish through the API resumes them."""
        for (stream_name, partition), local in self.partitions.items():
            replica = local.replica
            if not replica.is_leader or replica.paused or local.pause_requested:
                continue
            pause_after, unless_subscribed = self._auto_pause_settings(stream_name)
            if not pause_after or replica.idle_for() < pause_after or (unless_subscribed and replica.readers):
                continue
            local.pause_requested = True
            self._spawn(self._pause_idle(local, stream_name, partition))

    def _auto_pause_settings(self, stream_name: str) -> tuple[float, bool]:
        settings = self.read(lambda s: dict(s.streams[stream_name].settings) if stream_name in s.streams else {})
        defaults = self.config.streams
        default_time = self.config.cursors.stream_auto_pause_time if stream_name == CURSORS_STREAM else defaults.auto_pause_time
        return (
            settings.get("auto_pause_time", default_time),
            settings.get("auto_pause_disable_if_subscribers", defaults.auto_pause_disable_if_subscribers),
        )

    async def _pause_idle(self, local: LocalPartition, stream_name: str, partition: int) -> None:
        log.info("%s/%s: no messages for its auto-pause time, pausing", stream_name, partition)
        try:
            await self.metadata.call("pause", name=stream_name, partitions=[partition], resume_all=False,
                                     at=time.time_ns())
        except (MetadataError, NoMetadataLeader) as exc:
            log.warning("auto-pause of %s/%s failed: %s", stream_name, partition, exc)
        finally:
            local.pause_requested = False

    async def _change_isr(self, replica: PartitionReplica, request: IsrRequest) -> None:
        add, replica_id = request.add, request.replica_id
        log.info("%s/%s: %s %s %s the ISR", replica.stream, replica.partition,
                 "adding" if add else "removing", replica_id, "to" if add else "from")
        outcome = IsrOutcome.UNKNOWN
        try:
            await self.metadata.call(
                "change_isr", name=replica.stream, partition=replica.partition, replica=replica_id,
                add=add, leader=self.server_id, leader_epoch=request.leader_epoch, epoch=request.partition_epoch,
            )
            outcome = IsrOutcome.ACCEPTED
        except MetadataError as exc:
            log.warning("ISR change of %s/%s refused: %s", replica.stream, replica.partition, exc)
            outcome = IsrOutcome.REFUSED
        except NoMetadataLeader as exc:
            log.warning("ISR change of %s/%s: outcome unknown: %s", replica.stream, replica.partition, exc)
        finally:
            replica.isr_request_done(request, outcome)

    # ---- admin -------------------------------------------------------------------------------

    async def raft_quorum(self) -> dict[str, Any]:
        """The Raft leader's view of the quorum (only it knows match indexes), else this node's."""
        if not self.raft.is_leader:
            try:
                reply = await self.nats.request(self.subjects.admin_status, b"", timeout=ADMIN_TIMEOUT)
                return msgpack.unpackb(reply.data, raw=False)
            except Exception as exc:
                log.info("no Raft leader view (%r); answering with this node's", exc)
        return {**self.raft.quorum(), "answered_by": self.server_id}

    async def _on_status_request(self, msg: Msg) -> None:
        if self.raft.is_leader and msg.reply:
            view = {**self.raft.quorum(), "answered_by": self.server_id}
            await self.nats.publish(msg.reply, msgpack.packb(view, use_bin_type=True))

    def replica_report(self) -> dict[str, tuple[int, int, int]]:
        """"stream/partition" -> (log end offset, HW, epoch of the last entry) of every sound replica on
        this node, as elections compare them (a damaged log ends at its damage; a failed one is left out)."""
        return {
            f"{stream}/{pid}": _report_of(local.replica)
            for (stream, pid), local in self.partitions.items()
            if local.started and not local.replica.closed and local.replica.failed is None
        }

    async def _on_replicas_request(self, msg: Msg) -> None:
        if msg.reply:
            report = {"id": self.server_id, "replicas": self.replica_report()}
            await self.nats.publish(msg.reply, msgpack.packb(report, use_bin_type=True))

    async def gather_replica_reports(
        self, timeout: float, expected: set[str] | None = None,
    ) -> dict[str, dict[str, tuple[int, int, int]]]:
        """Every reachable broker's replica report, by broker id (scatter-gather over NATS);
        answers are awaited from ``expected`` (default: every registered broker) at most."""
        if expected is None:
            expected = set(self.read(lambda s: list(s.brokers)))
        reports: dict[str, dict[str, tuple[int, int, int]]] = {}
        everyone_answered = asyncio.Event()

        async def on_reply(msg: Msg) -> None:
            try:
                body = msgpack.unpackb(msg.data, raw=False)
                reports[body["id"]] = {k: tuple(v) for k, v in body["replicas"].items()}
            except Exception as exc:
                log.warning("dropping malformed replica report: %s", exc)
            if expected <= set(reports):
                everyone_answered.set()

        inbox = self.nats.new_inbox()
        subscription = await self.nats.subscribe(inbox, cb=on_reply)
        try:
            await self.nats.publish(self.subjects.admin_replicas, b"", reply=inbox)
            try:
                await asyncio.wait_for(everyone_answered.wait(), timeout)
            except asyncio.TimeoutError:
                pass
        finally:
            await subscription.unsubscribe()
        return reports

    # ---- capture and publish -----------------------------------------------------------------

    def _capture_handler(self, local: LocalPartition) -> Callable[[list[Delivery]], None]:
        replica = local.replica

        def on_messages(deliveries: list[Delivery]) -> None:
            batch = capture.capture_batch(deliveries)
            try:
                if batch.acks:
                    replica.submit(batch.records, partial(self._captured_write, local, batch.acks, time.time_ns()))
                else:
                    replica.submit(batch.records)
            except (NotLeader, PartitionClosed) as exc:
                log.warning("dropping %d messages on %s: %s", len(batch.records), local.subject, exc)
                self._schedule_reconcile()  # stop capturing what this node no longer leads

        return on_messages

    def _captured_write(
        self, local: LocalPartition, acks: list[tuple[int, capture.AckRequest]], reception_ns: int,
        first_offset: int | None, error: BaseException | None,
    ) -> None:
        if error is not None:
            return  # no ack: the publisher's timeout tells it the write did not happen
        on_write = [ack for ack in acks if ack[1].policy != capture.ALL]
        on_commit = [ack for ack in acks if ack[1].policy == capture.ALL]
        for group in (on_write, on_commit):
            if group:
                index, request = group[-1]
                _at_ack_point(local, request.policy, first_offset + index,
                              partial(self._captured_ack_point, local, first_offset, group, reception_ns))

    def _captured_ack_point(
        self, local: LocalPartition, first_offset: int, acks: list[tuple[int, capture.AckRequest]],
        reception_ns: int, last_offset: int | None, error: BaseException | None,
    ) -> None:
        if error is None:
            self._send_acks(local, first_offset, acks, reception_ns)

    def _send_acks(
        self, local: LocalPartition, first_offset: int, acks: list[tuple[int, capture.AckRequest]], reception_ns: int,
    ) -> None:
        """All of a batch's acks in one write on the capture connection: through nats-py, each
        publish would cost more than the rest of the message's capture."""
        encoded = capture.encode_acks(local.replica.stream, local.subject, first_offset, acks, reception_ns,
                                      time.time_ns())
        self.capture_connection.publish_many(encoded)

    def submit_local(
        self, local: LocalPartition, record: Record, policy: int, correlation_id: str, msg_subject: str,
        on_ack: Callable[[api_pb2.Ack | None, BaseException | None], None],
    ) -> None:
        """Append to a partition this node leads; ``on_ack`` gets the ack once written (committed,
        under ack policy ALL), or the error."""
        reception = time.time_ns()
        request = capture.AckRequest("", correlation_id, policy, msg_subject)

        def ack_point(offset: int | None, error: BaseException | None) -> None:
            if error is not None:
                on_ack(None, error)
            else:
                on_ack(capture.ack_message(local.replica.stream, local.subject, offset, request, reception,
                                           time.time_ns()), None)

        def written(offset: int | None, error: BaseException | None) -> None:
            if error is None:
                _at_ack_point(local, policy, offset, ack_point)
            else:
                on_ack(None, error)

        local.replica.submit([record], written, API_WRITE_LINGER)

    async def publish_local(
        self, local: LocalPartition, record: Record, policy: int, correlation_id: str, msg_subject: str,
    ) -> api_pb2.Ack:
        """submit_local, awaited."""
        acked: asyncio.Future[api_pb2.Ack] = asyncio.get_running_loop().create_future()
        self.submit_local(local, record, policy, correlation_id, msg_subject, partial(settle, acked))
        return await acked

    async def _on_ack(self, msg: Msg) -> None:
        waiter = self._ack_waiters.pop(msg.subject, None)
        if waiter is None or waiter.done():
            return
        try:
            waiter.set_result(envelope.decode_message(msg.data, envelope.MsgType.ACK, api_pb2.Ack))
        except envelope.EnvelopeError as exc:
            log.warning("dropping malformed ack on %s: %s", msg.subject, exc)

    async def publish_to_subject(
        self, subject: str, message: api_pb2.Message, wait: bool, timeout: float | None = None
    ) -> api_pb2.Ack | None:
        """Publish an envelope on NATS, as Liftbridge does, and optionally wait for the leader's ack."""
        if not wait:
            await self.nats.publish(subject, envelope.encode_message(message, envelope.MsgType.PUBLISH))
            return None
        self._ack_sequence += 1
        inbox = f"{self._ack_prefix}.{self._ack_sequence}"
        message.ackInbox = inbox
        waiter = self._ack_waiters[inbox] = asyncio.get_running_loop().create_future()
        try:
            await self.nats.publish(subject, envelope.encode_message(message, envelope.MsgType.PUBLISH))
            return await asyncio.wait_for(waiter, timeout or REMOTE_ACK_TIMEOUT)
        finally:
            self._ack_waiters.pop(inbox, None)

    async def publish_remote(self, request: api_pb2.PublishRequest, wait: bool) -> api_pb2.Ack | None:
        """Publish to a partition led elsewhere, through its NATS subject."""
        stream = self.read(lambda s: s.streams.get(request.stream))
        subject = partition_subject(stream.subject, request.partition)
        message = api_pb2.Message(
            key=request.key, value=request.value, headers=request.headers,
            correlationId=request.correlationId, ackPolicy=request.ackPolicy,
        )
        return await self.publish_to_subject(subject, message, wait)

    @property
    def max_message_bytes(self) -> int:
        """The largest publish request accepted: forwarded to a leader elsewhere, it must fit one
        NATS message (the server's max_payload, from its INFO) as an envelope with this node's
        ack inbox. Replication carries whatever that makes (big entries go in pieces)."""
        return self.nats.max_payload - PUBLISH_ENVELOPE_OVERHEAD - len(self._ack_prefix)

    async def until_leading(self, stream: str, partition: int) -> LocalPartition | None:
        """The partition once this node leads it, when the metadata names it leader but it does
        not lead yet (just started, or handing back an epoch of an earlier run); None once the
        metadata names another leader. The replica as it is after a leader timeout."""
        deadline = time.monotonic() + self.config.clustering.replica_max_leader_timeout
        while True:
            local = self.partitions.get((stream, partition))
            leader = self.read(lambda s: getattr(s.partition(stream, partition), "leader", None))
            if leader != self.server_id:
                return None
            if (local is not None and local.replica.is_leader) or time.monotonic() > deadline:
                return local
            await asyncio.sleep(LEADERSHIP_POLL)

    def local_partition(self, stream: str, partition: int) -> LocalPartition | None:
        return self.partitions.get((stream, partition))


def _report_of(replica: PartitionReplica) -> tuple[int, int, int]:
    last_epoch, log_end = replica.position()
    return log_end, replica.high_watermark, last_epoch


def _copy_partition(p: Partition) -> Partition:
    return Partition(**{**vars(p), "replicas": list(p.replicas), "isr": list(p.isr)})


def _at_ack_point(local: LocalPartition, policy: int, offset: int, then: Outcome) -> None:
    """Call ``then`` once the record written at ``offset`` may be acked under ``policy``: at once
    (LEADER), or once it is committed (ALL)."""
    if policy == capture.ALL:
        local.replica.when_committed(offset, then)
    else:
        then(offset, None)
