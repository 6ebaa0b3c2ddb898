"""A NATS cluster (one nats-server per node, LocalCluster(nats_cluster=True)) whose routes are cut (issue 25).

The metadata Raft group runs on its own TCP links, so a node whose nats-server is cut off from the others can
keep Raft leadership while the ISR changes and failure reports that travel over NATS cannot reach it: every
ack-ALL write then waits for the whole cut. These tests cut the metadata leader's server under an ack-ALL load,
with the partition led there or elsewhere (both need the metadata leader: an election, or an ISR shrink), and
check that writes resume during the cut and that nothing acked is lost.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from cluster_checks import (
    FAST,
    Publisher,
    check_live,
    create_stream,
    leader_index,
    raft_leader_index,
    raft_status,
    running_publisher,
    wait_for,
)
from pysyncobj.utility import TcpUtility

from bascule.testing.local import LocalCluster

pytestmark = [pytest.mark.anyio, pytest.mark.cluster, pytest.mark.timeout(90)]

# Writes stall 2.5-4.5 s at the cut (the cut leader's standing lapses, the metadata and the partition move).
CUT = 12.0
# Writes must flow again before the cut's last third: a leader that kept its leadership would stall them all.
RESUMED_WITHIN = 8.0
SAMPLE = 0.05


def _transfer_raft_leadership(cluster: LocalCluster, leader: int, target: int) -> None:
    node = cluster.node(leader)
    utility = TcpUtility(password=node.extra_env.get("BASCULE_RAFT_PASSWORD"), timeout=2)
    utility.executeCommand(node.raft_address, ["transfer", cluster.node(target).raft_address])


async def _make_raft_leader(cluster: LocalCluster, target: int) -> None:
    async def moved() -> bool:
        leader = await raft_leader_index(cluster)
        if leader is not None and leader != target:
            await asyncio.to_thread(_transfer_raft_leadership, cluster, leader, target)
            await asyncio.sleep(0.5)
        return leader == target

    await wait_for(moved, 20, f"node {target} to lead the metadata Raft group", cluster, interval=0.2)


async def _acks_during(load: Publisher, seconds: float) -> list[tuple[float, int]]:
    """(time since the start, batches acked so far), sampled for ``seconds``."""
    start = time.monotonic()
    samples = [(0.0, load.batches_acked)]
    while (elapsed := time.monotonic() - start) < seconds:
        await asyncio.sleep(SAMPLE)
        samples.append((elapsed, load.batches_acked))
    return samples


def _longest_stall(samples: list[tuple[float, int]]) -> float:
    """The longest time without a new ack, from the start to the end of the samples."""
    ack_times = [0.0] + [t for (t, n), (_, before) in zip(samples[1:], samples) if n > before] + [samples[-1][0]]
    return max(later - earlier for earlier, later in zip(ack_times, ack_times[1:]))


@pytest.mark.parametrize("partition_led_there", [True, False], ids=["partition-leader-cut", "partition-follower-cut"])
async def test_cutting_the_metadata_leaders_nats_routes_stalls_writes_only_briefly(partition_led_there: bool) -> None:
    with LocalCluster(3, config=FAST, nats_cluster=True) as cluster:
        assert cluster.routes is not None
        await create_stream(cluster, "cut")
        partition_leader = await leader_index(cluster, "cut")
        cut = partition_leader if partition_led_there else (partition_leader + 1) % 3
        await _make_raft_leader(cluster, cut)
        async with running_publisher(cluster, "cut") as load:
            await load.wait_acks(10, 15)
            cluster.routes.cut_server(cut)
            acked_before = len(load.acked)
            samples = await _acks_during(load, CUT)
            acked_during = len(load.acked) - acked_before
            raft_leader_at_the_end = await raft_leader_index(cluster)
            cluster.routes.heal()
            await load.wait_acks(10, 20)
        stall = _longest_stall(samples)
        late = samples[-1][1] - next(n for t, n in samples if t >= RESUMED_WITHIN)
        status = await asyncio.to_thread(raft_status, cluster, cut)
        print(f"metadata leader node-{cut} cut off from NATS for {CUT:.0f} s "
              f"({'partition leader' if partition_led_there else 'partition follower'} there): "
              f"{acked_during} acks during the cut, longest stall {stall:.2f} s, {late} batches acked after "
              f"{RESUMED_WITHIN:.0f} s; Raft leader at the end of the cut: node-{raft_leader_at_the_end} "
              f"(cut node's Raft state then {status and status.get('state')}); "
              f"{load.failures} failed batches {dict(load.errors)}")
        assert not load.conflicts, load.conflicts
        assert late > 0, f"writes did not resume within {RESUMED_WITHIN:.0f} s of the cut: stalled {stall:.2f} s"
        await check_live(cluster, "cut", load.acked, timeout=30)


async def test_a_nats_outage_that_reaches_every_node_leaves_a_metadata_leader_once_nats_is_back() -> None:
    """Every node loses its standing while NATS is down (no node leads the metadata); when NATS returns, the
    group elects a leader again and serves metadata requests."""
    with LocalCluster(3, config=FAST, nats_cluster=True) as cluster:
        await wait_for(lambda: raft_leader_index(cluster), 15, "a metadata leader", cluster)
        await asyncio.to_thread(cluster.restart_nats, 3.0)  # past the contact timeout
        back = time.monotonic()
        await wait_for(lambda: raft_leader_index(cluster), 15, "a metadata leader after the NATS outage", cluster)
        await create_stream(cluster, "after")
        print(f"NATS down 3 s: metadata leader and a new stream {time.monotonic() - back:.2f} s after NATS returned")
