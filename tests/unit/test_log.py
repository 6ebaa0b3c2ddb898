import os
from pathlib import Path

import pytest
from conftest import not_private

from bascule.partition.log import (
    CommitLog,
    CorruptEntry,
    EpochHistory,
    LogConfig,
    OffsetOutOfRange,
    Record,
    commitlog,
)
from bascule.partition.log.segment import Segment
from bascule.wire.entry import decode_entries, encode_entries

SMALL_SEGMENTS = LogConfig(segment_max_bytes=1024, index_interval_bytes=128)


class FakeClock:
    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def values(count: int, prefix: str = "m") -> list[Record]:
    return [Record(f"{prefix}{i}".encode() * 5) for i in range(count)]


def log_files(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir() if path.suffix in (".log", ".index"))


def all_log_bytes(directory: Path) -> bytes:
    return b"".join(path.read_bytes() for path in sorted(directory.glob("*.log")))


def test_empty_log(tmp_path):
    with CommitLog.open(tmp_path) as log:
        assert (log.oldest_offset, log.newest_offset, log.next_offset) == (0, -1, 0)
        assert log.high_watermark == -1
        assert log.epochs == EpochHistory()
        assert log.read_raw(0, 100) == b""
        assert log.read(0) == []
    assert log_files(tmp_path) == ["00000000000000000000.index", "00000000000000000000.log"]


def test_append_assigns_offsets_and_read_returns_entries(tmp_path):
    clock = FakeClock()
    with CommitLog.open(tmp_path, clock=clock) as log:
        assert log.append([Record(b"a"), Record(b"b", key=b"k")], leader_epoch=3) == (0, 1)
        clock.now += 10
        assert log.append([Record(b"c", headers={"subject": b"s"})], leader_epoch=3) == (2, 2)
        entries = log.read(0)
        assert [(e.offset, e.value, e.key, e.leader_epoch) for e in entries] == [
            (0, b"a", None, 3),
            (1, b"b", b"k", 3),
            (2, b"c", None, 3),
        ]
        assert [e.timestamp for e in entries] == [1_000_000, 1_000_000, 1_000_010]
        assert entries[2].headers == {"subject": b"s"}
        assert (log.newest_offset, log.next_offset) == (2, 3)


def test_append_rejects_empty_batch_and_stale_epoch(tmp_path):
    with CommitLog.open(tmp_path) as log:
        with pytest.raises(ValueError):
            log.append([], 1)
        log.append(values(1), 5)
        with pytest.raises(ValueError, match="older"):
            log.append(values(1), 4)
        assert log.next_offset == 1


def test_timestamps_never_go_backwards(tmp_path):
    clock = FakeClock(5_000)
    with CommitLog.open(tmp_path, clock=clock) as log:
        log.append(values(1), 1)
        clock.now = 4_000  # the wall clock stepped back
        log.append(values(1), 1)
        log.append(
            [Record(b"own", timestamp=9_000), Record(b"early", timestamp=100), Record(b"x")], 1
        )
        log.append([Record(b"older than now", timestamp=9_500)], 1)
        clock.now = 10_000
        log.append([Record(b"x"), Record(b"own", timestamp=9_800)], 1)
        assert [e.timestamp for e in log.read(0)] == [
            5_000,
            5_000,
            9_000,
            9_000,
            9_000,
            9_500,
            10_000,
            10_000,
        ]


def test_new_epochs_are_recorded_and_checkpointed(tmp_path):
    with CommitLog.open(tmp_path) as log:
        log.append(values(2), 1)
        log.append(values(3), 4)
        log.append(values(1), 4)
        assert log.epochs.entries == [(1, 0), (4, 2)]
    assert (tmp_path / "leader-epoch-checkpoint").read_text() == "end 6\n1 0\n4 2\n"


def test_changes_to_epochs_are_checkpointed_by_the_next_sync_after_the_data(tmp_path):
    with CommitLog.open(tmp_path) as log:
        log.append(values(2), 1)
        log.sync()
        assert (tmp_path / "leader-epoch-checkpoint").read_text() == "end 2\n1 0\n"
        assert log.epochs.assign(2, log.next_offset)  # a new leader, before its first append
        assert (tmp_path / "leader-epoch-checkpoint").read_text() == "end 2\n1 0\n"
        sync = log.begin_sync()
        log.append(values(1), 2)  # after the sync began: not covered by it
        sync()
        assert (tmp_path / "leader-epoch-checkpoint").read_text() == "end 2\n1 0\n2 2\n"
        log.append(values(1), 2)
        assert log.epochs.end_offset_for(1, log.next_offset) == (1, 2)


def test_the_epoch_checkpoint_follows_a_growing_log_and_a_clean_close(tmp_path, monkeypatch):
    """Opening walks the entries past the checkpoint's end: a log that only grows in one epoch keeps the
    checkpoint within EPOCH_CHECKPOINT_LAG offsets of its end, and a clean close brings it to the end."""
    monkeypatch.setattr(commitlog, "EPOCH_CHECKPOINT_LAG", 10)
    with CommitLog.open(tmp_path) as log:
        log.append(values(2), 1)
        log.sync()
        log.append(values(10), 1)
        log.sync()
        assert (tmp_path / "leader-epoch-checkpoint").read_text() == "end 2\n1 0\n"  # within the lag
        log.append(values(1), 1)
        log.sync()
        assert (tmp_path / "leader-epoch-checkpoint").read_text() == "end 13\n1 0\n"
        log.append(values(3), 1)
    assert (tmp_path / "leader-epoch-checkpoint").read_text() == "end 16\n1 0\n"


def test_a_cleanly_closed_log_opens_without_reading_its_entries_for_their_epochs(tmp_path, monkeypatch):
    with CommitLog.open(tmp_path) as log:
        log.append(values(100), 1)
        log.append(values(100), 3)
        log.sync()  # the checkpoint: end 200
        log.append(values(20), 3)  # no new epoch, and well within the lag
    walked: list[int] = []
    entry_epochs = Segment.entry_epochs

    def counted(segment: Segment, offset: int):
        walked.append(offset)
        return entry_epochs(segment, offset)

    monkeypatch.setattr(Segment, "entry_epochs", counted)
    with CommitLog.open(tmp_path) as log:
        assert log.epochs.entries == [(1, 0), (3, 100)]
    assert walked == []


def test_read_limits(tmp_path):
    with CommitLog.open(tmp_path) as log:
        log.append(values(10), 1)
        one_entry = len(log.read_raw(0, 1))
        assert one_entry > 1  # at least one entry even if bigger than max_bytes
        assert len(decode_entries(log.read_raw(0, one_entry * 3 + 1))) == 3
        assert len(log.read(2, max_entries=4)) == 4
        assert [e.offset for e in log.read(2, max_bytes=one_entry * 2)] == [2, 3]
        assert log.read(5, max_entries=0) == []
        assert [e.offset for e in log.read(8)] == [8, 9]
        assert log.read(10) == []


def test_big_entry_is_returned_whole(tmp_path):
    with CommitLog.open(tmp_path) as log:
        log.append([Record(b"x" * 100_000), Record(b"y")], 1)
        assert [e.value for e in log.read(0, max_bytes=10)] == [b"x" * 100_000]
        assert [e.value for e in log.read(0, max_bytes=100_100)] == [b"x" * 100_000, b"y"]


def test_segments_roll_by_size_and_reads_span_them(tmp_path):
    with CommitLog.open(tmp_path, SMALL_SEGMENTS) as log:
        for batch in range(20):
            log.append(values(3, prefix=f"b{batch}-"), 1)
        names = log_files(tmp_path)
        assert len(names) > 4
        assert all(size <= 1024 for size in (p.stat().st_size for p in tmp_path.glob("*.log")))
        entries = log.read(0, max_entries=1000, max_bytes=1 << 20)
        assert [e.offset for e in entries] == list(range(60))
        raw = log.read_raw(7, 3000)
        assert [e.offset for e in decode_entries(raw)] == list(
            range(7, 7 + len(decode_entries(raw)))
        )
        assert len(raw) <= 3000
        for offset in range(60):
            assert (
                log.read(offset, max_entries=1)[0].value
                == f"b{offset // 3}-{offset % 3}".encode() * 5
            )


def test_segment_base_offsets_name_files(tmp_path):
    with CommitLog.open(tmp_path, LogConfig(segment_max_bytes=200)) as log:
        for _ in range(3):
            log.append(values(2), 1)
    bases = sorted(int(p.stem) for p in tmp_path.glob("*.log"))
    assert bases == [0, 2, 4]
    assert all(len(p.stem) == 20 for p in tmp_path.glob("*.log"))


def test_segments_roll_by_age(tmp_path):
    clock = FakeClock()
    config = LogConfig(segment_max_age=10)
    with CommitLog.open(tmp_path, config, clock=clock) as log:
        log.append(values(1), 1)
        clock.now += 9 * 10**9
        log.append(values(1), 1)
        assert len(list(tmp_path.glob("*.log"))) == 1
        clock.now += 1 * 10**9
        log.append(values(1), 1)
        assert sorted(int(p.stem) for p in tmp_path.glob("*.log")) == [0, 2]


def test_offset_out_of_range(tmp_path):
    with CommitLog.open(tmp_path) as log:
        log.append(values(3), 1)
        with pytest.raises(OffsetOutOfRange):
            log.read_raw(4, 100)
        with pytest.raises(OffsetOutOfRange):
            log.read(-1)
        assert log.read_raw(3, 100) == b""


def test_offset_for_timestamp(tmp_path):
    clock = FakeClock(1_000)
    with CommitLog.open(tmp_path, SMALL_SEGMENTS, clock=clock) as log:
        assert log.offset_for_timestamp(0) == 0
        for _ in range(30):
            log.append(values(2), 1)
            clock.now += 100
        # offsets 2k and 2k+1 carry timestamp 1000 + 100k
        assert log.offset_for_timestamp(0) == 0
        assert log.offset_for_timestamp(1_000) == 0
        assert log.offset_for_timestamp(1_001) == 2
        assert log.offset_for_timestamp(1_100) == 2
        assert log.offset_for_timestamp(2_550) == 32
        assert log.offset_for_timestamp(3_900) == 58
        assert log.offset_for_timestamp(3_901) == 60
        for k in range(30):
            assert log.offset_for_timestamp(1_000 + 100 * k) == 2 * k


def test_high_watermark(tmp_path):
    with CommitLog.open(tmp_path) as log:
        log.append(values(5), 1)
        with pytest.raises(ValueError):
            log.high_watermark = 5
        with pytest.raises(ValueError):
            log.high_watermark = -2
        log.high_watermark = 3
        assert not (tmp_path / "replication-offset-checkpoint").exists()
        log.checkpoint()
        assert (tmp_path / "replication-offset-checkpoint").read_text() == "3\n"
        assert not list(tmp_path.glob("*.tmp"))
        log.high_watermark = 4
    with CommitLog.open(tmp_path) as log:
        assert log.high_watermark == 4  # close checkpoints it


def test_reopen_keeps_everything(tmp_path):
    clock = FakeClock()
    with CommitLog.open(tmp_path, SMALL_SEGMENTS, clock=clock) as log:
        for epoch in (1, 1, 2, 5):
            log.append(values(7), epoch)
            clock.now += 1
        log.high_watermark = 20
        before = log.read(0, max_entries=1000)
        epochs = log.epochs.entries
    with CommitLog.open(tmp_path, SMALL_SEGMENTS, clock=clock) as log:
        assert log.read(0, max_entries=1000) == before
        assert log.epochs.entries == epochs == [(1, 0), (2, 14), (5, 21)]
        assert log.high_watermark == 20
        assert (log.oldest_offset, log.next_offset) == (0, 28)
        assert log.append(values(1), 5) == (28, 28)
        assert log.read(28)[0].timestamp == clock.now


def test_epoch_without_entries_is_forgotten_at_reopen(tmp_path):
    with CommitLog.open(tmp_path) as log:
        log.append(values(1), 1)
        log.epochs.assign(2, 1)
    with CommitLog.open(tmp_path) as log:
        assert log.epochs.entries == [(1, 0)]


# --- follower path --------------------------------------------------------------------------


def replicate(leader: CommitLog, follower: CommitLog, fetch_bytes: int) -> None:
    while follower.next_offset < leader.next_offset:
        follower.append_raw(leader.read_raw(follower.next_offset, fetch_bytes))


def test_append_raw_reproduces_leader_bytes(tmp_path):
    config = LogConfig(index_interval_bytes=100)
    with (
        CommitLog.open(tmp_path / "leader", config) as leader,
        CommitLog.open(tmp_path / "follower", config) as follower,
    ):
        for epoch, size in ((1, 1), (1, 17), (3, 4), (3, 40), (7, 2)):
            leader.append(values(size, prefix=f"e{epoch}-"), epoch)
        replicate(leader, follower, fetch_bytes=333)
        assert follower.epochs == leader.epochs
        assert follower.read(0, max_entries=1000) == leader.read(0, max_entries=1000)
    for name in (
        "00000000000000000000.log",
        "00000000000000000000.index",
        "leader-epoch-checkpoint",
    ):
        assert (tmp_path / "follower" / name).read_bytes() == (
            tmp_path / "leader" / name
        ).read_bytes()


def test_append_raw_across_segment_rolls(tmp_path):
    with (
        CommitLog.open(tmp_path / "leader", SMALL_SEGMENTS) as leader,
        CommitLog.open(tmp_path / "follower", SMALL_SEGMENTS) as follower,
    ):
        for batch in range(30):
            leader.append(values(2, prefix=f"{batch}-"), 1 + batch // 10)
        replicate(leader, follower, fetch_bytes=500)
        assert follower.epochs == leader.epochs
    assert all_log_bytes(tmp_path / "follower") == all_log_bytes(tmp_path / "leader")


def test_append_raw_rejects_bad_data_and_appends_nothing(tmp_path):
    with CommitLog.open(tmp_path) as log:
        log.append(values(3), 2)
        size = (tmp_path / "00000000000000000000.log").stat().st_size
        good = encode_entries(3, 2, values(2), 1)[0]
        with pytest.raises(ValueError, match="continue"):
            log.append_raw(encode_entries(2, 2, values(2), 1)[0])  # an overlap (a gap is a compacted leader's)
        with pytest.raises(ValueError, match="older"):
            log.append_raw(encode_entries(3, 1, values(2), 1)[0])
        damaged = bytearray(good)
        damaged[-1] ^= 1
        with pytest.raises(CorruptEntry):
            log.append_raw(bytes(damaged))
        with pytest.raises(CorruptEntry):
            log.append_raw(good + b"\x00" * 7)
        assert log.next_offset == 3
        assert (tmp_path / "00000000000000000000.log").stat().st_size == size
        assert log.append_raw(b"") == 3
        assert log.append_raw(good) == 5
        assert log.append_raw(memoryview(encode_entries(5, 3, values(1), 1)[0])) == 6
        assert log.epochs.entries == [(2, 0), (3, 5)]


# --- truncation -----------------------------------------------------------------------------


def test_truncate_inside_a_segment_then_append(tmp_path):
    with CommitLog.open(tmp_path) as log:
        log.append(values(10), 1)
        log.append(values(5), 2)
        log.high_watermark = 12
        log.truncate(7)
        assert (log.next_offset, log.newest_offset) == (7, 6)
        assert log.epochs.entries == [(1, 0)]
        assert log.high_watermark == 6
        assert [e.offset for e in log.read(0)] == list(range(7))
        assert log.append([Record(b"new")], 3) == (7, 7)
        assert log.read(7)[0].value == b"new"
    with CommitLog.open(tmp_path) as log:
        assert [e.value for e in log.read(6)] == [b"m6" * 5, b"new"]
        assert log.epochs.entries == [(1, 0), (3, 7)]


def test_truncate_across_segments(tmp_path):
    with CommitLog.open(tmp_path, SMALL_SEGMENTS) as log:
        for batch in range(20):
            log.append(values(3, prefix=f"{batch}-"), 1 + batch // 5)
        bases = sorted(int(p.stem) for p in tmp_path.glob("*.log"))
        cut = bases[2] + 1
        log.truncate(cut)
        assert sorted(int(p.stem) for p in tmp_path.glob("*.log")) == bases[:3]
        assert sorted(int(p.stem) for p in tmp_path.glob("*.index")) == bases[:3]
        assert log.next_offset == cut
        assert log.epochs.entries == [
            (e, s) for e, s in [(1, 0), (2, 15), (3, 30), (4, 45)] if s < cut
        ]
        log.append(values(50, prefix="again"), 9)
        assert [e.offset for e in log.read(0, max_entries=1000)] == list(range(cut + 50))
        expected = log.read(0, max_entries=1000)
    with CommitLog.open(tmp_path, SMALL_SEGMENTS) as log:
        assert log.read(0, max_entries=1000) == expected


def test_truncate_at_a_segment_base(tmp_path):
    with CommitLog.open(tmp_path, SMALL_SEGMENTS) as log:
        for _ in range(10):
            log.append(values(3), 1)
        base = sorted(int(p.stem) for p in tmp_path.glob("*.log"))[1]
        log.truncate(base)
        assert log.next_offset == base
        log.append(values(1), 1)
        assert [e.offset for e in log.read(0, max_entries=1000)] == list(range(base + 1))


def test_truncate_everything_and_past_the_end(tmp_path):
    with CommitLog.open(tmp_path) as log:
        log.append(values(4), 1)
        log.truncate(10)
        assert log.next_offset == 4
        log.truncate(0)
        assert (log.oldest_offset, log.next_offset) == (0, 0)
        assert log.epochs.entries == []
        assert log.read(0) == []
        log.append(values(2), 2)
        assert [e.leader_epoch for e in log.read(0)] == [2, 2]


def test_truncate_below_oldest_restarts_the_log(tmp_path):
    with CommitLog.open(tmp_path, SMALL_SEGMENTS) as log:
        for _ in range(20):
            log.append(values(3), 1)
        log.high_watermark = log.newest_offset
        log.enforce_retention()  # no limits: nothing deleted
        assert log.oldest_offset == 0
    config = LogConfig(segment_max_bytes=1024, index_interval_bytes=128, retention_max_messages=10)
    with CommitLog.open(tmp_path, config) as log:
        log.high_watermark = log.newest_offset
        assert log.enforce_retention() > 0
        oldest = log.oldest_offset
        log.truncate(oldest - 5)
        assert (log.oldest_offset, log.next_offset) == (oldest - 5, oldest - 5)
        assert log_files(tmp_path) == [f"{oldest - 5:020d}.index", f"{oldest - 5:020d}.log"]
        log.append(values(1), 2)
        assert log.read(oldest - 5)[0].offset == oldest - 5


def test_sync_and_close_are_idempotent(tmp_path):
    log = CommitLog.open(tmp_path)
    log.append(values(3), 1)
    log.sync()
    log.sync()
    log.close()
    log.close()


def test_restart_at_empties_the_log_and_starts_it_past_its_old_end(tmp_path):
    """A follower below its leader's log start restarts its log there; the restart survives a reopen."""
    with CommitLog.open(tmp_path, SMALL_SEGMENTS) as log:
        log.append(values(20), 1)
        log.high_watermark = 15
        log.restart_at(100)
        assert (log.oldest_offset, log.next_offset, log.high_watermark) == (100, 100, 99)
        assert log.epochs.entries == []
        with pytest.raises(OffsetOutOfRange):
            log.read(50)
        log.append(values(3), 2)
        log.high_watermark = 101
    assert [name for name in log_files(tmp_path) if name.endswith(".log")] == ["00000000000000000100.log"]
    with CommitLog.open(tmp_path, SMALL_SEGMENTS) as log:
        assert (log.oldest_offset, log.next_offset, log.high_watermark) == (100, 103, 101)
        assert log.epochs.entries == [(2, 100)]


def test_everything_a_log_creates_is_private(tmp_path, permissive_umask):
    """Directories 0700 (with the parents the log makes), files 0600: segments, indexes, checkpoints,
    and the segments a truncation or a restart starts, whatever the umask."""
    directory = tmp_path / "streams" / "orders@1" / "0"
    with CommitLog.open(directory, SMALL_SEGMENTS) as log:
        for epoch in (1, 2, 3):
            log.append(values(20), epoch)
        log.high_watermark = log.newest_offset
        log.sync()
        log.checkpoint()
        log.truncate(30)  # cuts into a sealed segment
        log.append(values(5), 4)
    with CommitLog.open(directory, SMALL_SEGMENTS) as log:  # an active segment reopened
        log.append(values(5), 4)
        log.restart_at(log.next_offset + 10)  # a new first segment
        log.append(values(1), 5)
    names = {path.name for path in directory.iterdir()}
    assert {"leader-epoch-checkpoint", "replication-offset-checkpoint"} <= names
    assert len(log_files(directory)) >= 2
    os.chmod(tmp_path, 0o700)  # pytest's, not the log's
    assert not_private(tmp_path) == {}
