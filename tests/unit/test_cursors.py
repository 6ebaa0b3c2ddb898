"""Cursors as Liftbridge stores them (a protobuf Cursor per record, keyed, in a compacted stream),
read back by the API's index from a real commit log: old 8-byte records, compaction, new
leaderships."""

import time
from types import SimpleNamespace

import pytest
from google.protobuf.descriptor import FieldDescriptor as F
from hypothesis import given
from hypothesis import strategies as st

from bascule.api.cursors import OLD_OFFSET, CursorError, Cursors, cursor_key, cursor_offset, encode_cursor
from bascule.h2grpc import Status
from bascule.partition.log import CommitLog, LogConfig
from bascule.partition.replica import PartitionReplica, SyncPolicy
from bascule.wire.entry import Record
from bascule.wire.names import CURSORS_STREAM
from bascule.wire.pb import internal_pb2

pytestmark = pytest.mark.anyio


def test_the_cursor_record_is_liftbridges_field_for_field():
    fields = {field.name: (field.number, field.type) for field in internal_pb2.Cursor.DESCRIPTOR.fields}
    assert fields == {
        "stream": (1, F.TYPE_STRING),
        "partition": (2, F.TYPE_INT32),
        "cursorId": (3, F.TYPE_STRING),
        "offset": (4, F.TYPE_INT64),
    }
    # the bytes Liftbridge's Go server writes for Cursor{Stream: "s", Partition: 2, CursorId: "c", Offset: 300}
    go_bytes = b"\x0a\x01s\x10\x02\x1a\x01c\x20\xac\x02"
    assert encode_cursor("s", 2, "c", 300) == go_bytes
    assert cursor_offset(go_bytes) == 300


@pytest.mark.parametrize("offset", [0, 1, 5, 2**40, 2**56 - 1, -1, -(2**56)])
def test_records_of_earlier_bascule_are_read_as_their_offset(offset):
    assert cursor_offset(OLD_OFFSET.pack(offset)) == offset


@given(st.text(min_size=1), st.integers(0, 2**31 - 1), st.text(min_size=1), st.integers(-(2**63), 2**63 - 1))
def test_new_records_are_never_taken_for_old_ones(stream, partition, cursor_id, offset):
    assert cursor_offset(encode_cursor(stream, partition, cursor_id, offset)) == offset


@given(st.binary(max_size=40))
def test_garbage_is_an_offset_or_none_never_an_error(value):
    assert cursor_offset(value) is None or isinstance(cursor_offset(value), int)


# --- the index over a real log ------------------------------------------------------------------


class Cluster:
    server_id = "me"

    def __init__(self) -> None:
        cursors = SimpleNamespace(partitions={0: SimpleNamespace(leader="me", paused=False)})
        self.state = SimpleNamespace(
            streams={CURSORS_STREAM: cursors},
            partition=lambda stream, partition: SimpleNamespace(paused=False) if partition == 0 else None,
        )


class Replicas:
    def __init__(self, replica: PartitionReplica) -> None:
        self.replica = replica

    def get(self, stream, partition):
        return SimpleNamespace(replica=self.replica, subject="ns.cursors")


def cursor_replica(directory, epoch: int = 1) -> PartitionReplica:
    log = CommitLog.open(directory, LogConfig(segment_max_bytes=300, index_interval_bytes=64))
    replica = PartitionReplica(CURSORS_STREAM, 0, log, SyncPolicy(), time.monotonic)
    replica.become_leader("me", epoch, 0, ("me",), ("me",), min_isr=1, max_lag_time=10.0, leader_timeout=10.0)
    return replica


def write(replica: PartitionReplica, records: list[tuple[bytes, bytes]]) -> None:
    for key, value in records:
        replica.log.append([Record(value, key=key)], replica.leader_epoch)
    replica.log.high_watermark = replica.log.newest_offset


def compact(log: CommitLog) -> None:
    job = log.begin_compaction()
    assert job is not None
    job.prepare()
    log.finish_compaction(job)()


async def test_old_records_new_records_and_compaction_all_read_as_the_latest_per_key(tmp_path):
    replica = cursor_replica(tmp_path / "cursors")
    try:
        cursors = Cursors(Cluster(), Replicas(replica), publishing=None)
        a, b = cursor_key("reader", "events", 0), cursor_key("other", "events", 0)
        write(replica, [(a, OLD_OFFSET.pack(offset)) for offset in range(10)])  # written before the upgrade
        write(replica, [(b, OLD_OFFSET.pack(7))])
        assert cursors.fetch("events", 0, "reader") == 9
        write(replica, [(a, encode_cursor("events", 0, "reader", offset)) for offset in range(10, 20)])
        assert cursors.fetch("events", 0, "reader") == 19
        assert cursors.fetch("events", 0, "other") == 7  # an old record stays the latest of its key
        write(replica, [(a, b"\x07garbage"), (None, b"no key")])  # neither moves any cursor
        assert cursors.fetch("events", 0, "reader") == 19
        write(replica, [(a, encode_cursor("events", 0, "reader", 25))] + [(b"pad", b"x" * 60)] * 6)
        compact(replica.log)
        assert len(replica.log.read(replica.log.oldest_offset, 1000)) < replica.log.next_offset
        fresh = Cursors(Cluster(), Replicas(replica), publishing=None)  # as after a restart
        assert fresh.fetch("events", 0, "reader") == 25
        assert fresh.fetch("events", 0, "other") == 7
        assert fresh.fetch("events", 0, "never") == -1
    finally:
        replica.close()


async def test_cursors_survive_reopening_the_compacted_log(tmp_path):
    replica = cursor_replica(tmp_path / "cursors")
    key = cursor_key("reader", "events", 0)
    write(replica, [(key, encode_cursor("events", 0, "reader", offset)) for offset in range(30)])
    write(replica, [(b"pad", b"x" * 60)] * 6)
    compact(replica.log)
    replica.close()
    replica = cursor_replica(tmp_path / "cursors", epoch=2)
    try:
        assert Cursors(Cluster(), Replicas(replica), publishing=None).fetch("events", 0, "reader") == 29
    finally:
        replica.close()


async def test_a_new_leadership_reads_the_partition_again(tmp_path):
    """A former follower's log may have been cut and written again since the index read it."""
    replica = cursor_replica(tmp_path / "cursors")
    try:
        cursors = Cursors(Cluster(), Replicas(replica), publishing=None)
        key = cursor_key("reader", "events", 0)
        write(replica, [(key, encode_cursor("events", 0, "reader", 5))])
        assert cursors.fetch("events", 0, "reader") == 5
        replica.log.truncate(0)  # as a follower, its entry was not the new leader's
        write(replica, [(b"other", b"x"), (key, encode_cursor("events", 0, "reader", 3))])
        replica.become_leader("me", 4, 1, ("me",), ("me",), min_isr=1, max_lag_time=10.0, leader_timeout=10.0)
        assert cursors.fetch("events", 0, "reader") == 3
    finally:
        replica.close()


async def test_a_cursor_may_name_any_stream_and_partition_but_needs_both_ids(tmp_path):
    """Liftbridge's rules and words: a stream or partition that does not exist is no error."""
    replica = cursor_replica(tmp_path / "cursors")
    try:
        cursors = Cursors(Cluster(), Replicas(replica), publishing=None)
        assert cursors.fetch("deleted", 9, "reader") == -1
        write(replica, [(cursor_key("reader", "deleted", 9), encode_cursor("deleted", 9, "reader", 4))])
        assert cursors.fetch("deleted", 9, "reader") == 4
        for stream, cursor_id, words in [("", "reader", "No stream provided"), ("events", "", "No cursorId provided")]:
            with pytest.raises(CursorError, match=words) as refused:
                cursors.fetch(stream, 0, cursor_id)
            assert refused.value.status == Status.INVALID_ARGUMENT
    finally:
        replica.close()
