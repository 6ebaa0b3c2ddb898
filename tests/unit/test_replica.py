"""The replica shell on a real commit log, without a network: groups, outcomes and group commit."""

import asyncio
import time

import pytest

from bascule.partition.log import CommitLog
from bascule.partition.replica import NotLeader, PartitionReplica, SyncPolicy
from bascule.wire.entry import Record

pytestmark = pytest.mark.anyio


def leader(tmp_path, sync: SyncPolicy, replicas=("me",)) -> PartitionReplica:
    replica = PartitionReplica("s", 0, CommitLog.open(tmp_path / "p"), sync, time.monotonic)
    replica.become_leader("me", 0, 0, replicas, replicas, min_isr=1, max_lag_time=10.0)
    return replica


async def until(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.001)


@pytest.mark.parametrize("sync", [SyncPolicy(), SyncPolicy(always=True)], ids=["never", "always"])
async def test_records_without_outcomes_are_committed_too(tmp_path, sync):
    replica = leader(tmp_path, sync)
    try:
        replica.submit([Record(b"a"), Record(b"b")])
        await until(lambda: replica.high_watermark == 1)
        replica.submit([Record(b"c")])
        await until(lambda: replica.high_watermark == 2)
        assert [e.value for e in replica.read_committed(0, 10)] == [b"a", b"b", b"c"]
    finally:
        replica.close()


@pytest.mark.parametrize("sync", [SyncPolicy(), SyncPolicy(always=True)], ids=["never", "always"])
async def test_each_group_learns_the_offset_of_its_first_record(tmp_path, sync):
    replica = leader(tmp_path, sync)
    outcomes = []
    try:
        replica.submit([Record(b"a"), Record(b"b")], lambda offset, error: outcomes.append(("ab", offset, error)))
        replica.submit([Record(b"plain")])
        replica.submit([Record(b"c")], lambda offset, error: outcomes.append(("c", offset, error)))
        await until(lambda: len(outcomes) == 2)
        assert outcomes == [("ab", 0, None), ("c", 3, None)]
    finally:
        replica.close()


async def test_groups_waiting_for_their_append_fail_when_leadership_ends(tmp_path):
    replica = leader(tmp_path, SyncPolicy(), replicas=("me", "other"))
    outcomes = []
    try:
        replica.submit([Record(b"a")], lambda offset, error: outcomes.append((offset, error)))
        replica.become_follower("other", 1)
        assert len(outcomes) == 1 and outcomes[0][0] is None and isinstance(outcomes[0][1], NotLeader)
        with pytest.raises(NotLeader):
            replica.submit([Record(b"b")])
    finally:
        replica.close()


async def test_a_write_synced_after_its_leadership_ended_is_never_acked(tmp_path):
    """Under "always" the ack waits for an fsync in a thread; if leadership ended meanwhile, even
    if this node was elected again, the write must not be acked: the new leadership's followers
    may have truncated it."""
    replica = leader(tmp_path, SyncPolicy(always=True), replicas=("me", "other"))
    outcomes = []
    try:
        replica.submit([Record(b"a")], lambda offset, error: outcomes.append((offset, error)))
        await asyncio.sleep(0)  # appended, its fsync running
        replica.become_follower("other", 1)
        replica.become_leader("me", 2, 5, ("me", "other"), ("me",), min_isr=1, max_lag_time=10.0)
        await until(lambda: outcomes)
        assert outcomes[0][0] is None and isinstance(outcomes[0][1], NotLeader)
    finally:
        replica.close()


def test_position_names_the_epoch_of_the_last_entry_not_an_empty_leader_epoch(tmp_path):
    async def run():
        replica = leader(tmp_path, SyncPolicy())
        try:
            assert replica.position() == (-1, 0)
            replica.submit([Record(b"a"), Record(b"b")])
            await until(lambda: replica.high_watermark == 1)
            replica.become_follower("other", 0)
            replica.become_leader("me", 4, 1, ("me",), ("me",), min_isr=1, max_lag_time=10.0)  # nothing written in 4
            assert replica.position() == (0, 2)
        finally:
            replica.close()

    asyncio.run(run())


async def test_a_follower_below_the_leaders_log_start_restarts_its_log_there_and_catches_up(tmp_path):
    """The leader's retention removed offsets 0..29; a follower that has 0..4 gets entries from 30
    (the replica shell serving the fetch), and its machine and log restart at 30 and catch up."""
    from bascule.partition.log import LogConfig
    from bascule.partition.replication.follower import Append, Follower, FollowerConfig, RestartLog
    from bascule.wire.entry import scan

    config = LogConfig(segment_max_bytes=300, index_interval_bytes=100, retention_max_messages=20)
    leader_replica = PartitionReplica("s", 0, CommitLog.open(tmp_path / "leader", config), SyncPolicy(), time.monotonic)
    leader_replica.become_leader("L", 3, 0, ("L", "F"), ("L",), min_isr=1, max_lag_time=10.0)
    leader_log = leader_replica.log
    for batch in range(10):
        leader_replica.submit([Record(b"x" * 20) for _ in range(5)])
        await until(lambda: leader_replica.high_watermark == batch * 5 + 4)  # one append each: segments roll
    leader_log.enforce_retention()
    assert leader_log.oldest_offset > 5
    follower_replica = PartitionReplica("s", 0, CommitLog.open(tmp_path / "follower"), SyncPolicy(), time.monotonic)
    follower_replica.log.append([Record(b"old") for _ in range(5)], 1)
    follower_replica.become_follower("L", 3)
    machine = Follower("F", "L", 3, follower_replica.log.epochs, 5, -1, 0.0, config=FollowerConfig())
    machine.start()
    machine.on_epoch_answer(1, 5, 0.0)
    try:
        for _ in range(10):
            if follower_replica.log.next_offset == leader_log.next_offset:
                break
            data = leader_replica.serve_fetch("F", follower_replica.log.next_offset, 3, 1 << 20)
            walked = list(scan(data))
            for action in machine.on_replicate(3, leader_log.high_watermark, [(o, e) for o, e, *_ in walked], 1.0):
                if isinstance(action, RestartLog):
                    follower_replica.restart_log(action.start_offset)
                elif isinstance(action, Append):
                    follower_replica.append_replicated(data, walked)
        assert follower_replica.log.oldest_offset == leader_log.oldest_offset
        assert follower_replica.log.read(leader_log.oldest_offset, 1000) == leader_log.read(leader_log.oldest_offset, 1000)
    finally:
        leader_replica.close()
        follower_replica.close()
