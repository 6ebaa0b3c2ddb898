"""SIGKILL of a real `bascule server` process under pipelined acked publishing, then restart."""

import asyncio

import grpc
import pytest

from bascule.client import Client
from bascule.testing.local import LocalNode
from bascule.wire.pb import api_pb2, api_pb2_grpc

pytestmark = pytest.mark.anyio


async def publish_until_killed(address: str, acked: dict[int, bytes]) -> None:
    """Pipelined PublishAsync with ack ALL; records each acked offset until the stream breaks."""
    sequence = 0
    async with grpc.aio.insecure_channel(address) as channel:
        stub = api_pb2_grpc.APIStub(channel)

        def requests():
            nonlocal sequence
            while True:
                sequence += 1
                yield api_pb2.PublishRequest(
                    stream="crash", value=b"value-%d" % sequence, correlationId=str(sequence),
                    ackPolicy=api_pb2.AckPolicy.ALL,
                )

        try:
            async for response in stub.PublishAsync(requests()):
                assert not response.HasField("asyncError"), response.asyncError.message
                acked[response.ack.offset] = b"value-" + response.correlationId.encode()
        except grpc.aio.AioRpcError:
            pass  # the server died mid-stream


@pytest.mark.parametrize("sync", ["never", "always"])
async def test_sigkill_loses_no_acked_message(tmp_path, sync):
    node = LocalNode(tmp_path / "node", embedded_nats=True, raft_bootstrap_seed=True,
                     config={"streams": {"sync": sync, "segment.max.bytes": 256 * 1024}})
    try:
        node.start()
        async with Client(node.address) as client:
            await client.create_stream("crash", "crash")
        acked: dict[int, bytes] = {}
        publisher = asyncio.create_task(publish_until_killed(node.address, acked))
        while len(acked) < 3000:
            await asyncio.sleep(0.05)
            assert not publisher.done(), "publisher stopped before the kill"
        node.kill()
        await asyncio.wait_for(publisher, 10)
        node.start()
        async with Client(node.address) as client:
            stored = [m async for m in client.subscribe("crash", start="earliest", stop_latest=True)]
    finally:
        node.kill()
    offsets = [m.offset for m in stored]
    assert offsets == list(range(len(stored))), "offsets are not contiguous from 0"
    by_offset = {m.offset: m.value for m in stored}
    missing = {o: v for o, v in acked.items() if by_offset.get(o) != v}
    assert not missing, f"{len(missing)} acked messages lost or changed, e.g. {list(missing.items())[:3]}"
    assert len(stored) >= len(acked)
