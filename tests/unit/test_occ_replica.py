"""The replica shell's sequencing point under optimistic concurrency control, on a real commit log."""

import asyncio
import time

import pytest

from bascule.partition.log import CommitLog
from bascule.partition.replica import PartitionReplica, SyncPolicy
from bascule.partition.replication.concurrency import NO_EXPECTATION, IncorrectOffset
from bascule.wire.entry import Record

pytestmark = pytest.mark.anyio

NEVER = SyncPolicy()
SYNC_POLICIES = pytest.mark.parametrize("sync", [NEVER, SyncPolicy(always=True)], ids=["never", "always"])


def leader(tmp_path, sync=NEVER, concurrency_control=True) -> PartitionReplica:
    replica = PartitionReplica("s", 0, CommitLog.open(tmp_path / "p"), sync, time.monotonic,
                               concurrency_control=concurrency_control)
    replica.become_leader("me", 0, 0, ["me"], ["me"], min_isr=1, max_lag_time=10.0, leader_timeout=10.0)
    return replica


class Outcomes:
    def __init__(self):
        self.got: dict[str, tuple[int | None, BaseException | None]] = {}

    def __call__(self, name):
        return lambda offset, error: self.got.__setitem__(name, (offset, error))

    async def wait(self, count, timeout=5.0):
        deadline = time.monotonic() + timeout
        while len(self.got) < count:
            assert time.monotonic() < deadline, f"only {sorted(self.got)} answered"
            await asyncio.sleep(0.001)

    def refused(self, name):
        offset, error = self.got[name]
        return offset is None and isinstance(error, IncorrectOffset)


def stored(replica):
    return [entry.value for entry in replica.log.read(0, max_entries=100)]


@SYNC_POLICIES
async def test_two_publishers_expecting_the_same_offset_in_one_append_get_one_write(tmp_path, sync):
    replica = leader(tmp_path, sync)
    outcomes = Outcomes()
    try:
        replica.submit([Record(b"first")], outcomes("first"), expected=[0])
        replica.submit([Record(b"second")], outcomes("second"), expected=[0])
        replica.submit([Record(b"next")], outcomes("next"), expected=[1])
        await outcomes.wait(3)
        assert outcomes.got["first"] == (0, None) and outcomes.got["next"] == (1, None)
        assert outcomes.refused("second")
        assert stored(replica) == [b"first", b"next"]
    finally:
        replica.close()


async def test_the_check_is_against_the_log_end_across_appends(tmp_path):
    replica = leader(tmp_path)
    outcomes = Outcomes()
    try:
        replica.submit([Record(b"a")], outcomes("a"), expected=[0])
        await outcomes.wait(1)
        replica.submit([Record(b"stale")], outcomes("stale"), expected=[0])
        replica.submit([Record(b"any")], outcomes("any"), expected=[NO_EXPECTATION])
        replica.submit([Record(b"unsaid")], outcomes("unsaid"))
        replica.submit([Record(b"c")], outcomes("c"), expected=[3])
        await outcomes.wait(5)
        assert outcomes.refused("stale")
        assert [outcomes.got[name] for name in ("any", "unsaid", "c")] == [(1, None), (2, None), (3, None)]
        assert stored(replica) == [b"a", b"any", b"unsaid", b"c"]
    finally:
        replica.close()


@pytest.mark.parametrize("expected", [-2, 1, 2**31, 2**63 - 1, -(2**63)])
async def test_garbage_expectations_are_refused_and_nothing_is_appended(tmp_path, expected):
    replica = leader(tmp_path)
    outcomes = Outcomes()
    try:
        replica.submit([Record(b"x")], outcomes("x"), expected=[expected])
        await outcomes.wait(1)
        assert outcomes.refused("x")
        assert replica.log.next_offset == 0
    finally:
        replica.close()


async def test_a_group_is_written_whole_or_refused_whole(tmp_path):
    replica = leader(tmp_path)
    outcomes = Outcomes()
    try:
        replica.submit([Record(b"a"), Record(b"b")], outcomes("ab"), expected=[0, 5])
        replica.submit([Record(b"c"), Record(b"d")], outcomes("cd"), expected=[0, 1])
        await outcomes.wait(2)
        assert outcomes.refused("ab") and outcomes.got["cd"] == (0, None)
        assert stored(replica) == [b"c", b"d"]
    finally:
        replica.close()


async def test_a_record_the_log_cannot_store_moves_no_one_elses_offset(tmp_path):
    replica = leader(tmp_path)
    outcomes = Outcomes()
    unstorable = Record(b"bad", headers={"n" * 70_000: b""})
    try:
        replica.submit([unstorable], outcomes("bad"), expected=[NO_EXPECTATION])
        replica.submit([Record(b"good")], outcomes("good"), expected=[0])
        await outcomes.wait(2)
        assert isinstance(outcomes.got["bad"][1], ValueError)
        assert outcomes.got["good"] == (0, None)
    finally:
        replica.close()


async def test_without_concurrency_control_expectations_are_ignored(tmp_path):
    replica = leader(tmp_path, concurrency_control=False)
    outcomes = Outcomes()
    try:
        replica.submit([Record(b"a")], outcomes("a"), expected=[7])
        replica.submit([Record(b"b")], outcomes("b"), expected=[-5])
        await outcomes.wait(2)
        assert outcomes.got == {"a": (0, None), "b": (1, None)}
    finally:
        replica.close()


async def test_expectations_must_match_the_records(tmp_path):
    replica = leader(tmp_path)
    try:
        with pytest.raises(ValueError):
            replica.submit([Record(b"a")], expected=[0, 1])
    finally:
        replica.close()
