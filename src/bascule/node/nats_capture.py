"""A NATS connection for capture subscriptions only, parsing MSG frames in bulk.

nats-py spends most of a captured message's cost on its per-message machinery (a
Msg object, a queue, a task wake-up, a callback). Captured messages need none of
it: this connection parses whole socket reads at once and hands each subscription
one list of (subject, reply, payload) per read, and writes the acks of a whole batch
at once. It speaks just enough of the NATS client protocol for that: CONNECT,
SUB/UNSUB, PUB, PING/PONG, MSG and HMSG, and it reconnects and resubscribes on its own.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import re
from typing import Callable
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

Delivery = tuple[str, str, bytes]  # subject, reply, payload
BatchHandler = Callable[[list[Delivery]], None]

RECONNECT_WAIT = 0.2
CONNECT_TIMEOUT = 5.0
_CRLF = b"\r\n"
# MSG <subject> <sid> [reply-to] <#bytes> and HMSG <subject> <sid> [reply-to] <#header bytes> <#total bytes>
_MSG_LINE = re.compile(rb"MSG ([^ \r\n]+) (\d+) (?:([^ \r\n]+) )?(\d+)")
_HMSG_LINE = re.compile(rb"HMSG ([^ \r\n]+) (\d+) (?:([^ \r\n]+) )?(\d+) (\d+)")
Frame = tuple[int, str, str, int, int]  # sid, subject, reply, header bytes, total bytes
FRAME_CACHE_SIZE = 4096


class ProtocolError(Exception):
    pass


def _subject(raw: bytes) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"subject {raw[:100]!r} is not UTF-8") from exc


class CaptureConnection(asyncio.Protocol):
    def __init__(self, servers: list[str], name: str) -> None:
        self.servers = [urlsplit(s if "://" in s else f"nats://{s}") for s in servers]
        self.name = name
        self._handlers: dict[int, BatchHandler] = {}
        self._subscriptions: dict[int, tuple[str, str]] = {}
        self._next_sid = 0
        self._transport: asyncio.Transport | None = None
        self._chunks: list[bytes] = []  # unparsed reads
        self._buffered = 0  # their total size
        self._needed = 0  # what an unfinished frame needs before parsing can go on (0: unknown)
        self._frames: dict[bytes, Frame] = {}
        self._greeted = False  # CONNECT sent on this connection (servers repeat INFO later)
        self._pongs: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closing = False
        self._reconnecting: asyncio.Task | None = None

    async def connect(self) -> None:
        await self._dial()

    async def _dial(self) -> None:
        loop = asyncio.get_running_loop()
        errors = []
        for url in self.servers:
            try:
                connected = self._expect_pong()
                await asyncio.wait_for(
                    loop.create_connection(lambda: self, url.hostname, url.port or 4222), CONNECT_TIMEOUT
                )
                await asyncio.wait_for(connected, CONNECT_TIMEOUT)
                return
            except (OSError, asyncio.TimeoutError) as exc:
                if connected in self._pongs:
                    self._pongs.remove(connected)
                errors.append(f"{url.geturl()}: {exc!r}")
        raise ConnectionError("capture connection failed: " + "; ".join(errors))

    # ---- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._chunks, self._buffered, self._needed = [], 0, 0
        self._greeted = False

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        while self._pongs:
            waiter = self._pongs.popleft()
            if not waiter.done():
                waiter.set_exception(ConnectionError("NATS connection lost"))
        if not self._closing:
            log.warning("capture connection to NATS lost (%r); reconnecting", exc)
            self._reconnecting = asyncio.get_running_loop().create_task(self._reconnect())

    def data_received(self, data: bytes) -> None:
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
            self._chunks, self._buffered, self._needed = [], 0, 0
            if self._transport is not None:
                self._transport.abort()
            return
        rest = buffer[consumed:]
        self._chunks = [rest] if rest else []
        self._buffered = len(rest)
        for sid, deliveries in batches.items():
            handler = self._handlers.get(sid)
            if handler is not None:
                try:
                    handler(deliveries)
                except Exception:
                    log.exception("capture handler failed for %d messages", len(deliveries))

    # ---- parsing ---------------------------------------------------------------------------

    def _parse(self, buffer: bytes) -> tuple[dict[int, list[Delivery]], int, int]:
        """(deliveries by sid, bytes consumed, bytes the unfinished frame needs from there, 0 if unknown)."""
        batches: dict[int, list[Delivery]] = {}
        position = 0
        end = len(buffer)
        find, frames = buffer.find, self._frames
        while position < end:
            line_end = find(_CRLF, position)
            if line_end < 0:
                return batches, position, 0
            line = buffer[position:line_end]
            frame = frames.get(line)
            if frame is None:
                if not line.startswith((b"MSG", b"HMSG")):
                    position = line_end + 2
                    self._control(line)
                    continue
                frame = self._frame(line)
            sid, subject, reply, header_size, total = frame
            payload_start = line_end + 2
            payload_end = payload_start + total
            if payload_end + 2 > end:
                return batches, position, payload_end + 2 - position
            if not buffer.startswith(_CRLF, payload_end):
                raise ProtocolError("message payload not followed by CRLF")
            delivery = (subject, reply, buffer[payload_start + header_size:payload_end])
            batch = batches.get(sid)
            if batch is None:
                batches[sid] = [delivery]
            else:
                batch.append(delivery)
            position = payload_end + 2
        return batches, position, 0

    def _frame(self, line: bytes) -> Frame:
        """A MSG/HMSG line parsed, and remembered: a stream's messages repeat a few lines."""
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
        frame = (int(sid), _subject(subject), _subject(reply) if reply else "", header_size, total)
        if len(self._frames) >= FRAME_CACHE_SIZE:
            self._frames.clear()
        self._frames[line] = frame
        return frame

    def _control(self, line: bytes) -> None:
        if line.startswith(b"INFO"):
            if not self._greeted:
                self._greeted = True
                self._send_connect()
        elif line == b"PING":
            self._write(b"PONG\r\n")
        elif line == b"PONG":
            if self._pongs:
                waiter = self._pongs.popleft()
                if not waiter.done():
                    waiter.set_result(None)
        elif line.startswith(b"-ERR"):
            log.error("NATS server error on the capture connection: %s", line.decode(errors="replace"))

    def _send_connect(self) -> None:
        url = self.servers[0]
        options = {
            "verbose": False, "pedantic": False, "headers": True, "no_responders": True,
            "name": self.name, "lang": "python-bascule", "version": "1", "protocol": 1,
        }
        if url.username:
            options.update(user=url.username, **{"pass": url.password or ""})
        lines = [b"CONNECT " + json.dumps(options).encode() + _CRLF]
        lines += [self._sub_line(sid, subject, queue) for sid, (subject, queue) in self._subscriptions.items()]
        lines.append(b"PING\r\n")
        self._write(b"".join(lines))

    # ---- subscriptions ---------------------------------------------------------------------

    def subscribe(self, subject: str, queue: str, handler: BatchHandler) -> int:
        self._next_sid += 1
        sid = self._next_sid
        self._subscriptions[sid] = (subject, queue)
        self._handlers[sid] = handler
        self._write(self._sub_line(sid, subject, queue))
        return sid

    def unsubscribe(self, sid: int) -> None:
        if self._subscriptions.pop(sid, None) is not None:
            self._handlers.pop(sid, None)
            self._write(f"UNSUB {sid}\r\n".encode())

    def publish_many(self, messages: list[tuple[str, bytes]]) -> None:
        """Publish each (subject, payload) in one write. Subjects must be valid as they are (no
        whitespace). While the connection is down they are dropped: this carries acks, whose
        publishers time out and retry."""
        self._write(b"".join([b"PUB %s %d\r\n%s\r\n" % (subject.encode(), len(payload), payload)
                              for subject, payload in messages]))

    @staticmethod
    def _sub_line(sid: int, subject: str, queue: str) -> bytes:
        return (f"SUB {subject} {queue} {sid}\r\n" if queue else f"SUB {subject} {sid}\r\n").encode()

    def _write(self, data: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)
        # Otherwise the subscription is sent with the next CONNECT.

    def _expect_pong(self) -> asyncio.Future[None]:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pongs.append(waiter)
        return waiter

    async def flush(self, timeout: float = CONNECT_TIMEOUT) -> None:
        """Wait until the server has processed everything sent so far (SUBs included)."""
        waiter = self._expect_pong()
        self._write(b"PING\r\n")
        await asyncio.wait_for(waiter, timeout)

    async def _reconnect(self) -> None:
        while not self._closing:
            try:
                await self._dial()
                log.info("capture connection to NATS re-established")
                return
            except ConnectionError as exc:
                log.debug("%s", exc)
                await asyncio.sleep(RECONNECT_WAIT)

    async def close(self) -> None:
        self._closing = True
        if self._reconnecting is not None:
            self._reconnecting.cancel()
        if self._transport is not None:
            self._transport.close()
