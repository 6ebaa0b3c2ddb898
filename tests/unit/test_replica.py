"""The replica shell on a real commit log, without a network: groups, outcomes and group commit."""

import asyncio
import errno
import logging
import os
import threading
import time

import pytest
from conftest import rot_entry, until

from bascule.partition.log import CommitLog, LogFailed
from bascule.partition.replica import NotLeader, PartitionReplica, ReplicaFailed, SyncPolicy
from bascule.wire.entry import CorruptEntry, Record

pytestmark = pytest.mark.anyio
# How the tests lead: a leader timeout of 10 s (what followers wait before reporting it).
LEADING = dict(min_isr=1, max_lag_time=10.0, leader_timeout=10.0)


def leader(tmp_path, sync: SyncPolicy, replicas=("me",)) -> PartitionReplica:
    replica = PartitionReplica("s", 0, CommitLog.open(tmp_path / "p"), sync, time.monotonic)
    replica.become_leader("me", 0, 0, replicas, replicas, **LEADING)
    return replica




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
        replica.become_leader("me", 2, 5, ("me", "other"), ("me",), **LEADING)
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
            replica.become_leader("me", 4, 1, ("me",), ("me",), **LEADING)  # nothing written in 4
            assert replica.position() == (0, 2)
        finally:
            replica.close()

    asyncio.run(run())


async def test_a_follower_below_the_leaders_log_start_appends_after_the_gap_and_catches_up(tmp_path):
    """The leader's retention removed offsets 0..29; a follower that has 0..4 gets entries from 30
    (the replica shell serving the fetch) and stores them after the gap, as it stores the gaps of a
    compacted log, keeping its own 0..4, and catches up."""
    from bascule.partition.log import LogConfig
    from bascule.partition.replication.follower import Append, Follower, FollowerConfig, RestartLog
    from bascule.wire.entry import scan

    config = LogConfig(segment_max_bytes=300, index_interval_bytes=100, retention_max_messages=20)
    leader_replica = PartitionReplica("s", 0, CommitLog.open(tmp_path / "leader", config), SyncPolicy(), time.monotonic)
    leader_replica.become_leader("L", 3, 0, ("L", "F"), ("L",), **LEADING)
    leader_log = leader_replica.log
    for batch in range(10):
        leader_replica.submit([Record(b"x" * 20) for _ in range(5)])
        # One append each: segments roll.
        await until(lambda batch=batch: leader_replica.high_watermark == batch * 5 + 4)
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
        assert follower_replica.log.oldest_offset == 0
        assert [entry.value for entry in follower_replica.log.read(0, 5)] == [b"old"] * 5
        oldest = leader_log.oldest_offset
        assert follower_replica.log.read(oldest, 1000) == leader_log.read(oldest, 1000)
        assert follower_replica.log.read(5, 1000) == leader_log.read(oldest, 1000)  # across the gap
    finally:
        leader_replica.close()
        follower_replica.close()


# ---- disk failures -------------------------------------------------------------------------------


def _fd_name(fd: int) -> str:
    return os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))


def _fail_fsyncs_once(monkeypatch, suffix: str, entered=None, release=None) -> None:
    """The next fsync of a file named ``*suffix`` raises EIO (after waiting for ``release``)."""
    failed = []

    def fsync(fd: int, real=os.fsync) -> None:
        if not failed and _fd_name(fd).endswith(suffix):
            failed.append(fd)
            if entered is not None:
                entered.set()
                release.wait(5)
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


async def test_a_failed_group_commit_fsync_fails_every_waiter_and_the_replica(tmp_path, monkeypatch, caplog):
    """fsyncgate: after a failed fsync the kernel may have dropped the pages it could not write, so
    a later fsync that succeeds proves nothing. The batch being synced, the writes waiting for the
    next sync and the writes waiting for their commit all fail; none is ever acknowledged."""
    replica = leader(tmp_path, SyncPolicy(always=True), replicas=("me", "other"))  # HW waits for "other"
    outcomes = {}

    def outcome(name):
        return lambda offset, error: outcomes.setdefault(name, (offset, error))

    try:
        # "other" heard from this leader just now: the lease holds, writes are acked on disk.
        replica.serve_fetch("other", 0, 0, 1 << 20, leader_time=replica.clock())
        replica.submit([Record(b"w0")], outcome("w0"))
        await until(lambda: "w0" in outcomes)
        assert outcomes.pop("w0") == (0, None)  # on this disk; committed once "other" has it
        replica.when_committed(0, outcome("commit of w0"))
        entered, release = threading.Event(), threading.Event()
        _fail_fsyncs_once(monkeypatch, ".log", entered, release)
        replica.submit([Record(b"a")], outcome("a"))
        await until(entered.is_set)  # a's fsync is running, and will fail
        replica.submit([Record(b"b")], outcome("b"))
        await until(lambda: replica.log.next_offset == 3)  # b written, waiting for the next fsync
        with caplog.at_level(logging.ERROR):
            release.set()
            await until(lambda: len(outcomes) == 3)
            await asyncio.sleep(0.05)  # nothing turns a failure into an ack later
        for name in ("commit of w0", "a", "b"):
            offset, error = outcomes[name]
            assert offset is None and isinstance(error, ReplicaFailed), name
            assert isinstance(error.__cause__, LogFailed) and error.__cause__.errno == errno.EIO
        assert isinstance(replica.failed, LogFailed) and replica.failed.errno == errno.EIO
        assert not replica.is_leader
        with pytest.raises(ReplicaFailed):
            replica.submit([Record(b"c")])
        with pytest.raises(ReplicaFailed):
            replica.become_leader("me", 1, 1, ("me",), ("me",), **LEADING)
        assert replica.serve_fetch("other", 1, 0, 1 << 20) == b""
        assert any(r.levelno == logging.ERROR and "s/0" in r.getMessage() for r in caplog.records)
    finally:
        release.set()
        replica.close()


async def test_a_failed_periodic_sync_fails_the_replica(tmp_path, monkeypatch):
    replica = leader(tmp_path, SyncPolicy(interval=1.0))
    try:
        replica.submit([Record(b"a")])
        await until(lambda: replica.high_watermark == 0)
        _fail_fsyncs_once(monkeypatch, ".log")
        with pytest.raises(ReplicaFailed):
            await replica.sync()
        with pytest.raises(ReplicaFailed):
            await replica.sync()  # fsync works again: the failure stands
        with pytest.raises(ReplicaFailed):
            replica.submit([Record(b"b")])
        assert isinstance(replica.failed, LogFailed) and replica.failed.errno == errno.EIO
    finally:
        replica.close()


async def test_a_full_disk_fails_one_append_and_the_replica_goes_on(tmp_path, monkeypatch):
    replica = leader(tmp_path, SyncPolicy())
    outcomes = []
    real_write = os.write

    def write(fd, data):
        if not outcomes and _fd_name(fd).endswith(".log"):
            real_write(fd, bytes(data)[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    try:
        replica.submit([Record(b"a")], lambda offset, error: outcomes.append((offset, error)))
        await until(lambda: outcomes)
        assert outcomes[0][0] is None and outcomes[0][1].errno == errno.ENOSPC
        assert replica.writes_failing  # the node hands the leadership to another ISR member
        replica.submit([Record(b"b")], lambda offset, error: outcomes.append((offset, error)))
        await until(lambda: len(outcomes) == 2)
        assert outcomes[1] == (0, None)
        assert replica.failed is None and not replica.writes_failing
        assert [entry.value for entry in replica.read_committed(0, 10)] == [b"b"]
    finally:
        replica.close()


async def test_the_follower_loop_ends_once_its_replica_failed(tmp_path, monkeypatch):
    """A failed replica's follower must not go on fetching (the leader would count its log end)."""
    from bascule.partition.follower import FollowerLoop, FollowerSettings
    from bascule.wire.subjects import Subjects

    class LeaderNotAnswering:
        async def request(self, subject, payload, timeout):
            await asyncio.sleep(0.01)
            raise TimeoutError

    async def report_leader(*_):
        pass

    replica = PartitionReplica("s", 0, CommitLog.open(tmp_path / "p"), SyncPolicy(interval=1.0), time.monotonic)
    replica.log.append([Record(b"a")], 0)
    replica.become_follower("L", 0)
    settings = FollowerSettings(1.0, 3.0, 1.0)
    loop = FollowerLoop(LeaderNotAnswering(), Subjects("t"), replica, "F", settings, report_leader)
    loop.start()
    try:
        await asyncio.sleep(0.05)
        _fail_fsyncs_once(monkeypatch, ".log")
        with pytest.raises(ReplicaFailed):
            await replica.sync()
        await asyncio.wait_for(asyncio.shield(loop._task), 2)
    finally:
        await loop.stop()
        replica.close()


async def test_a_leader_asked_again_for_a_damaged_entry_finds_and_records_the_damage(tmp_path):
    """Fetches are served without CRC checks; the follower rejects the damaged entry and asks
    again, and that second read is checked: it raises and the log knows where it is damaged,
    so this replica's election position ends there."""
    replica = leader(tmp_path, SyncPolicy(), replicas=("me", "F"))
    try:
        replica.submit([Record(b"value-%d" % i) for i in range(10)])
        await until(lambda: replica.log.next_offset == 10)
        replica.log.sync()
        rot_entry(tmp_path / "p", b"value-5")
        assert replica.serve_fetch("F", 5, 0, 1 << 20)  # unchecked: the follower finds the damage
        with pytest.raises(CorruptEntry):
            replica.serve_fetch("F", 5, 0, 1 << 20)
        assert replica.log.damaged_from == 5
        assert replica.position() == (0, 5)
    finally:
        replica.close()


async def test_a_follower_cuts_its_log_at_its_damage_and_grows_past_it_again(tmp_path):
    replica = PartitionReplica("s", 0, CommitLog.open(tmp_path / "p"), SyncPolicy(), time.monotonic)
    try:
        replica.log.append([Record(b"value-%d" % i) for i in range(10)], 1)
        replica.log.high_watermark = 9
        replica.log.sync()
        rot_entry(tmp_path / "p", b"value-3")
        with pytest.raises(CorruptEntry):
            replica.read_committed(3, 10)
        assert replica.log.damaged_from == 3
        assert replica.cut_damage() == 3
        assert replica.log.next_offset == 3 and replica.cut_damage() is None
        assert replica.log.damaged_from == 3  # still missing until fetched again
        replica.log.append([Record(b"again-%d" % i) for i in range(3, 10)], 1)
        assert replica.log.damaged_from is None
        assert replica.position() == (1, 10)
    finally:
        replica.close()


async def test_flag_changes_after_opening_are_event_times_and_the_opening_state_is_not(tmp_path):
    replica = leader(tmp_path, SyncPolicy())
    replica.set_flags(paused=True, readonly=False)  # the state it opened in
    assert (replica.pause_changes.first, replica.readonly_changes.first) == (0, 0)
    replica.set_flags(paused=False, readonly=True)
    replica.set_flags(paused=False, readonly=True)  # no change: no event
    first_pause, readonly = replica.pause_changes.first, replica.readonly_changes.first
    assert first_pause > 0 and readonly > 0
    replica.set_flags(paused=True, readonly=True)
    assert replica.pause_changes.first == first_pause < replica.pause_changes.latest
    assert replica.readonly_changes.latest == readonly


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def leased_leader(tmp_path, clock: Clock) -> PartitionReplica:
    """A leader of "me" with two ISR followers, F and G, and a leader timeout of 10 s."""
    replica = PartitionReplica("s", 0, CommitLog.open(tmp_path / "p"), SyncPolicy(), clock)
    replicas = ("me", "F", "G")
    replica.become_leader("me", 1, 0, replicas, replicas, **LEADING)
    return replica


async def test_writes_wait_for_their_acks_while_no_follower_vouches_for_the_leader(tmp_path):
    """A leader paused or cut off may have been replaced: until its followers' fetches show that
    they heard from it within the leader timeout, a write gets no ack; then the acks come, in order."""
    clock = Clock()
    replica = leased_leader(tmp_path, clock)
    outcomes = []
    try:
        replica.submit([Record(b"a")], lambda offset, error: outcomes.append(("a", offset, error)))
        replica.submit([Record(b"b")], lambda offset, error: outcomes.append(("b", offset, error)))
        await until(lambda: replica.log.next_offset == 2)
        await asyncio.sleep(0.01)
        assert outcomes == [] and replica.acks_held == 2  # no follower ever echoed this leader's clock
        replica.serve_fetch("F", 0, 1, 1 << 20, leader_time=clock.now)
        # F heard from it just now: G alone is not enough witnesses to replace it.
        assert outcomes == [("a", 0, None), ("b", 1, None)] and replica.acks_held == 0
        clock.now += 9.5  # past 0.9 of the leader timeout since F last heard: the lease lapsed
        replica.submit([Record(b"c")], lambda offset, error: outcomes.append(("c", offset, error)))
        await until(lambda: replica.log.next_offset == 3)
        await asyncio.sleep(0.01)
        assert len(outcomes) == 2
        replica.serve_fetch("G", 2, 1, 1 << 20, leader_time=clock.now - 20)  # before it led: proves nothing
        replica.serve_fetch("F", 2, 1, 1 << 20, leader_time=clock.now - 9.2)  # still too old
        assert len(outcomes) == 2
        replica.serve_fetch("F", 2, 1, 1 << 20, leader_time=clock.now - 0.1)
        assert outcomes[2] == ("c", 2, None)
    finally:
        replica.close()


async def test_held_acks_fail_when_the_leader_is_fenced_and_go_when_the_isr_is_the_leader_alone(tmp_path):
    clock = Clock()
    replica = leased_leader(tmp_path, clock)
    outcomes = []
    try:
        replica.submit([Record(b"a")], lambda offset, error: outcomes.append((offset, error)))
        await until(lambda: replica.log.next_offset == 1)
        replica.become_leader("me", 1, 1, ("me", "F", "G"), ("me",), **LEADING)
        assert outcomes == [(0, None)]  # no follower left that could report it
        replica.become_leader("me", 1, 2, ("me", "F", "G"), ("me", "F"), **LEADING)
        replica.submit([Record(b"b")], lambda offset, error: outcomes.append((offset, error)))
        await until(lambda: replica.log.next_offset == 2)
        await asyncio.sleep(0.01)
        assert len(outcomes) == 1
        replica.fence(2)  # a follower follows a newer leader epoch: this one was replaced
        assert outcomes[1][0] is None and isinstance(outcomes[1][1], NotLeader)
    finally:
        replica.close()
