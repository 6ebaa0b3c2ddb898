"""Cluster-wide admin queries over NATS: the Raft leader's view of the quorum, and every broker's
report of its replicas' positions (scatter-gather), which elections and admin tools compare."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, NamedTuple

import msgpack

from bascule.metadata.replicated import ReplicatedMetadata
from bascule.natsio.transport import Transport, TransportMessage
from bascule.node.partitions import Partitions
from bascule.partition.replica import PartitionReplica
from bascule.wire.subjects import Subjects

log = logging.getLogger(__name__)

ADMIN_TIMEOUT = 2.0

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

    def replica_report(self) -> ReplicaReport:
        """Every sound replica on this node, as elections compare them (a damaged log ends at its
        damage; a failed one is left out); none before this incarnation is registered, since until
        then the metadata cannot know whether they lost entries."""
        return {key: _report_of(replica) for key, replica in self._sound_replicas().items()}

    def _sound_replicas(self) -> dict[str, PartitionReplica]:
        if not self.partitions.registered():
            return {}
        return {
            f"{stream}/{pid}": local.replica
            for (stream, pid), local in self.partitions.items()
            if local.started and not local.replica.closed and local.replica.failed is None
        }

    async def _on_replicas_request(self, msg: TransportMessage) -> None:
        if msg.reply:
            replicas = self._sound_replicas()
            report = {
                "id": self.server_id,
                "replicas": {key: _report_of(replica) for key, replica in replicas.items()},
                # Beside "replicas", whose 3-tuples older nodes unpack: for the admin API only.
                "logs": {key: (replica.oldest_offset, replica.log.size_bytes) for key, replica in replicas.items()},
            }
            await self.nc.publish(msg.reply, msgpack.packb(report, use_bin_type=True))

    async def gather_replica_reports(
        self, timeout: float, expected: set[str] | None = None
    ) -> dict[str, ReplicaReport]:
        """Every reachable broker's replica report, by broker id; answers are awaited from
        ``expected`` (default: every registered broker) at most."""
        return await self._gather(timeout, expected, lambda body: {k: tuple(v) for k, v in body["replicas"].items()})

    async def gather_replica_states(self, timeout: float) -> ReplicaStates:
        """Every reachable broker's replicas with their logs' extent, by broker id (the admin API's view)."""
        return await self._gather(timeout, None, _replica_states)

    async def _gather(self, timeout: float, expected: set[str] | None, parse: Callable[[dict], Any]) -> dict[str, Any]:
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
            await self.nc.publish(self.subjects.admin_replicas, b"", reply=inbox)
            try:
                await asyncio.wait_for(everyone_answered.wait(), timeout)
            except TimeoutError:
                pass
        finally:
            await subscription.unsubscribe()
        return reports


def _replica_states(body: dict) -> dict[str, ReplicaState]:
    logs = body.get("logs", {})
    return {key: ReplicaState(*report, *logs.get(key, (-1, -1))) for key, report in body["replicas"].items()}


def _report_of(replica: PartitionReplica) -> tuple[int, int, int]:
    last_epoch, log_end = replica.position()
    return log_end, replica.high_watermark, last_epoch
