"""bascule's client retries UNAVAILABLE (no metadata leader yet, leadership moving) with backoff,
and gives up on other errors at once. The server here is a grpc.aio stand-in for a node whose
metadata leader is briefly unknown."""

import time

import grpc
import pytest

from bascule.client import BasculeError, Client
from bascule.wire.pb import api_pb2, api_pb2_grpc

pytestmark = pytest.mark.anyio


class FlakyAPI(api_pb2_grpc.APIServicer):
    def __init__(self, failures: int, code: grpc.StatusCode) -> None:
        self.failures, self.code, self.calls = failures, code, []

    async def DeleteStream(self, request, context):
        self.calls.append(time.monotonic())
        if len(self.calls) <= self.failures:
            await context.abort(self.code, "no known metadata leader")
        return api_pb2.DeleteStreamResponse()


async def serve(api: FlakyAPI) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    api_pb2_grpc.add_APIServicer_to_server(api, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def test_unavailable_is_retried_with_growing_pauses_until_it_succeeds():
    api = FlakyAPI(3, grpc.StatusCode.UNAVAILABLE)
    server, address = await serve(api)
    try:
        async with Client(address, timeout=5) as client:
            await client.delete_stream("s")
        assert len(api.calls) == 4
        pauses = [b - a for a, b in zip(api.calls, api.calls[1:])]
        assert pauses[-1] > pauses[0]
    finally:
        await server.stop(None)


async def test_unavailable_past_the_timeout_and_other_errors_are_raised():
    api = FlakyAPI(1000, grpc.StatusCode.UNAVAILABLE)
    server, address = await serve(api)
    try:
        async with Client(address, timeout=0.5) as client:
            with pytest.raises(BasculeError) as failed:
                await client.delete_stream("s")
        assert failed.value.code == grpc.StatusCode.UNAVAILABLE and len(api.calls) > 1
    finally:
        await server.stop(None)
    api = FlakyAPI(1, grpc.StatusCode.NOT_FOUND)
    server, address = await serve(api)
    try:
        async with Client(address, timeout=5) as client:
            with pytest.raises(BasculeError):
                await client.delete_stream("s")
        assert len(api.calls) == 1
    finally:
        await server.stop(None)
