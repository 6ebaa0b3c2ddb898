"""The replication scenarios (../shared/reference/replication-scenarios.md), scripted on the
simulator's cluster: the real node code (partitions, leader and follower machines and their
appliers, the metadata service and its elections, maintenance) on virtual time, over the memory bus,
with the modelled metadata log and real commit logs.

Every scenario runs with the invariants checked throughout (``bascule.simulation.invariants``: no
acked entry lost or moved, one value per offset below the HW, leader HWs monotonic, one leadership
acking each offset), then heals, converges and checks that every acked entry is in the leader's log.
Entries lost only to power cuts of every ISR member holding them are exempt (ack means held in the
ISR's memory without fsync); the scenarios say when they expect that. Two-replica scenarios run on
three nodes: the metadata group keeps its majority with one of them down, as a real one needs.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bascule.metadata import levels
from bascule.metadata.election import Role
from bascule.node import partitions
from bascule.simulation.cluster import SimCluster, Violation, scenario

pytestmark = pytest.mark.timeout(60)


def followers(cluster: SimCluster, partition: int = 0) -> list[str]:
    current = cluster.metadata.state.partition("sim", partition)
    assert current is not None and current.leader is not None
    return sorted(set(current.replicas) - {current.leader})


async def acked(cluster: SimCluster, count: int, prefix: bytes = b"m") -> list[int]:
    """Publish ``count`` values one after the other; the offsets acked."""
    offsets = []
    for i in range(count):
        offset = await cluster.publish(0, b"%s%d" % (prefix, i))
        assert offset is not None, f"{prefix!r}{i} not acked: {cluster.describe()}"
        offsets.append(offset)
    return offsets


def registered(cluster: SimCluster, node: str) -> bool:
    """Whether the metadata knows the node's current incarnation (and so whether it is unclean)."""
    broker = cluster.metadata.state.brokers.get(node)
    return broker is not None and broker.incarnation == cluster.nodes[node].incarnation


def clean_in_isr(cluster: SimCluster, node: str, partition: int = 0) -> bool:
    """The node's current incarnation is in the ISR and not unclean: it caught up since it started."""
    current = cluster.metadata.state.partition("sim", partition)
    return registered(cluster, node) and current is not None and node in current.isr and node not in current.unclean


def unclean(cluster: SimCluster) -> set[str]:
    current = cluster.metadata.state.partition("sim", 0)
    return set() if current is None else set(current.unclean)


# -- Leader-epoch truncation (KIP-101) ---------------------------------------------------------


def test_s1_a_restarted_follower_keeps_acked_entries_and_leads_with_them() -> None:
    """B restarts holding m0, m1 with a HW that may lag; it truncates through the leader's epoch
    end, not its HW, catches up (clean again), and when A dies B leads with both."""
    async def script(cluster: SimCluster) -> None:
        assert await acked(cluster, 2) == [0, 1]
        a, (b,) = cluster.leader(), followers(cluster)
        cluster.kill(b)
        cluster.nodes[b].start()
        await cluster.until("B to catch up and be clean again", lambda: clean_in_isr(cluster, b))
        cluster.kill(a)
        await cluster.until("B to lead", lambda: cluster.leader() == b and cluster.leading_replica(0) is not None)
        assert await cluster.publish(0, b"m2") == 2

    scenario(script, nodes=3, replication_factor=2, min_isr=1)


def test_s2_both_killed_the_first_back_waits_for_the_other_and_the_logs_agree() -> None:
    """A holds m1 that B lacks when both die. B, back first, is unclean and alone: it is not elected
    while A, which may hold more that was acked, is down. Once A is back the longer log leads and
    the replicas converge on one history."""
    async def script(cluster: SimCluster) -> None:
        await acked(cluster, 1)
        a, (b,) = cluster.leader(), followers(cluster)
        cluster.bus.partition({a}, {b})
        cluster.write(0, b"m1-on-A-only")
        await asyncio.sleep(0.1)
        cluster.kill(a)
        cluster.kill(b)
        cluster.heal_network()
        cluster.nodes[b].start()
        await asyncio.sleep(5.0)
        assert cluster.leading_replica(0) is None, "an unclean replica was elected alone"
        cluster.nodes[a].start()
        await cluster.until("a leader", lambda: cluster.leading_replica(0) is not None)

    scenario(script, nodes=3, replication_factor=2, min_isr=1)


def test_s2_an_entry_committed_but_lost_unsynced_on_one_replica_does_not_diverge() -> None:
    """m0..m4 committed on A and B; B loses power (its unsynced log is gone) while A is killed
    (A keeps its log). B is not elected with its lossy log; A's return brings everything back."""
    async def script(cluster: SimCluster) -> None:
        await acked(cluster, 5)
        a, (b,) = cluster.leader(), followers(cluster)
        cluster.kill(a)
        cluster.power_cut(b)
        cluster.nodes[b].start()
        await asyncio.sleep(5.0)
        assert cluster.leading_replica(0) is None
        cluster.nodes[a].start()
        await cluster.until("a leader", lambda: cluster.leading_replica(0) is not None)
        assert cluster.invariants.exempt_acks == 0

    scenario(script, nodes=3, replication_factor=2, min_isr=1)


# -- Cluster faults ----------------------------------------------------------------------------


@pytest.mark.parametrize("sync", ["always", "never"])
def test_last_replica_standing_loses_nothing_acked_under_sync_always(sync: str) -> None:
    """The ISR shrinks to the leader alone, which then loses power. Under "always" nothing acked is
    lost; under "never" what it had not synced goes with it, and only that (exempt) is lost."""
    async def script(cluster: SimCluster) -> None:
        await acked(cluster, 3)
        a, (b,) = cluster.leader(), followers(cluster)
        cluster.kill(b)
        await cluster.until("the ISR to shrink to the leader", lambda: set(
            cluster.metadata.state.partition("sim", 0).isr) == {a})
        await acked(cluster, 3, b"alone")
        cluster.power_cut(a)
        cluster.nodes[a].start()
        await cluster.until("a leader", lambda: cluster.leading_replica(0) is not None)

    # Three voters, so that the metadata keeps its majority with one node down; two replicas.
    cluster = scenario(script, nodes=3, replication_factor=2, min_isr=1, sync=sync)
    if sync == "always":
        assert cluster.invariants.exempt_acks == 0


def test_hard_bounce_of_the_leader_five_times_under_load() -> None:
    async def script(cluster: SimCluster) -> None:
        writer = asyncio.ensure_future(cluster.keep_writing())
        try:
            for _ in range(5):
                await cluster.until("a leader", lambda: cluster.leading_replica(0) is not None)
                await asyncio.sleep(0.5)
                leader = cluster.leader()
                assert leader is not None
                cluster.kill(leader)
                await asyncio.sleep(0.3)
                cluster.nodes[leader].start()
            await cluster.until("a leader", lambda: cluster.leading_replica(0) is not None)
            assert await cluster.publish(0, b"after") is not None
        finally:
            writer.cancel()

    cluster = scenario(script, nodes=3, min_isr=2)
    assert sum(len(acks) for acks in cluster.invariants.acked.values()) > 50


def test_a_follower_killed_and_restarted_under_load_rejoins_the_isr() -> None:
    async def script(cluster: SimCluster) -> None:
        writer = asyncio.ensure_future(cluster.keep_writing())
        try:
            await asyncio.sleep(1.0)
            follower = followers(cluster)[0]
            cluster.kill(follower)
            await asyncio.sleep(2.0)
            cluster.nodes[follower].start()
            await cluster.until("the follower back in the ISR, clean", lambda: clean_in_isr(cluster, follower))
        finally:
            writer.cancel()

    scenario(script, nodes=3, min_isr=2)


def test_metadata_leader_changes_lose_no_stream_isr_or_epoch() -> None:
    async def script(cluster: SimCluster) -> None:
        writer = asyncio.ensure_future(cluster.keep_writing())
        try:
            before = cluster.metadata.state.partition("sim", 0)
            for _ in range(4):
                cluster.metadata.move_leader()
                await cluster.until("a metadata leader", lambda: cluster.metadata.leader is not None)
                await asyncio.sleep(0.5)
            after = cluster.metadata.state.partition("sim", 0)
            assert after is not None and before is not None and after.leader_epoch >= before.leader_epoch
        finally:
            writer.cancel()

    scenario(script, nodes=3, min_isr=2)


def test_a_zombie_leader_cut_off_never_acks_once_its_successor_can_be_elected() -> None:
    """The leader is cut off from the other nodes and the metadata, but not from its publisher.
    A new leader is elected; whatever the zombie acks must be by the one leader there was (the
    invariants' check of one leadership per offset), and once healed it truncates as a follower."""
    async def script(cluster: SimCluster) -> None:
        await acked(cluster, 3)
        zombie = cluster.leader()
        assert zombie is not None
        replica = cluster.leading_replica(0)
        cluster.isolate(zombie)
        late = [cluster.write(0, b"to-the-zombie-%d" % i, replica) for i in range(20)]
        assert any(late)
        await cluster.until("a new leader", lambda: cluster.leader() not in (None, zombie))
        await cluster.until("the new leader to take writes", lambda: cluster.leading_replica(0) is not None)
        await acked(cluster, 3, b"new")
        await asyncio.sleep(2.0)
        zombie_acks = [a for a in cluster.invariants.acked[("sim", 0)].values() if a.value.startswith(b"to-the-zombie")]
        assert zombie_acks == [], zombie_acks

    scenario(script, nodes=3, min_isr=2)


def test_a_minority_isr_never_acks_on_a_single_copy() -> None:
    async def script(cluster: SimCluster) -> None:
        await acked(cluster, 2)
        for follower in followers(cluster):
            cluster.kill(follower)
        assert await cluster.publish(0, b"alone", timeout=5.0) is None

    scenario(script, nodes=3, min_isr=2)


# -- Compound faults and eligibility (KIP-966) ---------------------------------------------------


def test_a_follower_that_lost_power_is_not_elected_while_the_leader_holding_its_acks_is_down() -> None:
    """The compound-faults issue's sequence: ISR {L, F1} (F2 down); F1 loses power while L's
    process dies; F1 and F2 restart first. F1's log lost acked entries: it must not lead until L,
    which holds them, is back."""
    async def script(cluster: SimCluster) -> None:
        leader = cluster.leader()
        assert leader is not None
        f1, f2 = followers(cluster)
        cluster.kill(f2)
        await cluster.until("F2 out of the ISR", lambda: f2 not in cluster.metadata.state.partition("sim", 0).isr)
        await acked(cluster, 20)
        cluster.power_cut(f1)
        cluster.kill(leader)
        cluster.nodes[f1].start()
        cluster.nodes[f2].start()
        await asyncio.sleep(6.0)
        current = cluster.metadata.state.partition("sim", 0)
        assert current is not None and current.leader in (leader, None) or cluster.leading_replica(0) is None
        cluster.nodes[leader].start()
        await cluster.until("a leader", lambda: cluster.leading_replica(0) is not None)
        assert cluster.invariants.exempt_acks == 0

    scenario(script, nodes=3, min_isr=1)


def test_two_nodes_down_at_once_lose_nothing_held_by_a_member_that_kept_power() -> None:
    async def script(cluster: SimCluster) -> None:
        await acked(cluster, 10)
        leader = cluster.leader()
        assert leader is not None
        follower = followers(cluster)[0]
        cluster.kill(leader)
        cluster.power_cut(follower)
        await asyncio.sleep(0.5)
        cluster.nodes[leader].start()
        cluster.nodes[follower].start()
        await cluster.until("a leader", lambda: cluster.leading_replica(0) is not None)
        assert cluster.invariants.exempt_acks == 0

    scenario(script, nodes=3, min_isr=2)


@pytest.mark.parametrize("fault", ["full", "fsync_error"])
def test_a_failing_disk_on_the_leader_moves_leadership(fault: str) -> None:
    async def script(cluster: SimCluster) -> None:
        await acked(cluster, 5)
        leader = cluster.leader()
        assert leader is not None
        streams = cluster.nodes[leader].data_dir / "streams"
        (cluster.disks.full if fault == "full" else cluster.disks.fsync_failing).add(streams)
        cluster.write(0, b"on-the-failing-disk")
        await cluster.until("another leader", lambda: cluster.leader() not in (None, leader), timeout=10.0)
        await cluster.until("the new leader to take writes", lambda: cluster.leading_replica(0) is not None)
        assert await cluster.publish(0, b"after") is not None

    scenario(script, nodes=3, min_isr=1, sync="always")


def test_a_broken_invariant_fails_the_scenario_with_its_trace() -> None:
    """The harness itself: an ack the log never held is caught."""
    async def script(cluster: SimCluster) -> None:
        await acked(cluster, 1)
        cluster.invariants.ack(("sim", 0), 5, b"never-written", "n0", 0)

    with pytest.raises(Violation, match="offset 5.*lost") as caught:
        scenario(script, nodes=3, replication_factor=2, min_isr=1)
    assert "trace:" in str(caught.value)


# -- Back-to-back elections (KIP-279) ------------------------------------------------------------


def test_back_to_back_elections_leave_tails_of_epochs_the_leader_never_saw_and_they_are_cut() -> None:
    """A leads, is cut off with entries only it holds; B leads, is cut off the same way; C leads.
    A and B then hold tails of epochs C never saw (A's ends where B's epoch began, B's where C's
    did): each truncates, in as many epoch lookups as it takes, and all three converge."""
    async def script(cluster: SimCluster) -> None:
        await acked(cluster, 3)
        for round_ in range(2):
            cut_off = cluster.leader()
            assert cut_off is not None
            replica = cluster.leading_replica(0)
            cluster.isolate(cut_off)
            for i in range(5):
                cluster.write(0, b"only-on-%s-%d" % (cut_off.encode(), i), replica)
            await cluster.until("another leader", lambda old=cut_off: cluster.leader() not in (None, old))
            await cluster.until("it to take writes", lambda: cluster.leading_replica(0) is not None)
            await acked(cluster, 3, b"round-%d-" % round_)
            cluster.heal_network()
            await asyncio.sleep(0.5)

    scenario(script, nodes=3, min_isr=1, seed=3)


def test_control_a_leader_resuming_its_old_epoch_after_a_power_cut_is_caught(monkeypatch) -> None:
    """The harness catches a broken rule: a leader that resumes its leader epoch after losing its
    unsynced log (instead of handing it back) writes new entries where its followers hold acked ones."""
    def resuming(leader: str | None, leader_incarnation: str, replica_id: str, incarnation: str) -> Role:
        return Role.LEAD if leader == replica_id else Role.FOLLOW

    monkeypatch.setattr(partitions, "replica_role", resuming)

    async def script(cluster: SimCluster) -> None:
        await acked(cluster, 10)
        leader = cluster.leader()
        assert leader is not None
        cluster.power_cut(leader)
        cluster.nodes[leader].start()
        for i in range(10):
            await cluster.publish(0, b"after-%d" % i, timeout=1.0)

    with pytest.raises(Violation):
        scenario(script, nodes=3, min_isr=2)


def test_a_witness_that_lost_power_after_its_report_is_not_elected_on_its_old_position() -> None:
    """Found by the simulator (seed 5389 at 14 faults). L dies; F1 reports it with its whole log,
    then loses power and comes back unregistered; F2, which lost power too, comes back and reports
    L, completing the quorum. An election on the positions the reports carried would pick F1 (clean
    as far as the metadata knew) and drop L, the one holding every ack, from the ISR; positions
    gathered at the quorum come only from registered incarnations, and the partition waits for L."""
    async def script(cluster: SimCluster) -> None:
        await acked(cluster, 20)
        leader = cluster.leader()
        assert leader is not None
        f1, f2 = followers(cluster)
        bystander = sorted(set(cluster.nodes) - {leader, f1, f2})[0]
        cluster.metadata.move_leader(to=bystander)
        cluster.kill(leader)
        cluster.power_cut(f2)
        await asyncio.sleep(1.5)  # F1's report of L is in: one witness of two
        cluster.nodes[f2].start()
        await cluster.until("F2 registered", lambda: registered(cluster, f2))  # it reports L a second later
        cluster.power_cut(f1)
        cluster.nodes[f1].start()
        cluster.bus.partition({f1}, set(cluster.nodes) - {f1})  # its new incarnation cannot register
        await asyncio.sleep(3.0)  # F2's report completes the quorum
        current = cluster.metadata.state.partition("sim", 0)
        assert current is not None and current.leader == leader and leader in current.isr, cluster.describe()
        cluster.heal_network()
        cluster.nodes[leader].start()

    cluster = scenario(script, nodes=5, replication_factor=3, min_isr=1)
    assert cluster.invariants.exempt_acks == 0


# -- Batched elections (issue 32) ----------------------------------------------------------------


async def kill_the_busiest_leader(cluster: SimCluster, spared: str | None = None) -> tuple[str, list[int], int]:
    """Kill the node leading most partitions (not ``spared``), after moving the metadata leadership off
    it, once every partition took a write; it, the partitions it led, and the metadata's commit index
    before the kill. Returns once every partition is led again by a live replica."""
    for partition in range(cluster.partitions):
        assert await cluster.publish(partition, b"before-%d" % partition) is not None
    led = {p: cluster.leader(p) for p in range(cluster.partitions)}
    victim = max(set(led.values()) - {spared}, key=list(led.values()).count)
    mine = [p for p, leader in led.items() if leader == victim]
    if cluster.metadata.leader == victim:
        cluster.metadata.move_leader(to=sorted(set(cluster.nodes) - {victim})[0])
    first = cluster.metadata.commit_index
    cluster.kill(victim)
    await cluster.until(
        "every partition led again",
        lambda: all(cluster.leader(p) != victim and cluster.leading_replica(p) is not None
                    for p in range(cluster.partitions)),
        timeout=2.0,
    )
    return victim, mine, first


def changed_per_command(cluster: SimCluster, first: int, field: str) -> list[int]:
    """For each command committed after index ``first`` that changed any, how many partitions' ``field``
    (``leader_epoch``: elections; ``epoch``: any change) it changed."""
    states = cluster.metadata.states[first:]
    counts = [
        sum(getattr(after.partition("sim", p), field) != getattr(before.partition("sim", p), field)
            for p in range(cluster.partitions))
        for before, after in zip(states, states[1:])
    ]
    return [count for count in counts if count]


def test_a_killed_node_leading_many_partitions_is_replaced_in_every_one_by_batched_elections() -> None:
    """The node leading a third of 24 partitions dies: the survivors report their silent leaders in
    batches, and the metadata leader elects several partitions per ChangeLeaders command, each by the
    election rules; within a leader timeout and a second every partition is led again, and writes
    acked before the kill are still there (the invariants)."""
    async def script(cluster: SimCluster) -> None:
        victim, mine, first = await kill_the_busiest_leader(cluster)
        assert len(mine) == 8
        elected = changed_per_command(cluster, first, "leader_epoch")
        assert sum(elected) == len(mine) and max(elected) > 1, elected
        for partition in mine:
            assert await cluster.publish(partition, b"after-%d" % partition) is not None
        cluster.nodes[victim].start()

    scenario(script, nodes=3, partitions=24, min_isr=2)


def test_a_killed_nodes_partitions_are_shared_by_the_survivors() -> None:
    """Issue 32: every tie of a batch of elections went to the survivor with the smallest id, which took
    all of the dead node's partitions at once. Idle partitions tie: each goes to the survivor leading
    fewest, counting the batch's own."""
    async def script(cluster: SimCluster) -> None:
        victim, mine, _ = await kill_the_busiest_leader(cluster)
        assert len(mine) == 8
        took = sorted(cluster.leader(partition) for partition in mine)
        survivors = sorted(set(cluster.nodes) - {victim})
        assert took == sorted(survivors * 4), took
        cluster.nodes[victim].start()

    scenario(script, nodes=3, partitions=24, min_isr=2)


def test_while_a_voter_states_the_oldest_metadata_level_each_election_and_isr_change_is_its_own_command() -> None:
    """A node restarted stating metadata level 0, as a node of a version before ChangeLeaders and
    ChangeIsrs does (metadata.levels): when the node leading most partitions dies, the metadata
    leader proposes every election and every ISR change alone (ChangeLeader, ChangeIsr), which that
    version knows; every partition is led again as quickly, and nothing acked is lost. Once that node
    restarts stating this version's level, the next failover is batched again."""
    async def restart_stating(cluster: SimCluster, node: str, level: int) -> None:
        cluster.kill(node)
        cluster.nodes[node].metadata_level = level
        cluster.nodes[node].start()
        await cluster.until("every partition led, every node clean in its ISR", lambda: all(
            cluster.leading_replica(p) is not None and all(clean_in_isr(cluster, n, p) for n in cluster.nodes)
            for p in range(cluster.partitions)
        ))

    async def script(cluster: SimCluster) -> None:
        old = sorted(cluster.nodes)[-1]
        await restart_stating(cluster, old, 0)
        victim, mine, first = await kill_the_busiest_leader(cluster, spared=old)
        assert len(mine) >= 8
        await cluster.until("the ISRs without the dead node", lambda: all(
            victim not in cluster.metadata.state.partition("sim", p).isr for p in range(cluster.partitions)
        ))
        assert sum(changed_per_command(cluster, first, "leader_epoch")) == len(mine)
        assert set(changed_per_command(cluster, first, "epoch")) == {1}
        for partition in mine:
            assert await cluster.publish(partition, b"after-%d" % partition) is not None
        cluster.nodes[victim].start()
        await restart_stating(cluster, old, levels.LEVEL)
        _, mine, first = await kill_the_busiest_leader(cluster)
        assert max(changed_per_command(cluster, first, "leader_epoch")) > 1

    scenario(script, nodes=3, partitions=24, min_isr=2)


def test_a_node_that_sees_a_stream_deleted_and_created_again_at_once_opens_the_new_one() -> None:
    """A node cut off from the metadata while a stream is deleted and created again learns both in one
    reconcile: its replica of the old stream is closed and its files go (found by the nemesis: the
    replica was kept, its directory removed under it as unassigned); it opens the new stream's."""
    async def script(cluster: SimCluster) -> None:
        await acked(cluster, 2)
        leader = cluster.metadata.leader
        assert leader is not None
        lagging = sorted(set(cluster.nodes) - {leader})[0]
        core = cluster.nodes[leader].core
        assert core is not None

        def replica_directory() -> object:
            node_core = cluster.nodes[lagging].core
            local = node_core.partitions.get("other", 0) if node_core is not None else None
            return None if local is None or not local.started else local.replica.log.directory

        async def create() -> int:
            await core.metadata.call("create_stream", name="other", subject="other", group="",
                                     replication_factor=3, partitions=1, settings={})
            return cluster.metadata.state.streams["other"].created

        await create()
        await cluster.until("the replica of the first stream", lambda: replica_directory() is not None)
        old_directory = replica_directory()
        cluster.metadata.cut(lagging)
        await core.metadata.call("delete_stream", name="other")
        created = await create()
        cluster.metadata.reconnect()
        await cluster.until(
            "the replica of the new stream",
            lambda: replica_directory() is not None and f"@{created}" in str(replica_directory()),
        )
        new_directory = replica_directory()
        assert isinstance(new_directory, Path) and new_directory.is_dir()
        assert isinstance(old_directory, Path) and not old_directory.exists()
        node_core = cluster.nodes[lagging].core
        assert node_core is not None and node_core.partitions.get("other", 0).replica.failed is None

    scenario(script, nodes=3)


def test_isr_changes_and_elections_walk_no_data_directory(monkeypatch) -> None:
    """Issue 32: a node listed its data directory (and built every assigned partition's path) at each
    reconcile, so after each metadata command, 0.2-0.3 s of CPU at 10,000 partitions. Now only what is
    assigned changing walks it: here each node's start and the stream's creation, not an ISR change or
    an election."""
    walks: list[str] = []
    real = partitions.Partitions._remove_unassigned_directories

    def counted(self, assigned):
        walks.append(self.server_id)
        return real(self, assigned)

    monkeypatch.setattr(partitions.Partitions, "_remove_unassigned_directories", counted)

    async def script(cluster: SimCluster) -> None:
        await acked(cluster, 2)
        leader, follower = cluster.leader(), followers(cluster)[0]
        survivors = set(cluster.nodes) - {follower}
        before = {node: walks.count(node) for node in survivors}
        cluster.kill(follower)
        await cluster.until("the ISR to shrink", lambda: follower not in cluster.metadata.state.partition("sim", 0).isr)
        cluster.kill(leader)
        await cluster.until("another leader", lambda: cluster.leader() not in (None, leader)
                            and cluster.leading_replica(0) is not None)
        assert {node: walks.count(node) for node in survivors - {leader}} == {
            node: count for node, count in before.items() if node != leader}

    scenario(script, nodes=5, min_isr=1)
