"""Log compaction on a real 3-node cluster: a follower that was down while its leader compacted
catches up across the leader's gaps, stores them as they are, and compacts on its own."""

from __future__ import annotations

import grpc
import pytest
from cluster_checks import ALL_NODES, FAST, leader_index, partition_dir, read_node, wait_for

from bascule.client import Client
from bascule.partition.log import CommitLog
from bascule.partition.log.compaction import CLEANER_CHECKPOINT
from bascule.testing.local import LocalCluster
from bascule.wire.pb import api_pb2, api_pb2_grpc

pytestmark = [pytest.mark.anyio, pytest.mark.cluster, pytest.mark.timeout(120)]

CONFIG = {
    **FAST,
    "clustering.min.insync.replicas": 1,
    "streams.cleaner.interval": "200ms",
    "streams.compact.enabled": True,
}


async def test_a_follower_back_from_an_outage_stores_the_compacted_leaders_gaps_and_compacts_too() -> None:
    with LocalCluster(3, config=CONFIG) as cluster:
        async with grpc.aio.insecure_channel(cluster.brokers[0]) as channel:
            await api_pb2_grpc.APIStub(channel).CreateStream(api_pb2.CreateStreamRequest(
                name="kv", subject="kv", replicationFactor=3, segmentMaxBytes=api_pb2.NullableInt64(value=300),
            ), timeout=10)
        leader = await leader_index(cluster, "kv")
        follower = next(index for index in ALL_NODES if index != leader)
        latest: dict[bytes, tuple[int, bytes]] = {}
        async with Client(cluster.node(leader).address) as client:
            await wait_for(lambda: client.publish("kv", b"a-first", key=b"a", ack_policy="all"), 15, "a first ack")
            for key in (b"b", b"c"):  # the first round reaches every replica
                await client.publish("kv", key + b"-first", key=key, ack_policy="all")
            await wait_for(
                lambda: _holds(cluster.node(follower).address, 3), 15, "the follower holding the first round"
            )
            cluster.kill(follower)
            for round_number in range(12):
                for key in (b"a", b"b", b"c"):
                    value = key + str(round_number).encode()
                    ack = await client.publish("kv", value, key=key, ack_policy="leader")
                    latest[key] = (ack.offset, value)
            keyless = [(await client.publish("kv", b"end")).offset for _ in range(3)]
        expected = sorted([(offset, key, value) for key, (offset, value) in latest.items()]
                          + [(offset, b"", b"end") for offset in keyless])
        leader_address = cluster.node(leader).address
        await wait_for(lambda: _reads(leader_address, expected), 30, "the leader compacted")

        cluster.restart(follower)
        follower_address = cluster.node(follower).address
        # It kept its first round (0..2), fetched across the gap after it, then compacted those away.
        await wait_for(lambda: _reads(follower_address, expected), 30, "the follower caught up and compacted")
        cluster.node(follower).stop()
        directory = partition_dir(cluster, follower, "kv")
        assert (directory / CLEANER_CHECKPOINT).exists()  # its own compaction
        with CommitLog.open(directory) as log:
            assert [(e.offset, e.key or b"", e.value) for e in log.read(log.oldest_offset, 1000)] == expected
            assert log.find_damage() is None


async def _holds(address: str, count: int) -> bool:
    return len(await read_node(address, "kv")) >= count


async def _reads(address: str, expected: list[tuple[int, bytes, bytes]]) -> bool:
    return [(m.offset, m.key, m.value) for m in await read_node(address, "kv")] == expected
