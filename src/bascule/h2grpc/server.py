"""The asyncio shell of the gRPC server: sockets, tasks and timers around ``GrpcConnection``.

Each connection is an ``asyncio.Protocol``; each call runs its handler in a task the connection owns
(cancelled when the client resets the call, its deadline passes, or the connection ends). Writes are
coalesced: a handler's responses are queued, and the queue is flushed once per turn of the event loop,
so a Subscribe that yields a hundred messages in a turn sends them in a few DATA frames.

What a client can make the server hold is bounded (docs/operations.md, "Limits of the gRPC port"):
responses queued but not yet sent (a client that stops reading, or never opens its flow-control
windows) at most ``GrpcLimits.call_output`` per call, ``connection_output`` per connection and
``node_output`` over all: past any of them, streaming handlers wait before their next response,
unary handlers before they run,
and client-streaming handlers (PublishAsync) get no more requests, so the client's own windows stop
it; the socket's write buffer full, the connection stops reading too. Frames that cost work without
being calls (PINGs, SETTINGS, resets, empty DATA frames) are allowed ``flood_rate`` a second, in
bursts of ``flood_burst``; beyond that the connection gets GOAWAY ENHANCE_YOUR_CALM and is closed, as
is one that takes the parts of messages buffered over every connection beyond ``node_input``. A
connection's frames are handled ``frames_per_turn`` at a time, so that every connection gets turns.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import ssl
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

from google.protobuf.message import DecodeError

from bascule.h2grpc.connection import (
    CallCancelled,
    CallStarted,
    ConnectionEnded,
    GrpcConnection,
    MessagesReceived,
    Metadata,
    PingAcked,
    RequestsEnded,
)
from bascule.h2grpc.limits import GrpcLimits
from bascule.h2grpc.services import Method
from bascule.h2grpc.status import Abort, Ended, Status, status_of

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
KEEPALIVE_TIME = 60.0  # a PING after this long without hearing from the client
KEEPALIVE_TIMEOUT = 20.0  # and the connection closed if nothing comes back within this
# Connections still in their TLS handshake are not counted against the connection limit: they are
# closed if it has not completed within this.
TLS_HANDSHAKE_TIMEOUT = 10.0
MAX_REQUEST_BATCH = 1024  # requests a client-streaming handler takes at once
UNKNOWN_METHOD = "unknown"  # what an observer is told of a call to a method not served: clients choose paths

# Told of each call as it ends (its status sent, or the client gone: CANCELLED): the method's path,
# its status, the seconds since it started, and whether the status was a normal end (``Ended``).
# On the event loop, once per call: keep it cheap.
CallObserver = Callable[[str, Status, float, bool], None]


class Framed(bytes):
    """Responses a handler serialized and framed itself, each with gRPC's 5-byte prefix: a
    streaming handler that yields many at once saves a step per message."""


class CallContext:
    """What a handler knows of its call, with the subset of grpc.aio's ServicerContext that
    handlers use: abort, time_remaining, invocation_metadata, peer, cancelled."""

    __slots__ = ("_deadline", "_loop", "_metadata", "_peer", "_call")

    def __init__(self, call: _Call, metadata: Metadata, deadline: float | None, peer: str,
                 loop: asyncio.AbstractEventLoop) -> None:
        self._call, self._metadata, self._deadline, self._peer, self._loop = call, metadata, deadline, peer, loop

    async def abort(self, code: Any, details: str = "") -> NoReturn:
        raise Abort(status_of(code), details)

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - self._loop.time())

    def invocation_metadata(self) -> Metadata:
        return self._metadata

    def peer(self) -> str:
        return self._peer

    def cancelled(self) -> bool:
        return self._call.cancelled

    def peer_certificate(self) -> dict[str, Any] | None:
        """The client's verified certificate (ssl's getpeercert() form) under mutual TLS, else None."""
        return self._call.peer_certificate


class _Call:
    __slots__ = (
        "stream_id", "method", "context", "task", "inbox", "inbox_waiter", "requests_ended",
        "deadline_timer", "expired", "cancelled", "writable", "peer_certificate", "started", "observed",
    )

    def __init__(self, stream_id: int, method: Method, started: float) -> None:
        self.stream_id = stream_id
        self.method = method
        self.context: CallContext | None = None
        self.task: asyncio.Task[None] | None = None
        self.inbox: collections.deque[tuple[bytes, int]] = collections.deque()  # (message, flow bytes)
        self.inbox_waiter: asyncio.Future[None] | None = None
        self.requests_ended = False
        self.deadline_timer: asyncio.TimerHandle | None = None
        self.expired = False
        self.cancelled = False  # reset by the client, or the connection ended
        self.writable: asyncio.Future[None] | None = None
        self.peer_certificate: dict[str, Any] | None = None
        self.started = started  # the loop's time
        self.observed = False  # the server's observer was told how it ended


class _Requests:
    """A client-streaming call's requests, as the async iterator its handler reads."""

    __slots__ = ("_call", "_connection")

    def __init__(self, call: _Call, connection: _Connection) -> None:
        self._call, self._connection = call, connection

    def __aiter__(self) -> _Requests:
        return self

    async def __anext__(self) -> Any:
        if not await self._received():
            raise StopAsyncIteration
        data, flow_size = self._call.inbox.popleft()
        if flow_size:
            self._connection.consumed(self._call, flow_size)
        return _decode(self._call.method, data)

    async def batch(self, decode: Callable[[bytes], Any] | None = None) -> list[Any]:
        """The requests received and not yet read (at most MAX_REQUEST_BATCH), waiting for one if
        there is none; [] once the client has sent its last. A handler that takes requests in bulk
        (PublishAsync) saves a step of the iterator per request. A request that cannot be decoded
        ends the batch before it, and the next batch raises its error, as iterating would.
        ``decode``: what the handler makes of a request's bytes instead of the method's decoding
        (raising DecodeError as it would)."""
        if not await self._received():
            return []
        call, decode = self._call, decode or self._call.method.decode
        inbox, flow = call.inbox, 0
        requests: list[Any] = []
        while inbox and len(requests) < MAX_REQUEST_BATCH:
            data, flow_size = inbox[0]
            try:
                requests.append(decode(data))
            except DecodeError as error:
                if not requests:
                    raise _undecodable(error) from None
                break
            inbox.popleft()
            flow += flow_size
        if flow:
            self._connection.consumed(call, flow)
        return requests

    async def _received(self) -> bool:
        """Wait until a request is in the inbox and the call's responses are not stuck: False if
        none will come. A client that sends requests and reads no responses gets no more read."""
        call = self._call
        while self._connection.must_wait(call):
            await self._connection.writable(call)
        while not call.inbox:
            if call.requests_ended:
                return False
            call.inbox_waiter = self._connection.loop.create_future()
            try:
                await call.inbox_waiter
            finally:
                call.inbox_waiter = None
        return True


def _decode(method: Method, data: bytes) -> Any:
    try:
        return method.decode(data)
    except DecodeError as error:
        raise _undecodable(error) from None


def _undecodable(error: DecodeError) -> Abort:
    return Abort(Status.INTERNAL, f"could not decode the request: {error}")


class _Connection(asyncio.Protocol):
    def __init__(self, server: GrpcServer) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.limits = limits = server.limits
        self.grpc = GrpcConnection(server.max_message_bytes, frames_per_receive=limits.frames_per_turn,
                                   max_concurrent_calls=limits.max_concurrent_calls)
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.peer_certificate: dict[str, Any] | None = None
        self.calls: dict[int, _Call] = {}
        self._flush_scheduled = False
        self._paused = False
        self._rest_scheduled = False
        self._heard_from_client = True
        self._keepalive: asyncio.TimerHandle | None = None
        self._ping_sent = False
        self._allowance = limits.flood_burst
        self._allowance_at = self.loop.time()

    # --- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.peer = _peer_name(transport.get_extra_info("peername"))
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None and ssl_object.selected_alpn_protocol() != "h2":
            log.info("closing a TLS connection from %s that did not negotiate h2", self.peer)
            transport.close()
            return
        if ssl_object is not None:
            self.peer_certificate = ssl_object.getpeercert() or None
        if not self.server.admit(self):
            transport.close()
            return
        self.grpc.initiate()
        self._write()
        self._keepalive = self.loop.call_later(self.server.keepalive_time, self._keepalive_due)

    def data_received(self, data: bytes) -> None:
        self._heard_from_client = True
        self._receive(data)

    def _receive(self, data: bytes) -> None:
        """Handle a turn's share of what the client sent; the rest waits for the next turn, with
        reading paused meanwhile, so that a connection sending as fast as it can (pipelined calls,
        small frames) leaves the loop to the others between its shares."""
        for event in self.grpc.receive(data):
            if isinstance(event, MessagesReceived):
                self._messages(event)
            elif isinstance(event, CallStarted):
                self._start(event)
            elif isinstance(event, RequestsEnded):
                self._requests_ended(event.stream_id)
            elif isinstance(event, CallCancelled):
                self._cancel(event.stream_id)
            elif isinstance(event, ConnectionEnded):
                log.debug("connection from %s ends: %s", self.peer, event.reason)
                self.close_transport()
            elif isinstance(event, PingAcked):
                self._ping_sent = False
        if self.grpc.costly_frames:
            self._charge(self.grpc.costly_frames)
            self.grpc.costly_frames = 0
        if self.server.account_input(self, self.grpc.buffered_input) > self.limits.node_input:
            log.warning("closing the connection from %s: incomplete messages over the node's budget", self.peer)
            self.grpc.calm_down("incomplete messages over the node's budget")
            self.stop_calls()
            self.close_transport()
            self.server.account_input(self, 0)
        if self.grpc.input_pending:
            self._receive_rest_soon()
        self._flush()

    def _receive_rest_soon(self) -> None:
        if not self._rest_scheduled and self.transport is not None and not self.transport.is_closing():
            self._rest_scheduled = True
            self.transport.pause_reading()
            self.loop.call_soon(self._receive_rest)

    def _receive_rest(self) -> None:
        self._rest_scheduled = False
        if self.transport is None or self.transport.is_closing() or self._paused:
            return  # resume_writing comes back for the rest
        self._receive(b"")
        if not self.grpc.input_pending and not self._paused:
            self.transport.resume_reading()

    def _charge(self, frames: int) -> None:
        """A token bucket of costly frames: past it, the connection is abusing the protocol."""
        now, limits = self.loop.time(), self.limits
        self._allowance = min(limits.flood_burst,
                              self._allowance + (now - self._allowance_at) * limits.flood_rate) - frames
        self._allowance_at = now
        if self._allowance < 0:
            log.warning("closing the connection from %s: more PINGs, SETTINGS, resets or empty frames than "
                        "%g a second", self.peer, limits.flood_rate)
            self.grpc.calm_down("too many PINGs, SETTINGS, resets or empty frames")
            self.stop_calls()
            self.close_transport()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.server.account(self, 0)
        self.server.account_input(self, 0)
        if self._keepalive is not None:
            self._keepalive.cancel()
        for call in list(self.calls.values()):
            self._abandon(call)
        self.calls.clear()

    def pause_writing(self) -> None:
        # Nothing more is read until the client reads: what it sends (PINGs to answer, requests)
        # would only add to what waits for it.
        self._paused = True
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._paused = False
        if self.transport is not None and not self.transport.is_closing():
            if self.grpc.input_pending:
                self._receive_rest_soon()
            else:
                self.transport.resume_reading()
        self.wake_writers()

    # --- calls ---------------------------------------------------------------------------------

    def _start(self, event: CallStarted) -> None:
        method = self.server.methods.get(event.method)
        if method is None:
            self.grpc.finish(event.stream_id, Status.UNIMPLEMENTED, f"Method not found: {event.method}")
            self.server.observe(UNKNOWN_METHOD, Status.UNIMPLEMENTED, 0.0, False)
            return
        if self.server.closing:
            self.grpc.finish(event.stream_id, Status.UNAVAILABLE, "the server is shutting down")
            self.server.observe(method.path, Status.UNAVAILABLE, 0.0, False)
            return
        call = _Call(event.stream_id, method, self.loop.time())
        call.peer_certificate = self.peer_certificate
        deadline = None if event.timeout is None else self.loop.time() + event.timeout
        call.context = CallContext(call, event.metadata, deadline, self.peer, self.loop)
        self.calls[event.stream_id] = call
        if event.timeout is not None:
            call.deadline_timer = self.loop.call_later(event.timeout, self._expire, call)
        if method.client_streaming:
            self._run(call, _Requests(call, self))

    def _messages(self, event: MessagesReceived) -> None:
        call = self.calls.get(event.stream_id)
        if call is None:
            self.grpc.acknowledge(event.stream_id, event.flow_size)
            return
        messages = event.messages
        inbox = call.inbox
        if not call.method.client_streaming:
            self.consumed(call, event.flow_size)
            if len(inbox) + len(messages) > 1:
                # Refused now, not at the end: whatever a client sends, one call holds one message.
                self._end(call, Status.INTERNAL, "expected one request message, got more")
            elif call.task is None:
                inbox.append((messages[0], 0))
            return
        for message in messages[:-1]:
            inbox.append((message, 0))
        inbox.append((messages[-1], event.flow_size))
        if call.inbox_waiter is not None and not call.inbox_waiter.done():
            call.inbox_waiter.set_result(None)

    def consumed(self, call: _Call, flow_size: int) -> None:
        self.grpc.acknowledge(call.stream_id, flow_size)  # batched into WINDOW_UPDATEs there
        self.flush_soon()

    def _requests_ended(self, stream_id: int) -> None:
        call = self.calls.get(stream_id)
        if call is None or call.requests_ended:
            return
        call.requests_ended = True
        if call.method.client_streaming:
            if call.inbox_waiter is not None and not call.inbox_waiter.done():
                call.inbox_waiter.set_result(None)
            return
        if len(call.inbox) != 1:
            self._end(call, Status.INTERNAL, f"expected one request message, got {len(call.inbox)}")
            return
        try:
            request = _decode(call.method, call.inbox.popleft()[0])
        except Abort as abort:
            self._end(call, abort.status, abort.details)
            return
        self._run(call, request)

    def _run(self, call: _Call, argument: Any) -> None:
        call.task = self.loop.create_task(self._serve(call, argument), name=f"grpc {call.method.path}")

    async def _serve(self, call: _Call, argument: Any) -> None:
        method = call.method
        try:
            if method.server_streaming:
                next_response = method.handler(argument, call.context).__anext__
                grpc, server, limits = self.grpc, self.server, self.limits
                while True:
                    # Before the handler makes its next response: a call waiting here holds none.
                    # (With no more than a call's high water queued on the whole connection, no
                    # limit can be reached: the common case, checked first.)
                    if self._paused or grpc.queued > limits.call_output or server.queued_output > limits.node_output:
                        while self.must_wait(call):
                            await self.writable(call)
                    try:
                        response = await next_response()
                    except StopAsyncIteration:
                        break
                    self._send(call, response)
            else:
                # A unary call starts only within the budgets too: pipelined calls whose responses
                # the client does not read would otherwise queue one response each.
                while self.must_wait(call):
                    await self.writable(call)
                self._send(call, await method.handler(argument, call.context))
            self._end(call, Status.OK)
        except Abort as abort:
            self._end(call, abort.status, abort.details, isinstance(abort, Ended))
        except asyncio.CancelledError:
            if call.expired:
                self._end(call, Status.DEADLINE_EXCEEDED, "Deadline Exceeded")
            elif not call.cancelled:
                self._end(call, Status.UNAVAILABLE, "the server is shutting down")
            # The task is this connection's own and ends here, whoever cancelled it.
        except Exception as error:
            log.exception("%s failed", method.path)
            self._end(call, Status.UNKNOWN, f"unexpected {type(error).__name__}: {error}")
        finally:
            self._forget(call)

    def _send(self, call: _Call, response: Any) -> None:
        if isinstance(response, Framed):
            self.grpc.send_framed(call.stream_id, response)
            self.flush_soon()
            return
        payload = response if isinstance(response, bytes) else response.SerializeToString()
        if len(payload) > self.server.max_message_bytes:
            raise Abort(Status.RESOURCE_EXHAUSTED,
                        f"sent message larger than max ({len(payload)} vs. {self.server.max_message_bytes})")
        self.grpc.send_messages(call.stream_id, [payload])
        self.flush_soon()

    def must_wait(self, call: _Call) -> bool:
        """Whether the call's next response must wait: too much is queued for it, its connection
        or the node, or the socket's buffer is full."""
        limits = self.limits
        return (self._paused or self.grpc.pending_bytes(call.stream_id) > limits.call_output
                or self.grpc.queued > limits.connection_output or self.server.queued_output > limits.node_output)

    async def writable(self, call: _Call) -> None:
        """Until the call may go on (``must_wait`` looked again then); shared by its handler and its
        request reader."""
        waiter = call.writable
        if waiter is None or waiter.done():
            waiter = call.writable = self.loop.create_future()
        self.flush_soon()
        await asyncio.shield(waiter)

    def wake_writers(self) -> None:
        limits = self.limits
        if self._paused or self.grpc.queued > limits.connection_output * 3 // 4:
            return
        if self.server.queued_output > limits.node_output * 3 // 4:
            return
        for call in self.calls.values():
            writable = call.writable
            if writable is None or writable.done():
                continue
            if self.grpc.pending_bytes(call.stream_id) <= limits.call_output // 4:
                writable.set_result(None)

    def _end(self, call: _Call, status: Status, message: str = "", ended: bool = False) -> None:
        self.grpc.finish(call.stream_id, status, message)
        self._forget(call)
        self.flush_soon()
        self._observe(call, status, ended)

    def _observe(self, call: _Call, status: Status, ended: bool = False) -> None:
        if not call.observed:
            call.observed = True
            self.server.observe(call.method.path, status, self.loop.time() - call.started, ended)

    def _forget(self, call: _Call) -> None:
        if self.calls.get(call.stream_id) is call:
            del self.calls[call.stream_id]
        if call.deadline_timer is not None:
            call.deadline_timer.cancel()

    def _expire(self, call: _Call) -> None:
        call.expired = True
        if call.task is not None:
            call.task.cancel()
        else:
            self._end(call, Status.DEADLINE_EXCEEDED, "Deadline Exceeded")

    def _cancel(self, stream_id: int) -> None:
        call = self.calls.pop(stream_id, None)
        if call is not None:
            self._abandon(call)

    def _abandon(self, call: _Call) -> None:
        call.cancelled = True
        self._observe(call, Status.CANCELLED)
        if call.deadline_timer is not None:
            call.deadline_timer.cancel()
        if call.task is not None:
            call.task.cancel()

    def stop_calls(self) -> None:
        """End every call still running (shutdown once its grace is over)."""
        for call in list(self.calls.values()):
            if call.task is not None:
                call.task.cancel()
            else:
                self._end(call, Status.UNAVAILABLE, "the server is shutting down")

    # --- writing -------------------------------------------------------------------------------

    def flush_soon(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        self.grpc.flush()
        self._write()
        self.server.account(self, self.grpc.queued)
        self.wake_writers()

    def _write(self) -> None:
        data = self.grpc.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def go_away(self) -> None:
        self.grpc.go_away()
        self._flush()

    def close_transport(self) -> None:
        self._flush()
        if self.transport is not None:
            self.transport.close()

    def _keepalive_due(self) -> None:
        if self._ping_sent and not self._heard_from_client:
            log.info("closing the connection from %s: no answer to a keepalive PING", self.peer)
            self.stop_calls()
            self.close_transport()
            return
        if not self._heard_from_client:
            self._ping_sent = True
            self.grpc.ping(os.urandom(8))
            self._flush()
        self._heard_from_client = False
        delay = self.server.keepalive_timeout if self._ping_sent else self.server.keepalive_time
        self._keepalive = self.loop.call_later(delay, self._keepalive_due)


class GrpcServer:
    """A gRPC server for the given methods: ``bind``, then ``start`` (once the methods are added),
    then ``stop``."""

    def __init__(
        self,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        ssl_context: ssl.SSLContext | None = None,
        keepalive_time: float = KEEPALIVE_TIME,
        keepalive_timeout: float = KEEPALIVE_TIMEOUT,
        observer: CallObserver | None = None,
        limits: GrpcLimits | None = None,
    ) -> None:
        self.methods: dict[str, Method] = {}
        self.limits = limits or GrpcLimits()
        self.observe: CallObserver = observer or _unobserved
        self.max_message_bytes = max_message_bytes
        self.keepalive_time, self.keepalive_timeout = keepalive_time, keepalive_timeout
        self.connections: set[_Connection] = set()
        self.queued_output = 0  # responses queued over every connection, as of their last flush
        self._queued_by: dict[_Connection, int] = {}
        self.buffered_input = 0  # parts of messages over every connection, as of their last read
        self._buffered_by: dict[_Connection, int] = {}
        self.closing = False
        self._refusing = False  # at the connection limit, told once
        self._ssl = ssl_context
        self._server: asyncio.Server | None = None

    def admit(self, connection: _Connection) -> bool:
        """Whether a new connection may be served: the connections open stay within the limit, so
        that no client exhausts the process's file descriptors (which its logs, Raft and NATS need)."""
        if len(self.connections) >= self.limits.max_connections:
            if not self._refusing:
                log.warning("refusing gRPC connections: %d are open, the limit (grpc.max.connections)",
                            len(self.connections))
            self._refusing = True
            return False
        self._refusing = False
        self.connections.add(connection)
        return True

    def account(self, connection: _Connection, queued: int) -> None:
        """A connection's queued responses now; below the node's low mark again, every connection's
        waiting writers may go on."""
        before = self.queued_output
        self.queued_output += queued - self._queued_by.get(connection, 0)
        if queued:
            self._queued_by[connection] = queued
        else:
            self._queued_by.pop(connection, None)
        low = self.limits.node_output * 3 // 4
        if before > low >= self.queued_output:
            for other in list(self.connections):
                if other is not connection:
                    other.wake_writers()

    def account_input(self, connection: _Connection, buffered: int) -> int:
        """A connection's buffered parts of messages now; the node's total."""
        self.buffered_input += buffered - self._buffered_by.get(connection, 0)
        if buffered:
            self._buffered_by[connection] = buffered
        else:
            self._buffered_by.pop(connection, None)
        return self.buffered_input

    def add(self, methods: Iterable[Method]) -> None:
        for method in methods:
            self.methods[method.path] = method

    async def bind(self, host: str, port: int) -> int:
        """Bind ``host``:``port`` (0: a free port) without accepting yet; returns the port."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self), host, port, ssl=self._ssl, start_serving=False, reuse_address=True,
            ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT if self._ssl else None,
        )
        return self._server.sockets[0].getsockname()[1]

    async def start(self) -> None:
        assert self._server is not None, "bind first"
        await self._server.start_serving()

    async def stop(self, grace: float) -> None:
        """Refuse new connections and calls (GOAWAY), give running calls ``grace`` seconds to end,
        then end the rest (UNAVAILABLE) and close every connection."""
        if self._server is None:
            return
        self.closing = True
        self._server.close()
        for connection in list(self.connections):
            connection.go_away()
        running = self._call_tasks()
        if running:
            await asyncio.wait(running, timeout=grace)
        for connection in list(self.connections):
            connection.stop_calls()
        stopping = self._call_tasks()
        if stopping:
            await asyncio.wait(stopping, timeout=1.0)  # each sends its status as it ends
        for connection in list(self.connections):
            connection.close_transport()

    def _call_tasks(self) -> set[asyncio.Task[None]]:
        return {call.task for connection in self.connections for call in connection.calls.values()
                if call.task is not None}


def _unobserved(method: str, status: Status, seconds: float, ended: bool) -> None:
    pass


def _peer_name(address: Any) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        host, port = address[0], address[1]
        return f"ipv6:[{host}]:{port}" if ":" in str(host) else f"ipv4:{host}:{port}"
    return str(address or "")


def server_tls_context(cert_file: str, key_file: str, client_ca_file: str | None = None) -> ssl.SSLContext:
    """TLS for the server, offering only HTTP/2 (ALPN "h2"), as gRPC requires; with
    ``client_ca_file``, mutual TLS: a client without a certificate signed by that CA is refused
    in the handshake."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    context.set_alpn_protocols(["h2"])
    if client_ca_file:
        context.load_verify_locations(cafile=client_ca_file)
        context.verify_mode = ssl.CERT_REQUIRED
    return context
