"""The publish RPCs: Publish, PublishAsync and PublishToSubject.

A publish to a partition this node leads is appended here; one led elsewhere is forwarded to its
leader, bursts of them in one NATS request each (``node.forwarding``), or goes through the
partition's NATS subject, as Liftbridge forwards it, where that is the contract (an ack inbox, a
subject other streams capture too).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from bascule.api.authz import Authorization, ack_inbox_rights
from bascule.api.ports import Cluster, LedPartition, Publishing, Replicas
from bascule.api.status import PublishError, publish_failure
from bascule.h2grpc import Framed, Status
from bascule.h2grpc.messages import frame
from bascule.metadata.raft import MetadataError, NoMetadataLeader
from bascule.metadata.state import MetadataState
from bascule.partition.replica import NotLeader
from bascule.partition.replication.concurrency import IncorrectOffset
from bascule.wire import capture
from bascule.wire.dedup import (
    MESSAGE_ID_HEADER,
    decode_with_id,
    headers_with_id,
    message_id_field_size,
    message_ids,
    record_with_id,
)
from bascule.wire.entry import Record
from bascule.wire.forwarding import Unforwarded
from bascule.wire.names import partition_subject, publish_subject_error, subject_matches
from bascule.wire.pb import api_pb2
from bascule.wire.settings import effective_settings

_GRPC_PREFIX = 5  # a gRPC message's compressed flag and length, before its protobuf bytes
# An entry holds up to 65,535 headers, two of which each message gets (subject, reply).
MAX_HEADERS = 65535 - 2
MAX_HEADER_NAME_BYTES = 65535

# gRPC-framed responses, and how many requests they (and any ack-NONE publishes) answer.
Respond = Callable[[bytes, int], None]
# How many leaders a publish is forwarded to, one after another, while each refuses it unwritten
# (it no longer leads); each try waits for the metadata to name another.
FORWARD_ATTEMPTS = 3
DEADLINE_MARGIN = 0.1  # seconds before a call's deadline that a wait for its ack gives up
# Refusals from this node's metadata that a change it has not applied yet may lift: asked again
# once it has caught up with the metadata leader's.
MAYBE_STALE = frozenset({"NOT_FOUND", "READONLY"})
# How long a publish refused by a former leader waits for the metadata to name the next one.
LEADER_CHANGE_WAIT = 10.0

log = logging.getLogger(__name__)


class PublishRPCs:
    def __init__(
        self, cluster: Cluster, replicas: Replicas, publishing: Publishing, authorization: Authorization | None = None,
    ) -> None:
        self.cluster = cluster
        self.replicas = replicas
        self.publishing = publishing
        self.authorization = authorization  # PublishAsync checks each request ("Publish" on its stream)
        # Per metadata state (an immutable value: while it is the same object, so are the answers).
        self._lanes: tuple[MetadataState | None, dict[tuple[str, int], _Lane]] = (None, {})
        self._shared: tuple[MetadataState, dict[tuple[str, int], bool]] | None = None

    async def Publish(self, request, context):
        wait = request.ackPolicy != api_pb2.AckPolicy.NONE and context.time_remaining() is not None
        try:
            ack = await self.publish(request, wait)
        except Exception as exc:
            failure = _failure(exc)
            await context.abort(failure.status, failure.message)
        if not ack:
            return api_pb2.PublishResponse()
        return api_pb2.PublishResponse(ack=ack, correlationId=request.correlationId)

    async def publish(self, request: api_pb2.PublishRequest, wait: bool, inbox: str = "",
                      attempts: int = FORWARD_ATTEMPTS) -> api_pb2.Ack | None:
        """Publish ``request``; its ack (None when not ``wait``). An ack of this node or of the leader
        it forwards to names ``inbox`` (by default a new one), one through NATS the request's own."""
        inbox = inbox or self.publishing.new_ack_inbox()
        local = await self._writable_leader_caught_up(request) or await self._resume_here(request)
        if local is None and self._named_here(request):
            # Named its leader, its replica not open here yet (a restart's reconcile on its way): nothing
            # captures the partition's subject before this node leads it, so through NATS it would be lost.
            local = await self.replicas.until_leading(request.stream, request.partition)
            if local is None and self._named_here(request):
                raise NotLeader(f"{request.stream}/{request.partition}: named leader here, not leading yet")
        elif local is not None and not local.replica.is_leader:
            local = await self.replicas.until_leading(request.stream, request.partition)
        if local is None:
            leader = self._forwardable(request)
            if not leader:
                return _accepted(await self.publishing.publish_remote(request, wait))
            try:
                return await self._forward(leader, request, wait, inbox)
            except Unforwarded:
                if attempts <= 1:
                    raise
            await self.cluster.metadata_when(lambda state: _leader(state, request) != leader, LEADER_CHANGE_WAIT)
            return await self.publish(request, wait, inbox, attempts - 1)
        record = _record(request, local)
        if not wait:
            local.replica.submit([record], expected=[request.expectedOffset], ids=message_ids([record]))
            return None
        return await self.publishing.publish(local.replica, local.subject, record, request.ackPolicy,
                                             request.correlationId, request.expectedOffset, inbox)

    def _named_here(self, request: api_pb2.PublishRequest) -> bool:
        """Whether the metadata names this node the leader that appends ``request`` here (not paused,
        its subject captured by no other stream, no ack inbox to go through NATS for)."""
        return not request.ackInbox and self._lane(request.stream, request.partition).here

    def _forwardable(self, request: api_pb2.PublishRequest) -> str:
        """The leader to forward ``request`` to, or "" when it goes through the partition's subject."""
        if request.ackInbox or request.ByteSize() > self.publishing.max_forwarded_bytes:
            return ""
        return self._lane(request.stream, request.partition).remote

    async def _forward(self, leader: str, request: api_pb2.PublishRequest, wait: bool,
                       inbox: str) -> api_pb2.Ack | None:
        """Forward one publish to ``leader``; its ack, once acked (None when not ``wait``)."""
        if not wait:
            self.publishing.forward_burst(leader, request.stream, request.partition, [request], None)
            return None
        answered: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

        def acked(_: list[int], framed: bytes | None, error: BaseException | None) -> None:
            if answered.done():
                return
            if framed is None:
                answered.set_exception(error or RuntimeError("no ack"))
            else:
                answered.set_result(framed)

        self.publishing.forward_burst(leader, request.stream, request.partition, [request], acked, inbox)
        framed = await answered
        return api_pb2.PublishResponse.FromString(framed[_GRPC_PREFIX:]).ack

    async def _writable_leader_caught_up(self, request: api_pb2.PublishRequest) -> LedPartition | None:
        """``_writable_leader``, asked again once this node's metadata has caught up with the
        metadata leader's when it refuses a publish that a change it has not applied yet may allow
        (a stream just created, or made writable again, through another node)."""
        try:
            return self._writable_leader(request)
        except PublishError as error:
            if error.async_code not in MAYBE_STALE:
                raise
        await self.catch_up()
        return self._writable_leader(request)

    async def catch_up(self) -> None:
        try:
            await self.cluster.catch_up()
        except (MetadataError, NoMetadataLeader):
            log.debug("could not catch up with the metadata leader", exc_info=True)  # refused as it stands

    def _writable_leader(self, request: api_pb2.PublishRequest) -> LedPartition | None:
        """The partition to append ``request`` to, when this node leads it and it takes writes as it
        is; None when the publish must resume the partition or go to its leader. PublishError when
        it cannot be published at all."""
        self._check_message(request.ByteSize(), request.headers)
        local = self._lane(request.stream, request.partition).local
        if request.ackPolicy == capture.NONE and self._concurrency_controlled(request.stream, request.partition):
            raise PublishError(Status.INVALID_ARGUMENT,
                               "stream with concurrency control must have AckPolicy set", "BAD_REQUEST")
        if request.ackInbox:
            problem = publish_subject_error(request.ackInbox)
            if problem:
                raise PublishError(Status.INVALID_ARGUMENT, f"ackInbox: {problem}", "BAD_REQUEST")
            return None  # through NATS, as Liftbridge: the partition leader acks to that inbox
        return local

    def _lane(self, stream: str, partition: int) -> _Lane:
        """How a publish to the partition goes, as the metadata now says; PublishError when it
        cannot be published at all. A PublishAsync call asks about one partition many times."""
        state = self.cluster.state
        if self._lanes[0] is not state:
            self._lanes = (state, {})
        lane = self._lanes[1].get((stream, partition))
        if lane is not None:
            return lane
        meta = state.partition(stream, partition)
        if meta is None:
            raise PublishError(Status.NOT_FOUND, "No such stream or partition", "NOT_FOUND")
        if meta.readonly:
            raise PublishError(Status.FAILED_PRECONDITION, "Partition is readonly", "READONLY")
        shared = self._shared_subject(stream, partition)
        writable = not meta.paused and meta.leader == self.cluster.server_id and not shared
        lane = _Lane(self.replicas.get(stream, partition) if writable else None, meta.paused, writable)
        if not (meta.paused or shared or writable) and meta.leader:
            lane.remote = meta.leader
            lane.key = (stream, partition)
            lane.concurrency_control = self._concurrency_controlled(stream, partition)
        if lane.local is not None or not writable:  # not yet opened here: asked again next time
            self._lanes[1][stream, partition] = lane
        return lane

    def _concurrency_controlled(self, stream: str, partition: int) -> bool:
        """Whether the partition checks expected offsets: as its replica on this node was opened,
        else as the stream's settings resolve on this node (the stream's own, else the node's)."""
        local = self.replicas.get(stream, partition)
        if local is not None:
            return local.replica.concurrency_control
        meta = self.cluster.state.streams.get(stream)
        if meta is None:
            return False
        return effective_settings(stream, meta.settings, self.cluster.stream_defaults).concurrency_control

    def _shared_subject(self, stream: str, partition: int) -> bool:
        """Whether another stream captures what is published to this partition's subject: then a
        publish goes through NATS, as Liftbridge's do, so that every such stream stores it."""
        state = self.cluster.state
        if self._shared is None or self._shared[0] is not state:
            self._shared = (state, {})
        known = self._shared[1]
        if (stream, partition) not in known:
            subject = partition_subject(state.streams[stream].subject, partition)
            known[stream, partition] = publish_subject_error(subject) is None and any(
                subject_matches(partition_subject(other.subject, index), subject)
                for other in state.streams.values() if other.name != stream for index in other.partitions
            )
        return known[stream, partition]

    async def _resume_here(self, request: api_pb2.PublishRequest) -> LedPartition | None:
        """Resume the partition if it is paused; the partition if this node leads it."""
        meta = self.cluster.state.partition(request.stream, request.partition)
        if meta is None or not meta.paused:
            return None
        await self.cluster.call("resume", name=request.stream, partition=request.partition)
        if request.ackInbox or self._shared_subject(request.stream, request.partition):
            return None
        if meta.leader != self.cluster.server_id:
            return None
        await self.replicas.until_resumed(request.stream, request.partition)
        return self.replicas.get(request.stream, request.partition)

    def _check_message(self, size: int, headers: Mapping[str, bytes]) -> None:
        limit = self.publishing.max_message_bytes
        problem = None
        if size > limit:
            problem = f"message of {size} bytes exceeds the limit of {limit}"
        elif not headers:
            return
        elif len(headers) > MAX_HEADERS:
            problem = f"{len(headers)} headers exceed the limit of {MAX_HEADERS}"
        elif any(len(name.encode()) > MAX_HEADER_NAME_BYTES for name in headers):
            problem = f"a header name exceeds the limit of {MAX_HEADER_NAME_BYTES} bytes"
        if problem:
            raise PublishError(Status.INVALID_ARGUMENT, problem, "BAD_REQUEST")

    async def PublishAsync(self, request_iterator, context):
        """Requests are appended without a task each: those ready together on a partition this
        node leads go in one write with one callback (a burst), and their responses out in one
        batch. Only those that must resume a partition or go to another node get a task, owned by
        this call."""
        call = _AsyncCall(self, context)
        reader = asyncio.create_task(call.read(request_iterator))
        try:
            while True:
                await call.wake.wait()
                call.wake.clear()
                if call.ready:
                    framed = b"".join(call.ready)
                    call.ready.clear()
                    yield Framed(framed)
                if reader.done() and not call.outstanding:
                    reader.result()  # a request the client could not send ends the call with its error
                    return
        finally:
            reader.cancel()
            call.cancel()

    def _denial(self, request: api_pb2.PublishRequest, context: Any) -> PublishError | None:
        if self.authorization is None:
            return None
        rights = [(request.stream, "Publish"), *ack_inbox_rights(request)]
        problem = self.authorization.refusal(context, rights, "Publish")
        if problem is None:
            return None
        return PublishError(Status.PERMISSION_DENIED, problem, "PERMISSION_DENIED")

    async def PublishToSubject(self, request, context):
        message = api_pb2.Message(
            key=request.key, value=request.value, headers=request.headers, ackInbox=request.ackInbox,
            correlationId=request.correlationId, ackPolicy=request.ackPolicy,
        )
        remaining = context.time_remaining()
        wait = request.ackPolicy != api_pb2.AckPolicy.NONE and remaining is not None
        problem = publish_subject_error(request.subject) or (
            request.ackInbox and publish_subject_error(request.ackInbox))
        if problem:
            await context.abort(Status.INVALID_ARGUMENT, problem)
        try:
            self._check_message(message.ByteSize(), message.headers)
            # Given up on just before the call's deadline, so that the client hears Liftbridge's answer
            # to an ack that never came (no stream captures the subject, say), not the deadline's.
            ack = await self.publishing.publish_to_subject(
                request.subject, message, wait, None if remaining is None else max(0.0, remaining - DEADLINE_MARGIN))
        except TimeoutError:
            await context.abort(Status.UNKNOWN, "context deadline exceeded")
        except Exception as exc:
            failure = publish_failure(exc)
            await context.abort(failure.status, failure.message)
        return api_pb2.PublishToSubjectResponse(ack=ack) if ack else api_pb2.PublishToSubjectResponse()


def _record(request: api_pb2.PublishRequest, local: LedPartition) -> Record:
    # The headers a NATS-routed publish would have got, as Liftbridge records on every message.
    shared, block = capture.stored_headers(local.subject, "")  # shared, and encoded once
    record = _record_sharing(request, shared, block)
    if record is None:
        headers = {**request.headers, "subject": local.subject.encode(), "reply": b""}
        record = Record(value=request.value, key=request.key or None, headers=headers)
    return record


def _plain_record(request: api_pb2.PublishRequest, lane: _Lane) -> Record | None:
    """The record of a publish with no headers of its own but a message id, else None (the general
    path checks them)."""
    return None if lane.header_block is None else _record_sharing(request, lane.headers, lane.header_block)


def _record_sharing(request: api_pb2.PublishRequest, shared: dict[str, bytes], block: bytes) -> Record | None:
    """The record of a publish whose only own header, if any, is its message id, beside the
    ``shared`` subject and reply headers (encoded as ``block``); None for one with other headers."""
    own = request.headers
    if not own:
        return Record(request.value, request.key or None, shared, 0, block)
    if len(own) == 1 and (message_id := own.get(MESSAGE_ID_HEADER)) is not None:
        headers, with_id = headers_with_id(message_id, shared, block)
        return Record(request.value, request.key or None, headers, 0, with_id)
    return None


# A PublishAsync request and its message id, taken out of its headers when it is the only one
# (``wire.dedup.split_message_id``: protobuf's map is most of what an id costs to read), else None.
_decode_taking_id = functools.partial(decode_with_id, api_pb2.PublishRequest.FromString)
# Ids up to this long add this much and their length to a request's size (message_id_field_size).
_SHORT_ID, _SHORT_ID_FIELD = 112, message_id_field_size(b"")


def _with_id(request: api_pb2.PublishRequest, message_id: bytes) -> api_pb2.PublishRequest:
    """``request`` with the message id ``_decode_taking_id`` took out of it back as its one header."""
    request.headers[MESSAGE_ID_HEADER] = message_id
    return request


def _expected_offsets(local: LedPartition, requests: list[api_pb2.PublishRequest]) -> list[int] | None:
    """What the requests expect, for a partition that checks it (the others need not know)."""
    return [request.expectedOffset for request in requests] if local.replica.concurrency_control else None


def _failure(error: BaseException) -> PublishError:
    if isinstance(error, Unforwarded):  # the leaders it was sent to refused it: as a leader that lost it
        return publish_failure(NotLeader(str(error)))
    return _incorrect_offset() if isinstance(error, IncorrectOffset) else publish_failure(error)


def _leader(state: MetadataState, request: api_pb2.PublishRequest) -> str:
    meta = state.partition(request.stream, request.partition)
    return meta.leader if meta is not None else ""


def _incorrect_offset() -> PublishError:
    # Liftbridge's words and codes: PublishAsync's INCORRECT_OFFSET, and Publish's UNKNOWN (it maps
    # that code to no better status).
    return PublishError(Status.UNKNOWN, "incorrect expected offset", "INCORRECT_OFFSET")


def _accepted(ack: api_pb2.Ack | None) -> api_pb2.Ack | None:
    """The ack of a publish through NATS, or what its refusal (the ack's error) tells the client."""
    if ack is None or ack.ackError == api_pb2.Ack.Error.OK:
        return ack
    if ack.ackError == api_pb2.Ack.Error.INCORRECT_OFFSET:
        raise _incorrect_offset()
    if ack.ackError == api_pb2.Ack.Error.ENCRYPTION:  # the leader could not seal it (no master key)
        raise PublishError(Status.INTERNAL, "encryption failed on partition", "ENCRYPTION_FAILED")
    raise PublishError(Status.UNKNOWN, "unknown error", "UNKNOWN")


def _async_error(request: api_pb2.PublishRequest, error: PublishError) -> api_pb2.PublishResponse:
    code = getattr(api_pb2.PublishAsyncError.Code, error.async_code)
    return api_pb2.PublishResponse(
        correlationId=request.correlationId, asyncError=api_pb2.PublishAsyncError(code=code, message=error.message),
        # An empty Ack, as Liftbridge sends: clients older than asyncError (go-liftbridge <= 2.0.1) read
        # the ack of every response and would crash on a missing one.
        ack=api_pb2.Ack(),
    )


class _AsyncCall:
    """One PublishAsync call: its requests as they are read, its responses until they are sent,
    and the tasks of the requests that cannot be appended at once."""

    def __init__(self, rpcs: PublishRPCs, context: Any) -> None:
        self.rpcs = rpcs
        self.context = context
        self.ready: list[bytes] = []  # gRPC-framed responses not yet sent
        self.wake = asyncio.Event()
        self.outstanding = 0  # requests read and not yet answered (or, ack NONE, appended)
        self.inbox = rpcs.publishing.new_ack_inbox()  # what its acks name, as Liftbridge's session inbox
        self.burst = _Burst(rpcs.publishing, self.respond, self.publish, self.inbox)
        self.resuming: dict[tuple[str, int], list[api_pb2.PublishRequest]] = {}  # partition -> requests held back
        self.slow: set[asyncio.Task[None]] = set()

    def respond(self, framed: bytes, answered: int) -> None:
        if framed:
            self.ready.append(framed)
        self.outstanding -= answered
        self.wake.set()

    def refuse(self, request: api_pb2.PublishRequest, refusal: PublishError) -> None:
        # Answered whatever the ack policy, as Liftbridge answers a request that fails its checks.
        self.respond(frame([_async_error(request, refusal).SerializeToString()]), 1)

    async def read(self, request_iterator: Any) -> None:
        try:
            while requests := await request_iterator.batch(_decode_taking_id):
                self.outstanding += len(requests)
                self.take(requests)
        finally:
            self.wake.set()

    def cancel(self) -> None:
        for task in self.slow:
            task.cancel()

    def take(self, requests: list[tuple[api_pb2.PublishRequest, bytes | None]], caught_up: bool = False) -> None:
        """Route each request: most are plain appends to a partition this node leads, which go
        into the burst here without the general path's checks (headers, ackInbox, resuming).
        What is asked of the partition is asked once per run of requests to it (nothing changes
        while this runs: no await). A request comes with the message id taken out of its headers
        (``_decode_taking_id``), or None; it gets it back wherever it goes but into the burst.
        ``caught_up``: this node's metadata caught up with the metadata leader's after these
        requests came, so a refusal from it stands; otherwise one that a change not yet applied
        here may lift waits for a catch-up first."""
        rpcs, resuming, limit = self.rpcs, self.resuming, self.rpcs.publishing.max_message_bytes
        forward_limit = rpcs.publishing.max_forwarded_bytes
        checked = rpcs.authorization is not None
        key: tuple[str, int] | None = None
        lane: _Lane | None = None
        run: _Run | None = None  # the burst's run of the lane's partition, if this node appends or forwards it
        for request, message_id in requests:
            if message_id is not None and resuming:  # held back, or maybe: as it came
                request = _with_id(request, message_id)
                message_id = None
            if request.ackInbox:  # acked on the call, as Liftbridge acks a PublishAsync: no NATS way round
                request.ClearField("ackInbox")
            refusal = rpcs._denial(request, self.context) if checked else None
            if key is None or key[0] != request.stream or key[1] != request.partition:
                key, lane, run = (request.stream, request.partition), None, None
            if refusal is None and resuming and key in resuming:  # behind requests that resume it: in order
                resuming[key].append(request)
                continue
            try:
                if refusal is not None:
                    raise refusal
                if lane is None:
                    lane = rpcs._lane(*key)
                    run = self._run_of(lane)
            except PublishError as error:
                stale = error.async_code in MAYBE_STALE and not caught_up
                if refusal is None and stale:
                    resuming[key] = [request if message_id is None else _with_id(request, message_id)]
                    self._spawn(self._catch_up_then_take(key))
                    key = None  # asked again: requests after this one are held back
                    continue
                self.refuse(request, error)
                continue
            if message_id is not None and (lane.paused or run is None or run.local is None):
                request = _with_id(request, message_id)
                message_id = None
            if lane.paused:
                resuming[key] = [request]
                self._spawn(self._resume_then_publish(request))
                key = None  # asked again: requests after this one are held back
            elif run is None or request.ackInbox:
                self.publish(request)
                key = None  # the burst's last run may have changed
            elif run.local is None:  # forwarded to the leader: the leader makes the records
                size = request.ByteSize()
                if (request.ackPolicy == capture.NONE and lane.concurrency_control) or size > forward_limit:
                    self.publish(request)  # refused there, or sent as an envelope
                    key = None
                    continue
                try:
                    rpcs._check_message(size, request.headers)
                except PublishError as error:
                    self.refuse(request, error)
                    continue
                run.requests.append(request)
            elif message_id is None:
                if ((request.ackPolicy != capture.NONE or not run.local.replica.concurrency_control)
                        and request.ByteSize() <= limit and (record := _plain_record(request, lane)) is not None):
                    run.records.append(record)
                    run.requests.append(request)
                else:
                    self.publish(request)
                    key = None  # the burst's last run may have changed
            elif ((request.ackPolicy != capture.NONE or not run.local.replica.concurrency_control)
                  and lane.header_block is not None and request.ByteSize() + (
                      _SHORT_ID_FIELD + len(message_id) if len(message_id) <= _SHORT_ID
                      else message_id_field_size(message_id)) <= limit):
                run.records.append(record_with_id(Record, request.value, request.key or None, message_id,
                                                  lane.headers, lane.header_block))
                run.requests.append(request)  # its id stays out of its headers: only acks read it from now on
            else:
                self.publish(_with_id(request, message_id))
                key = None  # the burst's last run may have changed

    def _run_of(self, lane: _Lane) -> _Run | None:
        local = lane.local
        if local is not None and local.replica.is_leader:
            return self.burst.run(local)
        return self.burst.forwarded_run(lane) if lane.remote else None

    def publish(self, request: api_pb2.PublishRequest) -> None:
        """Publish one request the general way; ``respond`` gets its response: a refusal's whatever
        the ack policy, an ack or a failure after the request was taken only if it asked for one."""
        wait = request.ackPolicy != capture.NONE
        try:
            local = self.rpcs._writable_leader(request)
            if local is not None and local.replica.is_leader:
                self.burst.add(local, _record(request, local), request)
                return
        except Exception as exc:  # refused
            self.refuse(request, _failure(exc))
            return
        answered = False

        def acked(ack: api_pb2.Ack | None, error: BaseException | None) -> None:
            nonlocal answered
            if answered:
                return
            answered = True
            if isinstance(error, PublishError):  # refused where it was checked again
                self.refuse(request, error)
            elif not wait:
                self.respond(b"", 1)  # an ack-NONE publish gets no answer, taken or lost
            elif error is None:
                self.respond(frame([api_pb2.PublishResponse(ack=ack, correlationId=request.correlationId)
                                    .SerializeToString()]), 1)
            else:
                self.refuse(request, _failure(error))

        self._spawn(self._the_long_way(request, wait, acked))

    async def _the_long_way(self, request: api_pb2.PublishRequest, wait: bool, acked: capture.AckOutcome) -> None:
        """Resume the partition, wait for leadership or go through NATS; ``acked`` is told once,
        whatever happens (a cancelled stream included)."""
        try:
            ack = await self.rpcs.publish(request, wait, self.inbox)
        except asyncio.CancelledError as exc:
            acked(None, exc)
            raise
        except Exception as exc:
            acked(None, exc)
        else:
            acked(ack, None)

    async def _catch_up_then_take(self, key: tuple[str, int]) -> None:
        """Route the requests held back for a partition this node refused from its metadata,
        once that metadata has caught up with the metadata leader's, in the order they came.
        The catch-up answers for the requests held when it asks: the metadata leader may have
        applied a change (the partition made writable again) and told its client so before it
        was asked, never after. Those held later are taken again as they came, and a refusal of
        theirs asks again: refused from a version this call caught up to before, a publish sent
        after ``SetStreamReadonly(false)`` returned was refused (lbtool's ro.publish_after_unset)."""
        covered = len(self.resuming[key])
        try:
            await self.rpcs.catch_up()
        except asyncio.CancelledError:  # the call ended
            self.resuming.pop(key)
            raise
        held: list[tuple[api_pb2.PublishRequest, bytes | None]] = [(r, None) for r in self.resuming.pop(key)]
        # No await in between: requests read later come after these.
        self.take(held[:covered], caught_up=True)
        self.take(held[covered:])

    async def _resume_then_publish(self, first: api_pb2.PublishRequest) -> None:
        """Resume a paused partition, then publish the requests held back for it meanwhile, in the
        order they came (each on its own would race the others to the log)."""
        key = (first.stream, first.partition)
        try:
            await self.rpcs._resume_here(first)
            if self.rpcs.cluster.state.partition(*key) is not None and self.rpcs._writable_leader(first) is None:
                await self.rpcs.replicas.until_leading(*key)
        except asyncio.CancelledError:  # the call ended
            self.resuming.pop(key)
            raise
        except Exception:  # each request below meets the failure again, and answers with it
            log.debug("resuming %s/%s for PublishAsync failed", *key, exc_info=True)
        for request in self.resuming.pop(key):  # no await in between: requests read later come after these
            self.publish(request)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self.slow.add(task)
        task.add_done_callback(self.slow.discard)


class _Lane:
    """How publishes to one partition go, as of one metadata state."""

    __slots__ = ("local", "here", "paused", "headers", "header_block", "remote", "key", "concurrency_control")

    def __init__(self, local: LedPartition | None, paused: bool, here: bool = False) -> None:
        self.local = local  # the partition to append to here; None: resume it, or go to its leader
        # The metadata names this node the leader that appends here (local None: its replica is not open yet).
        self.here = here
        self.paused = paused
        self.remote = ""  # the leader to forward to, when another node leads and forwarding is the way
        self.key = ("", 0)  # (stream, partition), when forwarded
        self.concurrency_control = False  # whether the partition checks expected offsets, when forwarded
        # The headers a NATS-routed publish would have got (subject, reply), as Liftbridge records
        # on every message: shared, and encoded once.
        self.headers: dict[str, bytes] = {}
        self.header_block: bytes | None = None
        if local is not None:
            self.headers, self.header_block = capture.stored_headers(local.subject, "")


class _Run:
    """Requests of a burst in a row for one partition, and their records (none when forwarded)."""

    __slots__ = ("local", "forwarded", "records", "requests")

    def __init__(self, local: LedPartition | None, forwarded: _Lane | None = None) -> None:
        self.local = local  # appended here, or
        self.forwarded = forwarded  # forwarded to this lane's leader
        self.records: list[Record] = []
        self.requests: list[api_pb2.PublishRequest] = []


class _Burst:
    """The PublishAsync requests of one call that arrive in one event-loop turn for partitions this
    node leads or forwards to their leaders: each run of them on one partition is appended in one
    write, or forwarded in one request, and acked in one callback."""

    def __init__(self, publishing: Publishing, respond: Respond,
                 reroute: Callable[[api_pb2.PublishRequest], None], inbox: str) -> None:
        self._publishing = publishing
        self._respond = respond
        self._inbox = inbox  # what the acks name
        self._reroute = reroute  # a request a former leader refused unwritten, to publish again
        self._runs: list[_Run] = []

    def add(self, local: LedPartition, record: Record, request: api_pb2.PublishRequest) -> None:
        run = self.run(local)
        run.records.append(record)
        run.requests.append(request)

    def run(self, local: LedPartition) -> _Run:
        """The run that requests to ``local`` now join (its records and requests, to append to)."""
        runs = self._runs
        if not runs:
            asyncio.get_running_loop().call_soon(self._flush)
        if not runs or runs[-1].local is not local:
            runs.append(_Run(local))
        return runs[-1]

    def forwarded_run(self, lane: _Lane) -> _Run:
        """The run that requests forwarded through ``lane`` now join."""
        runs = self._runs
        if not runs:
            asyncio.get_running_loop().call_soon(self._flush)
        if not runs or runs[-1].forwarded is not lane:
            runs.append(_Run(None, lane))
        return runs[-1]

    def _flush(self) -> None:
        runs, self._runs = self._runs, []
        for run in runs:
            local, requests = run.local, run.requests
            if not requests:  # taken for requests that all went the general way
                continue
            policies = [request.ackPolicy for request in requests]
            unanswered = policies.count(capture.NONE)
            if local is None:
                self._forward(run, unanswered < len(requests))
            else:
                self._submit(local, run, policies)
            if unanswered:
                self._respond(b"", unanswered)  # ack NONE: answered by being appended (or sent on)

    def _forward(self, run: _Run, acked: bool) -> None:
        lane = run.forwarded
        assert lane is not None
        on_acks = functools.partial(self._acked, run.requests) if acked else None
        self._publishing.forward_burst(lane.remote, *lane.key, run.requests, on_acks, self._inbox)

    def _submit(self, local: LedPartition, run: _Run, policies: list[api_pb2.AckPolicy]) -> None:
        requests = run.requests
        try:
            self._publishing.submit_burst(local.replica, local.subject, run.records,
                                          [request.correlationId for request in requests], policies,
                                          functools.partial(self._acked, requests), _expected_offsets(local, requests),
                                          self._inbox)
        except Exception as exc:  # leadership ended since the requests were read
            self._acked(requests, [i for i, policy in enumerate(policies) if policy != capture.NONE], None, exc)

    def _acked(self, requests: list[api_pb2.PublishRequest], indices: list[int], framed: bytes | None,
               error: BaseException | None) -> None:
        if isinstance(error, Unforwarded):  # nothing written: on to the leader the metadata names next
            for index in indices:
                self._reroute(requests[index])
            return
        if framed is None:
            failure = _failure(error or RuntimeError("no ack"))
            framed = frame([_async_error(requests[index], failure).SerializeToString() for index in indices])
        self._respond(framed, len(indices))
