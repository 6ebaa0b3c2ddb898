"""Log compaction by key, Liftbridge's rule: only the latest committed entry of each key stays.

The rule (pure): an entry of a sealed segment stays if it has no key, if no later committed entry
(at or below the high watermark, in any segment, the active one included) has its key, or if it is
not below the high watermark. The active segment is never rewritten. Entries keep their offsets, so
a compacted log has gaps; the leader-epoch history is left as it was (a follower's truncation needs
where each epoch really began). An entry without a key (a stored key length of -1) always stays, as
in Liftbridge; an empty key is a key like any other.

On disk (a ``CompactionJob``, its reading and writing in a thread of its own): each sealed segment
that loses entries is written anew beside the old one, ``<base>.log.<job>.cleaned`` and
``<base>.index.<job>.cleaned``, both fsynced, and the cleaner checkpoint is raised over it (sealed
segments ending at or below it may end before the next one begins). The log then swaps them in on
its own thread (``CommitLog.finish_compaction``): the log copy is renamed to ``<base>.log.<job>.swap``
(the commit point), the new index over the old, the swap file over the old log, and the directory is
fsynced. A segment that keeps nothing is deleted, log first. ``recover`` completes or undoes what a
crash interrupted before the log opens: a ``.swap`` log is committed (renamed into place, its index
rebuilt from it, since either index may lie beside it), and ``.cleaned`` files are dropped with the
index beside them (rebuilt from the old log). A crash at any point leaves each segment either old or
compacted, never a mix, and never without an entry the rule keeps. The job's number in the names
keeps a job that outlived its log (closed and opened again meanwhile) off the next one's files.
"""

from __future__ import annotations

import itertools
import logging
import os
import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bascule import durable
from bascule.partition.log.index import SparseIndex
from bascule.partition.log.segment import INDEX_SUFFIX, LOG_SUFFIX, parse_segment_name, segment_name
from bascule.wire.entry import EMPTY_BODY_SIZE, ENTRY_HEADER, HEADER_SIZE, CorruptEntry, scan

logger = logging.getLogger(__name__)

CLEANER_CHECKPOINT = "cleaner-offset-checkpoint"
CLEANED_SUFFIX = ".cleaned"  # a compacted segment being written: dropped if found at open
SWAP_SUFFIX = ".swap"  # a compacted log that replaces its segment's: committed if found at open

_job_numbers = itertools.count(1)
_READ_CHUNK = 1024 * 1024
_KEY_LENGTH = struct.Struct(">i")  # the first field of an entry's body: -1 for no key

KeyedOffset = tuple[int, bytes | None]  # an entry's offset and key (None: no key)


# --- the rule (pure) --------------------------------------------------------------------------


def latest_offsets(entries: Iterable[KeyedOffset], high_watermark: int) -> dict[bytes, int]:
    """The offset of the latest committed entry (at or below ``high_watermark``) of each key."""
    latest: dict[bytes, int] = {}
    for offset, key in entries:
        if key is not None and offset <= high_watermark and offset > latest.get(key, -1):
            latest[key] = offset
    return latest


def survives(offset: int, key: bytes | None, latest: Mapping[bytes, int], high_watermark: int) -> bool:
    """Whether compaction keeps the entry at ``offset``: it has no key, is not below the high
    watermark, or no later committed entry has its key."""
    return key is None or offset >= high_watermark or latest.get(key, offset) <= offset


def stored_key(buf: bytes, start: int, end: int, offset: int) -> bytes | None:
    """The key of the whole stored entry at ``buf[start:end]`` (``scan`` has checked its lengths),
    None for no key."""
    key_length = _KEY_LENGTH.unpack_from(buf, start + HEADER_SIZE)[0]
    if key_length == -1:
        return None
    if not 0 <= key_length <= end - start - HEADER_SIZE - EMPTY_BODY_SIZE:
        raise CorruptEntry(f"entry at offset {offset} has a bad key length {key_length}")
    key_start = start + HEADER_SIZE + _KEY_LENGTH.size
    return buf[key_start:key_start + key_length]


# --- the cleaner checkpoint ---------------------------------------------------------------------


def read_cleaned_to(directory: Path) -> int:
    """The offset at or below which sealed segments may end early (compacted); 0 if none is."""
    path = directory / CLEANER_CHECKPOINT
    try:
        return max(0, int(path.read_text(encoding="ascii").strip()))
    except FileNotFoundError:
        return 0
    except (OSError, ValueError) as error:
        # A cleaner point too low only makes a compacted segment's missing tail look like damage,
        # which the replica then fetches again: read it as "every segment".
        logger.warning("unreadable cleaner checkpoint %s, taking every segment as compacted: %s", path, error)
        return 1 << 63


def write_cleaned_to(directory: Path, offset: int) -> None:
    durable.write_atomically(directory / CLEANER_CHECKPOINT, f"{offset}\n")


# --- recovery at open ---------------------------------------------------------------------------


def recover(directory: Path) -> None:
    """Complete the swaps a crash interrupted after their commit point and drop the compacted
    segments it interrupted before: see the module's description."""
    changed = False
    for name in sorted(os.listdir(directory)):
        stem, _, rest = name.partition(".")
        kind, _, step = rest.rpartition(".")  # "log.<job>" or "index.<job>"; "cleaned" or "swap"
        file_kind = kind.partition(".")[0]
        if parse_segment_name(stem) is None or "." + step not in (CLEANED_SUFFIX, SWAP_SUFFIX) or \
                "." + file_kind not in (LOG_SUFFIX, INDEX_SUFFIX):
            continue
        changed = True
        log_path, index_path = directory / (stem + LOG_SUFFIX), directory / (stem + INDEX_SUFFIX)
        if "." + file_kind == LOG_SUFFIX and "." + step == SWAP_SUFFIX:
            logger.warning("completing the compaction of %s that a crash interrupted", log_path)
            index_path.unlink(missing_ok=True)
            os.replace(directory / name, log_path)
            continue
        if "." + file_kind == LOG_SUFFIX:
            logger.warning("dropping the compacted copy of %s that a crash left unfinished", log_path)
            index_path.unlink(missing_ok=True)
        os.unlink(directory / name)
    if changed:
        durable.sync_directory(directory)


# --- a compaction run ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SealedSegment:
    """What a job needs of a sealed segment, taken on the log's thread."""

    base_offset: int
    next_offset: int
    may_end_early: bool


@dataclass(frozen=True)
class Rewrite:
    """A sealed segment that compaction changed: written anew (``.cleaned`` files), or emptied."""

    base_offset: int
    next_offset: int
    kept: int
    removed: int

    @property
    def emptied(self) -> bool:
        return self.kept == 0


@dataclass
class CompactionJob:
    """One compaction of a log's sealed segments below ``high_watermark``. ``prepare`` runs in a
    thread and touches only its own file descriptors and the ``.cleaned`` files; the log swaps the
    results in (``CommitLog.finish_compaction``) if it did not change meanwhile (``layout``)."""

    directory: Path
    segments: list[SealedSegment]  # the sealed segments, oldest first
    active_base: int
    active_size: int  # the bytes of the active segment written when the job began
    high_watermark: int
    index_interval_bytes: int
    cleaned_to: int  # the cleaner checkpoint when the job began
    layout: int  # the log's layout version when the job began
    rewrites: list[Rewrite] = field(default_factory=list)
    number: int = field(default_factory=lambda: next(_job_numbers))  # in its files' names

    def prepare(self) -> None:
        """Find each key's latest committed entry, write the compacted segments beside the old
        ones, and raise the cleaner checkpoint over them. Nothing visible to the log changes."""
        try:
            latest = latest_offsets(self._keyed_offsets(), self.high_watermark)
            for segment in self.segments:
                if segment.base_offset < self.high_watermark:
                    rewrite = self._rewrite(segment, latest)
                    if rewrite is not None:
                        self.rewrites.append(rewrite)
            if self.rewrites:
                self.cleaned_to = max(self.cleaned_to, max(rewrite.next_offset for rewrite in self.rewrites))
                write_cleaned_to(self.directory, self.cleaned_to)
        except BaseException:
            self.discard()
            raise

    def discard(self) -> None:
        """Remove the compacted copies (the job is abandoned); the index first, so a crash in
        between leaves a ``.log.cleaned`` whose recovery rebuilds the index beside it."""
        for segment in self.segments:
            for path in (self.cleaned_index(segment.base_offset), self.cleaned_log(segment.base_offset)):
                path.unlink(missing_ok=True)
        self.rewrites = []

    def cleaned_log(self, base_offset: int) -> Path:
        return self._own_file(base_offset, LOG_SUFFIX, CLEANED_SUFFIX)

    def cleaned_index(self, base_offset: int) -> Path:
        return self._own_file(base_offset, INDEX_SUFFIX, CLEANED_SUFFIX)

    def swap_log(self, base_offset: int) -> Path:
        return self._own_file(base_offset, LOG_SUFFIX, SWAP_SUFFIX)

    def _own_file(self, base_offset: int, kind: str, step: str) -> Path:
        return self.directory / f"{segment_name(base_offset)}{kind}.{self.number}{step}"

    def _keyed_offsets(self) -> Iterator[KeyedOffset]:
        for segment in self.segments:
            yield from self._keys_of(segment.base_offset, None)
        yield from self._keys_of(self.active_base, self.active_size)

    def _keys_of(self, base_offset: int, size: int | None) -> Iterator[KeyedOffset]:
        fd, file_size = _open_for_reading(self._log_path(base_offset))
        try:
            for offset, key, _, _ in _entries(fd, file_size if size is None else min(size, file_size), base_offset):
                yield offset, key
        finally:
            os.close(fd)

    def _rewrite(self, segment: SealedSegment, latest: Mapping[bytes, int]) -> Rewrite | None:
        """Write the entries of ``segment`` that survive into its ``.cleaned`` files; None (and
        no files) if every entry survives, or if the segment is damaged (it is left as it is)."""
        base = segment.base_offset
        fd, size = _open_for_reading(self._log_path(base))
        try:
            index = SparseIndex(self.index_interval_bytes)
            kept_ranges: list[tuple[int, int]] = []  # byte ranges of the old file to copy, runs merged
            kept = removed = new_size = walked_to = 0
            last_offset = base - 1
            for offset, key, start, end in _entries(fd, size, base):
                last_offset, walked_to = offset, end
                if not survives(offset, key, latest, self.high_watermark):
                    removed += 1
                    continue
                index.add_entry(offset - base, new_size, new_size + end - start)
                kept, new_size = kept + 1, new_size + end - start
                if kept_ranges and kept_ranges[-1][1] == start:
                    kept_ranges[-1] = (kept_ranges[-1][0], end)
                else:
                    kept_ranges.append((start, end))
            ends_where_it_should = segment.may_end_early or last_offset + 1 == segment.next_offset
            if walked_to != size or last_offset >= segment.next_offset or not ends_where_it_should:
                logger.warning("not compacting %s: it is damaged", self._log_path(base))
                return None
            if not removed:
                return None
            if kept:
                _copy_synced(fd, kept_ranges, self.cleaned_log(base))
                _write_synced(self.cleaned_index(base), index.encode())
        finally:
            os.close(fd)
        return Rewrite(base, segment.next_offset, kept, removed)

    def _log_path(self, base_offset: int) -> Path:
        return self.directory / (segment_name(base_offset) + LOG_SUFFIX)


def _open_for_reading(path: Path) -> tuple[int, int]:
    """A read-only descriptor of ``path`` (the log may delete the file meanwhile: the job is then
    abandoned) and the file's size."""
    fd = os.open(path, os.O_RDONLY)
    return fd, os.fstat(fd).st_size


def _entries(fd: int, size: int, base_offset: int) -> Iterator[tuple[int, bytes | None, int, int]]:
    """(offset, key, start, end) of the whole, intact entries of a segment file from its start,
    up to the first torn, damaged or out-of-order one, within ``size`` bytes."""
    position, lowest = 0, base_offset
    while position < size:
        chunk = os.pread(fd, min(max(_READ_CHUNK, _entry_size(fd, position)), size - position), position)
        consumed = 0
        try:
            for offset, _, _, start, end in scan(chunk):
                if offset < lowest:
                    return
                yield offset, stored_key(chunk, start, end, offset), position + start, position + end
                lowest, consumed = offset + 1, end
        except CorruptEntry:
            pass  # a torn entry at the chunk's end is read whole next time round
        if consumed == 0:
            return
        position += consumed


def _entry_size(fd: int, position: int) -> int:
    header = os.pread(fd, HEADER_SIZE, position)
    return HEADER_SIZE + ENTRY_HEADER.unpack(header)[3] if len(header) == HEADER_SIZE else HEADER_SIZE


def _copy_synced(source_fd: int, ranges: list[tuple[int, int]], path: Path) -> None:
    fd = durable.open_private(path, os.O_WRONLY | os.O_TRUNC)
    try:
        for start, end in ranges:
            while start < end:
                piece = os.pread(source_fd, min(_READ_CHUNK, end - start), start)
                if not piece:
                    raise OSError(f"{path}: the segment being compacted got shorter")
                _write_all(fd, piece)
                start += len(piece)
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: Path, data: bytes) -> None:
    fd = durable.open_private(path, os.O_WRONLY | os.O_TRUNC)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
