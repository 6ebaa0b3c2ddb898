"""The largest messages the API and NATS accept are replicated and committed (RF=3, ack ALL).

A stored entry is bigger than what was published (an entry header, the subject and reply headers),
so a plain NATS message of max_payload bytes, or a gRPC publish at the API's limit, used to make a
replication response larger than NATS carries: the partition stopped committing. Such entries now
travel in pieces. The API's limit is what still fits one NATS message once forwarded as an envelope
to a leader on another node."""

from __future__ import annotations

import re

import grpc
import nats
import pytest
from cluster_checks import ALL_NODES, FAST, converged, create_stream, leader_index, read_node, wait_for

from bascule.testing.local import LocalCluster
from bascule.wire.pb import api_pb2, api_pb2_grpc

pytestmark = [pytest.mark.anyio, pytest.mark.cluster, pytest.mark.timeout(120)]


async def publish(address: str, value: bytes, correlation_id: str) -> api_pb2.PublishResponse:
    request = api_pb2.PublishRequest(stream="big", value=value, ackPolicy=api_pb2.AckPolicy.ALL,
                                     correlationId=correlation_id)
    async with grpc.aio.insecure_channel(address, options=[("grpc.max_send_message_length", 1 << 24)]) as channel:
        return await api_pb2_grpc.APIStub(channel).Publish(request, timeout=20)


def value_for(size: int, correlation_id: str) -> bytes:
    """A value whose PublishRequest is exactly ``size`` bytes."""
    value = b"v" * size
    excess = api_pb2.PublishRequest(stream="big", value=value, ackPolicy=api_pb2.AckPolicy.ALL,
                                    correlationId=correlation_id).ByteSize() - size
    return b"v" * (size - excess)


async def test_messages_at_the_limit_are_replicated_through_grpc_and_plain_nats() -> None:
    with LocalCluster(3, config=FAST) as cluster:
        await create_stream(cluster, "big")
        leader = await leader_index(cluster, "big")
        other = next(i for i in ALL_NODES if i != leader)
        expected = []
        for index, name in ((leader, "leader"), (other, "follower")):
            address = cluster.node(index).address
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await publish(address, b"x" * (2 << 20), name)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            limit = int(re.search(r"limit of (\d+)", refused.value.details()).group(1))
            value = value_for(limit, name)
            response = await publish(address, value, name)
            assert response.ack.offset == len(expected), response
            expected.append(value)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await publish(address, value_for(limit + 1, name), name)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT

        nc = await nats.connect(cluster.nats.url)
        try:
            plain = b"p" * nc.max_payload
            await nc.publish("big.in", plain)
            expected.append(plain)
            await nc.flush()
        finally:
            await nc.close()

        async def all_have_everything():
            info = await converged(cluster, "big", ALL_NODES)
            return info is not None and info.high_watermark == len(expected) - 1

        await wait_for(all_have_everything, 30, "every replica to commit the big messages", cluster)
        for index in ALL_NODES:
            stored = await read_node(cluster.node(index).address, "big", timeout=20)
            assert [m.value for m in stored] == expected, f"node {index}"
        # The partition still commits small messages afterwards.
        assert (await publish(cluster.node(leader).address, b"small", "after")).ack.offset == len(expected)
