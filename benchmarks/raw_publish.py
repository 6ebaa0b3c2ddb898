"""A PublishAsync client that costs the benchmark little: raw HTTP/2 frames on one socket.

@grpc/grpc-js spends 37-47 us of its own CPU per PublishAsync request and waits for each write, which
on this 2-core machine caps it near the servers' rate; grpc.aio is slower still. This client writes
each window's worth of requests in one socket write (as a Go or Java client under load does), so the
servers' cost shows. One call, ``window`` requests in flight, correlation ids as indices.

    python benchmarks/raw_publish.py HOST:PORT STREAM COUNT WINDOW SIZE ACK_POLICY [ids]

With ``ids``, each request carries a Nats-Msg-Id as bascule's client makes them (16 random bytes,
base64url), so the partition leader deduplicates: what idempotent publishing costs the server.

With BENCH_GO=1 it connects, says READY on stderr and waits for GO on stdin (node_client's protocol);
its result is one JSON line: messages, seconds, rate, p50_ms, p99_ms, client_cpu_us_per_msg, errors.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import struct
import sys
import time

import hpack

from bascule.h2grpc.messages import MessageReader, frame
from bascule.wire.dedup import MESSAGE_ID_HEADER
from bascule.wire.pb import api_pb2

_FRAME = struct.Struct(">BHBBI")
_U32 = struct.Struct(">I")
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, SETTINGS, PING, WINDOW_UPDATE = 0, 1, 4, 6, 8
WINDOW = (1 << 31) - 1
STREAM = 1


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return _FRAME.pack(len(payload) >> 16, len(payload) & 0xFFFF, kind, flags, stream) + payload


async def publish(address: str, stream: str, count: int, window: int, size: int, policy: str,
                  ids: bool = False) -> dict:
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(PREFACE + _frame(SETTINGS, 0, 0, struct.pack(">HI", 4, WINDOW))
                 + _frame(WINDOW_UPDATE, 0, 0, _U32.pack(WINDOW - 65535)))
    headers = hpack.Encoder().encode([
        (":method", "POST"), (":scheme", "http"), (":path", "/proto.API/PublishAsync"), (":authority", address),
        ("content-type", "application/grpc"), ("te", "trailers"),
    ])
    writer.write(_frame(HEADERS, 0x4, STREAM, headers))
    value = b"x" * size
    ack_policy = api_pb2.AckPolicy.Value(policy)
    requests = [frame([api_pb2.PublishRequest(
        stream=stream, value=value, ackPolicy=ack_policy, correlationId=str(i),
        headers={MESSAGE_ID_HEADER: secrets.token_urlsafe(16).encode()} if ids else {},
    ).SerializeToString()]) for i in range(count)]
    sent_at = [0.0] * count
    latencies: list[float] = []
    errors = 0
    send_window = 65535  # the server's, raised by its SETTINGS and WINDOW_UPDATEs
    connection_window = 65535
    max_frame = 16384
    next_request = 0
    done = asyncio.get_running_loop().create_future()
    messages = MessageReader(1 << 24)
    buffer = bytearray()
    if os.environ.get("BENCH_GO"):
        sys.stderr.write("READY\n")
        sys.stderr.flush()
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    started = time.perf_counter()
    cpu_started = time.process_time()

    def send_more() -> None:
        nonlocal next_request, send_window, connection_window
        out = []
        while next_request < count and next_request - len(latencies) - errors < window:
            data = requests[next_request]
            if len(data) > min(send_window, connection_window, max_frame):
                break
            out.append(_frame(DATA, 0, STREAM, data))
            send_window -= len(data)
            connection_window -= len(data)
            sent_at[next_request] = time.perf_counter()
            next_request += 1
        if out:
            writer.write(b"".join(out))

    async def read() -> None:
        nonlocal send_window, connection_window, max_frame, errors
        received = 0
        while not done.done():
            chunk = await reader.read(1 << 20)
            if not chunk:
                raise ConnectionError("the server closed the connection")
            buffer.extend(chunk)
            position = 0
            while len(buffer) - position >= 9:
                high, low, kind, flags, stream_id = _FRAME.unpack_from(buffer, position)
                length = high << 16 | low
                if len(buffer) - position - 9 < length:
                    break
                payload = bytes(buffer[position + 9:position + 9 + length])
                position += 9 + length
                if kind == DATA:
                    received += length
                    now = time.perf_counter()
                    for message in messages.feed(payload):
                        response = api_pb2.PublishResponse.FromString(message)
                        if response.HasField("asyncError"):
                            errors += 1
                        else:
                            latencies.append(now - sent_at[int(response.correlationId)])
                elif kind == WINDOW_UPDATE:
                    increment = _U32.unpack(payload)[0]
                    if stream_id == 0:
                        connection_window += increment
                    else:
                        send_window += increment
                elif kind == SETTINGS and not flags & 1:
                    for at in range(0, length, 6):
                        setting, setting_value = struct.unpack_from(">HI", payload, at)
                        if setting == 4:
                            send_window += setting_value - 65535
                        elif setting == 5:
                            max_frame = setting_value
                    writer.write(_frame(SETTINGS, 1, 0, b""))
                elif kind == PING and not flags & 1:
                    writer.write(_frame(PING, 1, 0, payload))
                elif kind == HEADERS and flags & 1:
                    raise ConnectionError(f"the call ended early: {hpack.Decoder().decode(payload)}")
            del buffer[:position]
            if received > 1 << 20:
                writer.write(_frame(WINDOW_UPDATE, 0, 0, _U32.pack(received))
                             + _frame(WINDOW_UPDATE, 0, STREAM, _U32.pack(received)))
                received = 0
            if len(latencies) + errors >= count:
                done.set_result(None)
                return
            send_more()

    send_more()
    await read()
    seconds = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    writer.close()
    latencies.sort()
    acked = len(latencies)

    def percentile(fraction: float) -> float:
        return 1000 * latencies[min(acked - 1, int(fraction * acked))] if acked else 0.0

    return {"messages": acked, "errors": errors, "seconds": seconds, "rate": acked / seconds,
            "p50_ms": percentile(0.5), "p99_ms": percentile(0.99), "client_cpu_us_per_msg": 1e6 * cpu / count}


def main() -> None:
    address, stream, count, window, size, policy = sys.argv[1:7]
    result = asyncio.run(publish(address, stream, int(count), int(window), int(size), policy, sys.argv[7:] == ["ids"]))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
