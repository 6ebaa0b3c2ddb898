"""A disk that can lose power: a FUSE passthrough filesystem that forgets every write not fsynced.

``PowerCutDisk(backing, mountpoint)`` runs ``python -m bascule.testing.powercut BACKING MOUNTPOINT`` (the
FUSE process, on mfusepy and libfuse) and mounts ``backing`` at ``mountpoint``. Processes using the
mountpoint see an ordinary directory; after they are SIGKILLed, ``cut()`` puts every file back as a
power cut would have left it, and says how much it dropped.

The model:

- Every operation passes through to the backing directory at once, so the writing process sees its own
  writes, as it would through a page cache (and shared writable mmap works: files are not opened with
  direct_io, and mmap'd pages reach this process as writes when the kernel writes them back: at msync,
  at fsync, or when the last mapping goes, which a SIGKILL does too).
- Per file, an undo log kept in this process's memory: before the first write or truncate touching a
  byte range since the file's last fsync, the old bytes of that range are saved, and the file's size at
  its first such change. Bytes past that size need no saving: the cut truncates them away.
- fsync and fdatasync of a file (msync too, which the kernel turns into writeback and then fsync) drop
  its undo log: what it holds is durable. Nothing copies whole files; an fsync costs a dict removal.
- A regular file created since the mount (or the last cut) is new until it, or its parent directory,
  is fsynced; the cut removes new files, wherever renames took them.
- Everything else in the namespace is durable at once: rename, unlink, mkdir, rmdir, link, symlink,
  chmod, chown, utimens. On ext4 (data=ordered) these are journaled and committed in the order they
  happened, within the commit interval (5 s) or at the next fsync of any file, which commits the whole
  running transaction; the model takes the case where that commit happened. A program that writes a
  file, fsyncs it, renames it into place and fsyncs the directory, as it should, is right under both.
  Created files get the strict treatment instead, because losing a file that was created and written
  but never made durable is the mistake worth catching (a log segment nobody synced).
- ``cut()``: each file with an undo log gets its old bytes back and is truncated to its old size; new
  files are removed; the logs are forgotten. It is meant for after the writers were SIGKILLed (so that
  the kernel has written their mmap'd pages back); the kernel's caches hold nothing stale afterwards,
  since the mount caches no attributes or names (timeouts 0) and drops a file's pages when it is opened.

Not modelled: torn writes inside a range (a cut loses whole writes, never half of one), reordering of
data between two fsyncs of different files (both are simply lost), the loss of renames or unlinks
(see above), ext4's flush of a file's data when it is renamed over another (``auto_da_alloc``), and
durability of the backing files themselves: fsync is not passed on, since the test machine keeps power.

Disk faults, switched on and off while processes use the mount (``set_faults``, `DiskFaults`), each
limited to the files under a path prefix (``/streams``: a node's partition logs fail while its Raft
journal beside them does not, as with a separate log directory), by default the whole mount. A fault
applies to a file by its current path, or the path it was opened at once it is unlinked.

- full: write and a truncate that extends a file fail with ENOSPC, so do the kernel's writebacks of
  mmap'd pages (their error comes back once, at the next msync or fsync); statfs reports no free blocks.
  Reads, shrinking truncates, fsync, creates, renames and unlinks still work. Harsher than ext4 in two
  ways: it would take overwrites of allocated blocks, and an extending truncate (a hole). fallocate is
  not implemented, on any disk here (glibc's posix_fallocate then writes zeros, which fail).
- fsync_error: fsync, fdatasync and directory fsyncs fail with EIO and make nothing durable: the undo
  logs and the new files stay, and a later cut drops them. Linux would also have marked the failed
  pages clean, so that a retried fsync which succeeds does not write them, and they are lost at a power
  cut (or read back old once evicted). Not modelled: here a successful fsync after the fault is switched
  off makes everything durable, so the model does not catch a program that retries a failed fsync.
- fsync_delay: each fsync (and directory fsync) waits that many seconds before its work, while other
  operations go on (libfuse's multi-threaded loop). An fsync still waiting when a cut comes fails.

The test process talks to the FUSE process over a pipe: one command a line on its stdin, one JSON
reply a line on its stdout. ``cut`` answers with its counts and switches every fault off (the machine
boots again, on a disk that works); ``faults {"full": true, "fsync_error": false, "fsync_delay": 0.0,
"prefix": "/streams"}`` replaces the faults (keys left out are off) and answers ``{"ok": true}``;
``stop`` unmounts. Anything else, or a ``faults`` whose JSON is wrong, answers ``{"error": ...}`` and
changes nothing. End of input (the test process died) unmounts too, and libfuse's ``auto_unmount``
unmounts if the FUSE process itself is killed.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import functools
import json
import os
import posixpath
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

__all__ = ["DiskFaults", "PowerCutDisk", "PowerCutError", "fuse_unavailable_reason"]

FUSERMOUNT = "fusermount3"
# libfuse 3 speaks to the kernel in requests of up to 256 pages; asking for that gives 1 MiB writes.
MAX_WRITE = 1024 * 1024
MAX_FSYNC_DELAY = 3600.0
_STAT_FIELDS = ("st_mode", "st_ino", "st_nlink", "st_uid", "st_gid", "st_size", "st_blocks", "st_blksize", "st_rdev")
_STATVFS_FIELDS = ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree", "f_favail",
                   "f_flag", "f_namemax")


class PowerCutError(RuntimeError):
    """The power-cut filesystem did not mount, did not answer, or answered with an error."""


@dataclasses.dataclass(frozen=True)
class DiskFaults:
    """The faults a power-cut disk has switched on, each limited to the files under `prefix`."""

    full: bool = False  # writes and extending truncates fail with ENOSPC
    fsync_error: bool = False  # fsync, fdatasync and directory fsyncs fail with EIO, and make nothing durable
    fsync_delay: float = 0.0  # seconds each fsync waits before doing its work
    prefix: str = "/"  # a path inside the mount, like "/streams"

    def __post_init__(self) -> None:
        for name in ("full", "fsync_error"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false")
        delay = self.fsync_delay
        if isinstance(delay, bool) or not isinstance(delay, int | float) or not 0 <= delay <= MAX_FSYNC_DELAY:
            raise ValueError(f"fsync_delay must be a number of seconds from 0 to {MAX_FSYNC_DELAY:g}")
        prefix = self.prefix
        normalised = isinstance(prefix, str) and prefix.startswith("/") and posixpath.normpath(prefix) == prefix
        if not normalised or prefix.startswith("//"):
            raise ValueError(f"prefix must be a normalised absolute path inside the mount, like /streams: {prefix!r}")

    @classmethod
    def from_json(cls, text: str) -> DiskFaults:
        """The argument of a ``faults`` command; ValueError says what is wrong with it."""
        try:
            fields = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"faults takes a JSON object: {exc}") from None
        if not isinstance(fields, dict):
            raise ValueError("faults takes a JSON object")
        unknown = sorted(set(fields) - {field.name for field in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"unknown faults {unknown}")
        return cls(**fields)

    def covers(self, path: str) -> bool:
        return self.prefix == "/" or path == self.prefix or path.startswith(self.prefix + "/")


# ---- the FUSE process ----------------------------------------------------------------------------


class _Ranges:
    """Disjoint, sorted half-open byte ranges."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []

    def gaps(self, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of [start, end) not covered yet."""
        gaps = []
        index = bisect_right(self._ends, start)
        position = start
        while position < end and index < len(self._starts) and self._starts[index] < end:
            if self._starts[index] > position:
                gaps.append((position, self._starts[index]))
            position = max(position, self._ends[index])
            index += 1
        if position < end:
            gaps.append((position, end))
        return gaps

    def add(self, start: int, end: int) -> None:
        first = bisect_left(self._ends, start)
        after = bisect_right(self._starts, end)
        if first < after:
            start, end = min(start, self._starts[first]), max(end, self._ends[after - 1])
        self._starts[first:after] = [start]
        self._ends[first:after] = [end]


class UndoLog:
    """What one file held at its last fsync, for the bytes changed since: enough to put it back."""

    def __init__(self, fd: int) -> None:
        self.fd = os.dup(fd)  # its own descriptor: the file may be closed, or renamed, before the cut
        self.size = os.fstat(fd).st_size
        self._saved: list[tuple[int, bytes]] = []
        self._covered = _Ranges()

    def save(self, start: int, end: int) -> None:
        """Keep the old bytes of [start, end) that are not kept yet (none past the old size)."""
        end = min(end, self.size)
        if start >= end:
            return
        for gap_start, gap_end in self._covered.gaps(start, end):
            self._saved.append((gap_start, os.pread(self.fd, gap_end - gap_start, gap_start)))
        self._covered.add(start, end)

    def restore(self) -> tuple[int, int]:
        """Old bytes back, old size back; (bytes restored, bytes truncated)."""
        for offset, data in self._saved:
            os.pwrite(self.fd, data, offset)
        grown = os.fstat(self.fd).st_size - self.size
        os.ftruncate(self.fd, self.size)
        return sum(len(data) for _, data in self._saved), max(0, grown)

    def close(self) -> None:
        os.close(self.fd)


def _stat_dict(st: os.stat_result) -> dict[str, int]:
    attrs = {name: getattr(st, name) for name in _STAT_FIELDS}
    attrs.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
    return attrs


def _backing_flags(flags: int) -> int:
    # Read-write whenever writable, so that old bytes can be read before a write. The kernel gives
    # every write its offset (O_APPEND included), and O_TRUNC is done by the caller, with an undo log.
    flags &= ~(os.O_APPEND | os.O_TRUNC | os.O_CREAT | os.O_EXCL)
    if flags & os.O_ACCMODE != os.O_RDONLY:
        flags = (flags & ~os.O_ACCMODE) | os.O_RDWR
    return flags


class PowerCutFilesystem:
    """mfusepy operations: a passthrough to `backing` that keeps undo logs; see the module docstring."""

    use_ns = True  # timestamps in nanoseconds

    def __init__(self, backing: Path, on_ready: Any = None) -> None:
        self.backing = str(backing)
        self._on_ready = on_ready
        self._lock = threading.Lock()  # undo logs and the writes they guard
        self._inodes: dict[int, int] = {}  # open file handle -> inode
        self._logs: dict[int, UndoLog] = {}  # inode -> undo log
        self._new: dict[int, str] = {}  # inode -> path of a file whose creation is not durable yet
        self._paths: dict[int, str] = {}  # open file handle -> its path when opened
        self._cuts = 0
        self.faults = DiskFaults()

    def _full(self, path: str) -> str:
        return self.backing + path

    # -- lifecycle --
    def init_with_config(self, conn: Any, config: Any) -> None:
        conn.max_write = MAX_WRITE
        # Nothing cached in the kernel but pages, which it drops at each open: after a cut the
        # next process sees the files as they are now.
        config.attr_timeout = config.entry_timeout = config.negative_timeout = 0
        config.hard_remove = 1  # an unlinked open file stays reachable by its handle
        config.use_ino = 1
        if self._on_ready is not None:
            self._on_ready()

    # -- the undo model --
    def _log_for(self, fd: int) -> UndoLog:
        inode = self._inodes[fd] if fd in self._inodes else os.fstat(fd).st_ino
        log = self._logs.get(inode)
        if log is None:
            log = self._logs[inode] = UndoLog(fd)
        return log

    def _truncate_fd(self, fd: int, length: int, path: str) -> None:
        with self._lock:
            if length > os.fstat(fd).st_size:
                self._refuse_if_full(path)
            self._log_for(fd).save(length, 2**63)
            os.ftruncate(fd, length)

    def _drop_log(self, inode: int) -> None:
        log = self._logs.pop(inode, None)
        if log is not None:
            log.close()

    def _forget(self, inode: int) -> None:
        """The file is durable (fsynced) or gone (its last name removed)."""
        self._drop_log(inode)
        self._new.pop(inode, None)

    def _forget_if_last_link(self, full: str) -> None:
        try:
            st = os.lstat(full)
        except FileNotFoundError:
            return
        if st.st_nlink <= 1:
            self._forget(st.st_ino)

    def _forget_new_in(self, directory: str) -> None:
        for inode, new_path in list(self._new.items()):
            if os.path.dirname(new_path) == directory:
                del self._new[inode]

    # -- the faults --
    def _path_of(self, path: str | None, fh: int) -> str:
        # FUSE gives the current path, except for a file unlinked while open: then the one it was opened at.
        return path if path is not None else self._paths[fh]

    def _refuse_if_full(self, path: str) -> None:
        faults = self.faults
        if faults.full and faults.covers(path):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    def _sync(self, path: str, make_durable: Callable[[], None]) -> None:
        """Call make_durable() under the lock, after the faults on `path` (delay, then error) had their turn."""
        faults, cuts = self.faults, self._cuts
        if faults.covers(path):
            time.sleep(faults.fsync_delay)  # outside the lock: other operations go on meanwhile
            if faults.fsync_error:
                raise OSError(errno.EIO, os.strerror(errno.EIO), path)
        with self._lock:
            if self._cuts != cuts:  # the power went while this fsync waited: it never finished
                raise OSError(errno.EIO, os.strerror(errno.EIO), path)
            make_durable()

    def cut(self) -> dict[str, int]:
        """Drop whatever was not made durable, switch the faults off; how much was dropped."""
        stats = dict.fromkeys(("files_removed", "files_rolled_back", "bytes_restored", "bytes_truncated",
                               "bytes_dropped"), 0)
        with self._lock:
            for inode, path in self._new.items():
                self._drop_log(inode)
                full = self._full(path)
                st = os.lstat(full)
                if st.st_ino == inode:
                    os.unlink(full)
                    stats["files_removed"] += 1
                    stats["bytes_dropped"] += st.st_size
            for log in self._logs.values():
                restored, truncated = log.restore()
                log.close()
                stats["files_rolled_back"] += 1
                stats["bytes_restored"] += restored
                stats["bytes_truncated"] += truncated
                stats["bytes_dropped"] += restored + truncated
            self._logs.clear()
            self._new.clear()
            self._cuts += 1
            self.faults = DiskFaults()  # the machine boots again, on a disk that works
        return stats

    # -- files --
    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, int]:
        if fh is not None:
            return _stat_dict(os.fstat(fh))
        assert path is not None  # FUSE leaves the path out only when it gives a handle
        return _stat_dict(os.lstat(self._full(path)))

    def open(self, path: str, flags: int) -> int:
        fd = os.open(self._full(path), _backing_flags(flags))
        self._inodes[fd] = os.fstat(fd).st_ino
        self._paths[fd] = path
        if flags & os.O_TRUNC and flags & os.O_ACCMODE != os.O_RDONLY:
            self._truncate_fd(fd, 0, path)
        return fd

    def create(self, path: str, mode: int, flags: int) -> int:
        full = self._full(path)
        try:
            fd = os.open(full, _backing_flags(flags) | os.O_CREAT | os.O_EXCL, mode)
        except FileExistsError:
            if flags & os.O_EXCL:
                raise
            return self.open(path, flags)
        inode = self._inodes[fd] = os.fstat(fd).st_ino
        self._paths[fd] = path
        with self._lock:
            self._new[inode] = path
        return fd

    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        return os.pread(fh, size, offset)

    def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
        self._refuse_if_full(self._path_of(path, fh))
        with self._lock:
            self._log_for(fh).save(offset, offset + len(data))
            return os.pwrite(fh, data, offset)

    def truncate(self, path: str | None, length: int, fh: int | None = None) -> None:
        if fh is not None:
            self._truncate_fd(fh, length, self._path_of(path, fh))
            return
        assert path is not None  # FUSE leaves the path out only when it gives a handle
        fd = os.open(self._full(path), os.O_RDWR)
        try:
            self._truncate_fd(fd, length, path)
        finally:
            os.close(fd)

    def fsync(self, path: str | None, datasync: int, fh: int) -> None:
        inode = self._inodes[fh]  # now: a caller killed during a slow fsync has its handle released meanwhile
        self._sync(self._path_of(path, fh), lambda: self._forget(inode))

    def flush(self, path: str | None, fh: int) -> None:
        """close() makes nothing durable."""

    def release(self, path: str | None, fh: int) -> None:
        self._inodes.pop(fh, None)
        self._paths.pop(fh, None)
        os.close(fh)

    # -- the namespace --
    def fsyncdir(self, path: str, datasync: int, fh: int) -> None:
        self._sync(path, lambda: self._forget_new_in(path))

    def readdir(self, path: str, fh: int) -> list[tuple[str, dict[str, int], int]]:
        # With use_ino, an entry must carry its inode: readers skip those numbered 0.
        full = self._full(path)
        entries = [(name, os.lstat(os.path.join(full, name))) for name in (".", "..")]
        with os.scandir(full) as found:
            entries += [(entry.name, entry.stat(follow_symlinks=False)) for entry in found]
        return [(name, {"st_ino": st.st_ino, "st_mode": st.st_mode}, 0) for name, st in entries]

    def mkdir(self, path: str, mode: int) -> None:
        os.mkdir(self._full(path), mode)

    def rmdir(self, path: str) -> None:
        os.rmdir(self._full(path))

    def unlink(self, path: str) -> None:
        full = self._full(path)
        with self._lock:
            self._forget_if_last_link(full)
            os.unlink(full)

    def rename(self, old: str, new: str) -> None:
        with self._lock:
            self._forget_if_last_link(self._full(new))
            os.rename(self._full(old), self._full(new))
            for inode, path in self._new.items():
                if path == old or path.startswith(old + "/"):
                    self._new[inode] = new + path[len(old):]

    def link(self, target: str, source: str) -> None:
        os.link(self._full(source), self._full(target))

    def symlink(self, target: str, source: str) -> None:
        os.symlink(source, self._full(target))

    def readlink(self, path: str) -> str:
        return os.readlink(self._full(path))

    def chmod(self, path: str, mode: int) -> None:
        os.chmod(self._full(path), mode)

    def chown(self, path: str, uid: int, gid: int) -> None:
        os.chown(self._full(path), uid, gid, follow_symlinks=False)

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> None:
        if times is None:
            os.utime(self._full(path))
        else:
            os.utime(self._full(path), ns=times)

    def statfs(self, path: str) -> dict[str, int]:
        st = os.statvfs(self._full(path))
        attrs = {name: getattr(st, name) for name in _STATVFS_FIELDS}
        faults = self.faults
        if faults.full and faults.covers(path):
            attrs.update(f_bfree=0, f_bavail=0)
        return attrs


def _unmount(mountpoint: str) -> None:
    """Unmount, lazily if something still holds the mount (a node that was not stopped)."""
    if subprocess.run([FUSERMOUNT, "-u", "-q", mountpoint], stderr=subprocess.DEVNULL).returncode != 0:
        subprocess.run([FUSERMOUNT, "-u", "-z", "-q", mountpoint], stderr=subprocess.DEVNULL)


def _serve_commands(filesystem: PowerCutFilesystem, mountpoint: str, reply: Any) -> None:
    """Answer the test process until it says stop or goes away, then unmount (which ends the FUSE loop)."""
    try:
        for line in sys.stdin:
            command = line.strip()
            if command == "stop":
                break
            reply(_answer(filesystem, command))
    finally:
        _unmount(mountpoint)


def _answer(filesystem: PowerCutFilesystem, command: str) -> dict[str, Any]:
    name, _, argument = command.partition(" ")
    if command == "cut":
        try:
            return filesystem.cut()
        except OSError as exc:
            return {"error": f"cut failed: {exc}"}
    if name == "faults":
        try:
            filesystem.faults = DiskFaults.from_json(argument)
        except ValueError as exc:
            return {"error": str(exc)}
        return {"ok": True}
    return {"error": f"unknown command {command!r}"}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bascule.testing.powercut", description=__doc__.split("\n")[0])
    parser.add_argument("backing", type=Path, help="the directory holding the files")
    parser.add_argument("mountpoint", type=Path, help="where they appear (a node's data dir)")
    args = parser.parse_args(argv)
    import mfusepy  # here, not at the top: importing it loads libfuse, which the test process need not have

    reply_lock = threading.Lock()

    def reply(message: dict[str, Any]) -> None:
        with reply_lock:
            sys.stdout.write(json.dumps(message) + "\n")
            sys.stdout.flush()

    mountpoint = str(args.mountpoint.resolve())
    filesystem = PowerCutFilesystem(args.backing.resolve(), on_ready=lambda: reply({"ready": True}))
    threading.Thread(target=_serve_commands, args=(filesystem, mountpoint, reply), daemon=True).start()
    # Multi-threaded (mfusepy's default, said here because a slow fsync must not stall reads and writes
    # of other threads): libfuse's fuse_loop_mt, each operation in Python holding the GIL but for its I/O.
    mfusepy.FUSE(filesystem, mountpoint, foreground=True, nothreads=False, auto_unmount=True,
                 fsname="bascule-powercut")


# ---- the test process's side ---------------------------------------------------------------------


def _mounted(mountpoint: Path) -> bool:
    target = str(mountpoint)
    with open("/proc/self/mounts", encoding="utf-8", errors="replace") as mounts:
        # Spaces in mount points are written as \040.
        return any(line.split()[1].replace("\\040", " ") == target for line in mounts if line.strip())


def _force_unmount(mountpoint: Path) -> None:
    if not _mounted(mountpoint):
        return
    if shutil.which(FUSERMOUNT):
        subprocess.run([FUSERMOUNT, "-u", "-z", "-q", str(mountpoint)], stderr=subprocess.DEVNULL)
    if _mounted(mountpoint):
        subprocess.run(["umount", "-l", str(mountpoint)], stderr=subprocess.DEVNULL)


class PowerCutDisk:
    """`backing` mounted at `mountpoint` through the power-cut filesystem, run as its own process.

        with PowerCutDisk(tmp / ".data.backing", tmp / "data") as disk:
            ...               # a process writes under tmp/data, and is SIGKILLed
            disk.cut()        # {"bytes_dropped": ..., "files_removed": ..., ...}

    `set_faults` switches disk faults on while processes run on it (`DiskFaults`); a cut switches
    them off. `stop` unmounts (the files stay in `backing`); it can be started again.
    """

    def __init__(self, backing: str | os.PathLike[str], mountpoint: str | os.PathLike[str],
                 python: str = sys.executable) -> None:
        self.backing = Path(backing).resolve()
        self.mountpoint = Path(mountpoint).resolve()
        self.python = python
        self._process: subprocess.Popen[bytes] | None = None
        self._errors: IO[bytes] | None = None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout: float = 10.0) -> None:
        """Mount; returns once the kernel has opened the filesystem."""
        if self.running:
            raise PowerCutError(f"{self.mountpoint} is already mounted by this disk")
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self._errors = tempfile.TemporaryFile()
        self._process = subprocess.Popen(
            [self.python, "-m", "bascule.testing.powercut", str(self.backing), str(self.mountpoint)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._errors, cwd="/",
            start_new_session=True,  # a Ctrl-C meant for the tests must not take the mount away before cleanup
        )
        try:
            self._reply(timeout)
        except BaseException:
            self.stop()
            raise

    def cut(self, timeout: float = 30.0) -> dict[str, int]:
        """Drop every write not fsynced, and every file created and never synced, and switch the faults
        off; the counts.

        Call it when the processes that wrote are gone (SIGKILLed and reaped)."""
        return self._request("cut", timeout)

    def set_faults(self, *, full: bool = False, fsync_error: bool = False, fsync_delay: float = 0.0,
                   prefix: str = "/") -> None:
        """Switch on these faults (and off those not given) for the files under `prefix`, a path inside
        the mount ("/streams"), from now until the next `set_faults` or `cut`; ``set_faults()`` clears
        them. See `DiskFaults` and the module docstring."""
        faults = DiskFaults(full, fsync_error, fsync_delay, prefix)
        self._request(f"faults {json.dumps(dataclasses.asdict(faults))}", timeout=10.0)

    def _request(self, command: str, timeout: float) -> dict[str, Any]:
        if not self.running:
            raise PowerCutError(f"the power-cut filesystem at {self.mountpoint} is not running")
        assert self._process is not None and self._process.stdin is not None
        self._process.stdin.write(command.encode() + b"\n")
        self._process.stdin.flush()
        answer = self._reply(timeout)
        if "error" in answer:
            raise PowerCutError(answer["error"])
        return answer

    def stop(self, timeout: float = 10.0) -> None:
        """Unmount and end the FUSE process (killed after `timeout`); never leaves a mount behind."""
        process, self._process = self._process, None
        if process is not None:
            try:
                assert process.stdin is not None
                process.stdin.write(b"stop\n")
                process.stdin.close()
            except OSError:
                pass  # it is gone already
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()
        _force_unmount(self.mountpoint)
        if self._errors is not None:
            self._errors.close()
            self._errors = None

    def _reply(self, timeout: float) -> dict[str, Any]:
        assert self._process is not None and self._process.stdout is not None
        ready, _, _ = select.select([self._process.stdout], [], [], timeout)
        line = self._process.stdout.readline() if ready else b""
        if not line:
            why = "did not answer" if not ready else f"exited with {self._process.wait()}"
            raise PowerCutError(f"the power-cut filesystem at {self.mountpoint} {why}\n{self._error_tail()}")
        return json.loads(line)

    def _error_tail(self) -> str:
        if self._errors is None:
            return ""
        self._errors.seek(0)
        return self._errors.read().decode(errors="replace")[-4000:]

    def __enter__(self) -> PowerCutDisk:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


@functools.cache
def fuse_unavailable_reason() -> str | None:
    """Why no power-cut disk can be mounted here (a trial mount is made), or None when one can."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if shutil.which(FUSERMOUNT) is None:
        return f"no {FUSERMOUNT} (Debian package fuse3)"
    probe = subprocess.run([sys.executable, "-c", "import mfusepy"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"mfusepy cannot load libfuse: {probe.stderr.strip().splitlines()[-1:]}"
    with tempfile.TemporaryDirectory(prefix="bascule-fuse-probe-") as directory:
        disk = PowerCutDisk(Path(directory, "backing"), Path(directory, "mount"))
        try:
            disk.start()
        except PowerCutError as exc:
            return f"a FUSE mount failed: {exc}"
        finally:
            disk.stop()
    return None


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # the test process went away: nobody to answer
    main()
