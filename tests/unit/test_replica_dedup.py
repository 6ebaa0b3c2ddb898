"""Deduplication in the replica shell, on a real commit log: ids written, the window rebuilt from
the log's tail by a new leadership (a restart, a failover), and only that tail read."""

import asyncio
import time

import pytest

from bascule.partition import replica as replica_module
from bascule.partition.log import CommitLog
from bascule.partition.replica import PartitionReplica, SyncPolicy, placed_offsets, recent_ids
from bascule.partition.replication.dedup import DedupLimits
from bascule.wire.dedup import MESSAGE_ID_HEADER, window_key
from bascule.wire.entry import Record

pytestmark = pytest.mark.anyio
LEADING = dict(min_isr=1, max_lag_time=10.0, leader_timeout=10.0)
LIMITS = DedupLimits(max_age=120.0, max_messages=1000)


def with_id(value: bytes, message_id: bytes | None) -> Record:
    return Record(value, headers={} if message_id is None else {MESSAGE_ID_HEADER: message_id})


def leader(log: CommitLog, limits=LIMITS, epoch=0) -> PartitionReplica:
    replica = PartitionReplica("s", 0, log, SyncPolicy(), time.monotonic, dedup=limits)
    replica.become_leader("me", epoch, 0, ("me",), ("me",), **LEADING)
    return replica


async def written(replica: PartitionReplica, records: list[Record]) -> list[int]:
    """Submit ``records`` as one group with their ids; the offsets they were placed at."""
    done: asyncio.Future = asyncio.get_running_loop().create_future()
    replica.submit(records, lambda placement, error: done.set_result((placement, error)),
                   ids=[record.headers.get(MESSAGE_ID_HEADER) for record in records])
    placement, error = await asyncio.wait_for(done, 5)
    assert error is None
    return list(placed_offsets(placement, len(records)))


async def test_a_restarted_leader_rebuilds_its_window_from_the_log(tmp_path):
    replica = leader(CommitLog.open(tmp_path / "p"))
    assert await written(replica, [with_id(b"a", b"x"), with_id(b"b", None), with_id(b"c", b"y")]) == [0, 1, 2]
    assert await written(replica, [with_id(b"again", b"y")]) == [2]
    assert replica.duplicates == 1  # the metrics' bascule_partition_duplicates_total
    replica.close()
    reopened = leader(CommitLog.open(tmp_path / "p"), epoch=1)
    try:
        assert await written(reopened, [with_id(b"retry", b"x"), with_id(b"new", b"z")]) == [0, 3]
        assert [entry.value for entry in reopened.log.read(0, 10)] == [b"a", b"b", b"c", b"new"]
    finally:
        reopened.close()


async def test_deduplication_off_stores_every_copy(tmp_path):
    replica = leader(CommitLog.open(tmp_path / "p"), limits=DedupLimits(0, 0))
    try:
        assert await written(replica, [with_id(b"a", b"x")]) == [0]
        assert await written(replica, [with_id(b"a", b"x")]) == [1]
    finally:
        replica.close()


async def test_long_ids_are_kept_by_their_digest(tmp_path):
    replica = leader(CommitLog.open(tmp_path / "p"))
    long_id = b"k" * 500
    try:
        await written(replica, [with_id(b"a", long_id)])
        assert await written(replica, [with_id(b"b", long_id), with_id(b"c", long_id[:-1] + b"j")]) == [0, 1]
    finally:
        replica.close()
    assert [key for key, _, _ in recent_ids(CommitLog.open(tmp_path / "p"), LIMITS, 0.0)] == [
        window_key(long_id), window_key(long_id[:-1] + b"j")]


class CountingLog:
    """A real log that counts the entries read through it."""

    def __init__(self, log: CommitLog) -> None:
        self.log, self.entries_read = log, 0

    def __getattr__(self, name):
        return getattr(self.log, name)

    def read(self, offset, max_entries=1000, max_bytes=1 << 20):
        entries = self.log.read(offset, max_entries, max_bytes)
        self.entries_read += len(entries)
        return entries

    def read_through(self, offset, max_bytes, max_entries):
        data, advanced = self.log.read_through(offset, max_bytes, max_entries)
        self.entries_read += advanced
        return data, advanced


def test_a_rebuild_reads_only_the_window_s_tail(tmp_path):
    log = CommitLog.open(tmp_path / "p")
    for start in range(0, 5000, 500):
        log.append([with_id(b"v", b"id%d" % n) for n in range(start, start + 500)], 0)
    counting = CountingLog(log)
    remembered = recent_ids(counting, DedupLimits(max_age=120.0, max_messages=300), now=50.0)
    assert [offset for _, offset, _ in remembered] == list(range(4700, 5000))
    assert remembered[0][0] == b"id4700" and counting.entries_read <= 301  # the newest one, then the tail
    log.close()


def test_a_rebuild_keeps_only_ids_within_the_window_s_age(tmp_path):
    now_ns = [10**18]
    log = CommitLog.open(tmp_path / "p", clock=lambda: now_ns[0])
    log.append([with_id(b"old", b"old")], 0)
    now_ns[0] += 200 * 10**9  # 200 s later
    log.append([with_id(b"recent", b"recent"), with_id(b"newest", b"newest")], 0)
    remembered = recent_ids(log, DedupLimits(max_age=120.0, max_messages=1000), now=1000.0)
    assert [(key, offset, when) for key, offset, when in remembered] == [(b"recent", 1, 1000.0), (b"newest", 2, 1000.0)]
    log.close()


def test_a_log_without_ids_is_read_not_decoded(tmp_path, monkeypatch):
    log = CommitLog.open(tmp_path / "p")
    log.append([with_id(b"v", b"early")] + [with_id(b"v", None)] * 2000, 0)
    looked_into = []
    real = replica_module.stored_message_ids
    monkeypatch.setattr(replica_module, "stored_message_ids", lambda data: looked_into.append(data) or real(data))
    assert recent_ids(log, DedupLimits(max_age=120.0, max_messages=1000), now=0.0) == []
    assert looked_into == []
    log.close()
