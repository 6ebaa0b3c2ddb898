"""The leader's side of replication (over NATS, or any ``Transport``): answering fetches
and epoch queries.

Decisions (what to send, the HW, who is caught up) come from ``PartitionReplica``
and its pure ``IsrTracker``; this module only decodes requests and sends replies.
"""

from __future__ import annotations

import logging
from typing import TypeVar

from google.protobuf.message import Message

from bascule.logcontext import concerning
from bascule.natsio.transport import Transport, TransportMessage, TransportSubscription
from bascule.partition.log import OffsetOutOfRange
from bascule.partition.replica import PartitionReplica
from bascule.wire import envelope, replicate
from bascule.wire.entry import CorruptEntry
from bascule.wire.pb import internal_pb2
from bascule.wire.subjects import Subjects

log = logging.getLogger(__name__)
T = TypeVar("T", bound=Message)

RESPONSE_OVERHEAD = 64  # envelope, epoch and HW (and a fragment's sizes), with room to spare


class LeaderEndpoint:
    def __init__(self, nc: Transport, subjects: Subjects, replica: PartitionReplica, max_bytes: int) -> None:
        self.nc = nc
        self.subjects = subjects
        self.replica = replica
        # A response is one NATS message: it must fit the server's max payload.
        self.max_bytes = max(1, min(max_bytes, nc.max_payload - RESPONSE_OVERHEAD))
        self._subscriptions: list[TransportSubscription] = []

    async def start(self) -> None:
        stream, partition = self.replica.stream, self.replica.partition
        self._subscriptions = [
            await self.nc.subscribe(self.subjects.replicate(stream, partition), cb=self._on_fetch),
            await self.nc.subscribe(self.subjects.epoch_offset(stream, partition), cb=self._on_epoch_query),
        ]
        await self.nc.flush()  # followers of a new leader start fetching at once: be there first

    async def stop(self) -> None:
        for subscription in self._subscriptions:
            try:
                await subscription.unsubscribe()
            except Exception:
                log.debug("unsubscribe failed", exc_info=True)
        self._subscriptions = []

    async def _on_fetch(self, msg: TransportMessage) -> None:
        concerning(self.replica.stream, self.replica.partition)
        request = _decode(msg, envelope.MsgType.REPLICATION_REQUEST, internal_pb2.ReplicationRequest)
        if request is None:
            return
        replica = self.replica
        if not replica.serves_epoch(request.leaderEpoch):
            await self._not_leader(msg)
            return
        try:
            data = replica.serve_fetch(
                request.replicaID, request.offset + 1, request.leaderEpoch, self.max_bytes, request.leaderTime
            )
        except (OffsetOutOfRange, CorruptEntry) as exc:
            # No answer: an empty one would tell the follower it is caught up, and it would idle
            # below the damage forever; unanswered, it reports this leader, which gets replaced.
            log.error("cannot serve %s from %s/%s: %s", request.replicaID, replica.stream, replica.partition, exc)
            return
        if len(data) <= self.max_bytes and not request.fragmentStart:
            response = replicate.encode_response(replica.leader_epoch, replica.high_watermark, replica.clock(), data)
            sent = len(data)
        elif len(data) > self.max_bytes and 0 <= request.fragmentStart < len(data):
            # ``data`` is one entry (reads return more than max_bytes only for a first entry that
            # alone is bigger): it goes in pieces that each fit a NATS message.
            piece = memoryview(data)[request.fragmentStart : request.fragmentStart + self.max_bytes]
            response = replicate.encode_fragment(
                replica.leader_epoch, replica.high_watermark, replica.clock(), len(data), request.fragmentStart, piece
            )
            sent = len(piece)
        else:
            log.warning("%s asked %s/%s for a piece of an entry that is not there", request.replicaID,
                        replica.stream, replica.partition)
            return
        await self.nc.publish(msg.reply, response)
        replica.bytes_to_followers += sent

    async def _not_leader(self, msg: TransportMessage) -> None:
        """Say so at once: during a handoff a follower's first request can reach only this node's
        endpoint (the new leader not yet subscribed), and unanswered it would wait out a request
        timeout while ack-ALL writes stall."""
        if msg.reply:
            await self.nc.publish(msg.reply, envelope.NOT_LEADER_REPLY)

    async def _on_epoch_query(self, msg: TransportMessage) -> None:
        concerning(self.replica.stream, self.replica.partition)
        request = _decode(msg, envelope.MsgType.LEADER_EPOCH_OFFSET_REQUEST, internal_pb2.LeaderEpochOffsetRequest)
        if request is None:
            return
        if not self.replica.serves_epoch(request.currentLeaderEpoch):
            await self._not_leader(msg)
            return
        epoch, end_offset = self.replica.epoch_end(request.leaderEpoch)
        response = internal_pb2.LeaderEpochOffsetResponse(endOffset=end_offset, leaderEpoch=max(epoch, 0))
        await self.nc.publish(
            msg.reply, envelope.encode_message(response, envelope.MsgType.LEADER_EPOCH_OFFSET_RESPONSE)
        )


def _decode(msg: TransportMessage, msg_type: envelope.MsgType, message_class: type[T]) -> T | None:
    """The request in ``msg``, or None (logged) when it is garbage: the leader keeps serving."""
    try:
        return envelope.decode_message(msg.data, msg_type, message_class)
    except envelope.EnvelopeError as exc:
        log.warning("dropping malformed %s on %s: %s", msg_type.name.lower().replace("_", " "), msg.subject, exc)
        return None

