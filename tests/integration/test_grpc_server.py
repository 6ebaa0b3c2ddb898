"""bascule's own gRPC server (bascule.h2grpc) driven by real clients over loopback: grpcio's asyncio
client for what a well-behaved client does, raw sockets and python-hyper's h2 for what a hostile or
unusual one does. The servers serve test servicers written here, for the ``grpc.health.v1.Health``
and ``proto.API`` descriptors; the last test checks the health service through a real node."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import os
import re
import struct
import sys
import time
from collections.abc import Iterator

import grpc
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import hpack
import pytest
from conftest import issue, running_node
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from bascule.client import Client, ClientTls
from bascule.h2grpc import GrpcLimits, GrpcServer, server_tls_context, service_methods
from bascule.spark.connections import connect
from bascule.spark.options import parse_read_options
from bascule.wire.pb import api_pb2, api_pb2_grpc, health_pb2, health_pb2_grpc

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

HEALTH = health_pb2.DESCRIPTOR.services_by_name["Health"]
API = api_pb2.DESCRIPTOR.services_by_name["API"]
SERVING = health_pb2.HealthCheckResponse.SERVING
Check = health_pb2.HealthCheckRequest
LARGE = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
FLOOD_MESSAGE = api_pb2.Message(value=b"f" * (64 << 10)).SerializeToString()
FLOOD_COUNT = (200 << 20) // len(FLOOD_MESSAGE) + 1  # 200 MB in all


# --- the servicers ------------------------------------------------------------------------------


class HealthServicer:
    """Check and Watch do what the request's service name says: "command:argument"."""

    def __init__(self) -> None:
        self.calls = 0
        self.started = asyncio.Event()  # a "sleep" or "forever" handler is running
        self.cancelled = asyncio.Event()  # and saw CancelledError
        self.cancelled_at = 0.0
        self.remaining: list[float | None] = []
        self.metadata: tuple = ()
        self.peer = ""

    async def _sleep(self, seconds: float) -> None:
        self.started.set()
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            self.cancelled_at = time.monotonic()
            self.cancelled.set()
            raise

    async def Check(self, request, context):
        self.calls += 1
        command, _, argument = request.service.partition(":")
        if command == "abort":
            await context.abort(grpc.StatusCode.NOT_FOUND, argument)
        elif command == "raise":
            raise RuntimeError(argument)
        elif command == "sleep":
            await self._sleep(float(argument))
        elif command == "remaining":
            self.remaining.append(context.time_remaining())
        elif command == "whoami":
            self.metadata, self.peer = context.invocation_metadata(), context.peer()
        elif command == "busy":  # a handler holding the loop this many seconds, as a costly one would
            until = time.monotonic() + float(argument)
            while time.monotonic() < until:
                pass
        return health_pb2.HealthCheckResponse(status=SERVING)

    async def Watch(self, request, context):
        command, _, argument = request.service.partition(":")
        if command == "count":
            for _ in range(int(argument)):
                yield health_pb2.HealthCheckResponse(status=SERVING)
        elif command == "forever":
            yield health_pb2.HealthCheckResponse(status=SERVING)
            await self._sleep(3600)


class ApiServicer:
    """Three shapes of proto.API (CreateStream and the others are left out: UNIMPLEMENTED)."""

    def __init__(self) -> None:
        self.produced = 0  # responses the "flood" Subscribe has yielded

    async def Publish(self, request, context):
        if request.stream == "who-am-i":  # the client certificate's common name, under mutual TLS
            certificate = context.peer_certificate() or {}
            names = [value for rdn in certificate.get("subject", ()) for key, value in rdn if key == "commonName"]
            return api_pb2.PublishResponse(correlationId=",".join(names))
        if request.stream == "big-response":
            return api_pb2.PublishResponse(correlationId="r" * request.partition)
        # The value back, as text, and its length: what came in arrives intact.
        return api_pb2.PublishResponse(
            correlationId=request.correlationId,
            ack=api_pb2.Ack(msgSubject=request.value.decode("ascii"), offset=len(request.value)),
        )

    async def Subscribe(self, request, context):
        if request.stream == "count":
            value = request.consumer.consumerId.encode()
            for offset in range(request.startOffset):
                yield api_pb2.Message(offset=offset, value=value)
        elif request.stream == "flood":
            for _ in range(FLOOD_COUNT):
                self.produced += 1
                yield FLOOD_MESSAGE  # already serialized, which a handler may yield
        elif request.stream == "big":
            yield api_pb2.Message(value=b"b" * request.startOffset)

    async def PublishAsync(self, requests, context):
        async for request in requests:
            yield api_pb2.PublishResponse(correlationId=request.correlationId,
                                          ack=api_pb2.Ack(offset=len(request.value)))


class Served:
    def __init__(self, server: GrpcServer, port: int, health: HealthServicer, api: ApiServicer) -> None:
        self.server, self.port, self.health, self.api = server, port, health, api
        self.address = f"127.0.0.1:{port}"

    def channel(self, **kwargs) -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(self.address, **kwargs)


@contextlib.asynccontextmanager
async def serving(**server_settings):
    """A GrpcServer on a free loopback port serving both test servicers."""
    server = GrpcServer(**server_settings)
    health, api = HealthServicer(), ApiServicer()
    server.add(service_methods(HEALTH, health))
    server.add(service_methods(API, api))
    port = await server.bind("127.0.0.1", 0)
    await server.start()
    try:
        yield Served(server, port, health, api)
    finally:
        await server.stop(grace=0)


async def still_serves(address: str, **channel_settings) -> None:
    async with grpc.aio.insecure_channel(address, **channel_settings) as channel:
        response = await health_pb2_grpc.HealthStub(channel).Check(Check(service="ok"), timeout=5)
    assert response.status == SERVING


async def rpc_error(awaitable) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await awaitable
    return failure.value


def self_signed_certificate(directory) -> tuple[str, str, bytes]:
    """A certificate for localhost and 127.0.0.1 signed by its own key: (cert file, key file, PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem = certificate.public_bytes(serialization.Encoding.PEM)
    cert_file, key_file = directory / "server.pem", directory / "server.key"
    cert_file.write_bytes(pem)
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_file), str(key_file), pem


# --- a raw HTTP/2 client, for what grpcio will not do -------------------------------------------


def grpc_message(message) -> bytes:
    data = message.SerializeToString()
    return struct.pack(">BI", 0, len(data)) + data


def request_headers(path: str, *extra: tuple[str, str]) -> list[tuple[str, str]]:
    return [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "127.0.0.1"),
            ("content-type", "application/grpc"), ("te", "trailers"), *extra]


class RawH2:
    """h2's client state machine on an asyncio socket, with what came back for each stream."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.settings_received = False
        self.statuses: dict[int, str] = {}  # grpc-status, from trailers or a trailers-only response
        self.resets: dict[int, int] = {}  # RST_STREAM error codes
        self.closed = False

    @classmethod
    async def connect(cls, port: int) -> RawH2:
        client = cls(*await asyncio.open_connection("127.0.0.1", port))
        client.h2.initiate_connection()
        await client.send()
        return client

    async def send(self) -> None:
        self.writer.write(self.h2.data_to_send())
        await self.writer.drain()

    async def receive(self, until, timeout: float = 5.0) -> None:
        """Read until ``until()`` is true (or the connection closes)."""
        async def read():
            while not until():
                data = await self.reader.read(1 << 16)
                if not data:
                    self.closed = True
                    return
                for event in self.h2.receive_data(data):
                    self._note(event)
                await self.send()

        await asyncio.wait_for(read(), timeout)

    def _note(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RemoteSettingsChanged):
            self.settings_received = True
        elif isinstance(event, h2.events.DataReceived):
            self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamReset):
            self.resets[event.stream_id] = event.error_code
        elif isinstance(event, h2.events.TrailersReceived | h2.events.ResponseReceived):
            status = dict(event.headers).get("grpc-status")
            if status is not None:
                self.statuses[event.stream_id] = status

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


# --- round trips ---------------------------------------------------------------------------------


async def test_unary_round_trip():
    async with serving() as served, served.channel() as channel:
        response = await health_pb2_grpc.HealthStub(channel).Check(Check(service="ok"), timeout=5)
        assert response.status == SERVING
        echoed = await api_pb2_grpc.APIStub(channel).Publish(
            api_pb2.PublishRequest(value=b"hello", correlationId="c1"), timeout=5)
        assert (echoed.correlationId, echoed.ack.msgSubject, echoed.ack.offset) == ("c1", "hello", 5)


async def test_server_streaming_delivers_10000_messages_complete_and_in_order():
    async with serving() as served, served.channel() as channel:
        request = api_pb2.SubscribeRequest(stream="count", startOffset=10_000,
                                           consumer=api_pb2.Consumer(consumerId="v"))
        call = api_pb2_grpc.APIStub(channel).Subscribe(request, timeout=20)
        offsets = [message.offset async for message in call]
        assert offsets == list(range(10_000))
        assert await call.code() == grpc.StatusCode.OK


async def test_bidi_streaming_echoes_1000_requests_with_their_correlation_ids():
    async with serving() as served, served.channel() as channel:
        async def requests():
            for i in range(1000):
                yield api_pb2.PublishRequest(value=b"x" * (i % 7), correlationId=f"c{i}")

        call = api_pb2_grpc.APIStub(channel).PublishAsync(requests(), timeout=20)
        responses = [(r.correlationId, r.ack.offset) async for r in call]
        assert responses == [(f"c{i}", i % 7) for i in range(1000)]
        assert await call.code() == grpc.StatusCode.OK


# --- statuses ------------------------------------------------------------------------------------


async def test_a_method_the_servicer_lacks_is_unimplemented():
    async with serving() as served, served.channel() as channel:
        error = await rpc_error(api_pb2_grpc.APIStub(channel).CreateStream(
            api_pb2.CreateStreamRequest(name="s", subject="s"), timeout=5))
        assert error.code() == grpc.StatusCode.UNIMPLEMENTED, error
        await still_serves(served.address)


async def test_an_unknown_service_is_unimplemented():
    async with serving() as served, served.channel() as channel:
        call = channel.unary_unary("/no.such.Service/Method")  # bytes in and out, no serializers
        error = await rpc_error(call(b"\x08\x01", timeout=5))
        assert error.code() == grpc.StatusCode.UNIMPLEMENTED, error
        assert "/no.such.Service/Method" in error.details()


@pytest.mark.parametrize("details", ["x y %", "nicht gefunden: é ü ß — 😀 \u202e ✓ %41 \r\n"])
async def test_abort_reaches_the_client_with_its_code_and_exact_details(details):
    async with serving() as served, served.channel() as channel:
        error = await rpc_error(health_pb2_grpc.HealthStub(channel).Check(Check(service=f"abort:{details}"),
                                                                          timeout=5))
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert error.details() == details


async def test_an_unexpected_exception_is_unknown_and_the_server_goes_on():
    async with serving() as served, served.channel() as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        error = await rpc_error(stub.Check(Check(service="raise:boom"), timeout=5))
        assert error.code() == grpc.StatusCode.UNKNOWN
        assert "boom" in error.details()
        assert (await stub.Check(Check(service="ok"), timeout=5)).status == SERVING
        assert served.health.calls == 2


# --- deadlines and cancellation -----------------------------------------------------------------


async def test_a_handler_beyond_the_deadline_is_cancelled_and_the_client_gets_deadline_exceeded():
    async with serving() as served, served.channel() as channel:
        started = time.monotonic()
        error = await rpc_error(health_pb2_grpc.HealthStub(channel).Check(Check(service="sleep:10"), timeout=0.3))
        assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await asyncio.wait_for(served.health.cancelled.wait(), 2)
        assert served.health.cancelled_at - started < 1.5
        await still_serves(served.address)


async def test_the_server_enforces_the_deadline_itself():
    """A client that sends grpc-timeout and never resets the call gets DEADLINE_EXCEEDED from the server."""
    async with serving() as served:
        client = await RawH2.connect(served.port)
        try:
            stream = client.h2.get_next_available_stream_id()
            client.h2.send_headers(stream, request_headers("/grpc.health.v1.Health/Check", ("grpc-timeout", "200m")))
            client.h2.send_data(stream, grpc_message(Check(service="sleep:10")), end_stream=True)
            await client.send()
            started = time.monotonic()
            await client.receive(lambda: stream in client.statuses, timeout=3)
            assert client.statuses[stream] == str(grpc.StatusCode.DEADLINE_EXCEEDED.value[0])
            assert time.monotonic() - started < 1.5
            assert served.health.cancelled.is_set()
        finally:
            await client.close()


async def test_time_remaining_is_none_without_a_deadline_and_about_right_with_one():
    async with serving() as served, served.channel() as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        await stub.Check(Check(service="remaining"))
        await stub.Check(Check(service="remaining"), timeout=5)
        without, with_deadline = served.health.remaining
        assert without is None
        # grpcio rounds the grpc-timeout it sends up (to 10 ms steps for seconds), hence a little above 5.
        assert 4.0 < with_deadline <= 5.1


async def test_a_client_cancelling_a_stream_cancels_its_handler_promptly():
    async with serving() as served, served.channel() as channel:
        call = health_pb2_grpc.HealthStub(channel).Watch(Check(service="forever"))
        first = await call.read()
        assert first.status == SERVING
        await asyncio.wait_for(served.health.started.wait(), 2)
        cancelled = time.monotonic()
        call.cancel()
        await asyncio.wait_for(served.health.cancelled.wait(), 1)
        assert served.health.cancelled_at - cancelled < 0.5
        assert await call.code() == grpc.StatusCode.CANCELLED
        await still_serves(served.address)


# --- what a handler knows of its call ------------------------------------------------------------


async def test_invocation_metadata_and_peer():
    async with serving() as served, served.channel() as channel:
        metadata = (("x-tenant", "acme"), ("x-request-id", "r-42"))
        await health_pb2_grpc.HealthStub(channel).Check(Check(service="whoami"), metadata=metadata, timeout=5)
        received = dict(served.health.metadata)
        assert received["x-tenant"] == "acme" and received["x-request-id"] == "r-42"
        assert not any(key.startswith(":") for key, _ in served.health.metadata)
        match = re.fullmatch(r"ipv4:127\.0\.0\.1:(\d+)", served.health.peer)
        assert match, served.health.peer
        assert 0 < int(match.group(1)) < 65536 and int(match.group(1)) != served.port


async def test_binary_metadata_reaches_the_handler_decoded():
    async with serving() as served, served.channel() as channel:
        await health_pb2_grpc.HealthStub(channel).Check(Check(service="whoami"), timeout=5,
                                                        metadata=(("x-trace-bin", b"\x00\x01\xff"),))
        assert ("x-trace-bin", b"\x00\x01\xff") in served.health.metadata, served.health.metadata


async def test_repeated_metadata_keys_reach_the_handler_as_separate_entries():
    async with serving() as served, served.channel() as channel:
        await health_pb2_grpc.HealthStub(channel).Check(Check(service="whoami"), timeout=5,
                                                        metadata=(("x-a", "1"), ("x-a", "2,3")))
        assert [m for m in served.health.metadata if m[0] == "x-a"] == [("x-a", "1"), ("x-a", "2,3")]


# --- message sizes and flow control --------------------------------------------------------------


async def test_a_request_beyond_the_limit_is_resource_exhausted():
    async with serving(max_message_bytes=1024) as served, served.channel() as channel:
        stub = api_pb2_grpc.APIStub(channel)
        error = await rpc_error(stub.Publish(api_pb2.PublishRequest(value=b"v" * 2000), timeout=5))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
        small = await stub.Publish(api_pb2.PublishRequest(value=b"v" * 100), timeout=5)
        assert small.ack.offset == 100


async def test_a_response_beyond_the_limit_is_resource_exhausted():
    async with serving(max_message_bytes=1024) as served, served.channel() as channel:
        stub = api_pb2_grpc.APIStub(channel)
        error = await rpc_error(stub.Publish(api_pb2.PublishRequest(stream="big-response", partition=2000),
                                             timeout=5))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
        streamed = stub.Subscribe(api_pb2.SubscribeRequest(stream="big", startOffset=2000), timeout=5)
        error = await rpc_error(streamed.read())
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
        fits = await stub.Publish(api_pb2.PublishRequest(stream="big-response", partition=500), timeout=5)
        assert fits.correlationId == "r" * 500


async def test_10_mib_each_way_round_trips_intact():
    value = (b"abcdefghijklmnopqrstuvwxyz" * (1 << 20))[:10 << 20]
    async with serving() as served, served.channel(options=LARGE) as channel:
        stub = api_pb2_grpc.APIStub(channel)
        response = await stub.Publish(api_pb2.PublishRequest(value=value, correlationId="big"), timeout=20)
        assert response.ack.offset == len(value)
        assert response.ack.msgSubject.encode() == value
        streamed = stub.Subscribe(api_pb2.SubscribeRequest(stream="big", startOffset=10 << 20), timeout=20)
        messages = [message async for message in streamed]
        assert len(messages) == 1 and messages[0].value == b"b" * (10 << 20)


# --- compression ---------------------------------------------------------------------------------


async def test_gzip_requests_and_responses():
    async with serving() as served, served.channel(compression=grpc.Compression.Gzip) as channel:
        stub = api_pb2_grpc.APIStub(channel)
        value = b"compressible " * 10_000
        response = await stub.Publish(api_pb2.PublishRequest(value=value, correlationId="z"), timeout=5)
        assert (response.correlationId, response.ack.msgSubject.encode()) == ("z", value)
        health = await health_pb2_grpc.HealthStub(channel).Check(Check(service="ok"), timeout=5)
        assert health.status == SERVING
        request = api_pb2.SubscribeRequest(stream="count", startOffset=2000,
                                           consumer=api_pb2.Consumer(consumerId="zz" * 500))
        messages = [message async for message in stub.Subscribe(request, timeout=10)]
        assert [m.offset for m in messages] == list(range(2000))
        assert all(m.value == b"zz" * 500 for m in messages)

        async def requests():
            for i in range(200):
                yield api_pb2.PublishRequest(value=b"q" * i, correlationId=f"g{i}")

        echoed = [(r.correlationId, r.ack.offset) async for r in stub.PublishAsync(requests(), timeout=10)]
        assert echoed == [(f"g{i}", i) for i in range(200)]


# --- graceful stop -------------------------------------------------------------------------------


async def test_stop_lets_a_running_unary_call_finish():
    async with serving() as served, served.channel() as channel:
        call = asyncio.ensure_future(health_pb2_grpc.HealthStub(channel).Check(Check(service="sleep:0.5"),
                                                                              timeout=10))
        await asyncio.wait_for(served.health.started.wait(), 2)
        started = time.monotonic()
        await served.server.stop(grace=2)
        assert (await call).status == SERVING
        assert time.monotonic() - started < 2
        assert not served.health.cancelled.is_set()


async def test_no_new_connection_after_stop():
    async with serving() as served:
        await still_serves(served.address)
        await served.server.stop(grace=2)
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", served.port)
        async with served.channel() as channel:
            error = await rpc_error(health_pb2_grpc.HealthStub(channel).Check(Check(service="ok"), timeout=2))
        assert error.code() == grpc.StatusCode.UNAVAILABLE, error


async def test_stop_ends_a_never_ending_stream_within_its_grace_with_unavailable():
    async with serving() as served, served.channel() as channel:
        call = health_pb2_grpc.HealthStub(channel).Watch(Check(service="forever"))
        assert (await call.read()).status == SERVING
        grace = 1.0
        started = time.monotonic()
        stopping = asyncio.ensure_future(served.server.stop(grace=grace))
        error = await rpc_error(call.read())
        ended = time.monotonic() - started
        await stopping
        assert error.code() == grpc.StatusCode.UNAVAILABLE, error
        assert grace - 0.2 < ended < grace + 1, ended
        assert served.health.cancelled.is_set()


# --- backpressure --------------------------------------------------------------------------------


async def test_a_slow_reader_suspends_a_streaming_handler():
    """200 MB for a client that reads slowly: the handler is held back, not buffered ahead of it.

    grpcio's BDP probing grows its receive window as data flows (10 to 20 MiB measured, ahead of the
    reader in grpc core and the kernel's buffers); with it off the window is fixed, and what the
    handler yields ahead of the reader is what the server buffers, plus that window."""
    bound = 4 << 20
    size = len(FLOOD_MESSAGE)
    options = [*LARGE, ("grpc.http2.bdp_probe", 0)]
    async with serving() as served, served.channel(options=options) as channel:
        api = served.api
        call = api_pb2_grpc.APIStub(channel).Subscribe(api_pb2.SubscribeRequest(stream="flood"), timeout=30)
        read = 0
        ahead = []  # bytes the handler had yielded beyond what the client had read, after each read
        async for message in call:
            assert len(message.value) == 64 << 10
            read += 1
            ahead.append((api.produced - read) * size)
            if read <= 20:
                await asyncio.sleep(0.05)  # slowly, for a second
            if read == 20:
                before = api.produced
                await asyncio.sleep(0.5)
                assert api.produced == before, "the handler went on while nothing was read"
        assert read == FLOOD_COUNT == api.produced
        assert await call.code() == grpc.StatusCode.OK
        assert max(ahead) < bound, f"up to {max(ahead) / 2 ** 20:.1f} MiB ahead of the reader"


# --- hostile input -------------------------------------------------------------------------------


SETTINGS_FRAME = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


@pytest.mark.parametrize("garbage", [
    pytest.param(bytes(range(256)) * 4, id="garbage"),
    pytest.param(PREFACE + b"\xff" * 64, id="preface-then-garbage"),
    pytest.param(PREFACE + b"\x00\x00\x01\x00\x00\x00\x00\x00\x01X", id="preface-then-data-before-settings"),
    pytest.param(PREFACE + SETTINGS_FRAME + b"\x00\x00\x05\x01\x05\x00\x00\x00\x01\xff\xff\xff\xff\xff",
                 id="preface-settings-then-bad-hpack"),
    pytest.param(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n\r\n", id="http1.1"),
    pytest.param(b"POST /grpc.health.v1.Health/Check HTTP/1.1\r\nHost: x\r\nContent-Type: application/grpc\r\n"
                 b"Content-Length: 5\r\n\r\n\x00\x00\x00\x00\x00", id="http1.1-grpc"),
])
async def test_hostile_bytes_close_their_connection_and_the_server_goes_on(garbage):
    async with serving() as served:
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        try:
            writer.write(garbage)
            await writer.drain()

            async def until_closed() -> bytes:
                received = b""
                with contextlib.suppress(ConnectionResetError):
                    while data := await reader.read(1 << 16):
                        received += data
                return received

            received = await asyncio.wait_for(until_closed(), 5)
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        assert b"\x07\x00\x00\x00\x00\x00" in received, "no GOAWAY before closing"  # type 7, no flags, stream 0
        await still_serves(served.address)


async def test_2000_streams_at_once_on_one_connection_are_each_served_or_refused():
    """grpcio queues calls beyond the server's MAX_CONCURRENT_STREAMS; a raw client does not."""
    async with serving() as served:
        client = await RawH2.connect(served.port)
        try:
            streams = []
            for _ in range(2000):
                stream = client.h2.get_next_available_stream_id()
                client.h2.send_headers(stream, request_headers("/grpc.health.v1.Health/Check"))
                streams.append(stream)
            await client.send()
            await client.receive(lambda: len(client.resets) >= 1000, timeout=10)
            assert set(client.resets.values()) == {h2.errors.ErrorCodes.REFUSED_STREAM}
            accepted = [s for s in streams if s not in client.resets]
            assert len(accepted) == 1000  # the server's MAX_CONCURRENT_STREAMS
            for stream in accepted:
                client.h2.send_data(stream, grpc_message(Check(service="ok")), end_stream=True)
            await client.send()
            await client.receive(lambda: len(client.statuses) >= len(accepted), timeout=15)
            assert client.statuses == dict.fromkeys(accepted, "0")
            assert not client.closed
        finally:
            await client.close()

        async with served.channel() as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            answers = await asyncio.gather(*(stub.Check(Check(service="ok"), timeout=20) for _ in range(2000)))
        assert [a.status for a in answers] == [SERVING] * 2000


async def test_a_unary_call_does_not_buffer_unbounded_requests():
    """A client that sends message after message on a unary call, never ending it, is held back by
    flow control (or its call ended): the server does not queue what it will never use."""
    async with serving() as served:
        client = await RawH2.connect(served.port)
        try:
            await client.receive(lambda: client.settings_received, timeout=5)
            stream = client.h2.get_next_available_stream_id()
            client.h2.send_headers(stream, request_headers("/grpc.health.v1.Health/Check"))
            chunk = grpc_message(Check(service="x" * 16_000))
            sent, limit = 0, 16 << 20  # the server's windows: 1 MiB for the stream, 16 MiB for the connection
            while sent < limit and stream not in client.statuses and stream not in client.resets:
                if client.h2.local_flow_control_window(stream) < len(chunk):
                    with contextlib.suppress(TimeoutError):  # waiting for a WINDOW_UPDATE that may not come
                        await client.receive(lambda: client.h2.local_flow_control_window(stream) >= len(chunk),
                                             timeout=1)
                    if client.h2.local_flow_control_window(stream) < len(chunk):
                        break
                client.h2.send_data(stream, chunk)
                await client.send()
                sent += len(chunk)
            assert sent < 4 << 20, f"the server took {sent >> 20} MiB of requests for one unary call"
        finally:
            await client.close()
        await still_serves(served.address)


# --- TLS -----------------------------------------------------------------------------------------


async def test_tls_with_a_self_signed_certificate(tmp_path):
    cert_file, key_file, pem = self_signed_certificate(tmp_path)
    async with serving(ssl_context=server_tls_context(cert_file, key_file)) as served:
        credentials = grpc.ssl_channel_credentials(root_certificates=pem)
        async with grpc.aio.secure_channel(served.address, credentials) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            assert (await stub.Check(Check(service="ok"), timeout=5)).status == SERVING
            messages = [m async for m in api_pb2_grpc.APIStub(channel).Subscribe(
                api_pb2.SubscribeRequest(stream="count", startOffset=100), timeout=5)]
            assert [m.offset for m in messages] == list(range(100))

        async with served.channel() as plain:  # plain text at the TLS port
            error = await rpc_error(health_pb2_grpc.HealthStub(plain).Check(Check(service="ok"), timeout=3))
        assert error.code() == grpc.StatusCode.UNAVAILABLE, error

        async with grpc.aio.secure_channel(served.address, credentials) as channel:
            assert (await health_pb2_grpc.HealthStub(channel).Check(Check(service="ok"), timeout=5)).status == SERVING


async def test_mutual_tls_admits_only_clients_with_a_certificate_of_the_ca(tmp_path):
    ca, ca_key, ca_file, _ = issue(tmp_path, "ca", None)
    _, _, server_cert, server_key = issue(tmp_path, "server", (ca, ca_key))
    _, _, client_cert, client_key = issue(tmp_path, "alice", (ca, ca_key))
    stranger_ca = issue(tmp_path, "stranger-ca", None)
    _, _, stranger_cert, stranger_key = issue(tmp_path, "mallory", stranger_ca[:2])
    context = server_tls_context(str(server_cert), str(server_key), str(ca_file))
    async with serving(ssl_context=context) as served:

        def credentials(cert=None, key=None):
            return grpc.ssl_channel_credentials(
                root_certificates=ca_file.read_bytes(), private_key=key.read_bytes() if key else None,
                certificate_chain=cert.read_bytes() if cert else None)

        async with grpc.aio.secure_channel(served.address, credentials(client_cert, client_key)) as channel:
            answer = await api_pb2_grpc.APIStub(channel).Publish(api_pb2.PublishRequest(stream="who-am-i"), timeout=5)
            assert answer.correlationId == "alice"
        for refused in (credentials(), credentials(stranger_cert, stranger_key)):
            async with grpc.aio.secure_channel(served.address, refused) as channel:
                error = await rpc_error(health_pb2_grpc.HealthStub(channel).Check(Check(service="ok"), timeout=3))
            assert error.code() == grpc.StatusCode.UNAVAILABLE, error
        async with grpc.aio.secure_channel(served.address, credentials(client_cert, client_key)) as channel:
            assert (await health_pb2_grpc.HealthStub(channel).Check(Check(service="ok"), timeout=5)).status == SERVING


# --- the health service, as a node composes it ----------------------------------------------------


async def test_health_service_of_a_real_node(tmp_path):
    async with running_node(tmp_path) as (_node, address), grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "proto.API"):
            assert (await stub.Check(Check(service=service), timeout=5)).status == SERVING, service
        error = await rpc_error(stub.Check(Check(service="no.such.Service"), timeout=5))
        assert error.code() == grpc.StatusCode.NOT_FOUND
        watch = stub.Watch(Check(service=""), timeout=5)
        assert (await watch.read()).status == SERVING
        watch.cancel()


async def test_publish_async_takes_the_requests_before_an_undecodable_one_then_ends_internal(tmp_path):
    """PublishAsync reads what arrived together as one batch: requests before a garbage one in the
    same DATA frame are appended and acked, and the garbage ends the call with INTERNAL."""
    async with running_node(tmp_path) as (_node, address), Client(address) as client:
        await client.wait_ready()
        await client.create_stream("batch", "batch")
        raw = await RawH2.connect(int(address.rsplit(":", 1)[1]))
        try:
            stream_id = raw.h2.get_next_available_stream_id()
            raw.h2.send_headers(stream_id, request_headers("/proto.API/PublishAsync"))
            good = b"".join(grpc_message(api_pb2.PublishRequest(stream="batch", value=b"v%d" % i,
                                                                correlationId=str(i))) for i in range(3))
            garbage = struct.pack(">BI", 0, 3) + b"\xff\xff\xff"  # a truncated field: no PublishRequest
            raw.h2.send_data(stream_id, good + garbage)
            await raw.send()
            await raw.receive(lambda: stream_id in raw.statuses or raw.closed)
            assert raw.statuses[stream_id] == str(grpc.StatusCode.INTERNAL.value[0])
        finally:
            await raw.close()
        values = [m.value async for m in client.subscribe("batch", start="earliest", stop_latest=True)]
        assert values == [b"v0", b"v1", b"v2"]


async def test_a_node_configured_for_mutual_tls_serves_only_certified_clients(tmp_path):
    ca, ca_key, ca_file, _ = issue(tmp_path, "ca", None)
    _, _, server_cert, server_key = issue(tmp_path, "server", (ca, ca_key))
    _, _, client_cert, client_key = issue(tmp_path, "alice", (ca, ca_key))
    settings = {"tls.cert": str(server_cert), "tls.key": str(server_key), "tls.client.auth.enabled": True,
                "tls.client.auth.ca": str(ca_file)}
    (tmp_path / "node").mkdir()
    async with running_node(tmp_path / "node", **settings) as (_node, address):
        certified = grpc.ssl_channel_credentials(ca_file.read_bytes(), client_key.read_bytes(),
                                                 client_cert.read_bytes())
        async with grpc.aio.secure_channel(address, certified) as channel:
            metadata = await api_pb2_grpc.APIStub(channel).FetchMetadata(api_pb2.FetchMetadataRequest(), timeout=5)
            assert metadata.brokers
        async with grpc.aio.secure_channel(address, grpc.ssl_channel_credentials(ca_file.read_bytes())) as channel:
            error = await rpc_error(api_pb2_grpc.APIStub(channel).FetchMetadata(api_pb2.FetchMetadataRequest(),
                                                                                 timeout=3))
        assert error.code() == grpc.StatusCode.UNAVAILABLE, error

        # bascule's client and CLI, with and without their certificate
        tls = ClientTls.from_files(str(ca_file), str(client_cert), str(client_key))
        async with Client(address, tls=tls) as client:
            assert (await client.fetch_metadata()).brokers
        # and the Spark source's connections, from its tlsCa/tlsCert/tlsKey options
        options = parse_read_options({"brokers": address, "stream": "s", "tlsCa": str(ca_file),
                                      "tlsCert": str(client_cert), "tlsKey": str(client_key)}, streaming=False)
        spark_client = await connect(options.brokers, 5, options.tls)
        await spark_client.close()
        cli = [sys.executable, "-m", "bascule.cli", "metadata", "-a", address, "--json", "--timeout", "3",
               "--tls-ca", str(ca_file)]
        for extra, exit_code in (["--tls-cert", str(client_cert), "--tls-key", str(client_key)], 0), ([], 1):
            process = await asyncio.create_subprocess_exec(*cli, *extra, stdout=asyncio.subprocess.PIPE,
                                                           stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(process.communicate(), 30)
            assert process.returncode == exit_code, (extra, out, err)


ACL_MODEL = """
[request_definition]
r = sub, obj, act

[policy_definition]
p = sub, obj, act

[policy_effect]
e = some(where (p.eft == allow))

[matchers]
m = r.sub == p.sub && r.obj == p.obj && r.act == p.act
"""


@contextlib.asynccontextmanager
async def authorizing_node(tmp_path, policy: str):
    """A node under mutual TLS and Casbin ``policy`` (ACL_MODEL); yields a function that opens a
    channel as "alice" or "bob", each with a certificate of the node's CA."""
    ca, ca_key, ca_file, _ = issue(tmp_path, "ca", None)
    _, _, server_cert, server_key = issue(tmp_path, "server", (ca, ca_key))
    certified = {name: issue(tmp_path, name, (ca, ca_key))[2:] for name in ("alice", "bob")}
    (tmp_path / "model.conf").write_text(ACL_MODEL)
    (tmp_path / "policy.csv").write_text(policy)
    settings = {"tls.cert": str(server_cert), "tls.key": str(server_key), "tls.client.auth.enabled": True,
                "tls.client.auth.ca": str(ca_file), "tls.client.authz.enabled": True,
                "tls.client.authz.model": str(tmp_path / "model.conf"),
                "tls.client.authz.policy": str(tmp_path / "policy.csv")}
    (tmp_path / "node").mkdir()
    async with running_node(tmp_path / "node", **settings) as (_node, address):

        def channel(name: str) -> grpc.aio.Channel:
            cert, key = certified[name]
            credentials = grpc.ssl_channel_credentials(ca_file.read_bytes(), key.read_bytes(), cert.read_bytes())
            return grpc.aio.secure_channel(address, credentials)

        yield channel


async def test_authorization_by_casbin_policy_on_the_client_certificate(tmp_path):
    policy = "p, alice, *, FetchMetadata\np, alice, orders, CreateStream\np, alice, orders, Publish\n"
    async with authorizing_node(tmp_path, policy) as channel:
        async with channel("alice") as alice, channel("bob") as bob:
            api = api_pb2_grpc.APIStub(alice)
            assert (await api.FetchMetadata(api_pb2.FetchMetadataRequest(), timeout=5)).brokers
            await api.CreateStream(api_pb2.CreateStreamRequest(subject="orders", name="orders"), timeout=10)
            error = await rpc_error(api.CreateStream(api_pb2.CreateStreamRequest(subject="x", name="other"), timeout=5))
            assert error.code() == grpc.StatusCode.PERMISSION_DENIED, error
            assert error.details() == "The client is not authorized to call CreateStream on resource other"
            error = await rpc_error(api_pb2_grpc.APIStub(bob).FetchMetadata(api_pb2.FetchMetadataRequest(), timeout=5))
            assert error.code() == grpc.StatusCode.PERMISSION_DENIED, error

            async def requests():
                for stream, correlation in (("orders", "1"), ("other", "2")):
                    yield api_pb2.PublishRequest(stream=stream, value=b"v", correlationId=correlation,
                                                 ackPolicy=api_pb2.AckPolicy.LEADER)

            responses = {r.correlationId: r async for r in api.PublishAsync(requests(), timeout=10)}
            assert not responses["1"].HasField("asyncError") and responses["1"].ack.stream == "orders"
            assert responses["2"].asyncError.code == api_pb2.PublishAsyncError.Code.PERMISSION_DENIED
            # the health service answers everyone
            assert (await health_pb2_grpc.HealthStub(bob).Check(Check(service=""), timeout=5)).status == SERVING


async def test_authorization_covers_ack_inboxes_and_consumer_groups(tmp_path):
    """Stricter than Liftbridge: an ackInbox is a publish to its subject (PublishAsync ignores a
    request's, as Liftbridge's does: its acks come back on the call), and the consumer group calls
    need Subscribe on the group's streams; a group the caller may not see is refused like one it
    may not use, never NOT_FOUND."""
    policy = ("p, alice, orders, CreateStream\np, alice, orders, Publish\np, alice, orders, Subscribe\n"
              "p, alice, orders.acks, PublishToSubject\np, bob, orders, Publish\n")
    async with authorizing_node(tmp_path, policy) as channel:
        async with channel("alice") as alice_channel, channel("bob") as bob_channel:
            alice, bob = api_pb2_grpc.APIStub(alice_channel), api_pb2_grpc.APIStub(bob_channel)
            await alice.CreateStream(api_pb2.CreateStreamRequest(subject="orders", name="orders"), timeout=10)

            # An ack inbox needs PublishToSubject on it: bob may publish to orders, not to "other.in".
            error = await rpc_error(bob.Publish(api_pb2.PublishRequest(
                stream="orders", value=b"v", ackInbox="other.in", ackPolicy=api_pb2.AckPolicy.LEADER), timeout=5))
            assert error.code() == grpc.StatusCode.PERMISSION_DENIED, error
            assert "PublishToSubject on resource other.in" in error.details()

            async def requests():
                yield api_pb2.PublishRequest(stream="orders", value=b"v", ackInbox="other.in", correlationId="1",
                                             ackPolicy=api_pb2.AckPolicy.LEADER)
                yield api_pb2.PublishRequest(stream="orders", value=b"v", correlationId="2",
                                             ackPolicy=api_pb2.AckPolicy.LEADER)

            responses = {r.correlationId: r async for r in bob.PublishAsync(requests(), timeout=10)}
            assert not responses["1"].HasField("asyncError") and not responses["2"].HasField("asyncError")
            assert responses["1"].ack.ackInbox.startswith("liftbridge-default.ack.")  # the call's, not other.in
            ack = await alice.Publish(api_pb2.PublishRequest(stream="orders", value=b"v", ackInbox="orders.acks",
                                                             ackPolicy=api_pb2.AckPolicy.LEADER), timeout=5)
            assert ack is not None

            # Consumer groups: Subscribe on the group's streams.
            joined = await alice.JoinConsumerGroup(
                api_pb2.JoinConsumerGroupRequest(groupId="g", consumerId="a1", streams=["orders"]), timeout=10)
            for call in (
                bob.JoinConsumerGroup(api_pb2.JoinConsumerGroupRequest(groupId="g", consumerId="b1",
                                                                       streams=["orders"]), timeout=5),
                bob.LeaveConsumerGroup(api_pb2.LeaveConsumerGroupRequest(groupId="g", consumerId="a1"), timeout=5),
                bob.FetchConsumerGroupAssignments(api_pb2.FetchConsumerGroupAssignmentsRequest(
                    groupId="no-such-group", consumerId="b1", epoch=0), timeout=5),
                alice.FetchConsumerGroupAssignments(api_pb2.FetchConsumerGroupAssignmentsRequest(
                    groupId="no-such-group", consumerId="a1", epoch=0), timeout=5),
            ):
                error = await rpc_error(call)
                assert error.code() == grpc.StatusCode.PERMISSION_DENIED, error
            assignments = await alice.FetchConsumerGroupAssignments(api_pb2.FetchConsumerGroupAssignmentsRequest(
                groupId="g", consumerId="a1", epoch=joined.epoch), timeout=5)
            assert [a.stream for a in assignments.assignments] == ["orders"]


# --- one client cannot exhaust the server (issue 27) ------------------------------------------------


def resident_bytes() -> int:
    """This process's resident set (the server runs in it)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@contextlib.contextmanager
def resident_growth_under(limit: int) -> Iterator[None]:
    """The attack inside grows this process's resident set (the server's) by less than ``limit``."""
    before = resident_bytes()
    yield
    grown = resident_bytes() - before
    assert grown < limit, f"the resident set grew {grown / 2 ** 20:.0f} MiB"


async def answered_within_a_second(address: str) -> None:
    """A well-behaved client beside an attack: its call is answered within 1 s."""
    async with grpc.aio.insecure_channel(address) as channel:
        response = await health_pb2_grpc.HealthStub(channel).Check(Check(service="ok"), timeout=1.0)
    assert response.status == SERVING


async def goaway_code(reader: asyncio.StreamReader) -> int | None:
    """The error code of the GOAWAY the server sent before closing, None without one."""
    received = b""
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(1 << 16):
            received += data
    found = received.find(b"\x07\x00\x00\x00\x00\x00")  # a GOAWAY frame's type, flags and stream 0
    return None if found < 0 else struct.unpack(">I", received[found + 10:found + 14])[0]


def frame_bytes(frame_type: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    return struct.pack(">BHBBI", len(payload) >> 16, len(payload) & 0xFFFF, frame_type, flags, stream_id) + payload


async def test_zero_window_subscribes_hold_no_more_than_the_connection_budget():
    """1000 Subscribe calls on a connection that never opens a flow-control window: what the server
    queues for them stays within the connection's budget (before the budgets, these calls took the
    process from 67 to 1,639 MiB), and other clients are answered."""
    budget = GrpcLimits().connection_output
    async with serving() as served:
        with resident_growth_under(96 << 20):
            client = await RawH2.connect(served.port)
            try:
                client.h2.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
                for _ in range(1000):
                    stream = client.h2.get_next_available_stream_id()
                    client.h2.send_headers(stream, request_headers("/proto.API/Subscribe"))
                    client.h2.send_data(stream, grpc_message(api_pb2.SubscribeRequest(stream="flood")),
                                        end_stream=True)
                await client.send()
                await asyncio.sleep(1.0)
                await answered_within_a_second(served.address)
                queued = served.server.queued_output
                assert queued <= budget + 2 * len(FLOOD_MESSAGE), queued
                produced = served.api.produced * len(FLOOD_MESSAGE)
                assert produced <= budget + 2 * len(FLOOD_MESSAGE)
                await answered_within_a_second(served.address)
            finally:
                await client.close()


async def test_publish_async_requests_are_not_read_while_their_responses_are_not():
    """A client that sends PublishAsync requests and reads no responses: once the responses it does
    not read fill the budget, no more requests are read; its own window stops it."""
    async with serving() as served:
        with resident_growth_under(64 << 20):
            reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
            try:
                zero_window = struct.pack(">HI", 0x4, 0)
                writer.write(PREFACE + frame_bytes(0x4, 0, 0, zero_window))
                headers = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
                headers.initiate_connection()
                headers.data_to_send()
                headers.send_headers(1, request_headers("/proto.API/PublishAsync"))
                block = headers.data_to_send()
                writer.write(block)
                one = grpc_message(api_pb2.PublishRequest(correlationId="c", value=b"v"))
                data = one * ((1 << 20) // len(one))  # one stream window of requests
                for start in range(0, len(data), 16384):
                    writer.write(frame_bytes(0x0, 0, 1, data[start:start + 16384]))
                await writer.drain()
                await asyncio.sleep(1.0)
                await answered_within_a_second(served.address)
                connection = next(iter(served.server.connections))
                assert connection.grpc.queued <= GrpcLimits().call_output + (64 << 10), connection.grpc.queued
            finally:
                writer.close()


async def test_rapid_reset_gets_goaway_enhance_your_calm():
    """CVE-2023-44487: calls opened and cancelled at once, as fast as a client can."""
    async with serving() as served:
        with resident_growth_under(64 << 20):
            client = await RawH2.connect(served.port)
            try:
                for _ in range(50):
                    for _ in range(200):
                        stream = client.h2.get_next_available_stream_id()
                        client.h2.send_headers(stream, request_headers("/grpc.health.v1.Health/Check"))
                        client.h2.reset_stream(stream)
                    try:
                        await client.send()
                    except (ConnectionError, h2.exceptions.ProtocolError):
                        break
                goaway = []

                def closed() -> bool:
                    return client.closed or bool(goaway)

                original = client._note

                def note(event):
                    if isinstance(event, h2.events.ConnectionTerminated):
                        goaway.append(event.error_code)
                    original(event)

                client._note = note
                with contextlib.suppress(ConnectionError, h2.exceptions.ProtocolError):
                    await client.receive(closed, timeout=5)
                assert goaway == [h2.errors.ErrorCodes.ENHANCE_YOUR_CALM] or client.closed
                await answered_within_a_second(served.address)
            finally:
                await client.close()


async def test_a_ping_flood_gets_goaway_enhance_your_calm():
    async with serving() as served:
        with resident_growth_under(64 << 20):
            reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
            try:
                writer.write(PREFACE + SETTINGS_FRAME + frame_bytes(0x6, 0, 0, b"12345678") * 20000)
                with contextlib.suppress(ConnectionError):
                    await writer.drain()
                assert await asyncio.wait_for(goaway_code(reader), 5) == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
                await answered_within_a_second(served.address)
            finally:
                writer.close()


async def test_partial_messages_count_against_the_connections_input_budget():
    """Calls announcing big messages and sending most of them: what they make the server buffer is
    bounded; the call whose part would go beyond the budget ends RESOURCE_EXHAUSTED."""
    async with serving(max_message_bytes=1 << 20) as served:
        with resident_growth_under(64 << 20):
            client = await RawH2.connect(served.port)
            try:
                await client.receive(lambda: client.h2.outbound_flow_control_window > 1 << 20)
                streams = []
                for _ in range(4):
                    stream = client.h2.get_next_available_stream_id()
                    client.h2.send_headers(stream, request_headers("/proto.API/PublishAsync"))
                    prefix = struct.pack(">BI", 0, 1 << 20)  # a message of 1 MiB, announced
                    client.h2.send_data(stream, prefix + b"\0" * (900 << 10))  # and 900 KiB of it sent
                    streams.append(stream)
                    await client.send()
                await client.receive(lambda: len(client.statuses) >= 2, timeout=5)
                assert list(client.statuses.values()).count(str(grpc.StatusCode.RESOURCE_EXHAUSTED.value[0])) >= 2
                connection = next(iter(served.server.connections))
                assert connection.grpc.buffered_input <= (1 << 20) + (1 << 20)
                await answered_within_a_second(served.address)
            finally:
                await client.close()


async def test_a_header_block_over_the_limit_is_refused_before_it_is_decoded():
    async with serving() as served:
        with resident_growth_under(64 << 20):
            reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
            try:
                writer.write(PREFACE + SETTINGS_FRAME + frame_bytes(0x1, 0x4 | 0x1, 1, b"\x00" * (100 << 10)))
                await writer.drain()
                assert await asyncio.wait_for(goaway_code(reader), 5) == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
                await answered_within_a_second(served.address)
            finally:
                writer.close()


async def test_incomplete_messages_over_the_nodes_input_budget_close_the_connection_that_goes_beyond():
    """Two connections each within their own budget, but together beyond the node's: the second is
    closed (GOAWAY ENHANCE_YOUR_CALM), the first goes on."""
    async with serving(max_message_bytes=4 << 20, limits=GrpcLimits(node_input=3 << 20)) as served:
        with resident_growth_under(64 << 20):
            first, second = await RawH2.connect(served.port), await RawH2.connect(served.port)
            try:
                for client in (first, second):
                    h2_client = client.h2
                    await client.receive(lambda c=h2_client: c.outbound_flow_control_window > 2 << 20)
                    for _ in range(2):  # 2 MiB of parts a connection (each stream's window is 1 MiB)
                        stream = client.h2.get_next_available_stream_id()
                        client.h2.send_headers(stream, request_headers("/proto.API/PublishAsync"))
                        client.h2.send_data(stream, struct.pack(">BI", 0, 4 << 20) + b"\0" * (1000 << 10))
                    await client.send()
                    await asyncio.sleep(0.2)
                with contextlib.suppress(ConnectionError):
                    await second.receive(lambda: second.closed, timeout=5)
                assert second.closed and not first.closed
                assert served.server.buffered_input <= 3 << 20
                await answered_within_a_second(served.address)
            finally:
                await first.close()
                await second.close()


def pipelined_calls(path: str, requests: list[bytes]) -> bytes:
    """A connection's preface and one complete call per request, as a client pipelining as fast as
    it can writes them."""
    encoder = hpack.Encoder()
    frames = [PREFACE, SETTINGS_FRAME]
    for index, request in enumerate(requests):
        stream = 1 + 2 * index
        frames.append(frame_bytes(0x1, 0x4, stream, encoder.encode(request_headers(path))))
        frames.append(frame_bytes(0x0, 0x1, stream, request))
    return b"".join(frames)


async def test_pipelined_calls_of_one_connection_leave_turns_to_the_others():
    """A client pipelining calls as fast as it can, each costing the server 1 ms, gets a share of each
    turn of the event loop, not whole turns: another client is answered within 1 s throughout (before
    the shares, the server started up to 1000 of them in one turn, a second each)."""
    calls = pipelined_calls("/grpc.health.v1.Health/Check", [grpc_message(Check(service="busy:0.001"))] * 20000)
    async with serving() as served:
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)

        async def discard_responses() -> None:
            while await reader.read(1 << 16):
                pass

        draining = asyncio.create_task(discard_responses())
        try:
            writer.write(calls)
            await asyncio.sleep(0.05)
            for _ in range(5):
                await answered_within_a_second(served.address)
            assert served.health.calls > 5
        finally:
            writer.close()
            draining.cancel()


async def test_pipelined_unary_calls_whose_responses_are_not_read_wait_within_the_connections_budget():
    """Unary calls whose responses the client never lets through (a zero window): once what waits
    for it reaches the connection's budget, the next calls wait before they run, whatever the client
    sends (before, 200 such calls queued 50 MiB)."""
    response = 256 << 10
    calls = pipelined_calls("/proto.API/Publish",
                            [grpc_message(api_pb2.PublishRequest(stream="big-response", partition=response))] * 200)
    zero_window = frame_bytes(0x4, 0, 0, struct.pack(">HI", 0x4, 0))
    async with serving() as served:
        with resident_growth_under(64 << 20):
            reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
            try:
                writer.write(calls[:len(PREFACE)] + zero_window + calls[len(PREFACE):])
                await writer.drain()
                await asyncio.sleep(1.0)
                assert served.server.queued_output <= GrpcLimits().connection_output + 2 * response
                await answered_within_a_second(served.address)
            finally:
                writer.close()


async def test_connections_beyond_the_limit_are_closed_at_once_and_admitted_again_below_it():
    async with serving(limits=GrpcLimits(max_connections=8)) as served:
        held = [await asyncio.open_connection("127.0.0.1", served.port) for _ in range(8)]
        try:
            await asyncio.sleep(0.2)
            assert len(served.server.connections) == 8
            reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
            assert await asyncio.wait_for(reader.read(1 << 16), 5) == b""  # closed, no SETTINGS sent
            writer.close()
            assert len(served.server.connections) == 8
        finally:
            for _, writer in held:
                writer.close()
        await asyncio.sleep(0.2)
        await answered_within_a_second(served.address)
