"""bascule's async Python client, over Liftbridge's gRPC API, modelled on go-liftbridge v2.

The client knows a list of brokers and caches the cluster's metadata: partition calls (publish,
subscribe, cursors) go to the partition's leader; other calls go to one broker, and to the next
known one when it fails. Failures that may come from stale metadata drop the cache, and the call
is retried after a refresh for as long as the client's timeout allows. A subscription whose broker
dies, or stops leading, resubscribes to the new leader for up to ``resubscribe_wait`` seconds,
right after the last message it delivered. Publishes are idempotent (``client.idempotence``): a
message's id and partition are chosen once, before its first attempt, and kept by its retries.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message as ProtoMessage

from bascule.client.groups import Consumer
from bascule.client.idempotence import with_message_id
from bascule.client.model import (
    Ack,
    Assignments,
    BasculeError,
    GroupInfo,
    Membership,
    Message,
    Metadata,
    PartitionInfo,
    ack_from,
    metadata_from,
    partition_info,
)
from bascule.client.partitioners import Partitioner, choose_partition
from bascule.client.reading import APIStub, batches_else_messages, subscribe_messages
from bascule.client.routing import (
    CURSORS_STREAM,
    NoRoute,
    cursor_partition,
    leaves_metadata_stale,
    next_broker,
    partition_address,
    resumed,
    subscription_complete,
    worth_retrying,
)
from bascule.client.settings import StreamSettings
from bascule.client.tls import ClientTls
from bascule.wire.pb import admin_pb2, admin_pb2_grpc, api_pb2
from bascule.wire.policies import ACK_POLICIES, START_POSITIONS

RETRY_FIRST_DELAY = 0.05
RETRY_MAX_DELAY = 1.0
DEFAULT_RESUBSCRIBE_WAIT = 30.0  # go-liftbridge's ResubscribeWaitTime
NANOSECONDS = 1_000_000_000
Result = TypeVar("Result")
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    # A broker that comes back is reached again within a second, not after gRPC's default
    # backoff of up to two minutes.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


def _rpc_errors(call):
    """The call made as `Client._with_retries` makes it, within the client's timeout."""

    async def wrapper(self, *args, **kwargs):
        return await self._with_retries(partial(call, self, *args, **kwargs), time.monotonic() + self.timeout)

    wrapper.__name__ = call.__name__
    wrapper.__doc__ = call.__doc__
    return wrapper


class Client:
    """``brokers``: one address (host:port) or several; the others are learnt from the metadata.
    ``partitioner``: where `publish` sends a message that names no partition (default: partition 0,
    as go-liftbridge). ``idempotent``: whether publishes carry a message id (``Nats-Msg-Id``) that
    lets the partition's leader store a retried message once; each publish call may say otherwise."""

    def __init__(
        self,
        brokers: str | Sequence[str] = "127.0.0.1:9292",
        *,
        timeout: float = 10.0,
        tls: ClientTls | None = None,
        resubscribe_wait: float = DEFAULT_RESUBSCRIBE_WAIT,
        partitioner: Partitioner | None = None,
        idempotent: bool = True,
    ) -> None:
        self.seeds = [brokers] if isinstance(brokers, str) else list(brokers)
        if not self.seeds:
            raise ValueError("a client needs at least one broker address")
        self.address = self.seeds[0]  # where calls that need no leader go, until it fails
        self.timeout = timeout
        self.tls = tls
        self.resubscribe_wait = resubscribe_wait
        self.partitioner = partitioner
        self.idempotent = idempotent
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._metadata = Metadata({})  # the cache: the brokers, and the streams asked about

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

    # ---- routing ---------------------------------------------------------------------------------

    async def _with_retries(self, attempt: Callable[[], Awaitable[Result]], deadline: float) -> Result:
        """``attempt()``, and again while it fails in a way worth retrying (a broker gone, no metadata
        leader yet, leadership moving), after a failover to the next broker or a metadata refresh,
        with jittered exponential backoff, until ``deadline`` (time.monotonic()); a failure is
        raised as BasculeError."""
        delay = RETRY_FIRST_DELAY
        while True:
            try:
                return await attempt()
            except grpc.aio.AioRpcError as exc:
                code, details = exc.code(), exc.details() or ""
            except NoRoute as exc:
                code, details = exc.code, exc.details
            except BasculeError as exc:  # what the client made of an answer (PublishAsync's errors)
                code, details = exc.code, exc.message
            self._after_failure(code)
            pause = delay * random.uniform(0.5, 1.0)
            if not worth_retrying(code, details) or time.monotonic() + pause > deadline:
                raise BasculeError(code, details) from None
            await asyncio.sleep(pause)
            delay = min(delay * 2, RETRY_MAX_DELAY)

    def _stub(self, address: str | None = None) -> APIStub:
        address = address or self.address
        if address not in self._channels:
            self._channels[address] = (
                grpc.aio.insecure_channel(address, options=_CHANNEL_OPTIONS) if self.tls is None
                else grpc.aio.secure_channel(address, self.tls.credentials(), options=_CHANNEL_OPTIONS)
            )
        return APIStub(self._channels[address])

    def _after_failure(self, code: grpc.StatusCode) -> None:
        if leaves_metadata_stale(code):
            self._metadata = Metadata(self._metadata.brokers)
        if code == grpc.StatusCode.UNAVAILABLE:
            self.address = next_broker(self.address, self.seeds, self._metadata)

    async def _refresh(self, *streams: str) -> Metadata:
        """Fetch the metadata of ``streams`` (all if none), and keep it in the cache."""
        request = api_pb2.FetchMetadataRequest(streams=list(streams))
        fresh = metadata_from(await self._stub().FetchMetadata(request, timeout=self.timeout))
        kept = self._metadata.streams if streams else {}
        self._metadata = Metadata(fresh.brokers or self._metadata.brokers, {**kept, **fresh.streams})
        return fresh

    async def _partition_stub(self, stream: str, partition: int, read_isr_replica: bool = False) -> APIStub:
        address = partition_address(self._metadata, stream, partition, read_isr_replica)
        if address is None:
            await self._refresh(stream)
            info = self._metadata.streams.get(stream)
            if info is None or not info.exists or partition not in info.partitions:
                raise BasculeError(grpc.StatusCode.NOT_FOUND, f"no such stream or partition: {stream}/{partition}")
            address = partition_address(self._metadata, stream, partition, read_isr_replica)
        if address is None:
            raise NoRoute(grpc.StatusCode.UNAVAILABLE, f"no leader known for {stream}/{partition}")
        return self._stub(address)

    async def _leader_stub(self, stream: str, partition: int) -> APIStub:
        return await self._partition_stub(stream, partition)

    async def _broker_stub(self, broker_id: str) -> APIStub:
        if broker_id not in self._metadata.brokers:
            await self._refresh()
        address = self._metadata.brokers.get(broker_id)
        if address is None:
            raise NoRoute(grpc.StatusCode.UNAVAILABLE, f"broker {broker_id} is not in the metadata")
        return self._stub(address)

    async def _partition_count(self, stream: str) -> int:
        info = self._metadata.streams.get(stream)
        if info is None:
            info = (await self._refresh(stream)).streams.get(stream)
        if info is None or not info.exists:
            raise BasculeError(grpc.StatusCode.NOT_FOUND, f"no such stream: {stream}")
        return len(info.partitions)

    async def _target_partitions(
        self, stream: str, messages: Sequence[tuple[bytes | None, bytes]], partition: int | None,
        partitioner: Partitioner | None,
    ) -> list[int]:
        """Each message's (key, value) partition: the partition named, else the partitioner's choice,
        else partition 0. The partitioner is asked once per message, after the only await: a retry
        of this lookup asks no partitioner twice (a round-robin one would move on)."""
        partitioner = partitioner or self.partitioner
        if partition is not None or partitioner is None:
            return [partition or 0] * len(messages)
        count = await self._partition_count(stream)
        return [choose_partition(partitioner, stream, key, value, count) for key, value in messages]

    def _with_message_id(self, headers: Mapping[str, bytes] | None, idempotent: bool | None) -> dict[str, bytes]:
        return with_message_id(headers, self.idempotent if idempotent is None else idempotent)

    # ---- streams ---------------------------------------------------------------------------------

    @_rpc_errors
    async def create_stream(
        self,
        name: str,
        subject: str | None = None,
        *,
        group: str = "",
        replication_factor: int = 1,
        partitions: int = 1,
        settings: StreamSettings | None = None,
        **setting_values: Any,
    ) -> None:
        """Create a stream. ``settings`` (or the same as keywords: ``min_isr=2``,
        ``retention_max_age=3600``, durations in seconds) are `StreamSettings`; unset ones take the
        server's defaults. A replication factor of -1 puts a replica on every broker."""
        request = api_pb2.CreateStreamRequest(
            name=name, subject=subject or name, group=group,
            replicationFactor=replication_factor, partitions=partitions,
        )
        (settings or StreamSettings()).apply_to(request)
        StreamSettings(**setting_values).apply_to(request)
        await self._stub().CreateStream(request, timeout=self.timeout)

    @_rpc_errors
    async def delete_stream(self, name: str) -> None:
        await self._stub().DeleteStream(api_pb2.DeleteStreamRequest(name=name), timeout=self.timeout)
        self._metadata.streams.pop(name, None)

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
        """The brokers and ``streams`` (all streams if none is named); refreshes the client's cache."""
        return await self._refresh(*streams)

    @_rpc_errors
    async def fetch_partition_metadata(self, stream: str, partition: int = 0) -> PartitionInfo:
        stub = await self._leader_stub(stream, partition)
        response = await stub.FetchPartitionMetadata(
            api_pb2.FetchPartitionMetadataRequest(stream=stream, partition=partition), timeout=self.timeout
        )
        return partition_info(response.metadata)

    # ---- publishing ------------------------------------------------------------------------------
    # Each message's partition and id are chosen once, before its first attempt, and its retries keep
    # both: only the partition it went to knows its id, and only the same id tells its leader that a
    # retry is the message it may already have stored (the first attempt's ack lost, not its write).

    async def publish(
        self,
        stream: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | None = None,
        partition: int | None = None,
        partitioner: Partitioner | None = None,
        ack_policy: str = "leader",
        correlation_id: str = "",
        expected_offset: int = -1,
        idempotent: bool | None = None,
    ) -> Ack | None:
        """Publish one message to its partition's leader; returns its ack (None with ack policy
        "none"). The partition: ``partition`` if given, else the partitioner's choice (this call's,
        else the client's), else 0. ``expected_offset``: the offset the message must get, for a
        stream with optimistic concurrency control (-1: whatever is next). ``idempotent`` (None: the
        client's): give the message an id, unless ``headers`` carry a ``Nats-Msg-Id`` already."""
        deadline = time.monotonic() + self.timeout
        (target,) = await self._with_retries(
            partial(self._target_partitions, stream, [(key, value)], partition, partitioner), deadline
        )
        request = _publish_request(
            stream, value, key, self._with_message_id(headers, idempotent), target, ack_policy, correlation_id,
            expected_offset,
        )
        return await self._with_retries(partial(self._send_publish, request), deadline)

    async def _send_publish(self, request: api_pb2.PublishRequest) -> Ack | None:
        stub = await self._leader_stub(request.stream, request.partition)
        response = await stub.Publish(request, timeout=self.timeout)
        return ack_from(response.ack, request.partition) if response.HasField("ack") else None

    async def publish_many(
        self,
        stream: str,
        values: Iterable[bytes],
        *,
        keys: Sequence[bytes | None] | None = None,
        headers: Sequence[Mapping[str, bytes] | None] | None = None,
        partition: int | None = None,
        partitioner: Partitioner | None = None,
        ack_policy: str = "leader",
        idempotent: bool | None = None,
    ) -> list[Ack]:
        """Publish a batch, one PublishAsync stream per partition; returns acks in publish order
        (none with ack policy "none"). ``keys`` and ``headers``, when given, run parallel to
        ``values`` (None items allowed); partitions and ids are chosen as `publish` chooses them.
        A partition's stream that fails in a way worth retrying is opened again for the messages
        not acked yet."""
        values = list(values)
        keys = [None] * len(values) if keys is None else keys
        headers = [None] * len(values) if headers is None else headers
        if not len(keys) == len(headers) == len(values):
            raise ValueError("keys and headers must have one item per value")
        deadline = time.monotonic() + self.timeout
        targets = await self._with_retries(
            partial(self._target_partitions, stream, list(zip(keys, values)), partition, partitioner), deadline
        )
        by_partition: dict[int, list[api_pb2.PublishRequest]] = {}
        for index, (value, key, header, target) in enumerate(zip(values, keys, headers, targets)):
            by_partition.setdefault(target, []).append(_publish_request(
                stream, value, key, self._with_message_id(header, idempotent), target, ack_policy, str(index)
            ))
        acked: dict[str, Ack] = {}
        await asyncio.gather(*(
            self._with_retries(partial(self._publish_batch, stream, target, requests, acked), deadline)
            for target, requests in by_partition.items()
        ))
        return [acked[str(index)] for index in range(len(acked))]

    async def _publish_batch(
        self, stream: str, partition: int, requests: list[api_pb2.PublishRequest], acked: dict[str, Ack],
    ) -> None:
        """The requests not in ``acked`` yet (by correlation id), through one PublishAsync stream;
        their acks go into ``acked`` as they come."""
        unacked = [request for request in requests if request.correlationId not in acked]
        stub = await self._leader_stub(stream, partition)
        if requests[0].ackPolicy == api_pb2.AckPolicy.NONE:
            async for _ in stub.PublishAsync(iter(unacked)):
                pass
            return
        remaining = len(unacked)
        async for response in stub.PublishAsync(iter(unacked), timeout=self.timeout + len(unacked) / 1000):
            if response.HasField("asyncError"):
                message = response.asyncError.message
                # bascule marks transient failures so ("unavailable: ..."): PublishAsync has no such code.
                code = grpc.StatusCode.UNAVAILABLE if message.startswith("unavailable:") else grpc.StatusCode.UNKNOWN
                raise BasculeError(code, message)
            acked[response.ack.correlationId] = ack_from(response.ack, partition)
            remaining -= 1
            if not remaining:
                break

    async def publish_to_subject(
        self,
        subject: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | None = None,
        ack_policy: str = "leader",
        correlation_id: str = "",
        ack_inbox: str = "",
        idempotent: bool | None = None,
    ) -> Ack | None:
        """Publish to a NATS subject: every stream capturing it stores the message (perhaps none).
        Returns the first ack (None with ack policy "none"); its ``partition`` is None. The message's
        id, as `publish` gives it, lets each partition that captures it store it once."""
        deadline = time.monotonic() + self.timeout
        request = api_pb2.PublishToSubjectRequest(
            subject=subject, value=value, key=key or b"", headers=self._with_message_id(headers, idempotent),
            ackInbox=ack_inbox, correlationId=correlation_id, ackPolicy=ACK_POLICIES[ack_policy],
        )
        return await self._with_retries(partial(self._send_to_subject, request), deadline)

    async def _send_to_subject(self, request: api_pb2.PublishToSubjectRequest) -> Ack | None:
        response = await self._stub().PublishToSubject(request, timeout=self.timeout)
        return ack_from(response.ack, None) if response.HasField("ack") else None

    # ---- subscribing -----------------------------------------------------------------------------

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
        resume: bool = False,
        resubscribe_wait: float | None = None,
    ) -> AsyncIterator[Message]:
        """Messages of one partition from the start position; ends at a stop position, if one is
        given. ``reverse``: from the start position back to the oldest message, newest first.
        ``resume``: wake a paused partition to read it. When the broker serving it dies or stops
        leading, the subscription moves to the new leader, resuming after the last message it
        delivered, for up to ``resubscribe_wait`` seconds (the client's, 30 s by default); a reverse
        read does not move."""
        request = api_pb2.SubscribeRequest(
            stream=stream, partition=partition, readISRReplica=read_isr_replica, resume=resume,
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
        async for message in self._subscription(request, resubscribe_wait):
            yield message

    async def _subscription(
        self, request: api_pb2.SubscribeRequest, resubscribe_wait: float | None = None,
    ) -> AsyncIterator[Message]:
        wait = self.resubscribe_wait if resubscribe_wait is None else resubscribe_wait
        # Only Liftbridge's Subscribe reads backwards and serves consumer groups; a Liftbridge
        # server has no batches.
        liftbridge_only = request.reverse or request.HasField("consumer")
        read = subscribe_messages if liftbridge_only else batches_else_messages
        last_offset: int | None = None
        broken_since: float | None = None
        delay = RETRY_FIRST_DELAY
        while True:
            try:
                stub = await self._partition_stub(request.stream, request.partition, request.readISRReplica)
                async for message in read(stub, resumed(request, last_offset)):
                    broken_since, delay = None, RETRY_FIRST_DELAY
                    last_offset = message.offset
                    yield message
                return
            except grpc.aio.AioRpcError as exc:
                code, details = exc.code(), exc.details() or ""
            except NoRoute as exc:
                code, details = exc.code, exc.details
            if subscription_complete(code, details, request.reverse):
                return
            self._after_failure(code)
            now = time.monotonic()
            broken_since = now if broken_since is None else broken_since
            if request.reverse or not worth_retrying(code, details) or now - broken_since >= wait:
                raise BasculeError(code, details)
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, RETRY_MAX_DELAY)

    # ---- cursors ---------------------------------------------------------------------------------

    @_rpc_errors
    async def set_cursor(self, stream: str, partition: int, cursor_id: str, offset: int) -> None:
        request = api_pb2.SetCursorRequest(stream=stream, partition=partition, cursorId=cursor_id, offset=offset)
        await (await self._cursor_stub(cursor_id, stream, partition)).SetCursor(request, timeout=self.timeout)

    @_rpc_errors
    async def fetch_cursor(self, stream: str, partition: int, cursor_id: str) -> int:
        """The cursor's offset, -1 for a cursor never set."""
        request = api_pb2.FetchCursorRequest(stream=stream, partition=partition, cursorId=cursor_id)
        stub = await self._cursor_stub(cursor_id, stream, partition)
        return (await stub.FetchCursor(request, timeout=self.timeout)).offset

    async def _cursor_stub(self, cursor_id: str, stream: str, partition: int) -> APIStub:
        """The leader of the cursors stream's partition that holds the cursor; without a cursors
        stream, any broker, whose refusal says why."""
        cursors = self._metadata.streams.get(CURSORS_STREAM)
        if cursors is None:
            cursors = (await self._refresh(CURSORS_STREAM)).streams.get(CURSORS_STREAM)
        if cursors is None or not cursors.exists or not cursors.partitions:
            return self._stub()
        return await self._partition_stub(
            CURSORS_STREAM, cursor_partition(cursor_id, stream, partition, len(cursors.partitions))
        )

    # ---- consumer groups -------------------------------------------------------------------------

    def consumer(
        self,
        group_id: str,
        *,
        consumer_id: str | None = None,
        auto_offset: str = "new",
        checkpoint_interval: float = 5.0,
        fetch_interval: float | None = None,
    ) -> Consumer:
        """A member of consumer group ``group_id`` (see `Consumer`): ``consumer.messages(streams)``
        reads the partitions the group assigns it."""
        return Consumer(
            self, group_id, consumer_id=consumer_id, auto_offset=auto_offset,
            checkpoint_interval=checkpoint_interval, fetch_interval=fetch_interval,
        )

    @_rpc_errors
    async def join_consumer_group(self, group_id: str, consumer_id: str, streams: Sequence[str]) -> Membership:
        request = api_pb2.JoinConsumerGroupRequest(groupId=group_id, consumerId=consumer_id, streams=list(streams))
        joined = await self._stub().JoinConsumerGroup(request, timeout=self.timeout)
        return Membership(
            joined.coordinator, joined.epoch, joined.consumerTimeout / NANOSECONDS,
            joined.coordinatorTimeout / NANOSECONDS,
        )

    @_rpc_errors
    async def leave_consumer_group(self, group_id: str, consumer_id: str) -> None:
        request = api_pb2.LeaveConsumerGroupRequest(groupId=group_id, consumerId=consumer_id)
        await self._stub().LeaveConsumerGroup(request, timeout=self.timeout)

    @_rpc_errors
    async def fetch_consumer_group_assignments(
        self, group_id: str, consumer_id: str, epoch: int, coordinator: str,
    ) -> Assignments:
        """The partitions the group's coordinator (a broker id) assigns the consumer at ``epoch``.
        Also the member's heartbeat: a member that stops fetching leaves the group."""
        return await self._assignments(group_id, consumer_id, epoch, coordinator)

    async def _assignments(self, group_id: str, consumer_id: str, epoch: int, coordinator: str) -> Assignments:
        request = api_pb2.FetchConsumerGroupAssignmentsRequest(groupId=group_id, consumerId=consumer_id, epoch=epoch)
        stub = await self._broker_stub(coordinator)
        response = await stub.FetchConsumerGroupAssignments(request, timeout=self.timeout)
        return Assignments(response.epoch, {a.stream: list(a.partitions) for a in response.assignments})

    @_rpc_errors
    async def report_consumer_group_coordinator(
        self, group_id: str, consumer_id: str, coordinator: str, epoch: int,
    ) -> None:
        """Tell the cluster the group's coordinator does not answer: once enough members say so,
        the metadata leader moves the group to another broker."""
        request = api_pb2.ReportConsumerGroupCoordinatorRequest(
            groupId=group_id, consumerId=consumer_id, coordinator=coordinator, epoch=epoch,
        )
        await self._stub().ReportConsumerGroupCoordinator(request, timeout=self.timeout)

    @_rpc_errors
    async def fetch_group_metadata(self, group_id: str) -> GroupInfo:
        """The group's coordinator and epoch (``exists`` False for an unknown group)."""
        request = api_pb2.FetchMetadataRequest(groups=[group_id])
        return metadata_from(await self._stub().FetchMetadata(request, timeout=self.timeout)).groups[group_id]

    # ---- administration --------------------------------------------------------------------------

    @_rpc_errors
    async def status(self) -> dict:
        """The metadata Raft group: brokers, leader, term, each voter's match index and lag."""
        stub = admin_pb2_grpc.AdminStub(self._stub().channel)
        response = await stub.Status(admin_pb2.StatusRequest(), timeout=self.timeout)
        return _as_dict(response)

    @_rpc_errors
    async def partitions(self, stream: str = "", *, metadata_only: bool = False) -> list[dict]:
        """Each partition's leader, replicas, ISR, epochs, HW, every replica's log end and lag, and
        whether its stream is compacted (False from a node older than that field). `metadata_only`:
        without the HW and the replicas' state, for an answer that never waits on a broker that is down."""
        stub = admin_pb2_grpc.AdminStub(self._stub().channel)
        request = admin_pb2.PartitionsRequest(stream=stream, metadataOnly=metadata_only)
        response = await stub.Partitions(request, timeout=self.timeout)
        return [_as_dict(p) for p in response.partitions]

    async def wait_ready(self, deadline: float = 10.0) -> None:
        """Wait until a broker answers metadata requests with at least one broker."""
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


def _publish_request(
    stream: str, value: bytes, key: bytes | None, headers: Mapping[str, bytes] | None, partition: int,
    ack_policy: str, correlation_id: str, expected_offset: int = -1,
) -> api_pb2.PublishRequest:
    return api_pb2.PublishRequest(
        stream=stream, value=value, key=key or b"", headers=dict(headers or {}), partition=partition,
        ackPolicy=ACK_POLICIES[ack_policy], correlationId=correlation_id, expectedOffset=expected_offset,
    )
