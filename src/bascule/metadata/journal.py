"""Durable storage for the metadata Raft: pysyncobj's journal, meta file and full dump, fsynced.

pysyncobj's ``FileJournal`` writes its entries through an mmap that is never flushed, and rewrites its
meta file (term, vote, commit index) and its full dump without fsync: a power cut can take back a vote,
or an entry already counted towards a commit. Raft is safe only if neither happens.

The hook is the journal itself. SyncObj sends an AppendEntries response, a vote or a request for votes,
and counts its own copy of an entry towards the commit index, only after the journal call that wrote
the state returned; so a journal whose every change is on disk when the call returns gives all of
these guarantees without touching SyncObj's logic. ``install_durable_storage`` swaps it in for the
``createJournal`` that SyncObj calls, and makes the dump's rename durable, because a compaction drops
the journal's prefix once the dump holds it.

Every file here is private (0600, see ``bascule.durable``): the journal and meta file are written
through ``durable``, and pysyncobj's serializer, which writes the full dump's temporary files itself
(``dump.tmp``, and ``dump.1.tmp`` for one received from the leader), is given an ``open`` that creates
them so.

``DurableFileJournal`` reads and writes FileJournal's file format, so existing data dirs open as they
are: a header whose last field is the end of the last record, then records
``size | index | term | command | size``. The header is the commit point: a record is fsynced before
the header points past it, so a power cut mid-append leaves the journal as it was before the append.
"""

from __future__ import annotations

import os
import struct
from typing import IO, Any

import pysyncobj.serializer
import pysyncobj.syncobj
from pysyncobj.journal import (
    APP_NAME,
    APP_VERSION,
    FIRST_RECORD_OFFSET,
    JOURNAL_FORMAT_VERSION,
    LAST_RECORD_OFFSET_OFFSET,
    NAME_SIZE,
    VERSION_SIZE,
    Journal,
    MemoryJournal,
)
from pysyncobj.pickle import dumps, loads, to_bytes

from bascule import durable

Entry = tuple[bytes, int, int]  # command, Raft index, term

_U32 = struct.Struct("<I")  # the header's end of the last record, and each record's size
_INDEX_TERM = struct.Struct("<QQ")


def install_durable_storage() -> None:
    """Make every SyncObj built from now on keep its journal, meta file and full dump durably, and
    privately."""
    pysyncobj.syncobj.createJournal = create_journal
    pysyncobj.serializer.atomicReplace = replace_durably
    # The module's global ``open`` comes before the builtin: the serializer's files are made through this.
    pysyncobj.serializer.open = open_serializer_file


def create_journal(path: str | None) -> Journal:
    return MemoryJournal() if path is None else DurableFileJournal(path)


class DurableFileJournal(Journal):
    """pysyncobj's file journal whose every change is on disk before the call returns."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._meta_path = path + ".meta"
        if not os.path.exists(path):
            _create_journal_file(path)
        self._fd = os.open(path, os.O_RDWR)
        self._entries, self._offsets, self._end = _parse(_read_all(self._fd), self._path)
        self._meta = _load_meta(self._meta_path)
        self._meta_saved = True

    # -- entries --
    def add(self, command: bytes, idx: int, term: int) -> None:
        start = self._end
        record = _record(command, idx, term)
        _write_at(self._fd, record, start)
        # On disk before the header points past it: a torn append must not become part of the journal.
        os.fdatasync(self._fd)
        self._set_end(start + len(record))
        self._entries.append((command, idx, term))
        self._offsets.append(start)

    def clear(self) -> None:
        self._set_end(FIRST_RECORD_OFFSET)
        self._entries, self._offsets = [], []

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        if entryFrom >= len(self._entries):
            return
        self._set_end(self._offsets[entryFrom])
        del self._entries[entryFrom:]
        del self._offsets[entryFrom:]

    def deleteEntriesTo(self, entryTo: int) -> None:
        """Drop the prefix (a compaction; the full dump holds it) by writing the rest to a new file: one
        fsync for all the entries kept, and a crash half-way leaves the old journal whole."""
        durable.write_atomically(self._path, _journal_bytes(self._entries[entryTo:]))
        os.close(self._fd)
        self._fd = os.open(self._path, os.O_RDWR)
        self._entries, self._offsets, self._end = _parse(_read_all(self._fd), self._path)

    def __getitem__(self, item: int | slice) -> Any:
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    def _set_end(self, end: int) -> None:
        _write_at(self._fd, _U32.pack(end), LAST_RECORD_OFFSET_OFFSET)
        os.fdatasync(self._fd)
        self._end = end

    def _destroy(self) -> None:
        os.close(self._fd)

    # -- meta --
    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        # Raft does not need the commit index on disk (it is relearnt from the leader), so it is saved
        # with the next timer or term change, as FileJournal does.
        self._meta["raftCommitIndex"] = raftCommitIndex
        self._meta_saved = False

    def getRaftCommitIndex(self) -> int:
        return self._meta.get("raftCommitIndex", 1)

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:
        self._meta["currentTerm"] = term
        self._meta["votedForNodeId"] = votedForNodeId
        self._store_meta()

    def getCurrentTerm(self) -> int:
        return self._meta.get("currentTerm", 0)

    def getVotedForNodeId(self) -> Any:
        return self._meta.get("votedForNodeId", None)

    def onOneSecondTimer(self) -> None:
        if not self._meta_saved:
            self._store_meta()

    def _store_meta(self) -> None:
        durable.write_atomically(self._meta_path, dumps(self._meta))
        self._meta_saved = True


# ---- file format -----------------------------------------------------------------------------------


def _header(end: int) -> bytes:
    return (APP_NAME.ljust(NAME_SIZE, b"\0") + APP_VERSION.ljust(VERSION_SIZE, b"\0")
            + _U32.pack(JOURNAL_FORMAT_VERSION) + _U32.pack(end))


def _record(command: bytes, idx: int, term: int) -> bytes:
    body = _INDEX_TERM.pack(idx, term) + to_bytes(command)
    size = _U32.pack(len(body))
    return size + body + size


def _journal_bytes(entries: list[Entry]) -> bytes:
    records = b"".join(_record(*entry) for entry in entries)
    return _header(FIRST_RECORD_OFFSET + len(records)) + records


class CorruptJournal(ValueError):
    """The Raft journal file is not one this module (or pysyncobj) wrote: the node must not start on it."""


def _parse(data: bytes, path: str) -> tuple[list[Entry], list[int], int]:
    """The entries up to the end the header names, each record's offset, and that end."""
    if len(data) < FIRST_RECORD_OFFSET or not data.startswith(APP_NAME):
        raise CorruptJournal(f"{path}: not a pysyncobj journal ({len(data)} bytes, header {data[:NAME_SIZE]!r})")
    (end,) = _U32.unpack_from(data, LAST_RECORD_OFFSET_OFFSET)
    if not FIRST_RECORD_OFFSET <= end <= len(data):
        raise CorruptJournal(f"{path}: the header's end of records {end} is outside the file's {len(data)} bytes")
    entries: list[Entry] = []
    offsets: list[int] = []
    offset = FIRST_RECORD_OFFSET
    while offset < end:
        size = _U32.unpack_from(data, offset)[0] if offset + _U32.size <= end else -1
        body = offset + _U32.size
        following = body + size + _U32.size
        if size < _INDEX_TERM.size or following > end or data[body + size: following] != data[offset:body]:
            raise CorruptJournal(f"{path}: malformed record at offset {offset} (size {size}, end of records {end})")
        idx, term = _INDEX_TERM.unpack_from(data, body)
        entries.append((data[body + _INDEX_TERM.size: body + size], idx, term))
        offsets.append(offset)
        offset = following
    return entries, offsets, end


def _write_at(fd: int, data: bytes, offset: int) -> None:
    if os.pwrite(fd, data, offset) != len(data):
        raise OSError(f"short write to the Raft journal at offset {offset}")


def _read_all(fd: int) -> bytes:
    return os.pread(fd, os.fstat(fd).st_size, 0)


def _load_meta(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as file:
            data = file.read()
    except FileNotFoundError:
        return {}
    try:
        meta = loads(data)
    except Exception as exc:  # noqa: BLE001 - pickle fails on garbage in many ways
        raise CorruptJournal(f"{path}: unreadable Raft term/vote file: {exc!r}") from None
    if not isinstance(meta, dict):
        raise CorruptJournal(f"{path}: the Raft term/vote file holds a {type(meta).__name__}, not a dict")
    return meta


# ---- durable file operations -----------------------------------------------------------------------


def _create_journal_file(path: str) -> None:
    durable.write_atomically(path, _header(FIRST_RECORD_OFFSET))
    # The raft directory is usually as new as its journal: its own entry must be durable too.
    durable.sync_directory(os.path.dirname(os.path.dirname(os.path.abspath(path))))


# Rename `source` over `target`, its content on disk before the rename and the rename on disk before
# returning: pysyncobj's atomicReplace, which its serializer uses for the full dump.
replace_durably = durable.replace


def open_serializer_file(file: str, mode: str = "r", *args: Any, **kwargs: Any) -> IO[Any]:
    """The builtin open for pysyncobj's serializer, except that a file it writes is private (0600)
    before the first byte goes in."""
    if any(flag in mode for flag in "wax+"):
        kwargs["opener"] = durable.private_opener
    return open(file, mode, *args, **kwargs)
