"""With a Raft password, the embedded NATS server keeps clients without the node's credentials off
the node-to-node subjects (issue 27), and leaves them every other subject: publishers without
credentials still reach the streams."""

from __future__ import annotations

import asyncio

import grpc
import nats
import pytest
from conftest import running_node

from bascule.node import node as node_module
from bascule.testing.ports import free_port
from bascule.wire.pb import api_pb2, api_pb2_grpc

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


async def test_a_stranger_on_the_embedded_server_cannot_reach_the_namespace(tmp_path, monkeypatch) -> None:
    port = free_port()
    monkeypatch.setattr(node_module, "NATS_DEFAULT_PORT", port)
    async with running_node(tmp_path, **{"nats.embedded.config": "", "clustering.raft.password": "s3cret"}) as (
        node, address,
    ):
        errors: list[Exception] = []

        async def on_error(error: Exception) -> None:
            errors.append(error)

        stranger = await nats.connect(f"nats://127.0.0.1:{port}", error_cb=on_error)
        try:
            namespace = node.config.clustering.namespace
            overheard: list[bytes] = []

            async def overhear(msg) -> None:
                overheard.append(msg.data)

            await stranger.subscribe(f"{namespace}.>", cb=overhear)
            await stranger.publish(f"{namespace}.propagate", b"x")
            await stranger.flush()
            await asyncio.sleep(0.5)
            assert any("permissions violation" in str(error).lower() for error in errors), errors
            async with grpc.aio.insecure_channel(address) as channel:
                api = api_pb2_grpc.APIStub(channel)
                await api.CreateStream(api_pb2.CreateStreamRequest(subject="orders", name="orders"), timeout=10)
                await stranger.publish("orders", b"from a stranger")  # a plain publisher, as before
                await stranger.flush()
                request = api_pb2.SubscribeRequest(stream="orders", startPosition=api_pb2.StartPosition.EARLIEST)
                async with asyncio.timeout(10):
                    async for message in api.Subscribe(request):
                        if message.value:  # after Liftbridge's empty first message
                            assert message.value == b"from a stranger"
                            break
            assert overheard == []
        finally:
            await stranger.close()
