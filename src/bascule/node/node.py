"""A bascule node: NATS connections, the metadata Raft group, and the partition replicas it runs.

``Node.start`` builds the parts in dependency order and ``stop`` takes them down in reverse; the
gRPC API is built beside it by the composition root (``bascule.server``), from the parts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nats

from bascule import durable
from bascule.config import Config
from bascule.config.values import unauthenticated_raft_error, unshared_secret_error
from bascule.listening import check_free
from bascule.metadata import levels
from bascule.metadata.heartbeats import NatsHeartbeats
from bascule.metadata.placement import PlacementError, replica_count
from bascule.metadata.raft import APPEND_ENTRIES_PERIOD, MetadataError, MetadataRaft, NoMetadataLeader
from bascule.metadata.service import join_cluster
from bascule.metadata.state import ALREADY_EXISTS, FAILED_PRECONDITION, INVALID_ARGUMENT, MetadataState
from bascule.natsio.auth import NatsAuth
from bascule.natsio.capture import CaptureConnection
from bascule.natsio.publisher import EnvelopePublisher
from bascule.natsio.sealed import SealedNats
from bascule.natsio.server import EMBEDDED_NODE_USER, EmbeddedNats, embedded_node_password, guarded_config
from bascule.natsio.urls import redacted
from bascule.node import identity
from bascule.node.activity import ActivityPublisher
from bascule.node.admin import ADMIN_TIMEOUT, AdminQueries
from bascule.node.capture import CapturePath
from bascule.node.core import NodeCore
from bascule.node.forwarding import Forwarder
from bascule.node.groups import GroupCoordinator
from bascule.node.handoff import hand_off_leaderships
from bascule.node.partitions import Partitions
from bascule.node.publishing import PublishPath
from bascule.node.tasks import Tasks
from bascule.partition.encryption import SETTING as ENCRYPTION
from bascule.partition.encryption import MasterKey, precondition_failure
from bascule.wire.names import CURSORS_STREAM, MAX_REPLICATION_FACTOR, stream_name_error, subject_error
from bascule.wire.seal import Sealer, derive_key
from bascule.wire.settings import StreamDefaults
from bascule.wire.subjects import Subjects

log = logging.getLogger(__name__)

NATS_DEFAULT_PORT = 4222
REGISTRATION_WAIT = 10.0
REGISTRATION_RETRY = 0.2
STREAM_START_WAIT = 5.0
STREAM_START_POLL = 0.02  # the first wait between polls, doubled after each up to STREAM_START_MAX_POLL
STREAM_START_MAX_POLL = 0.25
GROUP_APPLY_WAIT = 5.0
UNREACHABLE_REPORT_INTERVAL = 5.0  # seconds between warnings while NATS cannot be reached at start
# A NATS server that vanishes without a reset (its host or container gone, a cut link) is noticed after
# NATS_PING_INTERVAL * (NATS_MAX_OUTSTANDING_PINGS + 1) s, instead of nats-py's 6 minutes: only then does the
# node reconnect (to another server of nats.servers) and stop reporting itself ready.
NATS_PING_INTERVAL = 4
NATS_MAX_OUTSTANDING_PINGS = 2


class InsecureRaft(PermissionError):
    """The Raft transport would listen beyond loopback without a password."""


class UnsharedSecret(PermissionError):
    """The node has to join a cluster, and has no secret it could share with the others."""


class NatsUnreachable(ConnectionError):
    """No NATS server answered within nats.connect.timeout of the node's start."""


class NatsRefused(PermissionError):
    """The NATS server refused this node's credentials."""


class Node:
    def __init__(self, config: Config, tasks: Tasks) -> None:
        self.config = config
        self.tasks = tasks
        self.data_dir = Path(config.data_dir).resolve()
        self.subjects = Subjects(config.clustering.namespace)
        # This process's incarnation: a leader epoch given to an earlier one is never resumed. It states
        # the metadata level of this version, which the metadata leader journals by (metadata.levels).
        self.incarnation = levels.incarnation(uuid.uuid4().hex)
        # Encryption at rest: every node of a cluster needs the same key (any may lead any partition).
        self.master_key = MasterKey.from_environment(os.environb)
        self.server_id = ""
        self.api_port = 0
        # Whether the metadata knows all this node's logs may have lost (set at start, from the
        # previous run's shutdown; made true by the registration that records an unclean one).
        self._losses_recorded = False
        self._embedded: EmbeddedNats | None = None
        self._nats: nats.NATS | None = None
        self._internal: SealedNats | None = None  # the node-to-node side of _nats
        self._connecting: asyncio.Future[nats.NATS] | None = None
        self._refused_by_nats: str | None = None
        self._unreachable_because: Exception | None = None
        self._next_unreachable_report = 0.0
        self._capture_connection: CaptureConnection | None = None
        self._capture: CapturePath | None = None
        self._envelopes: EnvelopePublisher | None = None
        self._raft: MetadataRaft | None = None
        self._core: NodeCore | None = None
        self._publishing: PublishPath | None = None

    # The parts, once started.

    @property
    def raft(self) -> MetadataRaft:
        assert self._raft is not None, "node not started"
        return self._raft

    @property
    def core(self) -> NodeCore:
        assert self._core is not None, "node not started"
        return self._core

    @property
    def partitions(self) -> Partitions:
        return self.core.partitions

    @property
    def publishing(self) -> PublishPath:
        assert self._publishing is not None, "node not started"
        return self._publishing

    @property
    def admin(self) -> AdminQueries:
        return self.core.admin

    @property
    def groups(self) -> GroupCoordinator:
        return self.core.groups

    @property
    def capture(self) -> CapturePath:
        assert self._capture is not None, "node not started"
        return self._capture

    @property
    def state(self) -> MetadataState:
        return self.raft.state

    @property
    def nats_client(self) -> nats.NATS:
        assert self._nats is not None, "node not started"
        return self._nats

    @property
    def internal_nats(self) -> SealedNats:
        """The node-to-node side of the NATS connection (it counts the messages it drops)."""
        assert self._internal is not None, "node not started"
        return self._internal

    def why_not_ready(self) -> str | None:
        """Why this node should not take traffic yet; None once it has caught up with a metadata group
        that has a leader, is registered as a broker, is connected to NATS and has brought up every
        partition the metadata assigns to it."""
        if self._nats is None or self._raft is None or self._core is None:
            return "starting"
        if not self._raft.ready:
            return "the metadata has not caught up with the Raft group yet"
        if self._raft.leader is None:
            return "no metadata leader"
        if not self._nats.is_connected:
            return "not connected to NATS"
        registered = self.state.brokers.get(self.server_id)
        if registered is None or registered.incarnation != self.incarnation:
            return "not registered as a broker yet"
        unopened = self._core.partitions.unopened()
        if unopened:
            return f"{len(unopened)} partition(s) not brought up yet, such as {unopened[0][0]}/{unopened[0][1]}"
        return None

    async def hand_off_leaderships(self, timeout: float) -> int:
        """Controlled shutdown: the partitions this node leads, to other ISR members (node.handoff)."""
        if self._raft is None or self._core is None:
            return 0
        moved = await hand_off_leaderships(
            self.server_id, lambda: self.state, self.call, self._core.admin.gather_replica_reports, timeout
        )
        # At once, not when this node's metadata catches up: a leader endpoint still subscribed
        # here would swallow the followers' first requests to the new leader (each a request
        # timeout of stall), and a capture still subscribed, writers' messages.
        if self._core is not None:
            await self._core.partitions.withdraw()
        if moved and self._raft.is_leader:
            # The successors learn that their leadership is committed with this Raft leader's next
            # heartbeat; stopped before it, they would wait for a new Raft leader (0.4 s stalls).
            await asyncio.sleep(2 * APPEND_ENTRIES_PERIOD)
        return moved

    def live_brokers(self) -> set[str]:
        """This node and the brokers its Raft member is connected to: go-liftbridge dials every
        broker FetchMetadata lists, and one that is down must not stop it connecting."""
        connected = {voter["address"] for voter in self.raft.quorum()["voters"] if voter["connected"]}
        return {broker.id for broker in self.state.brokers.values()
                if broker.id == self.server_id or broker.raft in connected}

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self, api_port: int) -> None:
        self.api_port = api_port
        # Private to this user: made 0700, refused if another user's, closed to others if open.
        await asyncio.to_thread(durable.prepare_private_directory, self.data_dir)
        clustering = self.config.clustering
        self.server_id = await asyncio.to_thread(identity.server_id, clustering, self.data_dir)
        clean_start = self._losses_recorded = await asyncio.to_thread(identity.take_clean_shutdown, self.data_dir)
        if not clean_start:
            log.warning("the previous run of this node did not stop cleanly: its replicas count as unclean "
                        "(not electable) until they catch up with their leaders")
        joins = await asyncio.to_thread(identity.known_raft_peers, clustering, self.data_dir, "") is None
        problem = unshared_secret_error(clustering, joins)
        if problem:
            raise UnsharedSecret(problem)
        secret = await asyncio.to_thread(identity.cluster_secret, clustering, self.data_dir)
        nats_url, auth = await self._start_nats(secret)
        nc = self._nats = await self._connect_nats(nats_url, auth)
        internal = self._internal = SealedNats(nc, Sealer(derive_key(secret)))
        self._capture_connection = CaptureConnection(nats_url, f"bascule-{self.server_id}-capture", auth=auth)
        await self._capture_connection.connect()
        self._envelopes = await EnvelopePublisher.start(nc, f"bascule.{self.server_id}")
        raft_address = await asyncio.to_thread(identity.raft_address, clustering, self.data_dir)
        # Checked when the configuration was loaded, for its address; this one may come from the data dir.
        problem = unauthenticated_raft_error(raft_address, clustering.raft_password)
        if problem:
            raise InsecureRaft(problem)
        # pysyncobj binds in its own thread and retries in silence: a port held by another process is
        # said here, or the node would wait for ever for a Raft group it is not in.
        host, port = raft_address.rsplit(":", 1)
        await asyncio.to_thread(check_free, "the metadata Raft transport", host.strip("[]"), int(port),
                                "clustering.raft.listen, --raft-listen")
        self._raft = MetadataRaft(
            # Never a Raft transport without a password, even on loopback: pysyncobj unpickles
            # what a peer sends, and any local process can reach a loopback port.
            raft_address, await self._raft_peers(raft_address), self.data_dir, secret,
            self._on_metadata_change,
        )
        # Raft has links of its own, but the metadata leader serves the cluster over NATS (issue 25).
        heartbeats = NatsHeartbeats(
            lambda: self._heartbeats_connection(nats_url, auth, secret), self.subjects, self._raft,
            lambda: nc.is_connected,
        )
        self._raft.stand_only_while(heartbeats.standing)
        heartbeats.start()
        self.tasks.start(heartbeats.run(), "metadata heartbeats")
        core = self._core = NodeCore(
            self.config, self.data_dir, self.server_id, self.incarnation, internal, self.subjects, self._raft,
            self.tasks, self.master_key, self.live_brokers,
        )
        core.metadata.on_join = heartbeats.joined
        self._capture = CapturePath(self._capture_connection, core.partitions.schedule_reconcile)
        core.partitions.switch_capture = self._capture.switch
        forwarder = Forwarder(internal, clustering.namespace, self.server_id, self._raft, core.partitions)
        self._publishing = PublishPath(self._raft, self._envelopes, forwarder, self.subjects)
        await self._publishing.start()
        await core.start()
        registration = self.tasks.spawn(self._register_broker(raft_address, clean_start), "register broker")
        # Serve once this broker is known to the cluster, so the first CreateStream can place on it;
        # without a metadata leader in sight, serve anyway and answer "no known metadata leader".
        if registration is not None:
            await asyncio.wait({registration}, timeout=REGISTRATION_WAIT)
        core.maintenance.start()
        if self.config.activity.enabled:
            activity = ActivityPublisher(
                self.config.activity, clustering.namespace, self._raft, self.call, self._publishing
            )
            self.tasks.start(activity.run(), "activity stream")
        log.info("node %s started: nats %s, raft %s", self.server_id, [redacted(url) for url in nats_url], raft_address)

    async def stop(self) -> None:
        await self.tasks.close()
        if self._core is not None:
            await self._core.partitions.close()
            if self._losses_recorded and self._core.partitions.closed_sound:
                await asyncio.to_thread(identity.record_clean_shutdown, self.data_dir)
        if self._raft is not None:
            await asyncio.to_thread(self._raft.close)
        if self._publishing is not None:
            await self._publishing.close()
        if self._envelopes is not None:
            await self._envelopes.close()
        if self._capture_connection is not None:
            await self._capture_connection.close()
        if self._nats is not None and not self._nats.is_closed:
            # nats-py's close flushes what is queued and raises when NATS went away in the meantime (it is
            # often stopped with the node): nothing queued then can still be delivered, and the node is done.
            with contextlib.suppress(ConnectionError):
                await self._nats.close()
        if self._embedded is not None:
            await self._embedded.stop()

    async def _start_nats(self, secret: str) -> tuple[list[str], NatsAuth]:
        """The NATS servers to connect to, and how: an embedded server's own when it guards the
        namespace (a Raft password set, no config file or credentials of the operator's)."""
        nats_config = self.config.nats
        if not nats_config.embedded:
            return list(nats_config.servers), nats_config.auth
        config_file = nats_config.embedded_config or None
        auth = nats_config.auth
        if config_file is None and self.config.clustering.raft_password and auth == NatsAuth():
            auth = NatsAuth(user=EMBEDDED_NODE_USER, password=embedded_node_password(secret))
            config_file = str(self.data_dir / "nats-embedded.conf")
            text = guarded_config(self.config.clustering.namespace, auth.user, auth.password, NATS_DEFAULT_PORT)
            await asyncio.to_thread(durable.write_atomically, Path(config_file), text)
            log.info("the embedded NATS server keeps clients without the node's credentials off %s.>",
                     self.config.clustering.namespace)
        # Like Liftbridge, the embedded server takes NATS's usual port unless its config file says otherwise.
        self._embedded = EmbeddedNats(
            port=None if config_file else NATS_DEFAULT_PORT, config_file=config_file, log_dir=self.data_dir,
        )
        await self._embedded.start()
        return [self._embedded.url], auth

    async def _raft_peers(self, raft_address: str) -> list[str]:
        """The other voters to start Raft with; a new node that is no seed joins through the
        metadata leader first."""
        clustering = self.config.clustering
        peers = await asyncio.to_thread(identity.known_raft_peers, clustering, self.data_dir, raft_address)
        if peers is not None:
            return peers
        assert self._internal is not None
        members = await join_cluster(self._internal, self.subjects, raft_address)
        return await asyncio.to_thread(identity.remember_raft_members, self.data_dir, members, raft_address)

    async def _connect_nats(self, nats_url: list[str], auth: NatsAuth) -> nats.NATS:
        """Retried for nats.connect.timeout (NATS may be starting beside this node), then given up
        on with an error that names the servers; at once when NATS refuses the credentials: that
        needs an operator."""
        timeout = self.config.nats.connect_timeout
        self._connecting = asyncio.ensure_future(nats.connect(
            nats_url, name=f"bascule-{self.server_id}", max_reconnect_attempts=-1, reconnect_time_wait=0.5,
            ping_interval=NATS_PING_INTERVAL, max_outstanding_pings=NATS_MAX_OUTSTANDING_PINGS,
            error_cb=self._nats_error, **auth.client_options(),
        ))
        try:
            return await asyncio.wait_for(self._connecting, timeout)
        except TimeoutError:
            raise NatsUnreachable(
                f"cannot reach NATS at {', '.join(redacted(url) for url in nats_url)} after {timeout:g} s "
                f"({self._unreachable_because!r}); is it running? (nats.servers, nats.connect.timeout)"
            ) from None
        except asyncio.CancelledError:
            if self._refused_by_nats is None:
                raise
            raise NatsRefused(f"NATS refused this node ({self._refused_by_nats}); check nats.user, "
                              "nats.password, nats.token, nats.credentials, nats.nkey.seed and nats.tls.*") from None

    async def _heartbeats_connection(self, nats_url: list[str], auth: NatsAuth, secret: str) -> SealedNats:
        """The metadata heartbeats' own connection, opened on their thread (``metadata.heartbeats``): sealed
        with a sealer of its own (an incarnation of its own: its sequence numbers are its own)."""
        client = await nats.connect(
            nats_url, name=f"bascule-{self.server_id}-heartbeats", max_reconnect_attempts=-1, reconnect_time_wait=0.5,
            ping_interval=NATS_PING_INTERVAL, max_outstanding_pings=NATS_MAX_OUTSTANDING_PINGS,
            error_cb=_heartbeats_nats_error, **auth.client_options(),
        )
        return SealedNats(client, Sealer(derive_key(secret)))

    async def _nats_error(self, error: Exception) -> None:
        if self._nats is None and self._connecting is not None:
            self._starting_nats_error(error)
            return
        if isinstance(error, OSError | TimeoutError | nats.errors.StaleConnectionError):
            self._lost_nats_error(error)
            return
        # Slow-consumer drops on a capture subscription lose plain publishes: say so loudly.
        log.error("NATS error: %r", error)

    def _lost_nats_error(self, error: Exception) -> None:
        """The connection lost, or a reconnect attempt failed: nats-py reports each, twice a second while NATS
        is away, and NATS stopping before its nodes is an ordinary shutdown. Told now and then, as a warning
        (bascule_nats_connected and /readyz say it too)."""
        if self.tasks.closing:
            log.debug("NATS connection while stopping: %r", error)
            return
        now = time.monotonic()
        if now >= self._next_unreachable_report:
            self._next_unreachable_report = now + UNREACHABLE_REPORT_INTERVAL
            log.warning("NATS connection lost or not yet back (%r): reconnecting", error)

    def _starting_nats_error(self, error: Exception) -> None:
        """An error of the first connect: a refusal ends it, anything else is retried and told now
        and then (nats-py reports each attempt, twice a second)."""
        if "authorization violation" in str(error).lower() or "authentication" in str(error).lower():
            self._refused_by_nats = str(error)
            assert self._connecting is not None
            self._connecting.cancel()
            return
        self._unreachable_because = error
        now = time.monotonic()
        if now >= self._next_unreachable_report:
            self._next_unreachable_report = now + UNREACHABLE_REPORT_INTERVAL
            log.warning("cannot reach NATS yet (%r): retrying for up to %g s (nats.connect.timeout)",
                        error, self.config.nats.connect_timeout)

    def _on_metadata_change(self) -> None:
        if self._core is not None:
            self._core.partitions.schedule_reconcile()

    async def _register_broker(self, raft_address: str, clean_start: bool) -> None:
        """Registers this incarnation; after an unclean shutdown, the metadata marks this broker's
        ISR memberships unclean in the same command (``MetadataState._register_broker``)."""
        await self.core.register(self.config.advertised_host, self.api_port, raft_address, clean_start)
        self._losses_recorded = True
        await self._ensure_cursor_stream()

    async def _ensure_cursor_stream(self) -> None:
        partitions = self.config.cursors.stream_partitions
        while partitions and CURSORS_STREAM not in self.state.streams:
            try:
                # As Liftbridge's: on <ns>.cursors, compacted, auto-paused unless read.
                await self.call(
                    "create_stream", name=CURSORS_STREAM, subject=f"{self.config.clustering.namespace}.cursors",
                    group="", replication_factor=self.config.cursors.stream_replication_factor,
                    partitions=partitions, settings={
                        "compact_enabled": True, "auto_pause_time": self.config.cursors.stream_auto_pause_time,
                        "auto_pause_disable_if_subscribers": True,
                    },
                )
            except MetadataError as exc:
                if exc.code != ALREADY_EXISTS:  # else another node created it first
                    log.error("could not create the cursor stream: %s", exc.message)
                return
            except NoMetadataLeader:
                await asyncio.sleep(REGISTRATION_RETRY)

    # ---- metadata ----------------------------------------------------------------------------

    async def call(self, op: str, **args: Any) -> None:
        """Have the metadata leader carry out ``op`` (here, or forwarded to it over NATS)."""
        await self.core.metadata.call(op, **args)

    async def create_stream(
        self, name: str, subject: str, group: str, replication_factor: int, partitions: int,
        settings: dict[str, Any],
    ) -> None:
        for problem in (stream_name_error(name), subject_error(subject)):
            if problem:
                raise MetadataError(INVALID_ARGUMENT, problem)
        if partitions < 0:
            raise MetadataError(INVALID_ARGUMENT, "partitions must be >= 0")
        if not -1 <= replication_factor <= MAX_REPLICATION_FACTOR:  # said in Liftbridge's words, not the command's
            try:
                replica_count(replication_factor, len(self.state.brokers))
            except PlacementError as exc:
                raise MetadataError(INVALID_ARGUMENT, str(exc)) from None
        # Encryption is decided here, once, and recorded with the stream: a stream's partitions are
        # sealed or not whatever the defaults of the nodes that lead them later.
        if settings.get(ENCRYPTION, self.config.streams.encryption):
            if self.master_key.problem is not None:
                raise MetadataError(FAILED_PRECONDITION, precondition_failure(self.master_key.problem))
            settings = {**settings, ENCRYPTION: True}
        await self.call(
            "create_stream", name=name, subject=subject, group=group,
            replication_factor=replication_factor, partitions=partitions or 1, settings=settings,
        )
        await self._wait_until_led(name)

    @property
    def group_timeouts(self) -> tuple[float, float]:
        return self.config.groups.consumer_timeout, self.config.groups.coordinator_timeout

    @property
    def stream_defaults(self) -> StreamDefaults:
        return self.config.stream_defaults

    async def join_consumer_group(self, group: str, consumer: str, streams: list[str]) -> tuple[str, int]:
        """Join (creating the group if need be) through the metadata leader; the group's coordinator
        and epoch once this node has applied the join."""
        await self.call("join_consumer_group", group=group, consumer=consumer, streams=streams)
        joined = await self.metadata_when(lambda state: consumer in getattr(state.groups.get(group), "members", ()),
                                          GROUP_APPLY_WAIT)
        found = joined.groups.get(group)
        if found is None or consumer not in found.members:
            raise NoMetadataLeader(f"the join of consumer group {group} did not reach this node in time")
        return found.coordinator, found.epoch

    async def metadata_when(self, predicate: Callable[[MetadataState], bool], timeout: float) -> MetadataState:
        """This node's metadata once ``predicate`` holds of it, or as it is after ``timeout`` seconds."""
        found = await self.raft.watch.until(lambda: self.state if predicate(self.state) else None, timeout)
        return self.state if found is None else found

    async def catch_up(self) -> None:
        await self.core.metadata.catch_up()

    def fetch_group_assignments(self, group: str, consumer: str, epoch: int) -> tuple[int, dict[str, tuple[int, ...]]]:
        """The consumer's partitions, from this node as the group's coordinator (``GroupCoordinator``)."""
        return self.groups.assignments(group, consumer, epoch)

    async def _wait_until_led(self, stream: str) -> None:
        """Until each partition's leader has started it (its subject captured), so a publish right
        after CreateStream is not lost; Raft commit alone does not mean the leaders applied it.
        Each poll asks only the leaders of the partitions not seen started yet, about those, and
        the polls back off: a stream of 4,096 partitions had every broker report every replica
        every 20 ms, which slowed the very leaders it waited for (issue 32)."""
        deadline = time.monotonic() + STREAM_START_WAIT
        waiting: dict[str, str] | None = None  # "stream/partition" -> its leader, of those not seen started
        pause = STREAM_START_POLL
        while time.monotonic() < deadline:
            found = self.state.streams.get(stream)
            leaders = {f"{stream}/{p.id}": p.leader for p in found.partitions.values()} if found else {}
            waiting = {name: leader for name, leader in leaders.items() if waiting is None or name in waiting}
            remote = {name: leader for name, leader in waiting.items() if leader != self.server_id}
            reports = await self.admin.gather_replica_reports(
                ADMIN_TIMEOUT, set(remote.values()), list(remote)) if remote else {}
            reports[self.server_id] = self.admin.replica_report(
                [name for name, leader in waiting.items() if leader == self.server_id])
            waiting = {name: leader for name, leader in waiting.items() if name not in reports.get(leader, {})}
            if leaders and not waiting:
                return
            await asyncio.sleep(pause)
            pause = min(2 * pause, STREAM_START_MAX_POLL)
        log.warning("stream %s: not every partition leader started within %.0f s", stream, STREAM_START_WAIT)


async def _heartbeats_nats_error(error: Exception) -> None:
    # The node's own connection says what goes wrong with NATS (_nats_error); this one only follows it.
    log.debug("metadata heartbeats' NATS connection: %r", error)
