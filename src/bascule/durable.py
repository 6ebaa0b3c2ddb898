"""Small files written so that a crash leaves either the old or the new contents, never a mix, and
the new contents on disk once the call returns.

A rewrite goes to ``<name>.tmp``, is fsynced, renamed over ``<name>``, and the directory is fsynced
(a rename is an entry in the directory: without that fsync a power cut can undo it). A crash before
the rename leaves the old file and a ``.tmp`` leftover, which whoever owns the directory may delete.

Writes go through os.write and os.fsync, not a file object, so that tests can inject faults there.
"""

from __future__ import annotations

import os
from pathlib import Path

TEMPORARY_SUFFIX = ".tmp"


def write_atomically(path: str | os.PathLike[str], data: bytes | str) -> None:
    """Replace ``path`` by ``data`` (text is written as UTF-8) atomically and durably.

    If anything fails (a short disk, a failed fsync), ``path`` keeps its old contents, the temporary
    file is removed, and the error is raised.
    """
    path = Path(path)
    temporary = path.with_name(path.name + TEMPORARY_SUFFIX)
    payload = data.encode() if isinstance(data, str) else data
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
        sync_directory(path.parent)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def replace(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Rename ``source`` over ``target``, the contents on disk before the rename, and the rename on
    disk before returning."""
    fd = os.open(source, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(source, target)
    sync_directory(os.path.dirname(os.path.abspath(target)))


def sync_directory(directory: str | os.PathLike[str]) -> None:
    """Make the creations, renames and deletions of files in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
