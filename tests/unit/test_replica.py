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
