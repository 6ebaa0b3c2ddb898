"""Reading committed messages: Liftbridge's Subscribe (one message per gRPC message) and
bascule's SubscribeBatches (entries as stored, many per gRPC message)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc

from bascule.api import positions
from bascule.api.ports import Cluster, Replicas
from bascule.api.reading import readable_partition
from bascule.h2grpc import Framed
from bascule.partition.log import OffsetOutOfRange
from bascule.partition.replica import PartitionReplica
from bascule.wire.batches import as_subscribe_request
from bascule.wire.entry import CorruptEntry, first_offset, last_offset
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
        replica, offset, stop = await self._open(request, context)
        yield api_pb2.Message()  # handshake: clients wait for it before reading
        encoder = MessageEncoder(request.stream, request.partition)
        async for chunk, last in _committed_chunks(replica, offset, SUBSCRIBE_BATCH_BYTES, context):
            kept = stop.cut(chunk, last)
            if kept:
                try:
                    yield Framed(encoder.encode(kept))
                except CorruptEntry as exc:
                    await context.abort(grpc.StatusCode.DATA_LOSS, f"corrupt entry: {exc}")
            sent = last if len(kept) == len(chunk) else last_offset(kept) if kept else first_offset(chunk) - 1
            if stop.done_after(sent):
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "Stop offset reached")
            if len(kept) < len(chunk):
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "Stop timestamp reached")

    async def SubscribeBatches(self, request, context):
        if request.maxBytes > MAX_BATCH_BYTES:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"maxBytes {request.maxBytes} exceeds the limit of {MAX_BATCH_BYTES}"
            )
        replica, offset, stop = await self._open(as_subscribe_request(request), context)
        max_bytes = request.maxBytes if request.maxBytes > 0 else BATCH_BYTES
        async for chunk, last in _committed_chunks(replica, offset, max_bytes, context):
            kept = stop.cut(chunk, last)
            if kept:
                yield data_pb2.EntryBatch(entries=kept)
            if len(kept) < len(chunk) or stop.done_after(last):
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "Stop position reached")

    async def _open(self, request, context) -> tuple[PartitionReplica, int, positions.StopRule]:
        """The replica to read, the first offset and the stop rule, or the call aborted."""
        local = await readable_partition(
            self.cluster, self.replicas, request.stream, request.partition, context, allow_isr=request.readISRReplica
        )
        replica = local.replica
        bounds = positions.LogBounds(replica.log.oldest_offset, replica.log.newest_offset, replica.high_watermark)
        try:
            start = positions.start_offset(request, bounds, replica.log.offset_for_timestamp)
            stop = positions.stop_rule(request, bounds)
            if stop.offset is not None and start > stop.offset:
                raise positions.EndOfStream("Stop offset reached")  # nothing to send: end now, not wait
            return replica, start, stop
        except positions.PositionError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except positions.EndOfStream as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        raise AssertionError("unreachable: abort raises")


async def _committed_chunks(
    replica: PartitionReplica, offset: int, max_bytes: int, context: grpc.aio.ServicerContext
) -> AsyncIterator[tuple[bytes, int]]:
    """Committed entries from ``offset`` on, as stored, with the offset of the last one, until
    the call ends; waits for more."""
    replica.readers += 1
    try:
        async for chunk in _chunks_from(replica, offset, max_bytes, context):
            yield chunk
    finally:
        replica.readers -= 1


async def _chunks_from(
    replica: PartitionReplica, offset: int, max_bytes: int, context: grpc.aio.ServicerContext
) -> AsyncIterator[tuple[bytes, int]]:
    while True:
        try:
            chunk, count = replica.read_committed_raw(offset, max_bytes)
        except OffsetOutOfRange:
            offset = replica.log.oldest_offset  # retention removed what we were about to read
            continue
        except CorruptEntry as exc:
            log.error("corrupt entry in %s/%s: %s", replica.stream, replica.partition, exc)
            await context.abort(grpc.StatusCode.DATA_LOSS, f"corrupt entry at offset {offset}: {exc}")
        if chunk:
            last = offset + count - 1
            offset = last + 1
            yield chunk, last
            continue
        await _end_of_data(replica, offset, context)
        await replica.wait_for_data(IDLE_RECHECK)


async def _end_of_data(replica: PartitionReplica, offset: int, context: grpc.aio.ServicerContext) -> None:
    if replica.closed:
        await context.abort(grpc.StatusCode.NOT_FOUND, "Partition deleted")
    if replica.paused:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "Partition paused")
    if replica.readonly and offset > replica.log.newest_offset:
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "End of readonly partition")
