"""Cluster-wide admin queries over NATS: the Raft leader's view of the quorum, and every broker's
report of its replicas' positions (scatter-gather), which elections and admin tools compare."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

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
        if not self.partitions.registered():
            return {}
        return {
            f"{stream}/{pid}": _report_of(local.replica)
            for (stream, pid), local in self.partitions.items()
            if local.started and not local.replica.closed and local.replica.failed is None
        }

    async def _on_replicas_request(self, msg: TransportMessage) -> None:
        if msg.reply:
            report = {"id": self.server_id, "replicas": self.replica_report()}
            await self.nc.publish(msg.reply, msgpack.packb(report, use_bin_type=True))

    async def gather_replica_reports(
        self, timeout: float, expected: set[str] | None = None
    ) -> dict[str, ReplicaReport]:
        """Every reachable broker's replica report, by broker id; answers are awaited from
        ``expected`` (default: every registered broker) at most."""
        if expected is None:
            expected = set(self.raft.state.brokers)
        reports: dict[str, ReplicaReport] = {}
        everyone_answered = asyncio.Event()

        async def on_reply(msg: TransportMessage) -> None:
            try:
                body = msgpack.unpackb(msg.data, raw=False)
                reports[body["id"]] = {k: tuple(v) for k, v in body["replicas"].items()}
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


def _report_of(replica: PartitionReplica) -> tuple[int, int, int]:
    last_epoch, log_end = replica.position()
    return log_end, replica.high_watermark, last_epoch
