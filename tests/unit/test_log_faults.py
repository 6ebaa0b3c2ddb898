"""Disk errors on a real commit log: failed fsyncs, full disks, writes cut short.

Faults are injected by monkeypatching os.write, os.fsync and os.ftruncate for the files whose
names end a certain way (named through /proc/self/fd), so everything else keeps its real disk.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest

from bascule.partition.log import CommitLog, LogConfig, LogFailed, Record
from bascule.wire.entry import encode_entries

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names files through /proc")

# Small index intervals: every append of a few records adds index points, so the index file is
# written on each append too.
CONFIG = LogConfig(segment_max_bytes=4096, index_interval_bytes=64)


def records(count: int, prefix: str) -> list[Record]:
    return [Record(f"{prefix}{i}".encode() * 3, key=b"k") for i in range(count)]


def fd_name(fd: int) -> str:
    return os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))


def fail_writes(monkeypatch, suffix: str, error: int = errno.ENOSPC, times: int = 1) -> None:
    """The next ``times`` writes to a file whose name ends with ``suffix`` write half their bytes,
    then raise ``error`` (a disk filling up mid-write)."""
    left = [times]

    def write(fd: int, data, real=os.write) -> int:
        if left[0] and fd_name(fd).endswith(suffix):
            left[0] -= 1
            real(fd, bytes(data)[: len(data) // 2])
            raise OSError(error, os.strerror(error))
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)


def fail_fsyncs(monkeypatch, suffix: str, error: int = errno.EIO, times: int = 1) -> None:
    """The next ``times`` fsyncs of a file whose name ends with ``suffix`` raise ``error``."""
    left = [times]

    def fsync(fd: int, real=os.fsync) -> None:
        if left[0] and fd_name(fd).endswith(suffix):
            left[0] -= 1
            raise OSError(error, os.strerror(error))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def files(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


def open_fds_under(directory: Path) -> list[str]:
    names = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(directory)):
            names.append(target)
    return names


# --- a failed fsync fails the log for good ---------------------------------------------------


def test_a_failed_fsync_fails_the_log_for_good(tmp_path, monkeypatch, caplog):
    log = CommitLog.open(tmp_path, CONFIG)
    log.append(records(3, "a"), 1)
    fail_fsyncs(monkeypatch, ".log")
    with caplog.at_level(logging.ERROR), pytest.raises(LogFailed) as raised:
        log.sync()
    failure = raised.value
    assert failure.errno == errno.EIO and isinstance(failure, OSError)
    assert str(tmp_path) in str(failure) and "fsync" in str(failure)
    assert log.failure is failure
    assert str(tmp_path) in caplog.text
    # fsync works again from here on: too late, it cannot vouch for the pages the failed one lost.
    data, walked = encode_entries(3, 1, records(1, "b"), 1)
    for attempt in (
        log.sync,
        log.begin_sync,
        lambda: log.append(records(1, "b"), 1),
        lambda: log.append_raw(data, walked),
        lambda: log.truncate(1),
        lambda: log.restart_at(10),
    ):
        with pytest.raises(LogFailed) as raised:
            attempt()
        assert raised.value is failure
    assert [entry.value for entry in log.read(0)] == [record.value for record in records(3, "a")]
    log.close()


def test_a_failed_fsync_in_a_background_sync_fails_the_log(tmp_path, monkeypatch):
    log = CommitLog.open(tmp_path, CONFIG)
    log.append(records(3, "a"), 1)
    run = log.begin_sync()
    fail_fsyncs(monkeypatch, ".log")
    with pytest.raises(LogFailed) as raised:
        run()
    assert raised.value.errno == errno.EIO
    for attempt in (log.sync, log.begin_sync, lambda: log.append(records(1, "b"), 1)):
        with pytest.raises(LogFailed):
            attempt()
    log.close()


def test_a_sync_that_succeeds_after_another_failed_proves_nothing(tmp_path, monkeypatch):
    """Two group commits in flight: the first fails, the second's own fsync then works; the pages
    the first could not write may be gone, so the second must not report success either."""
    log = CommitLog.open(tmp_path, CONFIG)
    log.append(records(3, "a"), 1)
    first = log.begin_sync()
    log.append(records(3, "b"), 1)
    second = log.begin_sync()
    fail_fsyncs(monkeypatch, ".log")
    with pytest.raises(LogFailed):
        first()
    with pytest.raises(LogFailed):
        second()
    log.close()


def test_synced_end_is_what_the_last_good_sync_covered(tmp_path, monkeypatch):
    log = CommitLog.open(tmp_path, CONFIG)
    log.append(records(3, "a"), 1)
    assert log.synced_end == 0
    log.sync()
    log.append(records(2, "b"), 1)
    assert log.synced_end == 3
    fail_fsyncs(monkeypatch, ".log")
    with pytest.raises(LogFailed):
        log.sync()
    assert log.synced_end == 3  # what a recovering replica may keep of this log
    log.close()
    assert CommitLog.open(tmp_path, CONFIG).synced_end == 5  # what open finds counts as synced


def test_a_sync_begun_before_a_truncation_vouches_for_nothing_after_it(tmp_path):
    log = CommitLog.open(tmp_path, CONFIG)
    log.append(records(3, "a"), 1)
    log.sync()
    log.append(records(3, "b"), 1)
    run = log.begin_sync()
    log.truncate(4)
    log.append(records(1, "c"), 1)
    run()
    assert log.synced_end == 3
    log.sync()
    assert log.synced_end == 5
    log.close()


def test_a_failed_log_closes_its_files_and_keeps_its_last_checkpoint(tmp_path, monkeypatch):
    log = CommitLog.open(tmp_path, CONFIG)
    log.append(records(3, "a"), 1)
    log.high_watermark = 0
    log.checkpoint()
    log.append(records(3, "b"), 1)
    fail_fsyncs(monkeypatch, ".log")
    with pytest.raises(LogFailed):
        log.sync()
    log.high_watermark = 5  # what replication says; this disk may not hold it
    log.checkpoint()
    log.close()
    assert (tmp_path / "replication-offset-checkpoint").read_text() == "0\n"
    assert open_fds_under(tmp_path) == []


# --- a full disk during an append -----------------------------------------------------------


@pytest.mark.parametrize("failing_file", [".log", ".index"])
@pytest.mark.parametrize("writer", ["leader", "follower"])
def test_a_write_cut_short_by_a_full_disk_appends_nothing(tmp_path, monkeypatch, caplog, failing_file, writer):
    log = CommitLog.open(tmp_path, CONFIG)
    log.append(records(5, "a"), 1)
    before_files, before_entries = files(tmp_path), log.read(0)
    batch = records(5, "b")

    def append() -> None:
        if writer == "leader":
            log.append(batch, 1)
        else:
            log.append_raw(*encode_entries(5, 1, batch, 1))

    fail_writes(monkeypatch, failing_file)
    with pytest.raises(OSError) as raised:
        append()
    assert raised.value.errno == errno.ENOSPC
    assert "nothing was appended" in str(raised.value) and "00000000000000000000.log" in str(raised.value)
    assert log.failure is None
    assert log.next_offset == 5 and log.read(0) == before_entries
    assert files(tmp_path) == before_files  # no partial entry, no stray index point

    append()  # space is back: the retry appends once
    expected = [record.value for record in records(5, "a") + batch]
    assert [entry.value for entry in log.read(0)] == expected
    log.close()
    with caplog.at_level(logging.INFO), CommitLog.open(tmp_path, CONFIG) as reopened:
        assert [entry.value for entry in reopened.read(0)] == expected
        assert [entry.offset for entry in reopened.read(0)] == list(range(10))
    assert "index" not in caplog.text  # the index on disk was right: nothing repaired or added


def test_a_full_disk_while_checkpointing_a_new_epoch_costs_only_the_checkpoint(tmp_path, monkeypatch, caplog):
    """The epoch checkpoint is only a shortcut for the next open: one that cannot be written
    fails neither the sync nor the log, and the next open reads the epochs from the entries."""
    log = CommitLog.open(tmp_path, CONFIG)
    log.append(records(3, "a"), 1)
    log.sync()
    fail_fsyncs(monkeypatch, "leader-epoch-checkpoint.tmp", errno.ENOSPC)
    log.append(records(2, "b"), 2)
    with caplog.at_level(logging.WARNING):
        log.sync()
    assert "could not write the leader-epoch checkpoint" in caplog.text
    assert log.failure is None
    assert log.epochs.entries == [(1, 0), (2, 3)]
    assert (tmp_path / "leader-epoch-checkpoint").read_text() == "end 3\n1 0\n"
    assert not (tmp_path / "leader-epoch-checkpoint.tmp").exists()
    log.append(records(1, "c"), 2)
    monkeypatch.undo()
    log.close()
    with CommitLog.open(tmp_path, CONFIG) as reopened:
        assert reopened.epochs.entries == [(1, 0), (2, 3)]
        assert reopened.next_offset == 6


def test_a_partial_write_that_cannot_be_cut_off_fails_the_log(tmp_path, monkeypatch):
    """If the half-written bytes cannot be cut off, the next append would land after them."""
    log = CommitLog.open(tmp_path, CONFIG)
    log.append(records(3, "a"), 1)
    fail_writes(monkeypatch, ".log")

    def ftruncate(fd: int, length: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "ftruncate", ftruncate)
    with pytest.raises(LogFailed) as raised:
        log.append(records(2, "b"), 1)
    monkeypatch.undo()
    assert log.failure is raised.value and raised.value.errno == errno.EIO
    with pytest.raises(LogFailed):
        log.append(records(2, "b"), 1)
    log.close()
