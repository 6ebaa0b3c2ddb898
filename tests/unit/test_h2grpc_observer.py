"""The gRPC server's call observer: told once of every call as it ends, with its method, status and
duration, whatever ended it (a loopback server, grpcio's client)."""

import asyncio
import contextlib

import grpc
import pytest
from conftest import until

from bascule.h2grpc import GrpcServer, Status, service_methods
from bascule.h2grpc.server import UNKNOWN_METHOD
from bascule.wire.pb import health_pb2, health_pb2_grpc

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

HEALTH = health_pb2.DESCRIPTOR.services_by_name["Health"]
CHECK, WATCH = "/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"
Check = health_pb2.HealthCheckRequest


class Servicer:
    """Check and Watch do what the request's service name says."""

    def __init__(self) -> None:
        self.watching = asyncio.Event()

    async def Check(self, request, context):
        if request.service == "missing":
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such thing")
        if request.service == "crash":
            raise RuntimeError("a bug")
        if request.service.startswith("sleep:"):
            await asyncio.sleep(float(request.service.partition(":")[2]))
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    async def Watch(self, request, context):
        yield health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)
        self.watching.set()
        await asyncio.sleep(3600)


@contextlib.asynccontextmanager
async def observed():
    """A server on a free loopback port, a stub of its Health service, and what its observer was told."""
    calls: list[tuple[str, Status, float]] = []
    server = GrpcServer(observer=lambda method, code, seconds, ended: calls.append((method, code, seconds)))
    servicer = Servicer()
    server.add(service_methods(HEALTH, servicer))
    port = await server.bind("127.0.0.1", 0)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield health_pb2_grpc.HealthStub(channel), channel, servicer, calls
    finally:
        await server.stop(grace=0)




async def test_each_unary_call_is_observed_once_with_its_status_and_duration():
    async with observed() as (stub, _, _, calls):
        await stub.Check(Check(service="sleep:0.2"), timeout=5)
        for service, code in [("missing", grpc.StatusCode.NOT_FOUND), ("crash", grpc.StatusCode.UNKNOWN)]:
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                await stub.Check(Check(service=service), timeout=5)
            assert failure.value.code() == code
        await until(lambda: len(calls) == 3)
        assert [(method, code) for method, code, _ in calls] == [
            (CHECK, Status.OK), (CHECK, Status.NOT_FOUND), (CHECK, Status.UNKNOWN),
        ]
        assert 0.2 <= calls[0][2] < 5
        assert all(0 <= seconds < 1 for _, _, seconds in calls[1:])


async def test_a_deadline_a_cancelled_stream_and_an_unknown_method_are_observed():
    async with observed() as (stub, channel, servicer, calls):
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await stub.Check(Check(service="sleep:10"), timeout=0.2)
        assert failure.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        watch = stub.Watch(Check(service=""))
        await watch.read()
        await servicer.watching.wait()
        watch.cancel()  # the client resets the stream: the call ends there
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await channel.unary_unary("/no.Such/Method")(b"", timeout=5)
        assert failure.value.code() == grpc.StatusCode.UNIMPLEMENTED
        await until(lambda: len(calls) == 3)
        # grpcio resets a call at its deadline too: whichever of that reset and the server's own
        # timer comes first ends it.
        assert calls[0][:2] in [(CHECK, Status.DEADLINE_EXCEEDED), (CHECK, Status.CANCELLED)]
        assert [(method, code) for method, code, _ in calls[1:]] == [
            (WATCH, Status.CANCELLED), (UNKNOWN_METHOD, Status.UNIMPLEMENTED),
        ]
        assert 0.1 < calls[0][2] < 5  # the deadline the client sent, as the server's clock measures it
        await asyncio.sleep(0.1)
        assert len(calls) == 3  # the cancelled handler ending later is not a second end


async def test_streams_still_running_at_shutdown_are_observed_unavailable():
    calls: list[tuple[str, Status, float]] = []
    server = GrpcServer(observer=lambda method, code, seconds, ended: calls.append((method, code, seconds)))
    servicer = Servicer()
    server.add(service_methods(HEALTH, servicer))
    port = await server.bind("127.0.0.1", 0)
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(Check(service=""))
        await watch.read()
        await servicer.watching.wait()
        await server.stop(grace=0)
        assert [(method, code) for method, code, _ in calls] == [(WATCH, Status.UNAVAILABLE)]
        with pytest.raises(grpc.aio.AioRpcError):
            await watch.read()


async def test_a_server_without_an_observer_serves_as_before():
    server = GrpcServer()
    server.add(service_methods(HEALTH, Servicer()))
    port = await server.bind("127.0.0.1", 0)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            response = await health_pb2_grpc.HealthStub(channel).Check(Check(service=""), timeout=5)
        assert response.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await server.stop(grace=0)
