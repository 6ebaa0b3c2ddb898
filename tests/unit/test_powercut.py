"""bascule.testing.powercut: a FUSE mount whose cut drops exactly what was not fsynced."""

from __future__ import annotations

import errno
import mmap
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bascule.testing.local import LocalNode
from bascule.testing.powercut import PowerCutDisk, PowerCutError, fuse_unavailable_reason
from bascule.testing.processes import LocalProcessError


@pytest.fixture
def disk(tmp_path: Path):
    reason = fuse_unavailable_reason()
    if reason is not None:
        pytest.skip(f"power-cut tests need a FUSE mount: {reason}")
    with PowerCutDisk(tmp_path / ".data.backing", tmp_path / "data") as disk:
        yield disk


@pytest.fixture
def data(disk: PowerCutDisk) -> Path:
    return disk.mountpoint


def write(path: Path, data: bytes, *, offset: int | None = None, sync: bool = False) -> None:
    """Append `data` (or write it at `offset`), fsync if asked, close."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | (os.O_APPEND if offset is None else 0), 0o644)
    try:
        if offset is None:
            os.write(fd, data)
        else:
            os.pwrite(fd, data, offset)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def sync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def test_unsynced_appends_are_lost_and_the_synced_prefix_kept(disk: PowerCutDisk, data: Path) -> None:
    log = data / "log"
    write(log, b"first;", sync=True)
    write(log, b"second;")
    write(log, b"third;")
    assert log.read_bytes() == b"first;second;third;"  # the writer sees its own writes
    stats = disk.cut()
    assert log.read_bytes() == b"first;"
    assert stats["bytes_truncated"] == len(b"second;third;")
    assert stats["files_rolled_back"] == 1 and stats["files_removed"] == 0


def test_fsync_and_fdatasync_make_writes_durable(disk: PowerCutDisk, data: Path) -> None:
    write(data / "a", b"one", sync=True)
    write(data / "a", b"two", sync=True)
    fd = os.open(data / "b", os.O_WRONLY | os.O_CREAT)
    os.write(fd, b"datasynced")
    os.fdatasync(fd)
    os.close(fd)
    assert disk.cut()["bytes_dropped"] == 0
    assert (data / "a").read_bytes() == b"onetwo"
    assert (data / "b").read_bytes() == b"datasynced"


def test_overwrites_in_a_synced_file_get_their_old_bytes_back(disk: PowerCutDisk, data: Path) -> None:
    index = data / "index"
    write(index, bytes(range(100)), sync=True)
    write(index, b"\xff" * 10, offset=20)
    write(index, b"\xee" * 10, offset=25)  # overlaps: the bytes saved must be those before the first write
    write(index, b"\xdd" * 30, offset=90)  # runs past the old end
    stats = disk.cut()
    assert index.read_bytes() == bytes(range(100))
    assert stats["bytes_restored"] == 15 + 10 and stats["bytes_truncated"] == 20


def test_truncates_are_undone(disk: PowerCutDisk, data: Path) -> None:
    write(data / "shrunk", b"0123456789", sync=True)
    os.truncate(data / "shrunk", 4)
    write(data / "shrunk", b"abc")  # lands on bytes the truncate removed
    write(data / "grown", b"0123", sync=True)
    os.truncate(data / "grown", 1000)
    with open(data / "reopened", "wb") as file:
        file.write(b"kept")
        file.flush()
        os.fsync(file.fileno())
    with open(data / "reopened", "wb") as file:  # O_TRUNC
        file.write(b"new")
    disk.cut()
    assert (data / "shrunk").read_bytes() == b"0123456789"
    assert (data / "grown").read_bytes() == b"0123"
    assert (data / "reopened").read_bytes() == b"kept"


def test_a_new_file_is_removed_unless_it_or_its_directory_was_fsynced(disk: PowerCutDisk, data: Path) -> None:
    (data / "dir").mkdir()
    write(data / "dir" / "never-synced", b"gone")
    write(data / "dir" / "synced", b"kept", sync=True)
    write(data / "listed", b"data not synced")
    sync_directory(data)  # makes "listed" durable as a name, and "dir" (mkdir is durable anyway)
    stats = disk.cut()
    assert sorted(os.listdir(data)) == ["dir", "listed"]
    assert os.listdir(data / "dir") == ["synced"]
    assert (data / "dir" / "synced").read_bytes() == b"kept"
    assert (data / "listed").read_bytes() == b""  # its name survived, its unsynced data did not
    assert stats["files_removed"] == 1 and stats["bytes_dropped"] == len(b"gone") + len(b"data not synced")


def test_renames_and_unlinks_are_durable_at_once(disk: PowerCutDisk, data: Path) -> None:
    write(data / "old-name", b"synced", sync=True)
    os.rename(data / "old-name", data / "new-name")
    write(data / "doomed", b"synced", sync=True)
    os.unlink(data / "doomed")
    write(data / "target", b"old target", sync=True)
    write(data / "replacement.tmp", b"never synced")
    os.replace(data / "replacement.tmp", data / "target")
    write(data / "temporary", b"unsynced, then renamed into a new dir")
    (data / "moved").mkdir()
    os.rename(data / "temporary", data / "moved" / "file")
    disk.cut()
    # The replaced target is gone for good; the new file that replaced it was never synced, so it
    # goes too, wherever the rename took it.
    assert sorted(os.listdir(data)) == ["moved", "new-name"]
    assert os.listdir(data / "moved") == []
    assert (data / "new-name").read_bytes() == b"synced"


def test_writes_through_a_shared_mmap_are_undone_without_msync(disk: PowerCutDisk, data: Path) -> None:
    journal = data / "journal"
    write(journal, b"\0" * 8192, sync=True)
    with open(journal, "r+b") as file, mmap.mmap(file.fileno(), 0) as mapped:
        mapped[0:5] = b"dirty"
        assert journal.read_bytes()[:5] == b"dirty"  # other readers see it, as with a page cache
    disk.cut()
    assert journal.read_bytes() == b"\0" * 8192


def test_msync_and_fsync_make_mmap_writes_durable(disk: PowerCutDisk, data: Path) -> None:
    write(data / "msynced", b"\0" * 8192, sync=True)
    write(data / "fsynced", b"\0" * 8192, sync=True)
    for name, make_durable in [("msynced", lambda mapped, _: mapped.flush()), ("fsynced", lambda _, fd: os.fsync(fd))]:
        with open(data / name, "r+b") as file, mmap.mmap(file.fileno(), 0) as mapped:
            mapped[4096:4101] = b"saved"
            make_durable(mapped, file.fileno())
            mapped[0:4] = b"lost"  # after the sync: undone
    disk.cut()
    for name in ("msynced", "fsynced"):
        assert (data / name).read_bytes() == b"\0" * 4096 + b"saved" + b"\0" * 4091, name


WRITER = """
import mmap, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_APPEND)
for n in range(50):
    os.write(fd, b"record %02d;" % n)
    if n == 19:
        os.fsync(fd)
mapped = mmap.mmap(os.open(sys.argv[2], os.O_RDWR), 0)
mapped[100:108] = b"mmapped!"
print("written", flush=True)
time.sleep(60)
"""


def test_a_sigkilled_writer_loses_what_it_did_not_sync(disk: PowerCutDisk, data: Path) -> None:
    write(data / "log", b"", sync=True)
    write(data / "journal", b"\0" * 4096, sync=True)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(data / "log"), str(data / "journal")],
                              stdout=subprocess.PIPE)
    assert writer.stdout is not None and writer.stdout.readline() == b"written\n"
    writer.send_signal(signal.SIGKILL)
    writer.wait()  # its dirty mmap'd pages reach the filesystem as it exits
    stats = disk.cut()
    assert (data / "log").read_bytes() == b"".join(b"record %02d;" % n for n in range(20))
    assert (data / "journal").read_bytes() == b"\0" * 4096
    assert stats["bytes_truncated"] == 30 * len(b"record 00;") and stats["bytes_restored"] >= 8


def test_after_a_cut_the_disk_tracks_new_writes_afresh(disk: PowerCutDisk, data: Path) -> None:
    write(data / "log", b"a", sync=True)
    write(data / "log", b"b")
    disk.cut()
    write(data / "log", b"c", sync=True)
    write(data / "log", b"d")
    disk.cut()
    assert (data / "log").read_bytes() == b"ac"


def test_stop_unmounts_and_leaves_the_files_in_the_backing_dir(tmp_path: Path) -> None:
    reason = fuse_unavailable_reason()
    if reason is not None:
        pytest.skip(f"power-cut tests need a FUSE mount: {reason}")
    disk = PowerCutDisk(tmp_path / ".backing", tmp_path / "mount")
    disk.start()
    write(tmp_path / "mount" / "file", b"x", sync=True)
    disk.stop()
    assert str(tmp_path / "mount") not in Path("/proc/self/mounts").read_text()
    assert os.listdir(tmp_path / "mount") == []
    assert (tmp_path / ".backing" / "file").read_bytes() == b"x"


# ---- disk faults ----


def fails_with(error: int, action: Callable[[], object]) -> None:
    with pytest.raises(OSError) as raised:
        action()
    assert raised.value.errno == error, raised.value


def test_a_full_disk_refuses_writes_under_its_prefix_and_nothing_else(disk: PowerCutDisk, data: Path) -> None:
    (data / "streams").mkdir()
    write(data / "streams" / "log", b"synced;", sync=True)
    disk.set_faults(full=True, prefix="/streams")
    fails_with(errno.ENOSPC, lambda: write(data / "streams" / "log", b"refused;"))
    fails_with(errno.ENOSPC, lambda: write(data / "streams" / "new", b"refused"))
    fails_with(errno.ENOSPC, lambda: os.truncate(data / "streams" / "log", 100))
    assert os.statvfs(data / "streams").f_bavail == 0
    assert os.statvfs(data).f_bavail > 0
    write(data / "streams-beside", b"outside the prefix", sync=True)
    write(data / "journal", b"outside the prefix", sync=True)
    # What frees space or needs none still works.
    assert (data / "streams" / "log").read_bytes() == b"synced;"
    os.truncate(data / "streams" / "log", 6)
    sync_directory(data / "streams")
    os.rename(data / "streams" / "log", data / "streams" / "log.old")
    os.unlink(data / "streams" / "new")
    disk.set_faults()
    write(data / "streams" / "log.old", b"accepted", sync=True)
    assert (data / "streams" / "log.old").read_bytes() == b"syncedaccepted"


def test_a_failed_fsync_makes_nothing_durable(disk: PowerCutDisk, data: Path) -> None:
    write(data / "log", b"synced;", sync=True)
    disk.set_faults(fsync_error=True)
    fd = os.open(data / "log", os.O_WRONLY | os.O_APPEND)
    os.write(fd, b"lost;")
    fails_with(errno.EIO, lambda: os.fsync(fd))
    fails_with(errno.EIO, lambda: os.fdatasync(fd))
    os.close(fd)
    fails_with(errno.EIO, lambda: write(data / "new", b"created", sync=True))
    fails_with(errno.EIO, lambda: sync_directory(data))
    assert (data / "log").read_bytes() == b"synced;lost;"  # readers see the pages, as with a page cache
    stats = disk.cut()
    assert (data / "log").read_bytes() == b"synced;"
    assert os.listdir(data) == ["log"]
    assert stats["bytes_truncated"] == len(b"lost;") and stats["files_removed"] == 1


def test_a_cut_switches_the_faults_off(disk: PowerCutDisk, data: Path) -> None:
    disk.set_faults(full=True, fsync_error=True)
    disk.cut()
    write(data / "log", b"accepted", sync=True)
    disk.cut()
    assert (data / "log").read_bytes() == b"accepted"


def test_a_slow_fsync_waits_without_holding_up_other_operations(disk: PowerCutDisk, data: Path) -> None:
    delay = 1.0
    (data / "streams").mkdir()
    write(data / "streams" / "log", b"x" * 4096)
    write(data / "journal", b"y" * 4096)
    disk.set_faults(fsync_delay=delay, prefix="/streams")
    fsync_took: list[float] = []

    def slow_fsync() -> None:
        started = time.monotonic()
        write(data / "streams" / "log", b"synced", sync=True)
        fsync_took.append(time.monotonic() - started)

    syncer = threading.Thread(target=slow_fsync)
    syncer.start()
    time.sleep(delay / 4)  # the fsync is waiting in the filesystem now
    started = time.monotonic()
    assert (data / "streams" / "log").read_bytes()[:4096] == b"x" * 4096
    write(data / "journal", b"synced", sync=True)  # outside the prefix: no wait
    assert time.monotonic() - started < delay / 2 and syncer.is_alive()
    syncer.join()
    assert fsync_took[0] >= delay
    assert disk.cut()["bytes_dropped"] == 0


def test_garbage_commands_are_refused_and_change_nothing(disk: PowerCutDisk, data: Path) -> None:
    disk.set_faults(full=True)
    garbage = ["bogus", "faults", "faults {", "faults []", 'faults {"full": 1}', 'faults {"disk": true}',
               'faults {"fsync_delay": -1}', 'faults {"fsync_delay": 1e999}', 'faults {"prefix": "streams"}',
               'faults {"prefix": "/a/../b"}', 'faults {"prefix": "/streams/"}']
    for line in garbage:
        with pytest.raises(PowerCutError):
            disk._request(line, timeout=5.0)  # set_faults cannot send these
    fails_with(errno.ENOSPC, lambda: write(data / "log", b"refused"))
    with pytest.raises(ValueError, match="prefix"):
        disk.set_faults(prefix="streams")


def test_a_node_without_a_power_cut_disk_has_no_disk_faults(tmp_path: Path) -> None:
    with pytest.raises(LocalProcessError, match="no power-cut disk"):
        LocalNode(tmp_path / "data").disk_faults(full=True)
