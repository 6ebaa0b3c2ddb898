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
from bascule.wire import envelope, fetchmux, replicate
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
        # A response is one NATS message: it must fit the server's max payload, in a multiplexed
        # answer too.
        self.max_bytes = max(1, min(max_bytes, nc.max_payload - RESPONSE_OVERHEAD - fetchmux.ANSWER_RESERVE))
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
        reply = self.answer_fetch(msg.data, msg.subject)
        if reply is not None and msg.reply:
            await self.nc.publish(msg.reply, reply)

    def answer_fetch(self, data: bytes | memoryview, subject: str, room: int | None = None) -> bytes | None:
        """The reply to the fetch request ``data`` (None: it gets none). With ``room``, the reply
        shares a message with others (``partition.fetchmux``): it reads at most ``room`` bytes, and
        raises NoRoom when a first entry too big for them would have to go in pieces (alone, it
        goes whole, or in pieces when bigger than a message)."""
        concerning(self.replica.stream, self.replica.partition)
        request = _decode_bytes(data, subject, envelope.MsgType.REPLICATION_REQUEST, internal_pb2.ReplicationRequest)
        if request is None:
            return None
        replica = self.replica
        if not replica.serves_epoch(request.leaderEpoch):
            # Said at once: during a handoff a follower's first request can reach only this node's
            # endpoint (the new leader not yet subscribed), and unanswered it would wait out a
            # request timeout while ack-ALL writes stall.
            return envelope.NOT_LEADER_REPLY
        max_bytes = self.max_bytes if room is None else max(1, min(self.max_bytes, room))
        try:
            data = replica.serve_fetch(
                request.replicaID, request.offset + 1, request.leaderEpoch, max_bytes, request.leaderTime
            )
        except (OffsetOutOfRange, CorruptEntry) as exc:
            # No answer: an empty one would tell the follower it is caught up, and it would idle
            # below the damage forever; unanswered, it reports this leader, which gets replaced.
            log.error("cannot serve %s from %s/%s: %s", request.replicaID, replica.stream, replica.partition, exc)
            return None
        if len(data) <= max_bytes and not request.fragmentStart:
            response = replicate.encode_response(replica.leader_epoch, replica.high_watermark, replica.clock(), data)
            sent = len(data)
        elif room is not None and max_bytes < self.max_bytes:
            raise NoRoom(len(data))
        elif len(data) > max_bytes and 0 <= request.fragmentStart < len(data):
            # ``data`` is one entry (reads return more than max_bytes only for a first entry that
            # alone is bigger): it goes in pieces that each fit a NATS message.
            piece = memoryview(data)[request.fragmentStart : request.fragmentStart + max_bytes]
            response = replicate.encode_fragment(
                replica.leader_epoch, replica.high_watermark, replica.clock(), len(data), request.fragmentStart, piece
            )
            sent = len(piece)
        else:
            log.warning("%s asked %s/%s for a piece of an entry that is not there", request.replicaID,
                        replica.stream, replica.partition)
            return None
        replica.bytes_to_followers += sent
        return response

    async def _not_leader(self, msg: TransportMessage) -> None:
        """Said at once, as to a fetch (``answer_fetch``)."""
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


class NoRoom(Exception):
    """A fetch's reply did not fit the room left for it in a shared answer."""


def _decode(msg: TransportMessage, msg_type: envelope.MsgType, message_class: type[T]) -> T | None:
    return _decode_bytes(msg.data, msg.subject, msg_type, message_class)


def _decode_bytes(
    data: bytes | memoryview, subject: str, msg_type: envelope.MsgType, message_class: type[T]
) -> T | None:
    """The request in ``data``, or None (logged) when it is garbage: the leader keeps serving."""
    try:
        return envelope.decode_message(data, msg_type, message_class)
    except envelope.EnvelopeError as exc:
        log.warning("dropping malformed %s on %s: %s", msg_type.name.lower().replace("_", " "), subject, exc)
        return None
