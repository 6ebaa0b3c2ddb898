"""Failing disks for the simulator: a node's partition logs fill up (writes fail with ENOSPC) or its
fsyncs fail (EIO), while the rest of the process's I/O goes on.

The logs and ``bascule.durable`` write through ``os.write`` and sync through ``os.fsync`` (no file
objects), so for the length of a run both are wrapped: while a fault is on, a call on a file under a
faulty directory fails as the disk would make it fail. A failed fsync makes nothing durable, so the
log's synced end does not move, and a later power cut takes what it did not cover.
Not modelled: torn writes, and a disk full for some writes and not others (the power-cut FUSE disk of
the real-process tests has both).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path


class DiskFaults:
    def __init__(self) -> None:
        self.full: set[Path] = set()
        self.fsync_failing: set[Path] = set()

    def repair(self, directory: Path) -> None:
        """The disks under ``directory`` work again (the machine was power-cycled)."""
        for faulty in (self.full, self.fsync_failing):
            faulty.difference_update({path for path in faulty if path.is_relative_to(directory)})

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        write, fsync = os.write, os.fsync

        def faulty_write(fd: int, data: bytes | memoryview) -> int:
            if self.full and self._under(fd, self.full):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return write(fd, data)

        def faulty_fsync(fd: int) -> None:
            if self.fsync_failing and self._under(fd, self.fsync_failing):
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            fsync(fd)

        os.write, os.fsync = faulty_write, faulty_fsync  # type: ignore[assignment]
        try:
            yield
        finally:
            os.write, os.fsync = write, fsync

    @staticmethod
    def _under(fd: int, directories: set[Path]) -> bool:
        try:
            path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            return False
        return any(path.is_relative_to(directory) for directory in directories)
