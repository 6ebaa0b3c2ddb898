"""End-to-end faults on a real 3-node cluster (GitHub issue 3).

Each test starts a nats-server and three `bascule server` processes (LocalCluster), injects one fault
from /work/shared/reference/replication-scenarios.md, and then checks the invariants:

- every message acked under ALL is readable at the offset its ack named, with the same value;
- offsets are contiguous from 0;
- replicas are identical up to the smaller HW: live (Subscribe with readISRReplica on each node up
  to its HW) and, after a graceful stop, byte for byte in the segment files (CommitLog.open).

Timeouts are short (cluster_checks.FAST): a silent leader is reported after 1 s, a lagging follower
leaves the ISR after 2 s.

The last three tests pin bugs these faults once exposed (a follower loop that would not stop, a paused
leader acking in a dead epoch, a double election after a hung leader), two of them without a cluster.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from cluster_checks import (
    ALL_NODES,
    FAST,
    EnvelopePublisher,
    InvariantViolation,
    agreed_partition,
    check_acked,
    check_live,
    check_stored_logs,
    converged,
    create_stream,
    index_of,
    leader_epochs,
    leader_index,
    new_leader,
    publish_all_acked,
    publish_direct,
    raft_leader_index,
    read_node,
    read_stored_log,
    restart,
    running_observer,
    running_publisher,
    stop_and_check_files,
    views,
    wait_for,
)

from bascule.client import Client
from bascule.testing.local import LocalCluster
from bascule.wire.pb import api_pb2, api_pb2_grpc

pytestmark = [pytest.mark.anyio, pytest.mark.cluster, pytest.mark.timeout(90)]


# ---- 1. hard bounce -------------------------------------------------------------------------------------


async def test_hard_bounce_of_the_leader_under_ack_all_load() -> None:
    """SIGKILL the partition leader and restart it, four times, under a steady ack-ALL load."""
    bounces = 4
    with LocalCluster(3, config=FAST) as cluster:
        await create_stream(cluster, "bounce")
        async with (
            running_observer(cluster, "bounce") as reader,
            running_publisher(cluster, "bounce", batch=20) as load,
        ):
            await load.wait_acks(5, 10)
            outages = []
            for _ in range(bounces):
                old = await leader_index(cluster, "bounce")
                old_id = cluster.node(old).server_id
                cluster.kill(old)
                killed_at = time.monotonic()
                survivors = [i for i in ALL_NODES if i != old]
                await new_leader(cluster, "bounce", survivors, old_id)
                await load.wait_acks(3, 10)  # acks resume on two copies
                outages.append(round(time.monotonic() - killed_at, 2))
                await restart(cluster, old)
                # Back in the ISR before the next bounce: with a follower out, one more loss is fatal.
                await wait_for(lambda: converged(cluster, "bounce", ALL_NODES), 25,
                               f"{old_id} to rejoin the ISR", cluster)
                await load.wait_acks(3, 10)
        final = await leader_index(cluster, "bounce")
        epochs = leader_epochs(cluster, final, "bounce")
        print(f"hard bounce: {len(load.acked)} acked of {load.values_sent} sent, {load.failures} failed batches "
              f"{dict(load.errors)}; kill to acks resumed {outages} s; leader epochs {epochs}")
        assert not load.conflicts, load.conflicts
        # The client retries a publish the dead leader dropped; a failover within its deadline shows
        # only as a silence in the acks.
        assert load.longest_silence > 0.5, f"acks never paused ({load.longest_silence:.2f} s): no bounce hit the load"
        reader.check(await check_live(cluster, "bounce", load.acked))
        assert len(epochs) >= bounces + 1 and epochs[-1][0] >= bounces, epochs
        stop_and_check_files(cluster, {"bounce": load.acked})


async def test_a_rolling_restart_hands_leadership_over_and_loses_nothing_acked() -> None:
    """Controlled shutdown: SIGTERM each node in turn under a steady ack-ALL load. A stopping leader
    hands its partition to another ISR member first, so writes move at once (no leader timeout) and
    every acked message survives."""
    with LocalCluster(3, config=FAST) as cluster:
        await create_stream(cluster, "rolling")
        async with (
            running_observer(cluster, "rolling") as reader,
            running_publisher(cluster, "rolling", batch=20) as load,
        ):
            await load.wait_acks(5, 10)
            stalls, handed = [], 0
            for index in ALL_NODES:
                node_id = cluster.node(index).server_id
                led_here = await leader_index(cluster, "rolling") == index
                cluster.node(index).stop()  # SIGTERM, then waits for the process to exit
                stopped_at = time.monotonic()
                await load.wait_acks(2, 10)  # acks resume on the other two
                stalls.append(round(time.monotonic() - stopped_at, 2))
                log = (cluster.node(index).stored_dir / "bascule.log").read_text()
                if led_here:
                    handed += 1
                    assert "handed 1 of 1 partitions" in log, f"{node_id} did not hand its partition over"
                await restart(cluster, index)
                await wait_for(lambda: converged(cluster, "rolling", ALL_NODES), 25,
                               f"{node_id} to rejoin the ISR", cluster)
                await load.wait_acks(3, 10)
        print(f"rolling restart: {len(load.acked)} acked of {load.values_sent} sent, {load.failures} failed batches "
              f"{dict(load.errors)}; stop to acks resumed {stalls} s; {handed} handoffs")
        assert handed >= 1
        assert not load.conflicts, load.conflicts
        reader.check(await check_live(cluster, "rolling", load.acked))
        stop_and_check_files(cluster, {"rolling": load.acked})


async def test_hard_bounce_of_the_leader_under_envelope_acks_over_nats() -> None:
    """The capture path's acks: envelopes on the stream subject, ack ALL to inboxes; SIGKILL the leader
    twice. An ack names an offset only once the whole ISR has it, however the bursts were grouped."""
    with LocalCluster(3, config=FAST) as cluster:
        await create_stream(cluster, "envbounce")
        async with running_publisher(cluster, "envbounce", kind=EnvelopePublisher, batch=50) as load:
            await load.wait_acks(5, 10)
            for _ in range(2):
                old = await leader_index(cluster, "envbounce")
                old_id = cluster.node(old).server_id
                cluster.kill(old)
                await new_leader(cluster, "envbounce", [i for i in ALL_NODES if i != old], old_id)
                await load.wait_acks(3, 15)
                await restart(cluster, old)
                await wait_for(lambda: converged(cluster, "envbounce", ALL_NODES), 25,
                               f"{old_id} to rejoin the ISR", cluster)
                await load.wait_acks(3, 10)
        print(f"envelope bounce: {len(load.acked)} acked of {load.values_sent} sent, {load.failures} failed batches")
        assert not load.conflicts, load.conflicts
        assert load.failures > 0, "no batch ever failed: the kills did not hit the load"
        await check_live(cluster, "envbounce", load.acked)
        stop_and_check_files(cluster, {"envbounce": load.acked})


# ---- 2. follower with a divergent tail ----------------------------------------------------------------


async def test_restarted_old_leader_truncates_its_divergent_tail() -> None:
    """The leader appends (ack LEADER) while both followers are stopped, then dies; a new leader writes
    other messages at those offsets; the old leader comes back and must drop its tail (KIP-101/279)."""
    with LocalCluster(3, config=FAST) as cluster:
        await create_stream(cluster, "diverge")
        acked = await publish_all_acked(cluster, "diverge", [b"base-%d" % i for i in range(20)])
        old = await leader_index(cluster, "diverge")
        old_node = cluster.node(old)
        followers = [i for i in ALL_NODES if i != old]
        for i in followers:
            cluster.pause(i)
        try:
            divergent = {}
            for k in range(5):
                value = b"divergent-%d" % k
                divergent[await publish_direct(old_node.address, "diverge", value, "leader", 3.0)] = value
        finally:
            cluster.kill(old)
            for i in followers:
                cluster.resume(i)
        assert sorted(divergent) == list(range(20, 25)), divergent

        await new_leader(cluster, "diverge", followers, old_node.server_id)
        later = await publish_all_acked(cluster, "diverge", [b"after-%d" % i for i in range(10)])
        # (A retried batch may leave unacked copies first, so "after-0" may land later than offset 20.)
        assert min(later) >= 20, sorted(later)
        acked.update(later)

        await restart(cluster, old)
        await wait_for(lambda: converged(cluster, "diverge", ALL_NODES), 25,
                       f"{old_node.server_id} to truncate and rejoin the ISR", cluster)
        acked.update(await publish_all_acked(cluster, "diverge", [b"last-%d" % i for i in range(5)]))
        messages = await check_live(cluster, "diverge", acked)
        old_messages = await read_node(old_node.address, "diverge")
        assert not [m for m in old_messages if m.value.startswith(b"divergent-")], "divergent entries served"
        assert [m.value for m in old_messages[:20]] == [b"base-%d" % i for i in range(20)]
        assert len(old_messages) == len(messages) >= 35, (len(old_messages), len(messages))

        stop_and_check_files(cluster, {"diverge": acked})
        stored = read_stored_log(cluster, old, "diverge")
        assert len(stored.entries) == stored.hw + 1 == len(messages), (len(stored.entries), stored.hw)
        assert stored.epochs[19] < stored.epochs[20], "offset 20 should start the new leader's epoch"


# ---- 3. metadata (Raft) leader kill -----------------------------------------------------------------------


async def test_metadata_leader_kill_keeps_streams_isrs_and_epochs() -> None:
    with LocalCluster(3, config=FAST) as cluster:
        streams = ["meta-a", "meta-b"]
        acked: dict[str, dict[int, bytes]] = {}
        for name in streams:
            await create_stream(cluster, name)
            acked[name] = await publish_all_acked(cluster, name, [b"%s-%d" % (name.encode(), i) for i in range(20)])
        before = {name: await agreed_partition(cluster, name, ALL_NODES) for name in streams}
        epochs_before = {name: leader_epochs(cluster, index_of(cluster, before[name].leader), name)
                         for name in streams}

        raft_leader = await wait_for(lambda: raft_leader_index(cluster), 10, "a metadata Raft leader", cluster)
        raft_leader_id = cluster.node(raft_leader).server_id
        cluster.kill(raft_leader)
        survivors = [i for i in ALL_NODES if i != raft_leader]
        started = time.monotonic()
        await wait_for(lambda: raft_leader_index(cluster, survivors), 10, "a new metadata Raft leader", cluster)
        raft_failover = time.monotonic() - started

        # Streams, replicas, ISRs and epochs survive on the remaining nodes. A stream led by the killed node
        # fails over (new leader, higher epoch); any other keeps its leader, and its ISR loses at most that node.
        assert any(before[name].leader != raft_leader_id for name in streams), before
        for name in streams:
            async def settled(name: str = name):
                info = await agreed_partition(cluster, name, survivors)
                return info if info is not None and info.leader != raft_leader_id else None

            info = await wait_for(settled, 15, f"{name}: the survivors agree on a live leader", cluster)
            assert info.replicas == before[name].replicas, (name, info, before[name])
            leader = index_of(cluster, info.leader)
            epochs = leader_epochs(cluster, leader, name)
            if before[name].leader != raft_leader_id:
                assert info.leader == before[name].leader, (name, info, before[name])
                assert set(before[name].isr) - {raft_leader_id} <= set(info.isr), (name, info, before[name])
                assert epochs == epochs_before[name], (name, epochs, epochs_before[name])
            else:
                # The new leader checkpoints its epoch history after it took over, which can be after the
                # metadata named it: wait for the file.
                async def checkpointed(name: str = name, leader: int = leader):
                    found = leader_epochs(cluster, leader, name)
                    return found if found and found[-1][0] > epochs_before[name][-1][0] else None

                epochs = await wait_for(checkpointed, 10, f"{name}: the new leader's epoch in its checkpoint", cluster)
                assert epochs[: len(epochs_before[name])] == epochs_before[name], (name, epochs, epochs_before)
            check_acked(await read_node(cluster.node(leader).address, name, isr_replica=False), acked[name], name)

        # The new metadata leader takes commands: a new stream, and acks on it.
        async def create() -> bool:
            async with Client(cluster.node(survivors[0]).address) as client:
                await client.create_stream("meta-c", "meta-c.in", replication_factor=3, min_isr=2)
            return True

        await wait_for(create, 15, "CreateStream after the metadata leader died", cluster, interval=0.3)
        acked["meta-c"] = await publish_all_acked(cluster, "meta-c", [b"meta-c-%d" % i for i in range(10)])

        await restart(cluster, raft_leader)
        for name in acked:
            await check_live(cluster, name, acked[name], timeout=25)
        print(f"metadata leader {raft_leader_id} killed; new Raft leader after {raft_failover:.2f} s")
        stop_and_check_files(cluster, acked)


# ---- 4. NATS restart under load ------------------------------------------------------------------------------


async def test_nats_server_restart_under_load() -> None:
    with LocalCluster(3, config=FAST) as cluster:
        await create_stream(cluster, "natsdown")
        async with running_observer(cluster, "natsdown") as reader, running_publisher(cluster, "natsdown") as load:
            await load.wait_acks(5, 10)
            # Down for longer than the leader timeout and the max lag time.
            before = load.failures, len(load.acked)
            await asyncio.to_thread(cluster.restart_nats, 2.5)
            await load.wait_acks(20, 25)
        print(f"NATS restart: {len(load.acked)} acked of {load.values_sent} sent, {load.failures} failed batches "
              f"{dict(load.errors)} ({before[0]} failures, {before[1]} acks before)")
        assert not load.conflicts, load.conflicts
        reader.check(await check_live(cluster, "natsdown", load.acked, timeout=25))

        # Every node is back on NATS: a publish through a non-leader travels over NATS to the leader.
        # On a loaded machine the leader's capture connection may still be reconnecting: a publish
        # that times out is sent again (one that was stored unacked is allowed to stay).
        leader = await leader_index(cluster, "natsdown")
        for i in ALL_NODES:
            if i != leader:
                for attempt in range(3):
                    try:
                        offset = await publish_direct(cluster.node(i).address, "natsdown", b"via-%d" % i, "all", 10.0)
                        break
                    except grpc.aio.AioRpcError as exc:
                        if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED or attempt == 2:
                            raise
                load.acked[offset] = b"via-%d" % i
        await check_live(cluster, "natsdown", load.acked)
        stop_and_check_files(cluster, {"natsdown": load.acked})


# ---- 5. paused leader (zombie) -----------------------------------------------------------------------------------


async def test_paused_leader_does_not_ack_as_a_zombie_and_truncates() -> None:
    """SIGSTOP the leader for longer than the leader timeout; publishes sent to it (queued while it is stopped,
    and sent right after SIGCONT) must not be acked under ALL unless they are really committed; it then steps
    down, truncates what it appended as a zombie, and rejoins as a follower."""
    with LocalCluster(3, config=FAST) as cluster:
        await create_stream(cluster, "zombie")
        results: dict[tuple[str, bytes], object] = {}
        async with running_observer(cluster, "zombie") as reader, running_publisher(cluster, "zombie") as load:
            await load.wait_acks(5, 10)
            old = await leader_index(cluster, "zombie")
            old_node = cluster.node(old)
            survivors = [i for i in ALL_NODES if i != old]

            async def probe(policy: str, k: int) -> None:
                value = b"zombie-%s-%d" % (policy.encode(), k)
                try:
                    results[policy, value] = await publish_direct(old_node.address, "zombie", value, policy, 3.0)
                except grpc.aio.AioRpcError as exc:
                    results[policy, value] = exc.code().name

            cluster.pause(old)
            try:
                await new_leader(cluster, "zombie", survivors, old_node.server_id)
                await load.wait_acks(5, 10)
                # Queued while it is stopped, handled first thing after SIGCONT, with its stale view.
                probes = [asyncio.create_task(probe("all", k)) for k in range(4)]
                await asyncio.sleep(0.2)
            finally:
                cluster.resume(old)
            probes += [asyncio.create_task(probe("all", k)) for k in range(4, 8)]
            await asyncio.gather(*probes)
            await wait_for(lambda: converged(cluster, "zombie", ALL_NODES), 25,
                           f"{old_node.server_id} to step down, truncate and rejoin", cluster)
            await load.wait_acks(5, 10)
        zombie_acks = {offset: value for (policy, value), offset in results.items()
                       if policy == "all" and isinstance(offset, int)}
        print(f"zombie: {len(load.acked)} acked of {load.values_sent} sent, {load.failures} failed batches "
              f"{dict(load.errors)}; probes of the paused leader: {results}")
        assert not load.conflicts, load.conflicts
        overlap = {o: (v, load.acked[o]) for o, v in zombie_acks.items() if o in load.acked}
        assert not overlap, f"the zombie and the new leader acked the same offsets under ALL: {overlap}"
        acked = {**load.acked, **zombie_acks}
        try:
            reader.check(await check_live(cluster, "zombie", acked))
        except InvariantViolation as exc:
            raise InvariantViolation(f"{exc}; the paused leader answered {results}") from None
        view = {v.server_id: v.partition.leader for v in await views(cluster, "zombie")}
        assert view[old_node.server_id] != old_node.server_id, view
        stop_and_check_files(cluster, {"zombie": acked})


async def test_replaced_leader_does_not_ack_at_offsets_the_new_leader_committed() -> None:
    with LocalCluster(3, config=FAST, keep_data=False) as cluster:  # expected to fail: no logs left behind
        await create_stream(cluster, "zombie1")
        acked = await publish_all_acked(cluster, "zombie1", [b"base-%d" % i for i in range(10)])
        old = await leader_index(cluster, "zombie1")
        old_node = cluster.node(old)
        survivors = [i for i in ALL_NODES if i != old]
        results: dict[bytes, object] = {}
        async with grpc.aio.insecure_channel(old_node.address) as channel:
            # Connected before the pause, so the requests wait in its socket, read first thing after SIGCONT.
            await asyncio.wait_for(channel.channel_ready(), 5)
            stub = api_pb2_grpc.APIStub(channel)

            async def probe(k: int) -> None:
                value = b"zombie-leader-%d" % k
                request = api_pb2.PublishRequest(stream="zombie1", value=value, ackPolicy=api_pb2.AckPolicy.LEADER)
                try:
                    results[value] = (await stub.Publish(request, timeout=3.0)).ack.offset
                except grpc.aio.AioRpcError as exc:
                    results[value] = exc.code().name

            cluster.pause(old)
            try:
                await new_leader(cluster, "zombie1", survivors, old_node.server_id)
                acked.update(await publish_all_acked(cluster, "zombie1", [b"new-%d" % i for i in range(10)]))
                probes = [asyncio.create_task(probe(k)) for k in range(3)]
                await asyncio.sleep(0.2)
            finally:
                cluster.resume(old)
            await asyncio.gather(*probes)
        # Under ALL the new leader committed new-0.. at 10..19; an ack naming one of those offsets for another
        # message is an ack from a leader that no longer leads (two messages acked at one offset).
        conflicting = {value: offset for value, offset in results.items()
                       if isinstance(offset, int) and offset in acked and acked[offset] != value}
        assert not conflicting, (
            f"{old_node.server_id}, replaced while stopped, acked LEADER-policy publishes at offsets the new leader "
            f"had committed for other messages: {conflicting} (all answers: {results})"
        )
        await wait_for(lambda: converged(cluster, "zombie1", ALL_NODES), 25, "the old leader to rejoin", cluster)
        await check_live(cluster, "zombie1", acked)


# ---- 6. minority ISR --------------------------------------------------------------------------------------------


async def expect_not_acked(address: str, stream: str, values: list[bytes], timeout: float = 2.0) -> None:
    """Publish each value (ack ALL, concurrently) to the node at `address`: none may be acked."""

    async def one(value: bytes) -> str | None:
        try:
            offset = await publish_direct(address, stream, value, "all", timeout)
        except grpc.aio.AioRpcError as exc:
            assert exc.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INTERNAL,
                                  grpc.StatusCode.UNAVAILABLE), exc
            return None
        return f"{value!r} at offset {offset}"

    acked = [found for found in await asyncio.gather(*(one(v) for v in values)) if found]
    if acked:
        raise InvariantViolation(f"{stream}: acked under ALL with |ISR| < minISR: {acked}")


async def test_minority_isr_never_acks_ack_all_publishes() -> None:
    """minISR 2. minority2 (RF 2): its follower dies, the ISR shrinks to the leader alone (Raft keeps a quorum),
    ALL publishes must not be acked. minority3 (RF 3): two nodes die (no Raft quorum left), same."""
    with LocalCluster(3, config=FAST) as cluster:
        await create_stream(cluster, "minority3")
        await create_stream(cluster, "minority2", replication_factor=2)
        two = await wait_for(lambda: agreed_partition(cluster, "minority2", ALL_NODES), 15, "minority2 ISR", cluster)
        assert len(two.isr) == 2, two
        acked = {name: await publish_all_acked(cluster, name, [b"%s-%d" % (name.encode(), i) for i in range(10)])
                 for name in ("minority3", "minority2")}

        leader2 = index_of(cluster, two.leader)
        follower2 = index_of(cluster, next(r for r in two.replicas if r != two.leader))
        cluster.kill(follower2)
        alive = [i for i in ALL_NODES if i != follower2]

        async def shrunk():
            info = await agreed_partition(cluster, "minority2", alive)
            return info if info is not None and info.isr == [two.leader] else None

        await expect_not_acked(cluster.node(leader2).address, "minority2", [b"before-shrink"])
        await wait_for(shrunk, 15, "minority2's ISR to shrink to its leader", cluster)
        await expect_not_acked(cluster.node(leader2).address, "minority2", [b"single-copy-%d" % k for k in range(3)])

        # minority3 still has two live copies: acks go on. Then a second node dies.
        acked["minority3"].update(
            await publish_all_acked(cluster, "minority3", [b"two-copies-%d" % i for i in range(5)])
        )
        leader3 = await leader_index(cluster, "minority3", alive)
        second = next(i for i in alive if i != leader3)
        cluster.kill(second)
        await expect_not_acked(cluster.node(leader3).address, "minority3", [b"one-node-%d" % k for k in range(3)])

        await restart(cluster, follower2)
        await restart(cluster, second)
        replicas = {"minority3": ALL_NODES, "minority2": sorted([leader2, follower2])}
        for name, nodes in replicas.items():
            await wait_for(
                lambda name=name, nodes=nodes: converged(cluster, name, nodes), 25, f"{name} to recover", cluster
            )
            acked[name].update(await publish_all_acked(cluster, name, [b"back-%d" % i for i in range(5)]))
            await check_live(cluster, name, acked[name], indexes=nodes)
        cluster.stop()
        for name, nodes in replicas.items():
            check_stored_logs(cluster, name, acked[name], indexes=nodes)


# ---- root cause of an occasional hard-bounce failure, reproduced without a cluster -----------------------


async def test_follower_loop_stops_even_when_a_reply_lands_in_the_same_turn(tmp_path) -> None:
    from nats.errors import NoRespondersError
    from nats.errors import TimeoutError as NatsTimeout

    from bascule.partition.follower import FollowerLoop, FollowerSettings
    from bascule.partition.log import CommitLog
    from bascule.partition.replica import PartitionReplica, SyncPolicy
    from bascule.wire.subjects import Subjects

    class NatsLikeNatsPy:
        """request() as nats-py 2.x does it: publish, then asyncio.wait_for(future, timeout)."""

        def __init__(self) -> None:
            self.pending: list[asyncio.Future] = []
            self.requested = asyncio.Event()

        async def request(self, subject: str, payload: bytes, timeout: float):
            future = asyncio.get_running_loop().create_future()
            self.pending.append(future)
            self.requested.set()
            try:
                await asyncio.wait_for(future, timeout)
            except TimeoutError:
                raise NatsTimeout from None
            raise NoRespondersError  # the leader is gone: the server answers "no responders"

    async def no_report(*_: object) -> None:
        return None

    commit_log = CommitLog.open(tmp_path / "p")
    commit_log.epochs.assign(0, 0)
    replica = PartitionReplica("s", 0, commit_log, SyncPolicy(), time.monotonic)
    replica.become_follower("dead-leader", 0)
    nc = NatsLikeNatsPy()
    follower = FollowerLoop(nc, Subjects(""), replica, "me", FollowerSettings(1.0, 1.0, 0.5), no_report)
    follower.start()
    try:
        await nc.requested.wait()
        nc.pending[-1].set_result(b"")  # the reply arrives...
        stopping = asyncio.create_task(follower.stop())  # ...in the turn the node stops this follower
        done, _ = await asyncio.wait({stopping}, timeout=2.5)
        assert done, f"FollowerLoop.stop() still waiting after 2.5 s; {len(nc.pending) - 1} requests sent since"
    finally:
        if follower._task is not None:
            follower._task.cancel()
        replica.close()


async def test_one_lost_request_does_not_get_a_healthy_leader_reported(tmp_path) -> None:
    from nats.errors import TimeoutError as NatsTimeout

    from bascule.partition.follower import FollowerLoop, FollowerSettings
    from bascule.partition.log import CommitLog
    from bascule.partition.replica import PartitionReplica, SyncPolicy
    from bascule.wire import replicate
    from bascule.wire.subjects import Subjects

    class LateLeader:
        """The leader's first request is lost (it was not subscribed yet); it answers every later one."""

        def __init__(self) -> None:
            self.requests = 0

        async def request(self, subject: str, payload: bytes, timeout: float):
            self.requests += 1
            if self.requests == 1:
                await asyncio.sleep(timeout)
                raise NatsTimeout

            class Reply:
                data = replicate.encode_response(1, -1, 1.0, b"")

            return Reply()

    reports: list[tuple[str, int]] = []

    async def report(replica, leader: str, epoch: int) -> None:
        reports.append((leader, epoch))

    replica = PartitionReplica("s", 0, CommitLog.open(tmp_path / "p"), SyncPolicy(), time.monotonic)
    replica.become_follower("new-leader", 1)
    # The settings of these tests (cluster_checks.FAST): fetch timeout 1 s, leader timeout 1 s, idle wait 0.5 s.
    follower = FollowerLoop(LateLeader(), Subjects(""), replica, "me", FollowerSettings(1.0, 1.0, 0.5), report)
    follower.start()
    try:
        await asyncio.sleep(2.0)
    finally:
        await follower.stop()
        replica.close()
    assert not reports, f"a leader that answered every request but the first was reported: {reports}"
