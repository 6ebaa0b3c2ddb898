"""Crash safety on a real 3-node cluster (issue 10): a stream recreated while a replica is down, the
partition leader losing power and coming back within the leader timeout (five times), and KIP-101's
first scenario (a follower restarts, then the leader dies before the follower fetched again).

The checks are those of test_cluster_faults.py: every message acked under ALL is readable at its
offset, offsets are contiguous, and the replicas agree entry for entry in their files.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from cluster_checks import (
    ALL_NODES,
    FAST,
    agreed_partition,
    check_live,
    converged,
    create_stream,
    index_of,
    leader_epochs,
    leader_index,
    new_leader,
    publish_all_acked,
    read_node,
    restart,
    running_publisher,
    stop_and_check_files,
    wait_for,
)

from bascule.client import Client
from bascule.testing.local import LocalCluster
from bascule.testing.powercut import fuse_unavailable_reason

pytestmark = [pytest.mark.anyio, pytest.mark.cluster, pytest.mark.timeout(180)]


@pytest.fixture
def needs_fuse() -> None:
    reason = fuse_unavailable_reason()
    if reason is not None:
        pytest.skip(f"power cuts need a FUSE mount: {reason}")


async def test_recreated_stream_never_serves_the_deleted_ones_entries_on_a_returning_replica() -> None:
    """Delete a stream and create one of the same name while a replica is down: when it returns it
    holds only the new stream's entries, and the old stream's files are gone from its disk."""
    with LocalCluster(3, config=FAST) as cluster:
        await create_stream(cluster, "reborn")
        await publish_all_acked(cluster, "reborn", [b"old-%d" % i for i in range(5)])
        leader = await leader_index(cluster, "reborn")
        down = next(i for i in ALL_NODES if i != leader)
        cluster.kill(down)
        live = [i for i in ALL_NODES if i != down]
        async with Client(cluster.node(live[0]).address) as client:
            await client.delete_stream("reborn")
            await client.create_stream("reborn", "reborn.in", replication_factor=3, min_isr=2)
        acked = await publish_all_acked(cluster, "reborn", [b"new-%d" % i for i in range(5)])

        await restart(cluster, down)
        await wait_for(lambda: converged(cluster, "reborn", ALL_NODES), 25,
                       f"{cluster.node(down).server_id} to join the new stream's ISR", cluster)
        acked.update(await publish_all_acked(cluster, "reborn", [b"later-%d" % i for i in range(5)]))
        returned = [m.value for m in await read_node(cluster.node(down).address, "reborn")]
        assert returned == [b"new-%d" % i for i in range(5)] + [b"later-%d" % i for i in range(5)], returned
        await check_live(cluster, "reborn", acked)
        stop_and_check_files(cluster, {"reborn": acked})
        incarnations = sorted(p.name for p in (cluster.node(down).stored_dir / "streams").glob("reborn@*"))
        assert len(incarnations) == 1, f"the deleted stream's files are still on the returning replica: {incarnations}"


# Failure detection slower than a restart: the leader is back before anyone reports it, which is
# the case where it used to resume its old epoch over a log that had lost its unsynced tail.
SLOW_DETECTION = {**FAST, "clustering.replica.max.leader.timeout": "20s", "clustering.replica.max.lag.time": "20s"}


async def test_leader_power_cut_and_quick_restart_five_times_loses_no_acked_message(needs_fuse) -> None:
    bounces = 5
    with LocalCluster(3, config=SLOW_DETECTION, power_cuts=True) as cluster:
        await create_stream(cluster, "powerbounce")
        async with running_publisher(cluster, "powerbounce", batch=20) as load:
            await load.wait_acks(5, 10)
            cuts = []
            for _ in range(bounces):
                old = await leader_index(cluster, "powerbounce")
                old_id = cluster.node(old).server_id
                led = max(epoch for epoch, _ in leader_epochs(cluster, old, "powerbounce"))
                cuts.append(await asyncio.to_thread(cluster.power_cut, old))
                cut_at = time.monotonic()
                await restart(cluster, old)
                back_after = time.monotonic() - cut_at
                await leader_epoch_after(cluster, "powerbounce", led)
                await wait_for(lambda: converged(cluster, "powerbounce", ALL_NODES), 40,
                               f"{old_id} to rejoin the ISR after its power cut", cluster)
                await load.wait_acks(3, 15)
                print(f"power cut of {old_id}: back in {back_after:.1f} s, dropped {cuts[-1]}")
        final = await leader_index(cluster, "powerbounce")
        epochs = leader_epochs(cluster, final, "powerbounce")
        print(f"power-cut bounce: {len(load.acked)} acked, {load.failures} failed batches {dict(load.errors)}; "
              f"leader epochs {epochs}")
        assert not load.conflicts, load.conflicts
        assert sum(cut["bytes_dropped"] for cut in cuts) > 0, f"the cuts dropped nothing: {cuts}"
        assert len(epochs) >= bounces + 1, epochs
        await check_live(cluster, "powerbounce", load.acked)
        stop_and_check_files(cluster, {"powerbounce": load.acked})


async def leader_epoch_after(cluster: LocalCluster, stream: str, led: int) -> None:
    """Until the partition is led under an epoch after `led` (by another node, or by the restarted
    one under a new epoch: never the old epoch resumed)."""

    async def moved_on():
        info = await converged(cluster, stream, [i for i in ALL_NODES if cluster.node(i).running])
        epochs = leader_epochs(cluster, index_of(cluster, info.leader), stream) if info is not None else []
        return bool(epochs) and epochs[-1][0] > led

    await wait_for(moved_on, 40, f"{stream}: a leader epoch after {led}", cluster)


async def test_kip101_s1_a_restarted_follower_keeps_what_it_had_when_the_leader_dies_next() -> None:
    """KIP-101 S1: the follower fetched the last entries but its HW excludes them; it restarts, and the
    leader dies before the follower fetched again. Truncating to its own HW would drop acked entries."""
    config = {**FAST, "clustering.replica.max.lag.time": "20s"}  # the follower stays in the ISR while down
    with LocalCluster(3, config=config) as cluster:
        await create_stream(cluster, "s1", min_isr=1)
        async with running_publisher(cluster, "s1", batch=20) as load:
            await load.wait_acks(10, 10)
            leader = await leader_index(cluster, "s1")
            follower = next(i for i in ALL_NODES if i != leader)
            cluster.kill(follower)
            await restart(cluster, follower)
            cluster.kill(leader)
            await new_leader(cluster, "s1", [i for i in ALL_NODES if i != leader], cluster.node(leader).server_id)
            await load.wait_acks(3, 15)
            await restart(cluster, leader)
            await wait_for(lambda: converged(cluster, "s1", ALL_NODES), 30, "the old leader to rejoin", cluster)
            await load.wait_acks(3, 10)
        print(f"KIP-101 S1: {len(load.acked)} acked, {load.failures} failed batches {dict(load.errors)}")
        assert not load.conflicts, load.conflicts
        await check_live(cluster, "s1", load.acked)
        stop_and_check_files(cluster, {"s1": load.acked})


async def test_a_follower_that_lost_power_is_not_elected_while_the_leader_holding_its_acks_is_down(needs_fuse) -> None:
    """Issue 25's compound fault: ISR {L, F1} (F2 down), `sync: never`. F1 loses power and L's
    process dies at the same moment; F1 comes back first with a log that lost its unsynced tail,
    still in the ISR. Electing it would lose acked messages (L would truncate to it on return), so
    the partition waits for L; L's log (it kept power) holds them all. Five nodes, so that Raft keeps
    a majority with two of them down."""
    with LocalCluster(5, config=FAST, power_cuts=True) as cluster:
        async with Client(cluster.brokers[0]) as client:
            await client.create_stream("elr", "elr.in", replication_factor=3, min_isr=2)
        info = await wait_for(lambda: agreed_partition(cluster, "elr", list(range(5))), 15, "elr: a leader", cluster)
        followers = sorted(set(info.replicas) - {info.leader})
        leader, follower, other = (index_of(cluster, r) for r in [info.leader, *followers])
        replicas = sorted([leader, follower, other])
        bystanders = [i for i in range(5) if i not in replicas]
        async with running_publisher(cluster, "elr", batch=20) as load:
            await load.wait_acks(5, 10)
            cluster.kill(other)
            await wait_for(lambda: isr_is(cluster, "elr", [leader, follower]), 15, "F2 to leave the ISR", cluster)
            await load.wait_acks(20, 15)
            cluster.kill(leader)
            cut = await asyncio.to_thread(cluster.power_cut, follower)
            acked_before_faults = dict(load.acked)
            await restart(cluster, follower)
            # Long enough for F1's reports of L to reach the quorum (1 of 1) several times over.
            await asyncio.sleep(4)
            info = await wait_for(lambda: agreed_partition(cluster, "elr", [follower, *bystanders]), 10,
                                  "the live nodes to agree on elr", cluster)
            assert info.leader == cluster.node(leader).server_id, f"elected with a lossy log: {info}"
            async with Client(cluster.node(bystanders[0]).address) as client:
                [status] = await client.partitions("elr", metadata_only=True)
            assert status["unclean"] == [cluster.node(follower).server_id], status
            await restart(cluster, leader)
            await restart(cluster, other)
            await wait_for(lambda: converged(cluster, "elr", replicas), 40, "the replicas to converge", cluster)
            await load.wait_acks(5, 15)
        print(f"power cut of F1 while L died: dropped {cut}; {len(load.acked)} acked, {load.failures} failed batches")
        assert cut["bytes_dropped"] > 0, f"the cut dropped nothing: {cut}"
        assert not load.conflicts, load.conflicts[:5]
        assert set(acked_before_faults) <= set(load.acked)
        await check_live(cluster, "elr", load.acked, replicas)


async def isr_is(cluster: LocalCluster, stream: str, indexes: list[int]) -> bool:
    info = await agreed_partition(cluster, stream, indexes)
    return info is not None and sorted(info.isr) == sorted(cluster.node(i).server_id for i in indexes)
