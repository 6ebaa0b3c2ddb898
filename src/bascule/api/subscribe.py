"""Reading committed messages: Liftbridge's Subscribe (one message per gRPC message) and
bascule's SubscribeBatches (entries as stored, many per gRPC message)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from bascule.api import positions
from bascule.api.ports import Cluster, Replicas
from bascule.api.reading import readable_partition
from bascule.api.status import metadata_call
from bascule.h2grpc import CallContext, Ended, Framed, Status
from bascule.metadata.groups import NOT_ASSIGNED, subscription_error
from bascule.metadata.state import MetadataState
from bascule.partition.encryption import DecryptionFailed
from bascule.partition.log import OffsetOutOfRange
from bascule.partition.replica import PartitionReplica
from bascule.wire.batches import as_subscribe_request
from bascule.wire.entry import CorruptEntry, EntryWalk, stored_prefix
from bascule.wire.messages import MessageEncoder
from bascule.wire.pb import api_pb2, data_pb2

log = logging.getLogger(__name__)

SUBSCRIBE_BATCH_BYTES = 256 * 1024
BATCH_BYTES = 1024 * 1024
MAX_BATCH_BYTES = 4 * 1024 * 1024  # what a gRPC client takes in one message by default
IDLE_RECHECK = 1.0
# A reverse read takes this many offsets at a time, read forwards and sent newest first (its
# memory: that many messages).
REVERSE_CHUNK = 128
# How long a group member's subscription waits for this node's metadata to reach the group epoch
# the member holds (it learned it from a node that applied the change first).
GROUP_CATCH_UP = 2.0


@dataclass
class GroupReader:
    """The member of a consumer group reading a partition here; told to stop when displaced."""

    consumer: str
    epoch: int
    displaced: asyncio.Event = field(default_factory=asyncio.Event)


class GroupReaders:
    """Liftbridge's rule: one member of a group reads a partition at a time. A member holding the
    same or a newer group epoch takes over from the one reading (whose subscription ends); one
    holding an older epoch is refused."""

    def __init__(self) -> None:
        self._readers: dict[tuple[str, int, str], GroupReader] = {}

    def take(self, stream: str, partition: int, group: str, consumer: str, epoch: int) -> GroupReader | None:
        current = self._readers.get((stream, partition, group))
        if current is not None and current.epoch > epoch:
            return None
        if current is not None:
            current.displaced.set()
        reader = self._readers[(stream, partition, group)] = GroupReader(consumer, epoch)
        return reader

    def release(self, stream: str, partition: int, group: str, reader: GroupReader) -> None:
        if self._readers.get((stream, partition, group)) is reader:
            del self._readers[(stream, partition, group)]


class SubscribeRPCs:
    def __init__(self, cluster: Cluster, replicas: Replicas) -> None:
        self.cluster = cluster
        self.replicas = replicas
        self.group_readers = GroupReaders()

    async def Subscribe(self, request, context):
        replica, offset, last, reader = await self._open(request, context, empty_range_is_invalid=True)
        try:
            if request.reverse and replica.high_watermark < 0:  # Liftbridge's reverse reader needs one
                await context.abort(Status.INTERNAL, "Failed to create stream reader: segment not found")
            yield api_pb2.Message()  # handshake: clients wait for it before reading
            walk = MessageEncoder(request.stream, request.partition).walk
            displaced = reader.displaced if reader else None
            read = _reversed if request.reverse else _committed
            async for messages, sent in read(replica, offset, last, SUBSCRIBE_BATCH_BYTES, walk, context, displaced):
                yield Framed(messages)
                if sent == last:
                    raise Ended(Status.RESOURCE_EXHAUSTED, "Stop offset reached")
            if request.reverse and (displaced is None or not displaced.is_set()):
                raise Ended(Status.UNKNOWN, "EOF")  # past the oldest, in Liftbridge's words
        finally:
            if reader is not None:
                self.group_readers.release(request.stream, request.partition, request.consumer.groupId, reader)

    async def _group_reader(self, request, context) -> GroupReader | None:
        """For a member of a consumer group, its place as the group's reader of the partition, or the
        call aborted (Liftbridge's checks, in its words, then bascule's fencing); None for others."""
        group_id, consumer = request.consumer.groupId, request.consumer.consumerId
        if not group_id:
            return None
        if not consumer:
            await context.abort(
                Status.INVALID_ARGUMENT, "Consumer id cannot be empty when group id is provided"
            )
        meta = self.cluster.state.partition(request.stream, request.partition)
        if meta is None:
            await context.abort(Status.NOT_FOUND, "No such partition")
        leads = meta is not None and meta.leader == self.cluster.server_id
        if request.readISRReplica and not leads:
            await context.abort(Status.INVALID_ARGUMENT, "Consumer groups not compatible with ReadISRReplica")
        state = await self._group_state(group_id, request.consumer.groupEpoch)
        problem = subscription_error(
            state.groups.get(group_id), consumer, request.consumer.groupEpoch,
            state.group_assignments(group_id).get(consumer, {}), request.stream, request.partition,
        )
        reader = None if problem else self.group_readers.take(
            request.stream, request.partition, group_id, consumer, request.consumer.groupEpoch
        )
        if reader is None:
            await context.abort(Status.FAILED_PRECONDITION, problem or NOT_ASSIGNED)
        return reader

    async def _group_state(self, group_id: str, epoch: int) -> MetadataState:
        """The metadata once it knows ``group_id`` at ``epoch`` or later, or as it is after a while."""
        return await self.cluster.metadata_when(
            lambda state: getattr(state.groups.get(group_id), "epoch", -1) >= epoch, GROUP_CATCH_UP
        )

    async def SubscribeBatches(self, request, context):
        if request.maxBytes > MAX_BATCH_BYTES:
            await context.abort(
                Status.INVALID_ARGUMENT, f"maxBytes {request.maxBytes} exceeds the limit of {MAX_BATCH_BYTES}"
            )
        subscribe = as_subscribe_request(request)
        replica, offset, last, _ = await self._open(subscribe, context, empty_range_is_invalid=False)
        max_bytes = request.maxBytes if request.maxBytes > 0 else BATCH_BYTES
        async for entries, sent in _committed(replica, offset, last, max_bytes, stored_prefix, context):
            yield data_pb2.EntryBatch(entries=entries)
            if sent == last:
                raise Ended(Status.RESOURCE_EXHAUSTED, "Stop position reached")

    async def _open(
        self, request, context, empty_range_is_invalid: bool,
    ) -> tuple[PartitionReplica, int, int | None, GroupReader | None]:
        """The replica to read, the first offset and the last (None: follow until cancelled), and
        for a member of a consumer group its place as the group's reader; or the call aborted.
        A stop before the start is Liftbridge's invalid argument; bascule's own batches (its client
        and the Spark source ask for ranges that may be empty) end at once instead."""
        meta = self.cluster.state.partition(request.stream, request.partition)
        if request.resume and meta is not None and meta.paused:  # Liftbridge's resume: wake it to read
            await metadata_call(context, self.cluster.call("resume", name=request.stream, partition=request.partition))
        local = await readable_partition(
            self.cluster, self.replicas, request.stream, request.partition, context, allow_isr=request.readISRReplica
        )
        replica = local.replica
        if replica.values is not None and replica.values.problem is not None:
            await context.abort(Status.FAILED_PRECONDITION,
                                f"Partition is encrypted and this server has no valid key: {replica.values.problem}")
        bounds = positions.LogBounds(replica.oldest_offset, replica.newest_offset)
        try:
            start = positions.start_offset(request, bounds, replica.offset_for_timestamp)
            last = positions.stop_offset(request, bounds, lambda time: replica.offset_for_timestamp(time + 1) - 1)
            if empty_range_is_invalid:
                positions.check_range(start, last)
            elif last is not None and start > last:
                raise positions.EndOfStream("Stop position reached")
        except positions.PositionError as exc:
            await context.abort(Status.INVALID_ARGUMENT, str(exc))
        except positions.EndOfStream as exc:
            raise Ended(Status.RESOURCE_EXHAUSTED, str(exc)) from None
        # Last, as Liftbridge does: a call refused for anything else displaces no reader.
        return replica, start, last, await self._group_reader(request, context)


async def _committed(
    replica: PartitionReplica,
    offset: int,
    last: int | None,
    max_bytes: int,
    walk: EntryWalk,
    context: CallContext,
    displaced: asyncio.Event | None = None,
) -> AsyncIterator[tuple[bytes, int]]:
    """What ``walk`` makes of the committed entries from ``offset`` to ``last`` (None: on and
    on, waiting for more), with the offset of the last entry in each, until the call ends (or
    another member of the reader's consumer group takes the partition over: ``displaced``)."""
    replica.readers += 1
    try:
        while displaced is None or not displaced.is_set():
            try:
                made, count = await _read(replica, offset, max_bytes, last, walk, context)
            except OffsetOutOfRange:
                offset = replica.oldest_offset  # retention removed what we were about to read
                continue
            if count:
                offset += count
                replica.messages_to_subscribers += count
                replica.bytes_to_subscribers += len(made)
                yield made, offset - 1
                continue
            await _end_of_data(replica, offset, context)
            await _idle(replica, displaced)
    finally:
        replica.readers -= 1


async def _reversed(
    replica: PartitionReplica,
    start: int,
    last: int | None,
    max_bytes: int,
    walk: EntryWalk,
    context: CallContext,
    displaced: asyncio.Event | None = None,
) -> AsyncIterator[tuple[bytes, int]]:
    """Liftbridge's reverse subscription: the committed messages from ``start`` (the HW at most)
    down to the oldest, newest first, each with its offset, as ``_committed`` yields them (a stop
    offset is never below the start, so only a stop at the start ends it before the oldest)."""
    cursor = min(start, replica.high_watermark)
    replica.readers += 1
    try:
        while cursor >= replica.oldest_offset and (displaced is None or not displaced.is_set()):
            low = max(replica.oldest_offset, cursor - REVERSE_CHUNK + 1)
            try:
                messages = await _forwards(replica, low, cursor, max_bytes, walk, context)
            except OffsetOutOfRange:
                continue  # retention moved the oldest offset meanwhile
            cursor = low - 1
            for message in reversed(messages):
                replica.messages_to_subscribers += 1
                replica.bytes_to_subscribers += len(message)
                yield message, api_pb2.Message.FromString(message[5:]).offset if last is not None else -1
    finally:
        replica.readers -= 1


async def _forwards(
    replica: PartitionReplica, low: int, high: int, max_bytes: int, walk: EntryWalk, context: CallContext,
) -> list[bytes]:
    """The committed messages ``low`` to ``high`` as ``walk`` frames them, each on its own, oldest first."""
    messages, offset = [], low
    while offset <= high:
        made, count = await _read(replica, offset, max_bytes, high, walk, context)
        if not count:
            break
        offset += count
        position = 0
        while position < len(made):  # gRPC framing: a flag byte, a 4-byte length, the message
            end = position + 5 + int.from_bytes(made[position + 1:position + 5], "big")
            messages.append(made[position:end])
            position = end
    return messages


async def _read(
    replica: PartitionReplica, offset: int, max_bytes: int, last: int | None, walk: EntryWalk, context: CallContext,
) -> tuple[bytes, int]:
    """``read_committed_through``, or the call ended with DATA_LOSS at an entry that is damaged or
    a value that does not decrypt; OffsetOutOfRange if retention removed ``offset``."""
    try:
        return replica.read_committed_through(offset, max_bytes, last, walk)
    except CorruptEntry as exc:
        log.error("corrupt entry in %s/%s: %s", replica.stream, replica.partition, exc)
        await context.abort(Status.DATA_LOSS, f"corrupt entry at offset {offset}: {exc}")
    except DecryptionFailed as exc:
        log.error("a value of %s/%s does not decrypt: %s", replica.stream, replica.partition, exc)
        await context.abort(Status.DATA_LOSS, f"encrypted value does not decrypt at {exc}")


async def _idle(replica: PartitionReplica, displaced: asyncio.Event | None) -> None:
    """Until there may be more to read, or the reader is displaced."""
    if displaced is None:
        await replica.wait_for_data(IDLE_RECHECK)
        return
    waits = {asyncio.ensure_future(replica.wait_for_data(IDLE_RECHECK)), asyncio.ensure_future(displaced.wait())}
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


async def _end_of_data(replica: PartitionReplica, offset: int, context: CallContext) -> None:
    if replica.closed:
        await context.abort(Status.NOT_FOUND, "Partition deleted")
    if replica.paused:
        await context.abort(Status.FAILED_PRECONDITION, "Partition paused")
    if replica.readonly and offset > replica.newest_offset:
        raise Ended(Status.RESOURCE_EXHAUSTED, "End of readonly partition")
