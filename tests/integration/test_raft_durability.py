"""The metadata Raft's journal on a real 3-node cluster: every node killed at once, or losing power at once
(every write it had not fsynced dropped), comes back with the same metadata (bascule.metadata.journal;
its I/O is unit-tested in tests/unit/test_raft_journal.py)."""

from __future__ import annotations

import asyncio

import pytest
from cluster_checks import raft_leader_index, wait_for

from bascule.client import Client, Metadata
from bascule.testing.local import LocalCluster
from bascule.testing.powercut import fuse_unavailable_reason

pytestmark = [pytest.mark.anyio, pytest.mark.cluster, pytest.mark.timeout(120)]

STREAMS = {"durable-a": 3, "durable-b": 3, "durable-c": 1}  # name -> replication factor


async def metadata(cluster: LocalCluster, index: int) -> Metadata:
    async with Client(cluster.node(index).address, timeout=2.0) as client:
        return await client.fetch_metadata()


def placement(found: Metadata) -> dict[str, dict[int, list[str]]]:
    """What the journal decided: each stream's partitions and their replicas (leaders and ISRs may
    move after a restart)."""
    return {name: {pid: p.replicas for pid, p in info.partitions.items()} for name, info in found.streams.items()}


@pytest.mark.parametrize("fault", ["sigkill", "power_cut"])
async def test_metadata_survives_every_node_going_down_at_once(tmp_path, fault) -> None:
    power_cuts = fault == "power_cut"
    if power_cuts and (reason := fuse_unavailable_reason()) is not None:
        pytest.skip(f"power cuts need a FUSE mount: {reason}")
    with LocalCluster(3, base_dir=tmp_path, power_cuts=power_cuts) as cluster:
        async with Client(cluster.brokers[0]) as client:
            for name, replication_factor in STREAMS.items():
                await client.create_stream(name, f"{name}.in", replication_factor=replication_factor)
        before = placement(await metadata(cluster, 0))
        assert set(before) >= set(STREAMS)

        for index in range(len(cluster)):
            if power_cuts:
                print(f"node {index} power cut:", await asyncio.to_thread(cluster.power_cut, index))
            else:
                cluster.kill(index)
        for node in cluster.nodes:
            node.start(wait=False)
        await asyncio.to_thread(cluster.wait_ready)
        await wait_for(lambda: raft_leader_index(cluster), 15, "a metadata Raft leader", cluster)

        async def agreed() -> bool:
            found = [placement(await metadata(cluster, i)) for i in range(len(cluster))]
            return all(view == before for view in found)

        await wait_for(agreed, 15, "every node's metadata as it was before", cluster)
