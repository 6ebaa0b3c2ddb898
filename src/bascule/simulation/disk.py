"""The simulated nodes' disks: what a power cut leaves of their files, and faults (a full disk,
failing fsyncs) while the rest of the process's I/O goes on.

The logs and ``bascule.durable`` write through ``os.write`` and sync through ``os.fsync`` (no file
objects, no mmap), so for the length of a run ``os.open``, ``os.write`` and ``os.fsync`` are wrapped:

- durability, per file (by inode, so that renames keep it): a successful fsync makes the file's
  whole content at that moment durable. A power cut (``power_cut``) truncates each file under the
  directory to its durable size and removes the files never fsynced, as the page cache's loss
  would leave them. It knows nothing of the code's own idea of what it synced: a log that counts
  entries as durable when they are not is caught. Not modelled (the power-cut FUSE disk of the
  real-process tests has them): writes torn inside one ``os.write``, the old bytes of unsynced
  overwrites and shrinking truncates (they stay as written), lost renames and directory entries;
- faults, by directory: while a fault is on, a write under a full directory fails with ENOSPC and
  an fsync under a failing one with EIO, making nothing durable (the log's synced end then stays,
  and a later power cut takes what it did not cover).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path


class Disks:
    def __init__(self) -> None:
        self.full: set[Path] = set()
        self.fsync_failing: set[Path] = set()
        self._durable: dict[int, int] = {}  # inode -> size its last successful fsync covered

    def repair(self, directory: Path) -> None:
        """The disks under ``directory`` work again (the machine was power-cycled)."""
        for faulty in (self.full, self.fsync_failing):
            faulty.difference_update({path for path in faulty if path.is_relative_to(directory)})

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        """No fault while the checker reads a stopped node's files: it is not the node's I/O."""
        full, failing = set(self.full), set(self.fsync_failing)
        self.full.clear()
        self.fsync_failing.clear()
        try:
            yield
        finally:
            self.full.update(full)
            self.fsync_failing.update(failing)

    def power_cut(self, directory: Path) -> int:
        """Leave the files under ``directory`` as a power cut would; returns how many bytes went."""
        lost = 0
        for root, _, names in os.walk(directory):
            for name in names:
                path = os.path.join(root, name)
                status = os.stat(path)
                durable = self._durable.get(status.st_ino)
                if durable is None:
                    lost += status.st_size
                    os.unlink(path)
                elif status.st_size > durable:
                    lost += status.st_size - durable
                    os.truncate(path, durable)
        return lost

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        real_open, real_write, real_fsync = os.open, os.write, os.fsync

        def simulated_open(path: str | bytes | os.PathLike, flags: int, mode: int = 0o777, *,
                           dir_fd: int | None = None) -> int:
            fd = real_open(path, flags, mode, dir_fd=dir_fd)
            if flags & os.O_CREAT:
                status = os.fstat(fd)
                if status.st_size == 0:
                    self._durable.pop(status.st_ino, None)  # a new file (its inode may be an old one's)
            return fd

        def simulated_write(fd: int, data: bytes | memoryview) -> int:
            if self.full and self._under(fd, self.full):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real_write(fd, data)

        def simulated_fsync(fd: int) -> None:
            if self.fsync_failing and self._under(fd, self.fsync_failing):
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            real_fsync(fd)
            status = os.fstat(fd)
            self._durable[status.st_ino] = status.st_size

        os.open, os.write, os.fsync = simulated_open, simulated_write, simulated_fsync  # type: ignore[assignment]
        try:
            yield
        finally:
            os.open, os.write, os.fsync = real_open, real_write, real_fsync

    @staticmethod
    def _under(fd: int, directories: set[Path]) -> bool:
        try:
            path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            return False
        return any(path.is_relative_to(directory) for directory in directories)
