"""The publish RPCs: Publish, PublishAsync and PublishToSubject.

A publish to a partition this node leads is appended here; one led elsewhere goes through the
partition's NATS subject, as Liftbridge forwards it.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import Callable, Mapping
from typing import Any

import grpc

from bascule.api.authz import Authorization, denial
from bascule.api.ports import Cluster, LedPartition, Publishing, Replicas
from bascule.api.status import PublishError, publish_failure
from bascule.h2grpc import Framed
from bascule.h2grpc.messages import frame
from bascule.metadata.state import MetadataState
from bascule.partition.replication.concurrency import IncorrectOffset, concurrency_control
from bascule.wire import capture
from bascule.wire.entry import Record
from bascule.wire.names import partition_subject, publish_subject_error, subject_matches
from bascule.wire.pb import api_pb2

# An entry holds up to 65,535 headers, two of which each message gets (subject, reply).
MAX_HEADERS = 65535 - 2
MAX_HEADER_NAME_BYTES = 65535

# Serialized responses, and how many requests they (and any ack-NONE publishes) answer.
Respond = Callable[[list[bytes], int], None]

log = logging.getLogger(__name__)


class PublishRPCs:
    def __init__(
        self, cluster: Cluster, replicas: Replicas, publishing: Publishing, authorization: Authorization | None = None,
    ) -> None:
        self.cluster = cluster
        self.replicas = replicas
        self.publishing = publishing
        self.authorization = authorization  # PublishAsync checks each request ("Publish" on its stream)
        self._last_lookup: tuple[MetadataState, tuple[str, int], LedPartition | None] | None = None
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

    async def publish(self, request: api_pb2.PublishRequest, wait: bool) -> api_pb2.Ack | None:
        local = self._writable_leader(request) or await self._resume_here(request)
        if local is not None and not local.replica.is_leader:
            local = await self.replicas.until_leading(request.stream, request.partition)
        if local is None:
            return _accepted(await self.publishing.publish_remote(request, wait))
        record = _record(request, local)
        if not wait:
            local.replica.submit([record], expected=[request.expectedOffset])
            return None
        return await self.publishing.publish(local.replica, local.subject, record, request.ackPolicy,
                                             request.correlationId, request.expectedOffset)

    def _writable_leader(self, request: api_pb2.PublishRequest) -> LedPartition | None:
        """The partition to append ``request`` to, when this node leads it and it takes writes as it
        is; None when the publish must resume the partition or go to its leader. PublishError when
        it cannot be published at all."""
        self._check_message(request.ByteSize(), request.headers)
        state = self.cluster.state
        key = (request.stream, request.partition)
        if self._last_lookup is not None and self._last_lookup[0] is state and self._last_lookup[1] == key:
            local = self._last_lookup[2]  # a PublishAsync burst asks about one partition many times
        else:
            meta = state.partition(request.stream, request.partition)
            if meta is None:
                raise PublishError(grpc.StatusCode.NOT_FOUND, "No such stream or partition", "NOT_FOUND")
            if meta.readonly:
                raise PublishError(grpc.StatusCode.FAILED_PRECONDITION, "Partition is readonly", "READONLY")
            writable = not meta.paused and meta.leader == self.cluster.server_id and not self._shared_subject(*key)
            local = self.replicas.get(request.stream, request.partition) if writable else None
            if local is not None or not writable:  # not yet opened here: asked again next time
                # The metadata is an immutable value: while it is the same object, so is the answer.
                self._last_lookup = (state, key, local)
        if request.ackPolicy == capture.NONE and self._concurrency_controlled(*key):
            raise PublishError(grpc.StatusCode.INVALID_ARGUMENT,
                               "stream with concurrency control must have AckPolicy set", "BAD_REQUEST")
        if request.ackInbox:
            problem = publish_subject_error(request.ackInbox)
            if problem:
                raise PublishError(grpc.StatusCode.INVALID_ARGUMENT, f"ackInbox: {problem}", "BAD_REQUEST")
            return None  # through NATS, as Liftbridge: the partition leader acks to that inbox
        return local

    def _concurrency_controlled(self, stream: str, partition: int) -> bool:
        """Whether the partition checks expected offsets: as its replica on this node was opened
        (the stream's setting, else this node's default), else as the stream's own setting says."""
        local = self.replicas.get(stream, partition)
        if local is not None:
            return local.replica.concurrency_control
        meta = self.cluster.state.streams.get(stream)
        return meta is not None and concurrency_control(stream, meta.settings, server_default=False)

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
        leads = meta.leader == self.cluster.server_id
        return self.replicas.get(request.stream, request.partition) if leads else None

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
            raise PublishError(grpc.StatusCode.INVALID_ARGUMENT, problem, "BAD_REQUEST")

    async def PublishAsync(self, request_iterator, context):
        """Requests are appended without a task each: those ready together on a partition this
        node leads go in one write with one callback (a burst), and their responses out in one
        batch. Only those that must resume a partition or go to another node get a task, owned by
        this call."""
        ready: list[bytes] = []  # serialized responses not yet sent
        wake = asyncio.Event()
        outstanding = 0
        reading = True
        slow: set[asyncio.Task[None]] = set()

        def respond(responses: list[bytes], answered: int) -> None:
            nonlocal outstanding
            ready.extend(responses)
            outstanding -= answered
            wake.set()

        burst = _Burst(self.publishing, respond)
        resuming: dict[tuple[str, int], list[api_pb2.PublishRequest]] = {}  # partition -> requests held back

        async def read_requests() -> None:
            nonlocal outstanding, reading
            try:
                async for request in request_iterator:
                    outstanding += 1
                    if not self._allowed(request, context, respond):
                        continue
                    held = resuming.get((request.stream, request.partition))
                    if held is not None:  # behind requests that resume the partition: in order
                        held.append(request)
                    elif self._paused(request):
                        resuming[request.stream, request.partition] = [request]
                        task = asyncio.create_task(self._resume_then_publish(request, resuming, respond, burst, slow))
                        slow.add(task)
                        task.add_done_callback(slow.discard)
                    else:
                        self._publish_async(request, respond, burst, slow)
            finally:
                reading = False
                wake.set()

        reader = asyncio.create_task(read_requests())
        try:
            while True:
                await wake.wait()
                wake.clear()
                if ready:
                    batch = ready[:]
                    ready.clear()
                    yield Framed(frame(batch))
                if reader.done() and not outstanding:
                    reader.result()  # a request the client could not send ends the call with its error
                    return
        finally:
            reader.cancel()
            for task in slow:
                task.cancel()

    def _paused(self, request: api_pb2.PublishRequest) -> bool:
        meta = self.cluster.state.partition(request.stream, request.partition)
        return meta is not None and meta.paused

    async def _resume_then_publish(
        self, first: api_pb2.PublishRequest, resuming: dict[tuple[str, int], list[api_pb2.PublishRequest]],
        respond: Respond, burst: _Burst, slow: set[asyncio.Task[None]],
    ) -> None:
        """Resume a paused partition, then publish the requests held back for it meanwhile, in the
        order they came (each on its own would race the others to the log)."""
        key = (first.stream, first.partition)
        try:
            await self._resume_here(first)
            if self.cluster.state.partition(*key) is not None and self._writable_leader(first) is None:
                await self.replicas.until_leading(*key)
        except asyncio.CancelledError:  # the call ended
            resuming.pop(key)
            raise
        except Exception:  # each request below meets the failure again, and answers with it
            log.debug("resuming %s/%s for PublishAsync failed", *key, exc_info=True)
        for request in resuming.pop(key):  # no await in between: requests read later come after these
            self._publish_async(request, respond, burst, slow)

    def _allowed(self, request: api_pb2.PublishRequest, context: Any, respond: Respond) -> bool:
        if self.authorization is None or self.authorization.allows(context, request.stream, "Publish"):
            return True
        denied = PublishError(grpc.StatusCode.PERMISSION_DENIED, denial(request.stream, "Publish"), "PERMISSION_DENIED")
        respond([_async_error(request, denied).SerializeToString()], 1)  # a refusal is answered, as any policy's
        return False

    def _publish_async(
        self, request: api_pb2.PublishRequest, respond: Respond, burst: _Burst, slow: set[asyncio.Task[None]],
    ) -> None:
        """Publish one PublishAsync request; ``respond`` gets its response: a refusal's whatever
        the ack policy (as Liftbridge answers a request that fails its checks), an ack or a failure
        after the request was taken only if it asked for one."""
        wait = request.ackPolicy != capture.NONE
        try:
            local = self._writable_leader(request)
            if local is not None and local.replica.is_leader:
                burst.add(local, _record(request, local), request)
                return
        except Exception as exc:  # refused
            respond([_async_error(request, _failure(exc)).SerializeToString()], 1)
            return
        answered = False

        def acked(ack: api_pb2.Ack | None, error: BaseException | None) -> None:
            nonlocal answered
            if answered:
                return
            answered = True
            if isinstance(error, PublishError):  # refused where it was checked again
                respond([_async_error(request, error).SerializeToString()], 1)
            elif not wait:
                respond([], 1)  # an ack-NONE publish gets no answer, taken or lost
            elif error is None:
                respond([api_pb2.PublishResponse(ack=ack, correlationId=request.correlationId).SerializeToString()], 1)
            else:
                respond([_async_error(request, _failure(error)).SerializeToString()], 1)

        task = asyncio.create_task(self._publish_the_long_way(request, wait, acked))
        slow.add(task)
        task.add_done_callback(slow.discard)

    async def _publish_the_long_way(
        self, request: api_pb2.PublishRequest, wait: bool, acked: capture.AckOutcome,
    ) -> None:
        """Resume the partition, wait for leadership or go through NATS; ``acked`` is told once,
        whatever happens (a cancelled stream included)."""
        try:
            ack = await self.publish(request, wait)
        except asyncio.CancelledError as exc:
            acked(None, exc)
            raise
        except Exception as exc:
            acked(None, exc)
        else:
            acked(ack, None)

    async def PublishToSubject(self, request, context):
        message = api_pb2.Message(
            key=request.key, value=request.value, headers=request.headers, ackInbox=request.ackInbox,
            correlationId=request.correlationId, ackPolicy=request.ackPolicy,
        )
        wait = request.ackPolicy != api_pb2.AckPolicy.NONE and context.time_remaining() is not None
        problem = publish_subject_error(request.subject) or (
            request.ackInbox and publish_subject_error(request.ackInbox))
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        try:
            self._check_message(message.ByteSize(), message.headers)
            ack = await self.publishing.publish_to_subject(request.subject, message, wait, context.time_remaining())
        except Exception as exc:
            failure = publish_failure(exc)
            await context.abort(failure.status, failure.message)
        return api_pb2.PublishToSubjectResponse(ack=ack) if ack else api_pb2.PublishToSubjectResponse()


def _record(request: api_pb2.PublishRequest, local: LedPartition) -> Record:
    # The headers a NATS-routed publish would have got, as Liftbridge records on every message.
    if request.headers:
        headers = {**request.headers, "subject": local.subject.encode(), "reply": b""}
        return Record(value=request.value, key=request.key or None, headers=headers)
    headers, block = capture.stored_headers(local.subject, "")  # shared, and encoded once
    return Record(value=request.value, key=request.key or None, headers=headers, header_block=block)


def _expected_offsets(local: LedPartition, requests: list[api_pb2.PublishRequest]) -> list[int] | None:
    """What the requests expect, for a partition that checks it (the others need not know)."""
    return [request.expectedOffset for request in requests] if local.replica.concurrency_control else None


def _failure(error: BaseException) -> PublishError:
    return _incorrect_offset() if isinstance(error, IncorrectOffset) else publish_failure(error)


def _incorrect_offset() -> PublishError:
    # Liftbridge's words and codes: PublishAsync's INCORRECT_OFFSET, and Publish's UNKNOWN (it maps
    # that code to no better status).
    return PublishError(grpc.StatusCode.UNKNOWN, "incorrect expected offset", "INCORRECT_OFFSET")


def _accepted(ack: api_pb2.Ack | None) -> api_pb2.Ack | None:
    """The ack of a publish through NATS, or what its refusal (the ack's error) tells the client."""
    if ack is None or ack.ackError == api_pb2.Ack.Error.OK:
        return ack
    if ack.ackError == api_pb2.Ack.Error.INCORRECT_OFFSET:
        raise _incorrect_offset()
    raise PublishError(grpc.StatusCode.UNKNOWN, "unknown error", "UNKNOWN")


def _async_error(request: api_pb2.PublishRequest, error: PublishError) -> api_pb2.PublishResponse:
    code = getattr(api_pb2.PublishAsyncError.Code, error.async_code)
    return api_pb2.PublishResponse(
        correlationId=request.correlationId, asyncError=api_pb2.PublishAsyncError(code=code, message=error.message),
        # An empty Ack, as Liftbridge sends: clients older than asyncError (go-liftbridge <= 2.0.1) read
        # the ack of every response and would crash on a missing one.
        ack=api_pb2.Ack(),
    )


class _Burst:
    """The PublishAsync requests of one call that arrive in one event-loop turn for partitions this
    node leads: each run of them on one partition is appended in one write, acked in one callback."""

    def __init__(self, publishing: Publishing, respond: Respond) -> None:
        self._publishing = publishing
        self._respond = respond
        self._pending: list[tuple[LedPartition, Record, api_pb2.PublishRequest]] = []

    def add(self, local: LedPartition, record: Record, request: api_pb2.PublishRequest) -> None:
        if not self._pending:
            asyncio.get_running_loop().call_soon(self._flush)
        self._pending.append((local, record, request))

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        for local, run in itertools.groupby(pending, key=lambda item: item[0]):
            items = list(run)
            requests = [request for _, _, request in items]
            ack_requests = [
                capture.AckRequest("", request.correlationId, request.ackPolicy, local.subject) for request in requests
            ]
            unanswered = sum(request.ackPolicy == capture.NONE for request in requests)
            try:
                self._publishing.submit_burst(local.replica, local.subject, [record for _, record, _ in items],
                                              ack_requests, functools.partial(self._acked, requests),
                                              _expected_offsets(local, requests))
            except Exception as exc:  # leadership ended since the requests were read
                self._acked(requests, [i for i, r in enumerate(requests) if r.ackPolicy != capture.NONE], None, exc)
            if unanswered:
                self._respond([], unanswered)  # ack NONE: answered by being appended

    def _acked(self, requests: list[api_pb2.PublishRequest], indices: list[int], responses: list[bytes] | None,
               error: BaseException | None) -> None:
        if responses is None:
            failure = _failure(error or RuntimeError("no ack"))
            responses = [_async_error(requests[index], failure).SerializeToString() for index in indices]
        self._respond(responses, len(indices))
