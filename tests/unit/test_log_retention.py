import pytest

from bascule.partition.log import CommitLog, LogConfig, OffsetOutOfRange, Record

SECOND = 10**9


class FakeClock:
    def __init__(self, now: int = 1_000 * SECOND) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def fill(log: CommitLog, batches: int, per_batch: int = 4, clock: FakeClock | None = None) -> None:
    for batch in range(batches):
        log.append([Record(b"%d-%d" % (batch, i) * 10) for i in range(per_batch)], 1 + batch // 5)
        if clock:
            clock.now += SECOND
    log.high_watermark = log.newest_offset


def segment_bases(log: CommitLog) -> list[int]:
    return sorted(int(path.stem) for path in log.directory.glob("*.log"))


def segment_sizes(log: CommitLog) -> list[int]:
    return [path.stat().st_size for path in sorted(log.directory.glob("*.log"))]


def config(**limits) -> LogConfig:
    return LogConfig(segment_max_bytes=500, index_interval_bytes=100, **limits)


def test_no_limits_deletes_nothing(tmp_path):
    with CommitLog.open(tmp_path, config()) as log:
        fill(log, 20)
        assert log.enforce_retention() == 0
        assert log.oldest_offset == 0


def test_retention_by_bytes_keeps_the_newest_segments_within_the_limit(tmp_path):
    with CommitLog.open(tmp_path, config(retention_max_bytes=1_500)) as log:
        fill(log, 20)
        bases_before = segment_bases(log)
        deleted = log.enforce_retention()
        assert deleted > 0
        assert segment_bases(log) == bases_before[deleted:]
        assert sum(segment_sizes(log)) <= 1_500
        assert sum(segment_sizes(log)) + 500 > 1_500  # it did not delete more than needed
        assert log.oldest_offset == bases_before[deleted]
        assert log.read(log.oldest_offset)[0].offset == log.oldest_offset
        with pytest.raises(OffsetOutOfRange):
            log.read(log.oldest_offset - 1)
        assert log.enforce_retention() == 0


def test_retention_by_messages(tmp_path):
    with CommitLog.open(tmp_path, config(retention_max_messages=25)) as log:
        fill(log, 20)
        log.enforce_retention()
        held = log.next_offset - log.oldest_offset
        assert held <= 25
        first_deleted_would_fit = held + (segment_bases(log)[1] - segment_bases(log)[0])
        assert first_deleted_would_fit > 25 or len(segment_bases(log)) == 1


def test_retention_by_age_with_an_injected_clock(tmp_path):
    clock = FakeClock()
    with CommitLog.open(tmp_path, config(retention_max_age=10), clock=clock) as log:
        fill(log, 20, clock=clock)  # offset o stamped at 1000 s + o // 4 s; now is 1020 s
        cutoff_second = 1_010
        assert log.enforce_retention() > 0
        last_deleted = log.oldest_offset - 1
        assert 1_000 + last_deleted // 4 < cutoff_second
        first_kept_segment_end = segment_bases(log)[1] - 1
        assert 1_000 + first_kept_segment_end // 4 >= cutoff_second
        clock.now += 100 * SECOND
        log.enforce_retention()
        assert len(segment_bases(log)) == 1  # never the active segment


def test_active_segment_is_never_deleted(tmp_path):
    with CommitLog.open(
        tmp_path, LogConfig(retention_max_bytes=10, retention_max_messages=1)
    ) as log:
        fill(log, 3)
        assert log.enforce_retention() == 0
        assert log.oldest_offset == 0


def test_uncommitted_segments_are_kept(tmp_path):
    with CommitLog.open(tmp_path, config(retention_max_messages=1)) as log:
        fill(log, 20)
        bases = segment_bases(log)
        log.high_watermark = bases[2] - 1  # only the first two segments are committed
        assert log.enforce_retention() == 2
        assert log.oldest_offset == bases[2]
        log.high_watermark = -1
        assert log.enforce_retention() == 0


def test_retention_trims_epochs_and_survives_reopen(tmp_path):
    with CommitLog.open(tmp_path, config(retention_max_messages=30)) as log:
        fill(log, 20)  # epochs 1..4 start at offsets 0, 20, 40, 60
        log.enforce_retention()
        oldest = log.oldest_offset
        expected_epochs = [
            (1 + s // 20, max(s, oldest)) for s in (0, 20, 40, 60) if s + 20 > oldest
        ]
        assert log.epochs.entries == expected_epochs
        expected = log.read(oldest, max_entries=1000)
    with CommitLog.open(tmp_path, config(retention_max_messages=30)) as log:
        assert log.oldest_offset == oldest
        assert log.epochs.entries == expected_epochs
        assert log.read(oldest, max_entries=1000) == expected
        assert log.offset_for_timestamp(0) == oldest
