"""Power cuts of a real `bascule server` process: writes it had not fsynced are lost (LocalCluster.power_cut)."""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest

from bascule.client import Client
from bascule.testing.local import LocalCluster
from bascule.testing.powercut import fuse_unavailable_reason
from bascule.wire.pb import api_pb2, api_pb2_grpc

pytestmark = pytest.mark.anyio
log = logging.getLogger(__name__)
MARKER = b"published after the restart"


@pytest.fixture
def needs_fuse() -> None:
    reason = fuse_unavailable_reason()
    if reason is not None:
        pytest.skip(f"power-cut tests need a FUSE mount: {reason}")


async def publish_until_cut(address: str, ack_policy: int, acked: dict[int, bytes]) -> None:
    """Pipelined PublishAsync; records each acked offset until the server goes away."""
    sequence = 0
    async with grpc.aio.insecure_channel(address) as channel:
        stub = api_pb2_grpc.APIStub(channel)

        def requests():
            nonlocal sequence
            while True:
                sequence += 1
                yield api_pb2.PublishRequest(
                    stream="cut", value=b"value-%d" % sequence, correlationId=str(sequence), ackPolicy=ack_policy,
                )

        try:
            async for response in stub.PublishAsync(requests()):
                assert not response.HasField("asyncError"), response.asyncError.message
                acked[response.ack.offset] = b"value-" + response.correlationId.encode()
        except grpc.aio.AioRpcError:
            pass  # the server lost power mid-stream


async def publish_then_cut(cluster: LocalCluster, ack_policy: int, count: int) -> tuple[dict[int, bytes], dict]:
    """Create stream "cut", publish until `count` acks, cut node 0's power mid-stream, restart it."""
    async with Client(cluster.brokers[0]) as client:
        await client.create_stream("cut", "cut")
    acked: dict[int, bytes] = {}
    publisher = asyncio.create_task(publish_until_cut(cluster.brokers[0], ack_policy, acked))
    while len(acked) < count:
        await asyncio.sleep(0.02)
        assert not publisher.done(), "publisher stopped before the power cut"
    stats = await asyncio.to_thread(cluster.power_cut, 0)
    await asyncio.wait_for(publisher, 10)
    await asyncio.to_thread(cluster.restart, 0)
    return acked, stats


async def stored_after_restart(address: str) -> dict[int, bytes]:
    """The messages the restarted node holds. A marker published with ack ALL first: its ack waits
    until the partition is led again and its HW covers the recovered log, so reading up to it reads all."""
    async with Client(address) as client:
        marker = await client.publish("cut", MARKER, ack_policy="all")
        assert marker is not None
        stored = [m async for m in client.subscribe("cut", start="earliest", stop_offset=marker.offset)]
    assert [m.offset for m in stored] == list(range(marker.offset + 1)), "offsets are not contiguous from 0"
    assert stored[-1].value == MARKER
    return {m.offset: m.value for m in stored[:-1]}


@pytest.mark.parametrize("ack_policy", [api_pb2.AckPolicy.ALL, api_pb2.AckPolicy.LEADER], ids=["all", "leader"])
async def test_sync_always_keeps_every_acked_message(needs_fuse, tmp_path, ack_policy) -> None:
    config = {"streams": {"sync": "always", "segment.max.bytes": 256 * 1024}}
    with LocalCluster(1, base_dir=tmp_path, config=config, power_cuts=True) as cluster:
        acked, stats = await publish_then_cut(cluster, ack_policy, 1500)
        stored = await stored_after_restart(cluster.brokers[0])
    log.info("sync always, %d acked, %d stored after the cut; cut: %s", len(acked), len(stored), stats)
    missing = {offset: value for offset, value in acked.items() if stored.get(offset) != value}
    assert not missing, f"{len(missing)} acked messages lost or changed, e.g. {list(missing.items())[:3]}"


async def test_sync_never_loses_unsynced_messages_and_still_recovers(needs_fuse, tmp_path) -> None:
    config = {"streams": {"segment.max.bytes": 256 * 1024}}
    with LocalCluster(1, base_dir=tmp_path, config=config, power_cuts=True) as cluster:
        acked, stats = await publish_then_cut(cluster, api_pb2.AckPolicy.LEADER, 1500)
        stored = await stored_after_restart(cluster.brokers[0])
    lost = sum(1 for offset, value in acked.items() if stored.get(offset) != value)
    log.info("sync never: %d acked, %d stored after the cut, %d acked lost; cut: %s", len(acked), len(stored),
             lost, stats)
    print(f"sync never: {len(acked)} acked, {len(stored)} stored after the cut, {lost} acked lost; cut: {stats}")
    assert stats["bytes_dropped"] > 0, "the cut dropped nothing: nothing was written unsynced?"
    assert all(stored[offset] == acked[offset] for offset in stored if offset in acked), "a stored message changed"
