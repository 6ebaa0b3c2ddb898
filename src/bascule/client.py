"""bascule's async Python client, over Liftbridge's gRPC API.

Partition calls go to the partition's leader, found in the cluster metadata; the
client keeps one channel per broker.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from google.protobuf.message import Message as ProtoMessage

from bascule.wire.batches import as_batch_request
from bascule.wire.entry import decode_entries
from bascule.wire.pb import admin_pb2, admin_pb2_grpc, api_pb2, api_pb2_grpc, data_pb2_grpc
from bascule.wire.settings import set_on_request

ACK_POLICIES = {"leader": api_pb2.AckPolicy.LEADER, "all": api_pb2.AckPolicy.ALL, "none": api_pb2.AckPolicy.NONE}
START_POSITIONS = {
    "new": api_pb2.StartPosition.NEW_ONLY,
    "earliest": api_pb2.StartPosition.EARLIEST,
    "latest": api_pb2.StartPosition.LATEST,
    "offset": api_pb2.StartPosition.OFFSET,
    "timestamp": api_pb2.StartPosition.TIMESTAMP,
}


class BasculeError(Exception):
    """A failed call: ``code`` is the gRPC status code, ``message`` the server's reason."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code, self.message = code, message


@dataclass(slots=True)
class Message:  # not frozen: built once per message read, and frozen dataclasses build slowly
    stream: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes
    subject: str
    headers: dict[str, bytes]


@dataclass(frozen=True)
class Ack:
    stream: str
    partition_subject: str
    offset: int
    correlation_id: str


@dataclass(frozen=True)
class PartitionInfo:
    id: int
    leader: str
    replicas: list[str]
    isr: list[str]
    high_watermark: int
    newest_offset: int
    paused: bool
    readonly: bool


@dataclass(frozen=True)
class StreamInfo:
    name: str
    subject: str
    partitions: dict[int, PartitionInfo]
    exists: bool = True


@dataclass(frozen=True)
class Metadata:
    brokers: dict[str, str]  # id -> host:port
    streams: dict[str, StreamInfo] = field(default_factory=dict)


# Errors after which the cached partition leaders may be stale (a failover, a deleted stream).
_STALE_LEADER_CODES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND,
     grpc.StatusCode.INTERNAL, grpc.StatusCode.DEADLINE_EXCEEDED}
)


RETRY_FIRST_DELAY = 0.05
RETRY_MAX_DELAY = 1.0


class _APIStub(api_pb2_grpc.APIStub):
    """An API stub that keeps its channel, for bascule's own services on the same connection."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        super().__init__(channel)
        self.channel = channel


def _rpc_errors(call):
    """BasculeError for failed calls; UNAVAILABLE (no metadata leader yet, leadership moving) is
    retried with jittered exponential backoff for as long as the client's timeout allows."""

    async def wrapper(self, *args, **kwargs):
        deadline = time.monotonic() + self.timeout
        delay = RETRY_FIRST_DELAY
        while True:
            try:
                return await call(self, *args, **kwargs)
            except grpc.aio.AioRpcError as exc:
                if exc.code() in _STALE_LEADER_CODES:
                    self._leaders.clear()
                pause = delay * random.uniform(0.5, 1.0)
                if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() + pause > deadline:
                    raise BasculeError(exc.code(), exc.details() or "") from None
            await asyncio.sleep(pause)
            delay = min(delay * 2, RETRY_MAX_DELAY)

    wrapper.__name__ = call.__name__
    wrapper.__doc__ = call.__doc__
    return wrapper


@dataclass(frozen=True)
class ClientTls:
    """TLS to the server: the CA to check its certificate with (None: the system's), and a client
    certificate and key for servers that require one (mutual TLS). PEM bytes."""

    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = None

    @classmethod
    def from_files(cls, ca: str | None = None, cert: str | None = None, key: str | None = None) -> ClientTls:
        if bool(cert) != bool(key):
            raise ValueError("a client certificate needs its key, and a key its certificate")
        return cls(*(Path(path).read_bytes() if path else None for path in (ca, cert, key)))

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(self.ca, self.key, self.cert)


class Client:
    def __init__(self, address: str = "127.0.0.1:9292", *, timeout: float = 10.0, tls: ClientTls | None = None) -> None:
        self.address = address
        self.timeout = timeout
        self.tls = tls
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._leaders: dict[tuple[str, int], str] = {}

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

    def _stub(self, address: str | None = None) -> _APIStub:
        address = address or self.address
        if address not in self._channels:
            options = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
            self._channels[address] = (
                grpc.aio.insecure_channel(address, options=options) if self.tls is None
                else grpc.aio.secure_channel(address, self.tls.credentials(), options=options)
            )
        return _APIStub(self._channels[address])

    async def _leader_stub(self, stream: str, partition: int) -> _APIStub:
        if (stream, partition) not in self._leaders:
            metadata = await self.fetch_metadata(stream)
            info = metadata.streams[stream]
            if not info.exists or partition not in info.partitions:
                raise BasculeError(grpc.StatusCode.NOT_FOUND, f"no such stream or partition: {stream}/{partition}")
            leader = info.partitions[partition].leader
            self._leaders[stream, partition] = metadata.brokers.get(leader, self.address)
        return self._stub(self._leaders[stream, partition])

    async def _isr_replica_stub(self, stream: str, partition: int) -> _APIStub:
        """A random member of the partition's ISR (leader included), as Liftbridge's clients pick for readISRReplica."""
        metadata = await self.fetch_metadata(stream)
        info = metadata.streams[stream]
        if not info.exists or partition not in info.partitions:
            raise BasculeError(grpc.StatusCode.NOT_FOUND, f"no such stream or partition: {stream}/{partition}")
        meta = info.partitions[partition]
        candidates = [broker for broker in meta.isr if broker in metadata.brokers] or [meta.leader]
        return self._stub(metadata.brokers.get(random.choice(candidates), self.address))

    @_rpc_errors
    async def create_stream(
        self,
        name: str,
        subject: str | None = None,
        *,
        group: str = "",
        replication_factor: int = 1,
        partitions: int = 1,
        **settings: float | bool,
    ) -> None:
        """Create a stream; ``settings`` are bascule.wire.settings' keys, durations in seconds
        (retention_max_age=3600, segment_max_bytes=1 << 20, min_isr=2, ...)."""
        request = api_pb2.CreateStreamRequest(
            name=name, subject=subject or name, group=group,
            replicationFactor=replication_factor, partitions=partitions,
        )
        set_on_request(request, settings)
        await self._stub().CreateStream(request, timeout=self.timeout)

    @_rpc_errors
    async def delete_stream(self, name: str) -> None:
        await self._stub().DeleteStream(api_pb2.DeleteStreamRequest(name=name), timeout=self.timeout)
        self._leaders = {k: v for k, v in self._leaders.items() if k[0] != name}

    @_rpc_errors
    async def pause_stream(self, name: str, partitions: Iterable[int] = (), resume_all: bool = False) -> None:
        request = api_pb2.PauseStreamRequest(name=name, partitions=list(partitions), resumeAll=resume_all)
        await self._stub().PauseStream(request, timeout=self.timeout)

    @_rpc_errors
    async def set_stream_readonly(self, name: str, partitions: Iterable[int] = (), readonly: bool = True) -> None:
        request = api_pb2.SetStreamReadonlyRequest(name=name, partitions=list(partitions), readonly=readonly)
        await self._stub().SetStreamReadonly(request, timeout=self.timeout)

    @_rpc_errors
    async def fetch_metadata(self, *streams: str) -> Metadata:
        response = await self._stub().FetchMetadata(
            api_pb2.FetchMetadataRequest(streams=list(streams)), timeout=self.timeout
        )
        brokers = {b.id: f"{b.host}:{b.port}" for b in response.brokers}
        infos = {}
        for s in response.streamMetadata:
            partitions = {pid: _partition_info(p) for pid, p in s.partitions.items()}
            exists = s.error != api_pb2.StreamMetadata.Error.UNKNOWN_STREAM
            infos[s.name] = StreamInfo(s.name, s.subject, partitions, exists)
        return Metadata(brokers, infos)

    @_rpc_errors
    async def fetch_partition_metadata(self, stream: str, partition: int = 0) -> PartitionInfo:
        stub = await self._leader_stub(stream, partition)
        response = await stub.FetchPartitionMetadata(
            api_pb2.FetchPartitionMetadataRequest(stream=stream, partition=partition), timeout=self.timeout
        )
        return _partition_info(response.metadata)

    @_rpc_errors
    async def publish(
        self,
        stream: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | None = None,
        partition: int = 0,
        ack_policy: str = "leader",
        correlation_id: str = "",
    ) -> Ack | None:
        """Publish one message; returns its ack (None with ack policy "none")."""
        stub = await self._leader_stub(stream, partition)
        request = _publish_request(stream, value, key, headers, partition, ack_policy, correlation_id)
        response = await stub.Publish(request, timeout=self.timeout)
        return _ack(response.ack) if response.HasField("ack") else None

    @_rpc_errors
    async def publish_many(
        self,
        stream: str,
        values: Iterable[bytes],
        *,
        keys: Sequence[bytes | None] | None = None,
        headers: Sequence[Mapping[str, bytes] | None] | None = None,
        partition: int = 0,
        ack_policy: str = "leader",
    ) -> list[Ack]:
        """Publish a batch through one PublishAsync stream; returns acks in publish order.

        ``keys`` and ``headers``, when given, run parallel to ``values`` (None items allowed)."""
        stub = await self._leader_stub(stream, partition)
        values = list(values)
        keys = [None] * len(values) if keys is None else keys
        headers = [None] * len(values) if headers is None else headers
        if not len(keys) == len(headers) == len(values):
            raise ValueError("keys and headers must have one item per value")
        requests = [
            _publish_request(stream, value, key, header, partition, ack_policy, str(index))
            for index, (value, key, header) in enumerate(zip(values, keys, headers))
        ]
        acks: dict[int, Ack] = {}
        if ACK_POLICIES[ack_policy] == api_pb2.AckPolicy.NONE:
            call = stub.PublishAsync(iter(requests))
            async for _ in call:
                pass
            return []
        async for response in stub.PublishAsync(iter(requests), timeout=self.timeout + len(requests) / 1000):
            if response.HasField("asyncError"):
                message = response.asyncError.message
                # bascule marks transient failures so ("unavailable: ..."): PublishAsync has no such code.
                code = grpc.StatusCode.UNAVAILABLE if message.startswith("unavailable:") else grpc.StatusCode.UNKNOWN
                raise BasculeError(code, message)
            acks[int(response.correlationId)] = _ack(response.ack)
            if len(acks) == len(requests):
                break
        return [acks[i] for i in range(len(requests))]

    async def subscribe(
        self,
        stream: str,
        partition: int = 0,
        *,
        start: str = "new",
        offset: int | None = None,
        timestamp: int | None = None,
        stop_offset: int | None = None,
        stop_latest: bool = False,
        read_isr_replica: bool = False,
        reverse: bool = False,
    ) -> AsyncIterator[Message]:
        """Messages of one partition from the start position; ends at a stop position, if one is
        given. ``reverse``: from the start position back to the oldest message, newest first."""
        request = api_pb2.SubscribeRequest(
            stream=stream, partition=partition, readISRReplica=read_isr_replica,
            startPosition=START_POSITIONS["offset" if offset is not None else start], reverse=reverse,
        )
        if offset is not None:
            request.startOffset = offset
        if timestamp is not None:
            request.startPosition, request.startTimestamp = api_pb2.StartPosition.TIMESTAMP, timestamp
        if stop_offset is not None:
            request.stopPosition, request.stopOffset = api_pb2.StopPosition.STOP_OFFSET, stop_offset
        elif stop_latest:
            request.stopPosition = api_pb2.StopPosition.STOP_LATEST
        try:
            if read_isr_replica:
                stub = await self._isr_replica_stub(stream, partition)
            else:
                stub = await self._leader_stub(stream, partition)
            # Only Liftbridge's Subscribe reads backwards; a Liftbridge server has no batches.
            read = _subscribe_messages if reverse else _batches_else_messages
            async for message in read(stub, request):
                yield message
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                return  # the stop position was reached
            if reverse and (exc.code(), exc.details()) == (grpc.StatusCode.UNKNOWN, "EOF"):
                return  # past the oldest message, as Liftbridge ends a reverse read
            if exc.code() in _STALE_LEADER_CODES:
                self._leaders.clear()
            raise BasculeError(exc.code(), exc.details() or "") from None

    @_rpc_errors
    async def set_cursor(self, stream: str, partition: int, cursor_id: str, offset: int) -> None:
        request = api_pb2.SetCursorRequest(stream=stream, partition=partition, cursorId=cursor_id, offset=offset)
        await self._cursor_call("SetCursor", request)

    @_rpc_errors
    async def fetch_cursor(self, stream: str, partition: int, cursor_id: str) -> int:
        request = api_pb2.FetchCursorRequest(stream=stream, partition=partition, cursorId=cursor_id)
        return (await self._cursor_call("FetchCursor", request)).offset

    async def _cursor_call(self, method: str, request):
        # The cursor's partition leader is not known to the client: try each broker in turn.
        metadata = await self.fetch_metadata()
        last_error: grpc.aio.AioRpcError | None = None
        for address in [self.address, *metadata.brokers.values()]:
            try:
                return await getattr(self._stub(address), method)(request, timeout=self.timeout)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
                    raise
                last_error = exc
        assert last_error is not None  # every broker refused, and self.address is always one
        raise last_error

    @_rpc_errors
    async def status(self) -> dict:
        """The metadata Raft group: brokers, leader, term, each voter's match index and lag."""
        self._stub()  # opens the channel
        stub = admin_pb2_grpc.AdminStub(self._channels[self.address])
        response = await stub.Status(admin_pb2.StatusRequest(), timeout=self.timeout)
        return _as_dict(response)

    @_rpc_errors
    async def partitions(self, stream: str = "", *, metadata_only: bool = False) -> list[dict]:
        """Each partition's leader, replicas, ISR, epochs, HW, every replica's log end and lag, and
        whether its stream is compacted (False from a node older than that field). `metadata_only`:
        without the HW and the replicas' state, for an answer that never waits on a broker that is down."""
        self._stub()
        stub = admin_pb2_grpc.AdminStub(self._channels[self.address])
        request = admin_pb2.PartitionsRequest(stream=stream, metadataOnly=metadata_only)
        response = await stub.Partitions(request, timeout=self.timeout)
        return [_as_dict(p) for p in response.partitions]

    async def wait_ready(self, deadline: float = 10.0) -> None:
        """Wait until the server answers metadata requests with at least one broker."""
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline
        while True:
            try:
                if (await self.fetch_metadata()).brokers:
                    return
            except BasculeError:
                if loop.time() > end:
                    raise
            if loop.time() > end:
                raise BasculeError(grpc.StatusCode.UNAVAILABLE, "no broker registered")
            await asyncio.sleep(0.1)


def _as_dict(message: ProtoMessage) -> dict:
    """Every field, integers kept as integers (protobuf's JSON mapping turns int64 into strings)."""
    result = {}
    for descriptor in message.DESCRIPTOR.fields:
        value = getattr(message, descriptor.name)
        if descriptor.message_type is not None:
            value = [_as_dict(v) for v in value] if descriptor.is_repeated else _as_dict(value)
        elif descriptor.is_repeated:
            value = list(value)
        result[descriptor.name] = value
    return result


async def _batches_else_messages(stub: _APIStub, request: api_pb2.SubscribeRequest) -> AsyncIterator[Message]:
    try:
        async for message in _subscribe_batches(stub, request):
            yield message
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
            raise
        async for message in _subscribe_messages(stub, request):  # a Liftbridge server
            yield message


async def _subscribe_batches(stub: _APIStub, request: api_pb2.SubscribeRequest) -> AsyncIterator[Message]:
    """bascule's batch path: stored entries, many per gRPC message, decoded here."""
    batches = data_pb2_grpc.DataStub(stub.channel).SubscribeBatches(as_batch_request(request))
    stream, partition = request.stream, request.partition
    async for batch in batches:
        # The server CRC-checked these entries as it read them from its log.
        for entry in decode_entries(batch.entries, check_crc=False):
            headers = entry.headers
            yield Message(
                stream, partition, entry.offset, entry.timestamp, entry.key, entry.value,
                headers.get("subject", b"").decode(errors="replace"), headers,
            )


async def _subscribe_messages(stub: api_pb2_grpc.APIStub, request: api_pb2.SubscribeRequest) -> AsyncIterator[Message]:
    """Liftbridge's Subscribe: one gRPC message per record, after an empty handshake."""
    first = True
    async for message in stub.Subscribe(request):
        if first:
            first = False
            continue
        yield _message(message)


def _publish_request(stream, value, key, headers, partition, ack_policy, correlation_id) -> api_pb2.PublishRequest:
    return api_pb2.PublishRequest(
        stream=stream, value=value, key=key or b"", headers=dict(headers or {}),
        partition=partition, ackPolicy=ACK_POLICIES[ack_policy], correlationId=correlation_id,
    )


def _partition_info(p: api_pb2.PartitionMetadata) -> PartitionInfo:
    return PartitionInfo(
        p.id, p.leader, list(p.replicas), list(p.isr), p.highWatermark, p.newestOffset, p.paused, p.readonly
    )


def _ack(a: api_pb2.Ack) -> Ack:
    return Ack(a.stream, a.partitionSubject, a.offset, a.correlationId)


def _message(m: api_pb2.Message) -> Message:
    return Message(
        m.stream, m.partition, m.offset, m.timestamp, m.key or None, m.value, m.subject, dict(m.headers)
    )
