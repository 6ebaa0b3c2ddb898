"""A NATS connection for capture subscriptions only, parsing MSG frames in bulk.

nats-py spends most of a captured message's cost on its per-message machinery (a
Msg object, a queue, a task wake-up, a callback). Captured messages need none of
it: this connection parses whole socket reads at once and hands each subscription
one list of deliveries per read, (subject, reply, payload) and the message id when
its NATS headers carry one, and writes the acks of a whole batch at once. It speaks
just enough of the NATS client protocol for that: CONNECT, SUB/UNSUB, PUB, PING/PONG,
MSG and HMSG.

It keeps itself up: one socket at a time (a second one subscribed alongside would capture
every message twice), a PING whenever the socket has been silent for a while (a half-open
connection never reports its loss, it only goes quiet), and a redial with backoff, forever,
that subscribes again on the new socket.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import random
import re
from collections.abc import Callable
from urllib.parse import SplitResult, urlsplit

from bascule.natsio.auth import NatsAuth
from bascule.wire.capture import Delivery
from bascule.wire.dedup import MESSAGE_ID_HEADER
from bascule.wire.names import is_protocol_token

try:
    import bascule.natsio._frames as _frames
except ImportError:  # built without a C compiler: the Python loop stands in
    _frames = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

BatchHandler = Callable[[list[Delivery]], None]

CONNECT_TIMEOUT = 5.0
PING_INTERVAL = 2.0  # seconds of silence after which the connection is PINGed
MAX_PINGS_OUT = 2  # PINGs left unanswered before the connection counts as dead
RECONNECT_WAIT_MIN = 0.05
RECONNECT_WAIT_MAX = 2.0
# nats-server's default max_control_line: it answers a longer line by closing the connection, and
# a SUB resent on every reconnect would then keep the connection from ever coming back.
MAX_CONTROL_LINE = 4096
_CRLF = b"\r\n"
_PING = b"PING\r\n"
# MSG <subject> <sid> [reply-to] <#bytes> and HMSG <subject> <sid> [reply-to] <#header bytes> <#total bytes>
_MSG_LINE = re.compile(rb"MSG ([^ \r\n]+) (\d+) (?:([^ \r\n]+) )?(\d+)")
_HMSG_LINE = re.compile(rb"HMSG ([^ \r\n]+) (\d+) (?:([^ \r\n]+) )?(\d+) (\d+)")
Frame = tuple[int, str, str, int, int]  # sid, subject, reply, header bytes, total bytes
FRAME_CACHE_SIZE = 4096
MAX_FRAME_BYTES = 2**31 - 1  # nats-server holds max_payload in an int32
# A header block is its status line, starting NATS/1.0, then "Name: value" lines, each ending in
# CRLF, then CRLF. The id's line is found as JetStream finds it: a CRLF, the exact name (case
# counts), a colon.
_HEADER_STATUS = b"NATS/1.0"
_ID_LINE = b"\r\n" + MESSAGE_ID_HEADER.encode() + b":"
_SMALLEST_ID_BLOCK = len(_HEADER_STATUS) + len(_ID_LINE) + 1 + len(_CRLF)  # the status, a one-byte id's line


class ProtocolError(Exception):
    pass


def _subject(raw: bytes) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"subject {raw[:100]!r} is not UTF-8") from exc


def _check_name(kind: str, name: str) -> None:
    """Refuse a name that cannot go verbatim into a protocol line (callers validate names too;
    this connection does not rely on them)."""
    if not name:
        raise ValueError(f"empty {kind}")
    if not is_protocol_token(name):
        raise ValueError(f"{kind} {name[:100]!r} contains whitespace or control characters")


def _check_length(line: bytes, subject: str, queue: str = "") -> bytes:
    if len(line) > MAX_CONTROL_LINE:
        names = f"subject {subject[:100]!r}" + (f" with queue group {queue[:100]!r}" if queue else "")
        raise ValueError(f"{names} too long: {len(line)} bytes on a protocol line, NATS allows {MAX_CONTROL_LINE}")
    return line


def _sub_line(sid: int, subject: str, queue: str) -> bytes:
    """The SUB line for a subject and a queue group ("" for none); ValueError for names it cannot carry."""
    _check_name("subject", subject)
    if queue:
        _check_name("queue group", queue)
    line = (f"SUB {subject} {queue} {sid}\r\n" if queue else f"SUB {subject} {sid}\r\n").encode()
    return _check_length(line, subject, queue)


def _pub_line(subject: str, size: int) -> bytes:
    _check_name("subject", subject)
    return _check_length(b"PUB %s %d\r\n" % (subject.encode(), size), subject)


def header_message_id(buffer: bytes, start: int, end: int) -> bytes | None:
    """The Nats-Msg-Id the NATS header block ``buffer[start:end]`` carries (its first, without the
    spaces and tabs around it), or None: none, an empty one, or a block that is not one (no
    NATS/1.0 status, the id's line not ended by CRLF). Other lines are not read, garbage included:
    whatever the block holds, its message is delivered, at worst without an id. In C too, in
    parse_frames."""
    if end - start < _SMALLEST_ID_BLOCK:  # a bare "NATS/1.0\r\n\r\n", say
        return None
    name = buffer.find(_ID_LINE, start, end)  # never inside the status: it holds no CRLF
    if name < 0 or not buffer.startswith(_HEADER_STATUS, start):
        return None
    value_end = buffer.find(_CRLF, name + len(_ID_LINE), end)
    if value_end < 0:
        return None
    return buffer[name + len(_ID_LINE):value_end].strip(b" \t") or None


STOPPED = -1  # parse_frames' line_end when it reached the end of the buffer or an unfinished frame
NO_CRLF_AFTER_PAYLOAD = -2


def parse_frames_python(
    buffer: bytes, position: int, frames: dict[bytes, Frame], batches: dict[int, list[Delivery]],
) -> tuple[int, int, int]:
    """Take the frames from ``position`` whose MSG/HMSG line is in ``frames`` (the cache of parsed
    lines) into ``batches``, until the buffer ends, a frame is unfinished, or a line is not in the
    cache. Returns (position reached, bytes the unfinished frame there needs, 0 if unknown,
    line_end): line_end is where the line at ``position`` ends when it is not in the cache (the
    caller parses it), else STOPPED or NO_CRLF_AFTER_PAYLOAD. In C when built."""
    end = len(buffer)
    find = buffer.find
    while position < end:
        line_end = find(_CRLF, position)
        if line_end < 0:
            break
        frame = frames.get(buffer[position:line_end])
        if frame is None:
            return position, 0, line_end
        sid, subject, reply, header_size, total = frame
        payload_start = line_end + 2
        payload_end = payload_start + total
        if payload_end + 2 > end:
            return position, payload_end + 2 - position, STOPPED
        if not buffer.startswith(_CRLF, payload_end):
            return position, 0, NO_CRLF_AFTER_PAYLOAD
        payload = buffer[payload_start + header_size:payload_end]
        message_id = header_message_id(buffer, payload_start, payload_start + header_size) if header_size else None
        delivery: Delivery = (subject, reply, payload, message_id) if message_id else (subject, reply, payload)
        batch = batches.get(sid)
        if batch is None:
            batches[sid] = [delivery]
        else:
            batch.append(delivery)
        position = payload_end + 2
    return position, 0, STOPPED


parse_frames = parse_frames_python if _frames is None else _frames.parse_frames


class _Link(asyncio.Protocol):
    """One socket to a NATS server and what was read from it but not parsed yet.

    A link serves one socket only: a reconnect starts a new one, so nothing of the old socket
    (a half-read frame, a late read, an awaited PONG) can reach the next.
    """

    def __init__(self, owner: CaptureConnection, url: SplitResult, loop: asyncio.AbstractEventLoop) -> None:
        self._owner = owner
        self.url = url
        self._loop = loop
        self._transport: asyncio.Transport | None = None
        self._chunks: list[bytes] = []  # unparsed reads
        self._buffered = 0  # their total size
        self._needed = 0  # what an unfinished frame needs before parsing can go on (0: unknown)
        self._frames: dict[bytes, Frame] = {}
        self.greeted = False  # CONNECT sent (servers repeat INFO later)
        # Waiters for the PONGs to come, in the order of their PINGs; None for a health check's.
        self._pongs: collections.deque[asyncio.Future[None] | None] = collections.deque()
        self.ready: asyncio.Future[None] = loop.create_future()  # the PONG that ends the handshake
        self.lost: asyncio.Future[Exception | None] = loop.create_future()
        self.heard = False  # data arrived since the health check last looked

    @property
    def live(self) -> bool:
        """The handshake was answered and the socket is still open."""
        return self.ready.done() and not self.ready.cancelled() and self._open()

    def _open(self) -> bool:
        return self._transport is not None and not self._transport.is_closing()

    def write(self, data: bytes) -> None:
        if self._open():
            self._transport.write(data)  # type: ignore[union-attr]

    def ping(self) -> asyncio.Future[None]:
        """A future that completes with the server's PONG to this PING."""
        if not self.live:
            raise ConnectionError("NATS connection not up")
        waiter = self._loop.create_future()
        self._pongs.append(waiter)
        self.write(_PING)
        return waiter

    def ping_for_health(self) -> None:
        self._pongs.append(None)
        self.write(_PING)

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    # ---- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        for waiter in (self.ready, *self._pongs):
            if waiter is not None and not waiter.done():
                waiter.set_exception(ConnectionError("NATS connection lost"))
        self._pongs.clear()
        self.lost.set_result(exc)

    def data_received(self, data: bytes) -> None:
        self.heard = True
        # Reads are kept as they come until a frame can be completed: a large message spread
        # over many reads is joined once, not once per read.
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered < self._needed:
            return
        buffer = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        try:
            batches, consumed, self._needed = self._parse(buffer)
        except ProtocolError as exc:
            log.error("capture connection: %s; reconnecting", exc)
            self.abort()
            return
        rest = buffer[consumed:]
        self._chunks = [rest] if rest else []
        self._buffered = len(rest)
        if batches:
            self._owner._deliver(self, batches)

    def _greet(self, info_json: bytes) -> None:
        """Answer the server's first INFO: TLS first if either side asks for it, then CONNECT."""
        try:
            info = json.loads(info_json)
            nonce = info.get("nonce")
            tls = self._owner.auth.wants_tls or info.get("tls_required", False)
        except (ValueError, AttributeError) as exc:
            log.error("capture connection: unreadable INFO from the server (%r); reconnecting", exc)
            self.abort()
            return
        if not tls:
            self._send_greeting(nonce)
            return
        # The handshake is the dial's to wait for: its failure ends the dial through ``ready``.
        upgrade = self._loop.create_task(self._start_tls(nonce))
        upgrade.add_done_callback(lambda task: task.cancelled() or task.exception())

    async def _start_tls(self, nonce: str | None) -> None:
        try:
            context = self._owner.auth.ssl_context()
            assert self._transport is not None
            self._transport = await self._loop.start_tls(
                self._transport, self, context, server_hostname=self.url.hostname
            )
            self._send_greeting(nonce)
        except Exception as exc:
            log.error("capture connection: TLS with NATS %s failed: %r", self.url.hostname, exc)
            if not self.ready.done():
                self.ready.set_exception(ConnectionError(f"TLS handshake failed: {exc!r}"))
            self.abort()

    def _send_greeting(self, nonce: str | None) -> None:
        self._pongs.append(self.ready)
        try:
            self.write(self._owner._greeting(self.url, nonce))
        except ValueError as exc:  # credentials that cannot be used (NatsAuthError)
            self.ready.set_exception(ConnectionError(f"NATS credentials: {exc}"))
            self.abort()

    # ---- parsing ---------------------------------------------------------------------------

    def _parse(self, buffer: bytes) -> tuple[dict[int, list[Delivery]], int, int]:
        """(deliveries by sid, bytes consumed, bytes the unfinished frame needs from there, 0 if unknown)."""
        batches: dict[int, list[Delivery]] = {}
        position = 0
        while True:
            position, needed, line_end = parse_frames(buffer, position, self._frames, batches)
            if line_end == STOPPED:
                return batches, position, needed
            if line_end == NO_CRLF_AFTER_PAYLOAD:
                raise ProtocolError("message payload not followed by CRLF")
            line = buffer[position:line_end]
            if line.startswith((b"MSG", b"HMSG")):
                self._remember_frame(line)  # parse_frames takes the frame on the next call
            else:
                position = line_end + 2
                self._control(line)

    def _remember_frame(self, line: bytes) -> None:
        """Parse a MSG/HMSG line into the cache of frames: a stream's messages repeat a few lines."""
        if (match := _MSG_LINE.fullmatch(line)) is not None:
            subject, sid, reply, size = match.groups()
            header_size, total = 0, int(size)
        elif (match := _HMSG_LINE.fullmatch(line)) is not None:
            subject, sid, reply, header_bytes, size = match.groups()
            header_size, total = int(header_bytes), int(size)
            if header_size > total:
                raise ProtocolError(f"header block of {header_size} bytes in a {total}-byte message")
        else:
            raise ProtocolError(f"bad message line {line[:200]!r}")
        if total > MAX_FRAME_BYTES:
            raise ProtocolError(f"a message of {total} bytes, more than a NATS server sends")
        frame = (int(sid), _subject(subject), _subject(reply) if reply else "", header_size, total)
        if len(self._frames) >= FRAME_CACHE_SIZE:
            self._frames.clear()
        self._frames[line] = frame

    def _control(self, line: bytes) -> None:
        if line.startswith(b"INFO"):
            if not self.greeted:
                self.greeted = True
                self._greet(line[4:])
        elif line == b"PING":
            self.write(b"PONG\r\n")
        elif line == b"PONG":
            waiter = self._pongs.popleft() if self._pongs else None
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        elif line.startswith(b"-ERR"):
            log.error("NATS server error on the capture connection: %s", line.decode(errors="replace"))


class CaptureConnection:
    """Capture subscriptions on one NATS connection, kept up until close().

    Only connect() and then the one task that keeps the connection up ever dial, and never while
    another dial or socket is still in use: every message is captured once, on one socket.
    """

    def __init__(
        self,
        servers: list[str],
        name: str,
        *,
        ping_interval: float = PING_INTERVAL,
        max_pings_out: int = MAX_PINGS_OUT,
        auth: NatsAuth | None = None,
    ) -> None:
        self.servers = [urlsplit(s if "://" in s else f"nats://{s}") for s in servers]
        self.name = name
        self.auth = auth or NatsAuth()
        self.ping_interval = ping_interval
        self.max_pings_out = max_pings_out
        self._handlers: dict[int, BatchHandler] = {}
        self._subscriptions: dict[int, tuple[str, str]] = {}
        self._next_sid = 0
        self._link: _Link | None = None  # the socket being dialled or in use
        self._went_live = asyncio.Condition()
        self._keeper: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        """Dial the servers in turn until one answers (ConnectionError if none does), then keep
        the connection up, in the background, until close()."""
        link = await self._dial()
        self._keeper = asyncio.create_task(self._keep_connected(link))

    async def close(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
            await asyncio.wait([self._keeper])
        if self._link is not None:
            self._link.close()
            self._link = None

    # ---- dialling and health ---------------------------------------------------------------

    async def _dial(self) -> _Link:
        errors = []
        for url in self.servers:
            try:
                return await self._dial_one(url)
            except OSError as exc:  # TimeoutError, and ConnectionError for a loss mid-handshake, included
                errors.append(f"{url.hostname}:{url.port or 4222}: {exc!r}")
        raise ConnectionError("capture connection failed: " + "; ".join(errors))

    async def _dial_one(self, url: SplitResult) -> _Link:
        loop = asyncio.get_running_loop()
        # Current from the start: a subscription made during the handshake must reach this socket.
        link = self._link = _Link(self, url, loop)
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                # No host in the URL dials the loopback (getaddrinfo takes None); typeshed wants a str.
                await loop.create_connection(lambda: link, url.hostname, url.port or 4222)  # type: ignore[arg-type]
                await link.ready
        except BaseException:
            self._link = None
            link.ready.cancel()  # a loss after giving up is no one's error
            link.abort()
            raise
        async with self._went_live:
            self._went_live.notify_all()
        return link

    async def _keep_connected(self, link: _Link) -> None:
        while True:
            reason = await self._watch(link)
            self._link = None
            log.warning("capture connection to NATS %s:%s lost (%s); reconnecting",
                        link.url.hostname, link.url.port, reason)
            link = await self._redial()

    async def _watch(self, link: _Link) -> str:
        """Until the link is gone; why. A link silent through max_pings_out PINGs is half-open or
        hung, and is closed."""
        unanswered = 0
        while True:
            await asyncio.wait([link.lost], timeout=self.ping_interval)
            if link.lost.done():
                error = link.lost.result()
                return repr(error) if error else "connection closed"
            if link.heard:
                link.heard = False
                unanswered = 0
            elif unanswered < self.max_pings_out:
                link.ping_for_health()
                unanswered += 1
            else:
                link.abort()
                return f"silent for {(unanswered + 1) * self.ping_interval:.1f} s, {unanswered} PINGs unanswered"

    async def _redial(self) -> _Link:
        """Until a server answers. The waits between attempts double, and are jittered so that
        nodes cut off together do not all dial back at the same instant."""
        loop = asyncio.get_running_loop()
        outage_start = loop.time()
        wait = RECONNECT_WAIT_MIN
        attempts = 1
        while True:
            try:
                link = await self._dial()
                log.info("capture connection to NATS re-established after %.1f s (%d attempts)",
                         loop.time() - outage_start, attempts)
                return link
            except ConnectionError as exc:
                log.debug("%s", exc)
            await asyncio.sleep(random.uniform(wait / 2, wait))
            wait = min(wait * 2, RECONNECT_WAIT_MAX)
            attempts += 1

    def _greeting(self, url: SplitResult, nonce: str | None) -> bytes:
        """CONNECT, every subscription, and the PING whose PONG says the server has them all."""
        options = {
            "verbose": False, "pedantic": False, "headers": True, "no_responders": True,
            "name": self.name, "lang": "python-bascule", "version": "1", "protocol": 1,
            "tls_required": self.auth.wants_tls, **self.auth.connect_fields(nonce),
        }
        if url.username and url.password is None:  # nats://token@host, as nats-py reads it
            options["auth_token"] = url.username
        elif url.username:
            options.update(user=url.username, **{"pass": url.password})
        lines = [b"CONNECT " + json.dumps(options).encode() + _CRLF]
        lines += [_sub_line(sid, subject, queue) for sid, (subject, queue) in self._subscriptions.items()]
        lines.append(_PING)
        return b"".join(lines)

    def _deliver(self, link: _Link, batches: dict[int, list[Delivery]]) -> None:
        if link is not self._link:
            return  # a socket given up on: the next one has its subscriptions, and both could deliver a message
        for sid, deliveries in batches.items():
            handler = self._handlers.get(sid)
            if handler is not None:
                try:
                    handler(deliveries)
                except Exception:
                    log.exception("capture handler failed for %d messages", len(deliveries))

    # ---- subscriptions and publishing ------------------------------------------------------

    def subscribe(self, subject: str, queue: str, handler: BatchHandler) -> int:
        """Deliver the messages on subject (to one member of queue, unless it is "") to handler,
        one list per read. ValueError, and nothing subscribed, for an empty subject or a subject or
        queue with whitespace or control characters in it, or too long for a protocol line."""
        sid = self._next_sid + 1
        line = _sub_line(sid, subject, queue)
        self._next_sid = sid
        self._subscriptions[sid] = (subject, queue)
        self._handlers[sid] = handler
        self._write(line)
        return sid

    def unsubscribe(self, sid: int) -> None:
        if self._subscriptions.pop(sid, None) is not None:
            self._handlers.pop(sid, None)
            self._write(f"UNSUB {sid}\r\n".encode())

    def publish_many(self, messages: list[tuple[str, bytes]]) -> None:
        """Publish each (subject, payload) in one write. While the connection is down they are
        dropped: this carries acks, whose publishers time out and retry. So is, with a warning, a
        message whose subject cannot go on a PUB line, rather than failing the others' acks."""
        parts: list[bytes] = []
        for subject, payload in messages:
            try:
                parts += (_pub_line(subject, len(payload)), payload, _CRLF)
            except ValueError as exc:
                log.warning("capture connection: not publishing: %s", exc)
        self._write(b"".join(parts))

    def _write(self, data: bytes) -> None:
        # Before the CONNECT, nothing: the CONNECT carries every subscription.
        if self._link is not None and self._link.greeted:
            self._link.write(data)

    async def flush(self, timeout: float = CONNECT_TIMEOUT) -> None:
        """Wait until the server has processed everything sent so far (SUBs included). While the
        connection is down, that is until it is back: its CONNECT carries every SUB."""
        async with asyncio.timeout(timeout):
            while True:
                async with self._went_live:
                    await self._went_live.wait_for(lambda: self._link is not None and self._link.live)
                try:
                    await self._link.ping()  # type: ignore[union-attr]
                    return
                except ConnectionError:
                    pass  # lost meanwhile: wait for the next socket
