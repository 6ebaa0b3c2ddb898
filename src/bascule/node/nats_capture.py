"""A NATS connection for capture subscriptions only, parsing MSG frames in bulk.

nats-py spends most of a captured message's cost on its per-message machinery (a
Msg object, a queue, a task wake-up, a callback). Captured messages need none of
it: this connection parses whole socket reads at once and hands each subscription
one list of (subject, reply, payload) per read. It speaks just enough of the NATS
client protocol for that: CONNECT, SUB/UNSUB, PING/PONG, MSG and HMSG, and it
reconnects and resubscribes on its own.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
from typing import Callable
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

Delivery = tuple[str, str, bytes]  # subject, reply, payload
BatchHandler = Callable[[list[Delivery]], None]

RECONNECT_WAIT = 0.2
CONNECT_TIMEOUT = 5.0
_CRLF = b"\r\n"


class ProtocolError(Exception):
    pass


class CaptureConnection(asyncio.Protocol):
    def __init__(self, servers: list[str], name: str) -> None:
        self.servers = [urlsplit(s if "://" in s else f"nats://{s}") for s in servers]
        self.name = name
        self._handlers: dict[int, BatchHandler] = {}
        self._subscriptions: dict[int, tuple[str, str]] = {}
        self._next_sid = 0
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
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
        self._buffer.clear()
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
        self._buffer += data
        try:
            batches = self._parse()
        except ProtocolError as exc:
            log.error("capture connection: %s; reconnecting", exc)
            if self._transport is not None:
                self._transport.abort()
            return
        for sid, deliveries in batches.items():
            handler = self._handlers.get(sid)
            if handler is not None:
                try:
                    handler(deliveries)
                except Exception:
                    log.exception("capture handler failed for %d messages", len(deliveries))

    # ---- parsing ---------------------------------------------------------------------------

    def _parse(self) -> dict[int, list[Delivery]]:
        buffer = self._buffer
        batches: dict[int, list[Delivery]] = {}
        position = 0
        end = len(buffer)
        while position < end:
            line_end = buffer.find(_CRLF, position)
            if line_end < 0:
                break
            op = buffer[position:position + 4]
            if op == b"MSG " or op == b"HMSG":
                consumed = self._parse_message(buffer, position, line_end, end, batches)
                if consumed < 0:
                    break
                position = consumed
                continue
            line = bytes(buffer[position:line_end])
            position = line_end + 2
            self._control(line)
        del buffer[:position]
        return batches

    def _parse_message(
        self, buffer: bytearray, start: int, line_end: int, end: int, batches: dict[int, list[Delivery]]
    ) -> int:
        """Position after the message, or -1 when its payload has not fully arrived."""
        fields = bytes(buffer[start:line_end]).split()
        try:
            if fields[0] == b"MSG":
                header_size = 0
                total = int(fields[-1])
            else:
                header_size, total = int(fields[-2]), int(fields[-1])
            sid = int(fields[2])
            subject = fields[1].decode()
            with_reply = len(fields) == (5 if fields[0] == b"MSG" else 6)
            reply = fields[3].decode() if with_reply else ""
        except (IndexError, ValueError, UnicodeDecodeError) as exc:
            raise ProtocolError(f"bad message line {bytes(buffer[start:line_end])[:200]!r}") from exc
        payload_start = line_end + 2
        payload_end = payload_start + total
        if payload_end + 2 > end:
            return -1
        if buffer[payload_end:payload_end + 2] != _CRLF:
            raise ProtocolError("message payload not followed by CRLF")
        payload = bytes(buffer[payload_start + header_size:payload_end])
        batches.setdefault(sid, []).append((subject, reply, payload))
        return payload_end + 2

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
