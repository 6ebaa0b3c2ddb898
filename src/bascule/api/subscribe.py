"""Reading committed messages: Liftbridge's Subscribe (one message per gRPC message) and
bascule's SubscribeBatches (entries as stored, many per gRPC message)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc

from bascule.api import positions
from bascule.api.ports import Cluster, Replicas
from bascule.api.reading import readable_partition
from bascule.api.status import metadata_call
from bascule.h2grpc import Framed
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


class SubscribeRPCs:
    def __init__(self, cluster: Cluster, replicas: Replicas) -> None:
        self.cluster = cluster
        self.replicas = replicas

    async def Subscribe(self, request, context):
        replica, offset, last = await self._open(request, context)
        yield api_pb2.Message()  # handshake: clients wait for it before reading
        walk = MessageEncoder(request.stream, request.partition).walk
        async for messages, sent in _committed(replica, offset, last, SUBSCRIBE_BATCH_BYTES, walk, context):
            yield Framed(messages)
            if sent == last:
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "Stop offset reached")

    async def SubscribeBatches(self, request, context):
        if request.maxBytes > MAX_BATCH_BYTES:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"maxBytes {request.maxBytes} exceeds the limit of {MAX_BATCH_BYTES}"
            )
        replica, offset, last = await self._open(as_subscribe_request(request), context)
        max_bytes = request.maxBytes if request.maxBytes > 0 else BATCH_BYTES
        async for entries, sent in _committed(replica, offset, last, max_bytes, stored_prefix, context):
            yield data_pb2.EntryBatch(entries=entries)
            if sent == last:
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "Stop position reached")

    async def _open(self, request, context) -> tuple[PartitionReplica, int, int | None]:
        """The replica to read, the first offset and the last (None: follow until cancelled),
        or the call aborted."""
        meta = self.cluster.state.partition(request.stream, request.partition)
        if request.resume and meta is not None and meta.paused:  # Liftbridge's resume: wake it to read
            await metadata_call(context, self.cluster.call("resume", name=request.stream, partition=request.partition))
        local = await readable_partition(
            self.cluster, self.replicas, request.stream, request.partition, context, allow_isr=request.readISRReplica
        )
        replica = local.replica
        log = replica.log
        bounds = positions.LogBounds(log.oldest_offset, log.newest_offset)
        try:
            start = positions.start_offset(request, bounds, log.offset_for_timestamp)
            last = positions.stop_offset(request, bounds, lambda time: log.offset_for_timestamp(time + 1) - 1)
            if last is not None and start > last:
                raise positions.EndOfStream("Stop offset reached")  # nothing to send: end now, not wait
            return replica, start, last
        except positions.PositionError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except positions.EndOfStream as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        raise AssertionError("unreachable: abort raises")


async def _committed(
    replica: PartitionReplica,
    offset: int,
    last: int | None,
    max_bytes: int,
    walk: EntryWalk,
    context: grpc.aio.ServicerContext,
) -> AsyncIterator[tuple[bytes, int]]:
    """What ``walk`` makes of the committed entries from ``offset`` to ``last`` (None: on and
    on, waiting for more), with the offset of the last entry in each, until the call ends."""
    replica.readers += 1
    try:
        while True:
            try:
                made, count = replica.read_committed_through(offset, max_bytes, last, walk)
            except OffsetOutOfRange:
                offset = replica.log.oldest_offset  # retention removed what we were about to read
                continue
            except CorruptEntry as exc:
                log.error("corrupt entry in %s/%s: %s", replica.stream, replica.partition, exc)
                await context.abort(grpc.StatusCode.DATA_LOSS, f"corrupt entry at offset {offset}: {exc}")
            if count:
                offset += count
                yield made, offset - 1
                continue
            await _end_of_data(replica, offset, context)
            await replica.wait_for_data(IDLE_RECHECK)
    finally:
        replica.readers -= 1


async def _end_of_data(replica: PartitionReplica, offset: int, context: grpc.aio.ServicerContext) -> None:
    if replica.closed:
        await context.abort(grpc.StatusCode.NOT_FOUND, "Partition deleted")
    if replica.paused:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "Partition paused")
    if replica.readonly and offset > replica.log.newest_offset:
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "End of readonly partition")
