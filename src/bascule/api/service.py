"""Liftbridge's gRPC API (``proto.API``) on top of a bascule node.

Each RPC translates between protobuf and the node; status codes and messages are
Liftbridge's, because existing clients branch on them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import grpc

from bascule.api import positions
from bascule.api.admin import Admin
from bascule.api.cursors import CursorError, Cursors
from bascule.metadata.raft import MetadataError, NoMetadataLeader
from bascule.node.node import LocalPartition, Node
from bascule.partition.log import OffsetOutOfRange
from bascule.partition.replica import NotLeader, PartitionClosed, PartitionReplica
from bascule.wire.batches import as_subscribe_request
from bascule.wire.entry import CorruptEntry, Entry, Record, decode_entries, last_offset
from bascule.wire.names import RESERVED_STREAMS, publish_subject_error
from bascule.wire.pb import (
    admin_pb2_grpc,
    api_pb2,
    api_pb2_grpc,
    data_pb2,
    data_pb2_grpc,
)

log = logging.getLogger(__name__)

# Told how one publish ended: (ack or None, None) on success, (None, error) otherwise.
AckOutcome = Callable[[api_pb2.Ack | None, BaseException | None], None]

SUBSCRIBE_BATCH_BYTES = 256 * 1024
BATCH_BYTES = 1024 * 1024
MAX_BATCH_BYTES = 4 * 1024 * 1024  # what a gRPC client takes in one message by default
IDLE_RECHECK = 1.0
NO_LEADER = "no known metadata leader"
# An entry holds up to 65,535 headers, two of which each message gets (subject, reply).
MAX_HEADERS = 65535 - 2
MAX_HEADER_NAME_BYTES = 65535
UNAVAILABLE = "unavailable"  # how a transient failure's message starts (PublishAsync has no such code)

# CreateStream's optional settings: request field -> (settings key, scale to bascule's unit).
_DURATION_MS = 0.001
STREAM_SETTINGS = {
    "retentionMaxBytes": ("retention_max_bytes", 1),
    "retentionMaxMessages": ("retention_max_messages", 1),
    "retentionMaxAge": ("retention_max_age", _DURATION_MS),
    "cleanerInterval": ("cleaner_interval", _DURATION_MS),
    "segmentMaxBytes": ("segment_max_bytes", 1),
    "segmentMaxAge": ("segment_max_age", _DURATION_MS),
    "compactMaxGoroutines": ("compact_max_goroutines", 1),
    "compactEnabled": ("compact_enabled", None),
    "autoPauseTime": ("auto_pause_time", _DURATION_MS),
    "autoPauseDisableIfSubscribers": ("auto_pause_disable_if_subscribers", None),
    "minIsr": ("min_isr", 1),
    "optimisticConcurrencyControl": ("optimistic_concurrency_control", None),
    "encryption": ("encryption", None),
}

_METADATA_CODES = {
    "NOT_FOUND": grpc.StatusCode.NOT_FOUND,
    "ALREADY_EXISTS": grpc.StatusCode.ALREADY_EXISTS,
    "INVALID_ARGUMENT": grpc.StatusCode.INVALID_ARGUMENT,
    "FAILED_PRECONDITION": grpc.StatusCode.FAILED_PRECONDITION,
}


def stream_settings(request: api_pb2.CreateStreamRequest) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    for field, (key, scale) in STREAM_SETTINGS.items():
        if request.HasField(field):
            value = getattr(request, field).value
            settings[key] = value if scale is None else value * scale
    return settings


class API(api_pb2_grpc.APIServicer):
    def __init__(self, node: Node) -> None:
        self.node = node
        self.cursors = Cursors(node)

    async def _metadata_call(self, context: grpc.aio.ServicerContext, proposal: Any) -> None:
        try:
            await proposal
        except MetadataError as exc:
            await context.abort(_METADATA_CODES.get(exc.code, grpc.StatusCode.INTERNAL), exc.message)
        except NoMetadataLeader:
            # Liftbridge's words, but UNAVAILABLE: clients retry that, and it is transient.
            await context.abort(grpc.StatusCode.UNAVAILABLE, NO_LEADER)

    async def CreateStream(self, request, context):
        await self._metadata_call(
            context,
            self.node.create_stream(
                request.name, request.subject, request.group, request.replicationFactor,
                request.partitions, stream_settings(request),
            ),
        )
        return api_pb2.CreateStreamResponse()

    async def DeleteStream(self, request, context):
        await _refuse_internal_stream(request.name, context)
        await self._metadata_call(context, self.node.metadata.call("delete_stream", name=request.name))
        return api_pb2.DeleteStreamResponse()

    async def PauseStream(self, request, context):
        await _refuse_internal_stream(request.name, context)
        await self._metadata_call(
            context,
            self.node.metadata.call(
                "pause", name=request.name, partitions=list(request.partitions),
                resume_all=request.resumeAll, at=time.time_ns(),
            ),
        )
        return api_pb2.PauseStreamResponse()

    async def SetStreamReadonly(self, request, context):
        await _refuse_internal_stream(request.name, context)
        await self._metadata_call(
            context,
            self.node.metadata.call(
                "set_readonly", name=request.name, partitions=list(request.partitions),
                readonly=request.readonly, at=time.time_ns(),
            ),
        )
        return api_pb2.SetStreamReadonlyResponse()

    async def FetchMetadata(self, request, context):
        return self.node.read(lambda state: self._metadata(state, list(request.streams)))

    def _metadata(self, state, names: list[str]) -> api_pb2.FetchMetadataResponse:
        response = api_pb2.FetchMetadataResponse()
        replicas, leaders = state.partitions_per_broker(), state.partitions_led_by()
        for broker in state.brokers.values():
            response.brokers.add(
                id=broker.id, host=broker.host, port=broker.port,
                partitionCount=replicas.get(broker.id, 0), leaderCount=leaders.get(broker.id, 0),
            )
        for name in names or sorted(state.streams):
            stream = state.streams.get(name)
            if stream is None:
                response.streamMetadata.add(
                    name=name, error=api_pb2.StreamMetadata.Error.UNKNOWN_STREAM
                )
                continue
            entry = response.streamMetadata.add(
                name=stream.name, subject=stream.subject, creationTimestamp=stream.created
            )
            for partition in stream.partitions.values():
                entry.partitions[partition.id].CopyFrom(self._partition_metadata(partition))
        return response

    def _partition_metadata(self, partition) -> api_pb2.PartitionMetadata:
        local = self.node.local_partition(partition.stream, partition.id)
        hw, newest = -1, -1
        if local is not None and not local.replica.closed:
            hw, newest = local.replica.high_watermark, local.replica.log.newest_offset
        return api_pb2.PartitionMetadata(
            id=partition.id, leader=partition.leader, replicas=partition.replicas,
            isr=partition.isr, highWatermark=hw, newestOffset=newest,
            paused=partition.paused, readonly=partition.readonly,
        )

    async def FetchPartitionMetadata(self, request, context):
        await self._leader_partition(request.stream, request.partition, context)
        partition = self.node.read(lambda s: s.partition(request.stream, request.partition))
        return api_pb2.FetchPartitionMetadataResponse(metadata=self._partition_metadata(partition))

    async def _leader_partition(
        self, stream: str, partition: int, context, allow_isr: bool = False
    ) -> LocalPartition:
        meta = self.node.read(lambda s: s.partition(stream, partition))
        if meta is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "No such partition")
        local = self.node.local_partition(stream, partition)
        leads = meta.leader == self.node.server_id
        if leads and (local is None or not local.replica.is_leader):
            # named leader but not leading yet (just started, or handing back an epoch of an
            # earlier run): its high watermark is not the partition's until it leads
            local = await self.node.until_leading(stream, partition) or self.node.local_partition(stream, partition)
            leads = local is not None and local.replica.is_leader
        readable = leads or (allow_isr and self.node.server_id in meta.isr)
        if local is None or not readable:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "Server not partition leader")
        return local

    # ---- Subscribe ----------------------------------------------------------------------------

    async def Subscribe(self, request, context):
        replica, offset, stop = await self._open_subscription(request, context)
        yield api_pb2.Message()  # handshake: clients wait for it before reading
        async for chunk, _ in self._committed_chunks(replica, offset, SUBSCRIBE_BATCH_BYTES, context):
            for entry in decode_entries(chunk, check_crc=False):
                if stop.done_before(entry.offset, entry.timestamp):
                    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "Stop timestamp reached")
                yield message_from_entry(request.stream, request.partition, entry)
                if stop.done_after(entry.offset):
                    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "Stop offset reached")

    async def _open_subscription(self, request, context) -> tuple[PartitionReplica, int, positions.StopRule]:
        """The replica to read, the first offset and the stop rule, or the call aborted."""
        local = await self._leader_partition(
            request.stream, request.partition, context, allow_isr=request.readISRReplica
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

    async def _committed_chunks(
        self, replica: PartitionReplica, offset: int, max_bytes: int, context
    ) -> AsyncIterator[tuple[bytes, int]]:
        """Committed entries from ``offset`` on, as stored, with the offset of the last one, until
        the call ends; waits for more."""
        replica.readers += 1
        try:
            async for chunk in self._chunks_from(replica, offset, max_bytes, context):
                yield chunk
        finally:
            replica.readers -= 1

    async def _chunks_from(self, replica: PartitionReplica, offset: int, max_bytes: int, context):
        while True:
            try:
                chunk = replica.read_committed_raw(offset, max_bytes)
            except OffsetOutOfRange:
                offset = replica.log.oldest_offset  # retention removed what we were about to read
                continue
            except CorruptEntry as exc:
                log.error("corrupt entry in %s/%s: %s", replica.stream, replica.partition, exc)
                await context.abort(grpc.StatusCode.DATA_LOSS, f"corrupt entry at offset {offset}: {exc}")
            if chunk:
                last = last_offset(chunk)
                offset = last + 1
                yield chunk, last
                continue
            await self._end_of_data(replica, offset, context)
            await replica.wait_for_data(IDLE_RECHECK)

    async def _end_of_data(self, replica, offset: int, context) -> None:
        if replica.closed:
            await context.abort(grpc.StatusCode.NOT_FOUND, "Partition deleted")
        if replica.paused:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "Partition paused")
        if replica.readonly and offset > replica.log.newest_offset:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "End of readonly partition")

    # ---- Publish ------------------------------------------------------------------------------

    async def Publish(self, request, context):
        wait = request.ackPolicy != api_pb2.AckPolicy.NONE and context.time_remaining() is not None
        try:
            ack = await self.node_publish(request, wait)
        except Exception as exc:
            failure = publish_failure(exc)
            await context.abort(failure.status, failure.message)
        return api_pb2.PublishResponse(ack=ack, correlationId=request.correlationId) if ack else api_pb2.PublishResponse()

    async def node_publish(self, request: api_pb2.PublishRequest, wait: bool) -> api_pb2.Ack | None:
        local = self._writable_leader(request) or await self._resume_here(request)
        if local is not None and not local.replica.is_leader:
            local = await self.node.until_leading(request.stream, request.partition)
        if local is None:
            return await self.node.publish_remote(request, wait)
        record = _record(request, local)
        if not wait:
            local.replica.submit([record])
            return None
        return await self.node.publish_local(local, record, request.ackPolicy, request.correlationId, local.subject)

    def _writable_leader(self, request: api_pb2.PublishRequest) -> LocalPartition | None:
        """The partition to append ``request`` to, when this node leads it and it takes writes as it
        is; None when the publish must resume the partition or go to its leader. PublishError when
        it cannot be published at all."""
        self._check_message(request.ByteSize(), request.headers)
        meta = self.node.read(lambda s: s.partition(request.stream, request.partition))
        if meta is None:
            raise PublishError(grpc.StatusCode.NOT_FOUND, "No such stream or partition", "NOT_FOUND")
        if meta.readonly:
            raise PublishError(grpc.StatusCode.FAILED_PRECONDITION, "Partition is readonly", "READONLY")
        if meta.paused or meta.leader != self.node.server_id:
            return None
        return self.node.local_partition(request.stream, request.partition)

    async def _resume_here(self, request: api_pb2.PublishRequest) -> LocalPartition | None:
        """Resume the partition if it is paused; the partition if this node leads it."""
        meta = self.node.read(lambda s: s.partition(request.stream, request.partition))
        if meta is None or not meta.paused:
            return None
        await self.node.metadata.call("resume", name=request.stream, partition=request.partition)
        return self.node.local_partition(request.stream, request.partition) if meta.leader == self.node.server_id else None

    def _check_message(self, size: int, headers: Mapping[str, bytes]) -> None:
        limit = self.node.max_message_bytes
        problem = None
        if size > limit:
            problem = f"message of {size} bytes exceeds the limit of {limit}"
        elif len(headers) > MAX_HEADERS:
            problem = f"{len(headers)} headers exceed the limit of {MAX_HEADERS}"
        else:
            long_name = next((name for name in headers if len(name.encode()) > MAX_HEADER_NAME_BYTES), None)
            if long_name is not None:
                problem = f"a header name exceeds the limit of {MAX_HEADER_NAME_BYTES} bytes"
        if problem:
            raise PublishError(grpc.StatusCode.INVALID_ARGUMENT, problem, "BAD_REQUEST")

    async def PublishAsync(self, request_iterator, context):
        """Requests are appended from callbacks, without a task each (a task costs more than the
        append); only those that must resume a partition or go to another node get one."""
        responses: asyncio.Queue[api_pb2.PublishResponse | None] = asyncio.Queue()
        outstanding = 0
        reading = True
        slow: set[asyncio.Task] = set()

        def respond(response: api_pb2.PublishResponse | None) -> None:
            nonlocal outstanding
            if response is not None:
                responses.put_nowait(response)
            outstanding -= 1
            if not reading and not outstanding:
                responses.put_nowait(None)

        async def read_requests() -> None:
            nonlocal outstanding, reading
            async for request in request_iterator:
                outstanding += 1
                self._publish_async(request, respond, slow)
            reading = False
            if not outstanding:
                responses.put_nowait(None)

        reader = asyncio.create_task(read_requests())
        try:
            while (response := await responses.get()) is not None:
                yield response
        finally:
            reader.cancel()
            for task in slow:
                task.cancel()

    def _publish_async(
        self, request: api_pb2.PublishRequest, respond: Callable[[api_pb2.PublishResponse | None], None],
        slow: set[asyncio.Task],
    ) -> None:
        """Publish one PublishAsync request; ``respond`` gets its response (None: no ack wanted)."""
        wait = request.ackPolicy != api_pb2.AckPolicy.NONE
        answered = False

        def acked(ack: api_pb2.Ack | None, error: BaseException | None) -> None:
            nonlocal answered
            if answered:
                return
            answered = True
            if error is None:
                respond(api_pb2.PublishResponse(ack=ack, correlationId=request.correlationId) if wait else None)
            elif wait:
                respond(_async_error(request, publish_failure(error)))
            else:
                respond(None)  # an ack-NONE publish gets no answer, failed or not

        try:
            local = self._writable_leader(request)
            if local is None or not local.replica.is_leader:
                task = asyncio.create_task(self._publish_async_the_long_way(request, wait, acked))
                slow.add(task)
                task.add_done_callback(slow.discard)
                return
            record = _record(request, local)
            if wait:
                self.node.submit_local(local, record, request.ackPolicy, request.correlationId, local.subject, acked)
            else:
                local.replica.submit([record])
                acked(None, None)
        except Exception as exc:  # refused, or leadership ended since the metadata was read
            acked(None, exc)

    async def _publish_async_the_long_way(
        self, request: api_pb2.PublishRequest, wait: bool, acked: AckOutcome,
    ) -> None:
        """Resume the partition, wait for leadership or go through NATS; ``acked`` is told once,
        whatever happens (a cancelled stream included)."""
        try:
            ack = await self.node_publish(request, wait)
        except asyncio.CancelledError as exc:
            acked(None, exc)
            raise
        except Exception as exc:
            acked(None, exc)
        else:
            acked(ack, None)

    async def PublishToSubject(self, request, context):
        message = api_pb2.Message(
            key=request.key, value=request.value, headers=request.headers,
            correlationId=request.correlationId, ackPolicy=request.ackPolicy,
        )
        wait = request.ackPolicy != api_pb2.AckPolicy.NONE and context.time_remaining() is not None
        problem = publish_subject_error(request.subject)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        try:
            self._check_message(message.ByteSize(), message.headers)
            ack = await self.node.publish_to_subject(request.subject, message, wait, context.time_remaining())
        except Exception as exc:
            failure = publish_failure(exc)
            await context.abort(failure.status, failure.message)
        return api_pb2.PublishToSubjectResponse(ack=ack) if ack else api_pb2.PublishToSubjectResponse()

    # ---- cursors ------------------------------------------------------------------------------

    async def SetCursor(self, request, context):
        try:
            await self.cursors.set(request.stream, request.partition, request.cursorId, request.offset)
        except CursorError as exc:
            await context.abort(exc.status, exc.message)
        return api_pb2.SetCursorResponse()

    async def FetchCursor(self, request, context):
        try:
            offset = self.cursors.fetch(request.stream, request.partition, request.cursorId)
        except CursorError as exc:
            await context.abort(exc.status, exc.message)
        return api_pb2.FetchCursorResponse(offset=offset)


class Data(data_pb2_grpc.DataServicer):
    """bascule's batch data path: committed entries as stored, many per gRPC message."""

    def __init__(self, api: API) -> None:
        self.api = api

    async def SubscribeBatches(self, request, context):
        if request.maxBytes > MAX_BATCH_BYTES:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"maxBytes {request.maxBytes} exceeds the limit of {MAX_BATCH_BYTES}"
            )
        replica, offset, stop = await self.api._open_subscription(as_subscribe_request(request), context)
        max_bytes = request.maxBytes if request.maxBytes > 0 else BATCH_BYTES
        async for chunk, last in self.api._committed_chunks(replica, offset, max_bytes, context):
            kept = stop.cut(chunk, last)
            if kept:
                yield data_pb2.EntryBatch(entries=kept)
            if len(kept) < len(chunk) or stop.done_after(last):
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "Stop position reached")


class PublishError(Exception):
    def __init__(self, status: grpc.StatusCode, message: str, async_code: str) -> None:
        super().__init__(message)
        self.status, self.message, self.async_code = status, message, async_code


def _record(request: api_pb2.PublishRequest, local: LocalPartition) -> Record:
    # The headers a NATS-routed publish would have got, as Liftbridge records on every message.
    headers = {**request.headers, "subject": local.subject.encode(), "reply": b""}
    return Record(value=request.value, key=request.key or None, headers=headers)


async def _refuse_internal_stream(name: str, context: grpc.aio.ServicerContext) -> None:
    """The internal streams (cursors) are the server's own: clients may not delete or stop them."""
    if name in RESERVED_STREAMS:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Stream name {name!r} is reserved")


def publish_failure(error: BaseException) -> PublishError:
    """What a client is told about a publish that failed with ``error``: transient failures
    (no leader yet, leadership moving, an ack that did not come in time) are UNAVAILABLE (async
    code UNKNOWN, message "unavailable: ..."), which clients retry."""
    if isinstance(error, PublishError):
        return error
    if isinstance(error, MetadataError):
        status = _METADATA_CODES.get(error.code, grpc.StatusCode.INTERNAL)
        async_code = "NOT_FOUND" if status is grpc.StatusCode.NOT_FOUND else "BAD_REQUEST"
        return PublishError(status, error.message, async_code)
    if isinstance(error, NoMetadataLeader):
        return PublishError(grpc.StatusCode.UNAVAILABLE, f"{UNAVAILABLE}: {NO_LEADER}", "UNKNOWN")
    if isinstance(error, TimeoutError):  # asyncio.TimeoutError is TimeoutError since 3.11
        return PublishError(grpc.StatusCode.UNAVAILABLE, f"{UNAVAILABLE}: timed out waiting for the ack", "UNKNOWN")
    if isinstance(error, (PartitionClosed, NotLeader, asyncio.CancelledError)):
        return PublishError(grpc.StatusCode.UNAVAILABLE, f"{UNAVAILABLE}: {error}", "UNKNOWN")
    if isinstance(error, ValueError):  # a record the log cannot encode
        return PublishError(grpc.StatusCode.INVALID_ARGUMENT, f"bad message: {error}", "BAD_REQUEST")
    log.error("publish failed", exc_info=error)
    return PublishError(grpc.StatusCode.INTERNAL, f"publish failed: {error}", "INTERNAL")


def _async_error(request: api_pb2.PublishRequest, error: PublishError) -> api_pb2.PublishResponse:
    code = getattr(api_pb2.PublishAsyncError.Code, error.async_code)
    return api_pb2.PublishResponse(
        correlationId=request.correlationId, asyncError=api_pb2.PublishAsyncError(code=code, message=error.message)
    )


def message_from_entry(stream: str, partition: int, entry: Entry) -> api_pb2.Message:
    headers = entry.headers
    return api_pb2.Message(
        offset=entry.offset,
        key=entry.key or b"",
        value=entry.value,
        timestamp=entry.timestamp,
        stream=stream,
        partition=partition,
        subject=headers.get("subject", b"").decode(errors="replace"),
        replySubject=headers.get("reply", b"").decode(errors="replace"),
        headers=headers,
    )


def bind(node: Node, host: str, port: int, tls: tuple[bytes, bytes] | None = None) -> tuple[grpc.aio.Server, int]:
    """A gRPC server for ``node``, bound but not yet serving; returns it and its port (``port`` 0 = free)."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_send_message_length", 64 * 1024 * 1024),
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
        ]
    )
    api = API(node)
    api_pb2_grpc.add_APIServicer_to_server(api, server)
    data_pb2_grpc.add_DataServicer_to_server(Data(api), server)
    admin_pb2_grpc.add_AdminServicer_to_server(Admin(node), server)
    address = f"{host}:{port}"
    if tls is None:
        bound = server.add_insecure_port(address)
    else:
        cert, key = tls
        bound = server.add_secure_port(address, grpc.ssl_server_credentials([(key, cert)]))
    if not bound:
        raise OSError(f"cannot listen on {address}")
    return server, bound
