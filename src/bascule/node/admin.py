"""Cluster-wide admin queries over NATS: the Raft leader's view of the quorum, and every broker's
report of its replicas' positions (scatter-gather), which elections and admin tools compare.

A request for reports may name the partitions it wants (a msgpack map ``{"partitions": ["stream/0",
...]}``), and each broker then reports those only: elections and CreateStream's wait ask about a few
partitions, and a report of every replica of a node with thousands of them cost each broker more
than all the rest of an election, at every election (issue 32). An empty request asks for every
replica, as earlier versions always do (and they answer a named one so: a superset, which the asker
reads from all the same)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from typing import Any, NamedTuple

import msgpack

from bascule.metadata.replicated import ReplicatedMetadata
from bascule.natsio.transport import Transport, TransportMessage
from bascule.node.partitions import LocalPartition, Partitions
from bascule.partition.replica import PartitionReplica
from bascule.wire.subjects import Subjects

log = logging.getLogger(__name__)

ADMIN_TIMEOUT = 2.0
# Names a request for reports carries at most: past them it asks for every replica (a NATS message holds
# about 100,000 such names; a report of 10,000 replicas is a few hundred KB).
MAX_NAMED_PARTITIONS = 10_000

# "stream/partition" -> (log end offset, HW, epoch of the last entry)
ReplicaReport = dict[str, tuple[int, int, int]]


class ReplicaState(NamedTuple):
    """One replica's log as the admin API shows it: the replica report, and where its log starts and how
    big it is (-1 from a node older than those)."""

    log_end: int
    high_watermark: int
    last_epoch: int
    oldest_offset: int
    size_bytes: int


# broker id -> "stream/partition" -> its replica's state
ReplicaStates = dict[str, dict[str, ReplicaState]]


class AdminQueries:
    def __init__(
        self, server_id: str, nc: Transport, subjects: Subjects, raft: ReplicatedMetadata, partitions: Partitions,
    ) -> None:
        self.server_id = server_id
        self.nc = nc
        self.subjects = subjects
        self.raft = raft
        self.partitions = partitions

    async def start(self) -> None:
        await self.nc.subscribe(self.subjects.admin_status, cb=self._on_status_request)
        await self.nc.subscribe(self.subjects.admin_replicas, cb=self._on_replicas_request)

    async def raft_quorum(self) -> dict[str, Any]:
        """The Raft leader's view of the quorum (only it knows match indexes), else this node's."""
        if not self.raft.is_leader:
            try:
                reply = await self.nc.request(self.subjects.admin_status, b"", timeout=ADMIN_TIMEOUT)
                return msgpack.unpackb(reply.data, raw=False)
            except Exception as exc:
                log.info("no Raft leader view (%r); answering with this node's", exc)
        return {**self.raft.quorum(), "answered_by": self.server_id}

    async def _on_status_request(self, msg: TransportMessage) -> None:
        if self.raft.is_leader and msg.reply:
            view = {**self.raft.quorum(), "answered_by": self.server_id}
            await self.nc.publish(msg.reply, msgpack.packb(view, use_bin_type=True))

    def replica_report(self, named: list[str] | None = None) -> ReplicaReport:
        """Every sound replica on this node (or those ``named``, "stream/partition"), as elections
        compare them (a damaged log ends at its damage; a failed one is left out); none before this
        incarnation is registered, since until then the metadata cannot know whether they lost entries."""
        return {key: _report_of(replica) for key, replica in self._sound_replicas(named).items()}

    def _sound_replicas(self, named: list[str] | None = None) -> dict[str, PartitionReplica]:
        """This node's sound replicas, by "stream/partition": all of them, or those ``named``."""
        if not self.partitions.registered():
            return {}
        if named is None:
            found = {f"{stream}/{pid}": local for (stream, pid), local in self.partitions.items()}
        else:
            found = {name: local for name in named if (local := self._named(name)) is not None}
        return {
            name: local.replica for name, local in found.items()
            if local.started and not local.replica.closed and local.replica.failed is None
        }

    def _named(self, name: str) -> LocalPartition | None:
        stream, _, partition = name.rpartition("/")
        return self.partitions.get(stream, int(partition)) if partition.isdigit() else None

    async def _on_replicas_request(self, msg: TransportMessage) -> None:
        if msg.reply:
            try:
                named = _named_partitions(msg.data)
            except ValueError as exc:
                log.warning("dropping a malformed replica report request: %s", exc)
                return
            replicas = self._sound_replicas(named)
            report = {
                "id": self.server_id,
                "replicas": {key: _report_of(replica) for key, replica in replicas.items()},
                # Beside "replicas", whose 3-tuples older nodes unpack: for the admin API only.
                "logs": {key: (replica.oldest_offset, replica.log.size_bytes) for key, replica in replicas.items()},
            }
            await self.nc.publish(msg.reply, msgpack.packb(report, use_bin_type=True))

    async def gather_replica_reports(
        self, timeout: float, expected: set[str] | None = None, partitions: Collection[str] | None = None,
    ) -> dict[str, ReplicaReport]:
        """Every reachable broker's replica report, by broker id; answers are awaited from
        ``expected`` (default: every registered broker) at most. With ``partitions`` ("stream/partition"
        names), a report need hold only those (a broker of an earlier version reports every replica)."""
        return await self._gather(
            timeout, expected, lambda body: {k: tuple(v) for k, v in body["replicas"].items()}, partitions,
        )

    async def gather_replica_states(self, timeout: float) -> ReplicaStates:
        """Every reachable broker's replicas with their logs' extent, by broker id (the admin API's view)."""
        return await self._gather(timeout, None, _replica_states)

    async def _gather(
        self, timeout: float, expected: set[str] | None, parse: Callable[[dict], Any],
        partitions: Collection[str] | None = None,
    ) -> dict[str, Any]:
        if expected is None:
            expected = set(self.raft.state.brokers)
        reports: dict[str, Any] = {}
        everyone_answered = asyncio.Event()

        async def on_reply(msg: TransportMessage) -> None:
            try:
                body = msgpack.unpackb(msg.data, raw=False)
                reports[body["id"]] = parse(body)
            except Exception as exc:
                log.warning("dropping malformed replica report: %s", exc)
            if expected <= set(reports):
                everyone_answered.set()

        inbox = self.nc.new_inbox()
        subscription = await self.nc.subscribe(inbox, cb=on_reply)
        try:
            await self.nc.publish(self.subjects.admin_replicas, _replicas_request(partitions), reply=inbox)
            try:
                await asyncio.wait_for(everyone_answered.wait(), timeout)
            except TimeoutError:
                pass
        finally:
            await subscription.unsubscribe()
        return reports


def _replicas_request(partitions: Collection[str] | None) -> bytes:
    """A request for the reports of ``partitions`` (every replica: None, or too many to name)."""
    if partitions is None or len(partitions) > MAX_NAMED_PARTITIONS:
        return b""
    return msgpack.packb({"partitions": list(partitions)}, use_bin_type=True)


def _named_partitions(data: bytes | memoryview) -> list[str] | None:
    """The partitions a request for reports names; None: every replica. Raises ValueError."""
    if not data:
        return None
    try:
        body = msgpack.unpackb(data, raw=False)
    except Exception as exc:
        raise ValueError(str(exc)) from None
    named = body.get("partitions") if isinstance(body, dict) else None
    if not isinstance(named, list) or len(named) > MAX_NAMED_PARTITIONS or not all(isinstance(n, str) for n in named):
        raise ValueError("not a list of partition names")
    return named


def _replica_states(body: dict) -> dict[str, ReplicaState]:
    logs = body.get("logs", {})
    return {key: ReplicaState(*report, *logs.get(key, (-1, -1))) for key, report in body["replicas"].items()}


def _report_of(replica: PartitionReplica) -> tuple[int, int, int]:
    last_epoch, log_end = replica.position()
    return log_end, replica.high_watermark, last_epoch
