"""Small files written so that a crash leaves either the old or the new contents, never a mix, and
the new contents on disk once the call returns.

A rewrite goes to ``<name>.tmp``, is fsynced, renamed over ``<name>``, and the directory is fsynced
(a rename is an entry in the directory: without that fsync a power cut can undo it). A crash before
the rename leaves the old file and a ``.tmp`` leftover, which whoever owns the directory may delete.

Writes go through os.write and os.fsync, not a file object, so that tests can inject faults there.

Everything bascule keeps is its server user's alone: files are created 0600 and directories 0700,
whatever the process umask (the mode is given to the call that creates, then set again, since a umask
can only take bits away). ``prepare_private_directory`` makes the data dir so, or refuses one that
belongs to another user.
"""

from __future__ import annotations

import logging
import os
import pwd
import stat
from pathlib import Path

TEMPORARY_SUFFIX = ".tmp"
PRIVATE_FILE_MODE = 0o600
PRIVATE_DIRECTORY_MODE = 0o700

log = logging.getLogger(__name__)


def write_atomically(path: str | os.PathLike[str], data: bytes | str) -> None:
    """Replace ``path`` by ``data`` (text is written as UTF-8) atomically and durably.

    If anything fails (a short disk, a failed fsync), ``path`` keeps its old contents, the temporary
    file is removed, and the error is raised.
    """
    path = Path(path)
    temporary = path.with_name(path.name + TEMPORARY_SUFFIX)
    payload = data.encode() if isinstance(data, str) else data
    # Private before the first byte goes in, also when a crash left the temporary file behind.
    fd = open_private(temporary, os.O_WRONLY | os.O_TRUNC)
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


# ---- private files and directories -------------------------------------------------------------------


class ForeignDirectory(PermissionError):
    """A directory bascule would keep its files in belongs to another user."""


def open_private(path: str | os.PathLike[str], flags: int) -> int:
    """``os.open(path, flags | O_CREAT)``, the file readable and writable by its owner alone whatever
    the umask: created 0600, and set 0600 (before anything is written) when it was there already."""
    fd = os.open(path, flags | os.O_CREAT, PRIVATE_FILE_MODE)
    try:
        os.fchmod(fd, PRIVATE_FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def private_opener(path: str, flags: int) -> int:
    """``open(path, mode, opener=private_opener)``: a file object on a private file (see open_private)."""
    return open_private(path, flags)


def make_private_directories(path: str | os.PathLike[str]) -> None:
    """Create the directory ``path`` and those of its parents that are missing, each 0700 whatever
    the umask; those already there are left as they are."""
    path = Path(os.path.abspath(path))
    missing = []
    while not path.is_dir():
        missing.append(path)
        if path.parent == path:
            break
        path = path.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, PRIVATE_DIRECTORY_MODE)
        except FileExistsError:
            if not directory.is_dir():
                raise
            continue  # made by someone else meanwhile: not ours to change
        os.chmod(directory, PRIVATE_DIRECTORY_MODE)


def owned_directory(path: str | os.PathLike[str]) -> os.stat_result | None:
    """The status of the directory ``path``, or None when there is nothing there. Raises
    ForeignDirectory when another user owns it (this process's user could not keep it private),
    NotADirectoryError when it is no directory."""
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(status.st_mode):
        raise NotADirectoryError(f"{path} exists and is not a directory")
    if status.st_uid != os.geteuid():
        raise ForeignDirectory(
            f"{path} belongs to {_user_name(status.st_uid)}, not to {_user_name(os.geteuid())} who runs "
            "this server: refusing to keep data where another user can read or change it (use another "
            "directory, or give this one to the server's user)"
        )
    return status


def prepare_private_directory(path: str | os.PathLike[str]) -> None:
    """Make ``path`` a directory that only this process's user can enter: created 0700 (with its
    missing parents) when there is none; refused (ForeignDirectory) when it belongs to another user;
    its group and world permissions taken away, with a log line, when it has any."""
    status = owned_directory(path)
    if status is None:
        make_private_directories(path)
        status = owned_directory(path)  # what is there now, made by this call or not
        assert status is not None
    mode = stat.S_IMODE(status.st_mode)
    if mode & 0o077:
        os.chmod(path, PRIVATE_DIRECTORY_MODE)
        log.warning("%s was open to other users (mode %04o): now %04o", path, mode, PRIVATE_DIRECTORY_MODE)


def _user_name(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"
