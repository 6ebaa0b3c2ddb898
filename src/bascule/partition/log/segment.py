"""One segment of a commit log: ``<base offset>.log`` entries and its ``<base offset>.index``.

Appends go through os.write on an O_APPEND descriptor and reads through os.pread, so whatever
was appended is visible to the next read at once, with no buffers to flush.

Offsets rise along a segment but may skip: compaction removes entries and keeps the others'
offsets, and a follower stores the gaps its leader's log has. A read from an offset that is not
there starts at the next one. Only a segment known to end in a gap (compacted, or cut inside one)
may end before its ``next_offset`` (``may_end_early``): elsewhere a missing tail is damage (a crash
lost unsynced entries).
"""

from __future__ import annotations

import logging
import os
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from bascule import durable
from bascule.partition.log.index import POINT_SIZE, InvalidIndex, SparseIndex
from bascule.wire.entry import (
    EMPTY_BODY_SIZE,
    ENTRY_HEADER,
    HEADER_SIZE,
    CorruptEntry,
    EntryWalk,
    WalkedEntry,
    offset_and_epoch,
    scan,
    stored_prefix,
)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
# ``<segment>.log.corrupt-<first offset lost>``: bytes moved out of a segment because a damaged
# entry was followed by intact ones. Kept for whoever investigates; the log never reads them.
QUARANTINE_INFIX = ".corrupt-"
BASE_OFFSET_DIGITS = 20

# Enough to reach any entry from its index point in one read when entries are small.
_LOCATE_CHUNK = 16 * 1024
_WALK_CHUNK = 1024 * 1024
_MAX_RELATIVE_OFFSET = 0xFFFFFFFF  # index points hold an offset relative to the base as uint32

logger = logging.getLogger(__name__)


def segment_name(base_offset: int) -> str:
    return f"{base_offset:0{BASE_OFFSET_DIGITS}d}"


def parse_segment_name(stem: str) -> int | None:
    """Base offset of a segment file stem, None if it is not a segment name."""
    if len(stem) != BASE_OFFSET_DIGITS or not stem.isdigit():
        return None
    return int(stem)


@dataclass
class WalkedTail:
    """What walking a segment from its last index point to its end found."""

    valid_end: int  # end of the last whole entry reached
    next_offset: int
    last_timestamp: int | None = None
    # First offset moved aside into a quarantine file at open (a damaged entry followed by intact
    # ones), None if the segment was whole or only its torn tail was cut.
    damaged_from: int | None = None


class _MisplacedIndexPoint(Exception):
    """An index point that does not land on the entry it names."""


class PartialWriteLeft(OSError):
    """A failed append whose partial bytes could not be cut off again: the file now holds bytes
    the segment does not account for, and the next append would land after them."""


class Segment:
    """Entries from ``base_offset`` up to (excluding) ``next_offset``, ``size`` bytes of file."""

    def __init__(
        self, directory: Path, base_offset: int, next_offset: int, interval_bytes: int
    ) -> None:
        self.base_offset = base_offset
        self.next_offset = next_offset
        self.log_path = directory / (segment_name(base_offset) + LOG_SUFFIX)
        self.index_path = directory / (segment_name(base_offset) + INDEX_SUFFIX)
        self.interval_bytes = interval_bytes
        self.unsynced = False
        # Whether entries may be missing from the end (the segment was compacted, or truncated in a
        # gap): then a read past its last entry goes on in the next segment instead of failing.
        self.may_end_early = False
        # Opened on first use, so that old segments nobody reads hold no file descriptors.
        self._open_log_fd: int | None = None
        self._open_index_fd: int | None = None
        self.size = self.log_path.stat().st_size if self.log_path.exists() else 0
        # Loaded on first use too: old segments may never need it.
        self._index: SparseIndex | None = None
        self._first_timestamp: int | None = None
        self._last_timestamp: int | None = None

    @property
    def _log_fd(self) -> int:
        if self._open_log_fd is None:
            self._open_log_fd = _open_appendable(self.log_path)
        return self._open_log_fd

    @property
    def _index_fd(self) -> int:
        if self._open_index_fd is None:
            self._open_index_fd = _open_appendable(self.index_path)
        return self._open_index_fd

    # --- opening ---------------------------------------------------------------------------

    @classmethod
    def create(cls, directory: Path, base_offset: int, interval_bytes: int) -> Segment:
        segment = cls(directory, base_offset, base_offset, interval_bytes)
        if segment.size:
            raise FileExistsError(f"new segment {segment.log_path} already holds data")
        for path in (segment.log_path, segment.index_path):
            os.close(durable.open_private(path, os.O_WRONLY))
        segment._index = SparseIndex(interval_bytes)
        return segment

    @classmethod
    def open_sealed(
        cls, directory: Path, base_offset: int, next_offset: int, interval_bytes: int
    ) -> Segment:
        """An older segment, trusted to hold whole entries up to its size (reads check CRCs)."""
        return cls(directory, base_offset, next_offset, interval_bytes)

    @classmethod
    def recover(
        cls, directory: Path, base_offset: int, interval_bytes: int
    ) -> tuple[Segment, WalkedTail]:
        """Open the active segment, keeping the entries up to the first torn or damaged one.

        Only the entries after the last trustworthy index point are read and CRC-checked. What
        follows the last good entry is cut off. A torn tail (nothing intact after the damage: an
        append a crash cut short, zeros, garbage) is simply cut. A damaged entry followed by
        intact entries may be in the middle of committed data: those bytes are first moved aside
        into a quarantine file, and ``damaged_from`` reports the first offset lost, so that the
        replica fetches them again instead of serving a silently shortened log.
        """
        segment = cls(directory, base_offset, base_offset, interval_bytes)
        tail = segment._load_index_and_walk_tail(check_crc=True)
        if tail.valid_end < segment.size:
            intact_at = segment._intact_entry_after(tail.valid_end, tail.next_offset)
            if intact_at is None:
                logger.warning(
                    "cutting %d bytes of torn or corrupt entries from the end of %s (kept %d bytes)",
                    segment.size - tail.valid_end,
                    segment.log_path,
                    tail.valid_end,
                )
            else:
                segment._quarantine_from(tail.valid_end, tail.next_offset, intact_at)
                tail.damaged_from = tail.next_offset
            os.ftruncate(segment._log_fd, tail.valid_end)
            os.fsync(segment._log_fd)
            segment.size = tail.valid_end
        segment.next_offset = tail.next_offset
        return segment, tail

    def _intact_entry_after(self, start: int, expected_offset: int) -> int | None:
        """Position of the first whole, CRC-correct entry after the damaged one at ``start``
        whose offset could follow it: from ``expected_offset`` up to the last offset the segment
        can hold (a follower stores its compacted leader's gaps, so the offsets after the damage
        may have jumped any distance within that); None if the damage runs to the end of the file.
        The search is for the bytes such an offset begins with, and a candidate's header is
        checked before its CRC, so runs of zeros and garbage cost little even in a big segment."""
        highest_offset = self.base_offset + _MAX_RELATIVE_OFFSET
        prefix = _common_prefix(_OFFSET.pack(expected_offset), _OFFSET.pack(highest_offset))
        position = start + 1
        while position + HEADER_SIZE <= self.size:
            window = os.pread(self._log_fd, min(_WALK_CHUNK, self.size - position), position)
            last_start = len(window) - HEADER_SIZE  # candidates whose header lies in the window
            at = window.find(prefix, 0, last_start + len(prefix))
            while 0 <= at <= last_start:
                if window.startswith(_ZERO_HEADER, at):
                    # No entry begins with a whole header of zeros: jump to where one could.
                    nonzero = _NONZERO.search(window, at + HEADER_SIZE)
                    at = len(window) if nonzero is None else nonzero.start() - HEADER_SIZE + 1
                elif self._is_intact_entry_at(window, at, position, expected_offset, highest_offset):
                    return position + at
                else:
                    at += 1
                if at > last_start:
                    break
                at = window.find(prefix, at, last_start + len(prefix))
            if position + len(window) >= self.size:
                break
            position += last_start + 1
        return None

    def _is_intact_entry_at(
        self, window: bytes, at: int, window_position: int, lowest_offset: int, highest_offset: int
    ) -> bool:
        """Whether a whole, CRC-correct entry with an offset in [``lowest_offset``,
        ``highest_offset``] begins at ``window[at]`` (``window`` read from ``window_position``)."""
        offset, _, _, body_size, _ = ENTRY_HEADER.unpack_from(window, at)
        end = at + HEADER_SIZE + body_size
        if not (
            lowest_offset <= offset <= highest_offset
            and body_size >= EMPTY_BODY_SIZE
            and window_position + end <= self.size
        ):
            return False
        if end <= len(window):
            data: bytes | memoryview = memoryview(window)[at:end]
        else:
            data = os.pread(self._log_fd, end - at, window_position + at)
        try:
            next(scan(data))
        except CorruptEntry:
            return False
        return True

    def _quarantine_from(self, start: int, first_offset_lost: int, intact_at: int) -> None:
        """Move the bytes from ``start`` to the end into ``<segment>.log.corrupt-<offset>``, on
        disk before the segment is cut, so that no committed entry disappears without a copy. If
        that fails (a full disk) opening fails: the segment stays as it is."""
        path = self.log_path.with_name(f"{self.log_path.name}{QUARANTINE_INFIX}{first_offset_lost}")
        copies = 1
        while path.exists():  # an earlier incident at the same offset: keep its copy too
            path = path.with_name(f"{self.log_path.name}{QUARANTINE_INFIX}{first_offset_lost}.{copies}")
            copies += 1
        durable.write_atomically(path, os.pread(self._log_fd, self.size - start, start))
        logger.error(
            "%s: the entry at offset %d (byte %d) is damaged and intact entries follow it (from "
            "byte %d): moved the %d bytes from byte %d to %s; this replica has lost offsets %d and "
            "on and must fetch them again",
            self.log_path,
            first_offset_lost,
            start,
            intact_at,
            self.size - start,
            start,
            path.name,
            first_offset_lost,
        )

    @property
    def index(self) -> SparseIndex:
        if self._index is None:
            tail = self._load_index_and_walk_tail(check_crc=False)
            if tail.valid_end < self.size:
                logger.warning(
                    "%s is damaged after byte %d; reads past offset %d will fail",
                    self.log_path,
                    tail.valid_end,
                    tail.next_offset - 1,
                )
        assert self._index is not None  # _load_index_and_walk_tail sets it
        return self._index

    def _load_index_and_walk_tail(self, check_crc: bool) -> WalkedTail:
        """Load the index, drop points that do not land on their entries, and walk from the last
        good point to the end of the file, adding the points that are due (a crash can stop an
        append between the log write and the index write)."""
        index, damaged = self._read_index_file()
        while len(index) and not self._point_is_valid(*index.last_point()):
            index.drop_last_point()
            damaged = True
        relative_offset, position = index.restart_at_last_point()
        points_before_walk = len(index)
        tail = WalkedTail(valid_end=position, next_offset=self.base_offset + relative_offset)
        for offset, _, timestamp, start, end in self._walk(
            position, tail.next_offset, check_crc
        ):
            index.add_entry(offset - self.base_offset, start, end)
            tail.valid_end, tail.next_offset, tail.last_timestamp = end, offset + 1, timestamp
        index.truncate(tail.next_offset - self.base_offset, tail.valid_end)
        self._index = index
        self._last_timestamp = tail.last_timestamp
        if damaged:
            logger.warning("repaired index %s", self.index_path)
        elif len(index) != points_before_walk:
            logger.info(
                "added %d missing points to index %s",
                len(index) - points_before_walk,
                self.index_path,
            )
        if damaged or len(index) != points_before_walk:
            self._rewrite_index_file()
        return tail

    def _read_index_file(self) -> tuple[SparseIndex, bool]:
        """The index as stored, without points past the data; True if it was damaged."""
        try:
            data = self.index_path.read_bytes()
        except FileNotFoundError:
            data = b""
        try:
            index = SparseIndex.decode(data, self.interval_bytes, self.size)
        except InvalidIndex as error:
            logger.warning("index %s is invalid: %s", self.index_path, error)
            return SparseIndex(self.interval_bytes), True
        dropped = index.truncate_beyond(self.size)
        return index, dropped > 0 or len(data) % POINT_SIZE != 0

    def _point_is_valid(self, relative_offset: int, position: int) -> bool:
        header = os.pread(self._log_fd, HEADER_SIZE, position)
        return (
            len(header) == HEADER_SIZE
            and ENTRY_HEADER.unpack(header)[0] == self.base_offset + relative_offset
        )

    def _rebuild_index(self) -> None:
        index = SparseIndex(self.interval_bytes)
        for offset, _, _, start, end in self._walk(0, self.base_offset, check_crc=False):
            index.add_entry(offset - self.base_offset, start, end)
        self._index = index
        self._rewrite_index_file()

    def _rewrite_index_file(self) -> None:
        os.ftruncate(self._index_fd, 0)
        _write_all(self._index_fd, self.index.encode())
        self.unsynced = True

    # --- writing ---------------------------------------------------------------------------

    def append(self, data: bytes, entries: list[WalkedEntry]) -> None:
        """Write ``data``, whose entry boundaries (relative to ``data``) are ``entries``.

        All or nothing: if a write fails (a full disk, an I/O error), whatever part of the data
        and its index points reached the files is cut off again and the OSError raised, so the
        segment ends where it did and a retry appends the entries once. If even that cut fails,
        PartialWriteLeft is raised.
        """
        index = self.index
        position = self.size
        points_before = len(index)
        try:
            _write_all(self._log_fd, data)
            index.add_scanned_entries(entries, self.base_offset, position)
            if len(index) > points_before:
                # Written after the data: points a crash loses in between are re-added at open.
                _write_all(self._index_fd, index.encode(points_before))
        except OSError as error:
            self._undo_append(position, error)
        if position == 0:
            self._first_timestamp = entries[0][2]
        self.size += len(data)
        self.next_offset = entries[-1][0] + 1
        self._last_timestamp = entries[-1][2]
        self.unsynced = True

    def _undo_append(self, position: int, error: OSError) -> NoReturn:
        """Cut a failed append's bytes and index points off (the index file holds exactly the
        points in memory), then raise its error."""
        self.index.truncate(self.next_offset - self.base_offset, position)
        try:
            os.ftruncate(self._log_fd, position)
            os.ftruncate(self._index_fd, len(self.index) * POINT_SIZE)
        except OSError as undo_error:
            raise PartialWriteLeft(
                undo_error.errno,
                f"appending failed ({error.strerror or error}) and cutting the partial write off "
                f"failed too ({undo_error.strerror or undo_error})",
                str(self.log_path),
            ) from error
        raise OSError(
            error.errno,
            f"{error.strerror or error}; nothing was appended (the partial write was cut off)",
            str(self.log_path),
        ) from error

    def truncate(self, offset: int) -> None:
        """Remove the entry at ``offset`` and everything after it."""
        position = self.locate(offset)
        os.ftruncate(self._log_fd, position)
        self.size = position
        self.next_offset = offset
        self.index.truncate(offset - self.base_offset, position)
        self._rewrite_index_file()
        self._first_timestamp = None
        self._last_timestamp = None
        last = self.last_entry_before(offset)
        if (self.base_offset if last is None else last[0] + 1) < offset:
            self.may_end_early = True  # cut in a gap: its last entry is before the cut

    def take_unsynced(self) -> list[int]:
        """Duplicates of the file descriptors to fsync, for a sync running in another thread (a
        duplicate stays valid even if the segment is closed meanwhile); the caller closes them."""
        if not self.unsynced:
            return []
        self.unsynced = False
        return [os.dup(self._log_fd), os.dup(self._index_fd)]

    def close(self) -> None:
        for fd in (self._open_log_fd, self._open_index_fd):
            if fd is not None:
                os.close(fd)
        self._open_log_fd = self._open_index_fd = None

    def delete(self) -> None:
        """Close and remove the files, the log first: a stray index is cleaned up at open."""
        self.close()
        self.log_path.unlink(missing_ok=True)
        self.index_path.unlink(missing_ok=True)

    # --- reading ---------------------------------------------------------------------------

    @property
    def is_empty(self) -> bool:
        return self.size == 0

    def read_entries(
        self,
        offset: int,
        max_bytes: int,
        max_entries: int,
        at_least_one: bool,
        check_crc: bool = True,
        walk: EntryWalk = stored_prefix,
    ) -> tuple[bytes, int, int]:
        """(made, reach, length): what ``walk`` makes of the whole, CRC-checked entries from
        ``offset`` (or the first one after it) below ``offset + max_entries`` within the byte
        limit (their own bytes by default), how many offsets from ``offset`` they account for
        (see ``intact_prefix``: the whole segment's, once read to its end) and their stored length.

        ``at_least_one`` takes the first entry even when it is bigger than ``max_bytes``.
        The entries stop before a damaged one; if that is the first, CorruptEntry is raised
        (when ``at_least_one``), so a reader gets every good entry and then the error.
        """
        position = self.locate(offset)
        available = self.size - position
        wanted = min(max_bytes, available)
        if at_least_one:
            wanted = min(max(wanted, self._entry_size_at(position)), available)
        chunk = os.pread(self._log_fd, wanted, position)
        length, reach, error, walked = walk(chunk, offset, max_entries, check_crc)
        if error is not None and at_least_one and not length and not self._cut_by_read_limit(chunk, length, position):
            raise CorruptEntry(f"{self.log_path}, byte {position}: {error}") from error
        if error is None and position + length == self.size and self.may_end_early:
            reach = min(self.next_offset - offset, max_entries)  # the offsets after its last entry are gone
        return walked, reach, length

    def _cut_by_read_limit(self, chunk: bytes, good_length: int, position: int) -> bool:
        """Whether the entry after ``good_length`` only looks torn because the read stopped."""
        if position + len(chunk) >= self.size:
            return False
        rest = len(chunk) - good_length
        if rest < HEADER_SIZE:
            return True
        body_size = ENTRY_HEADER.unpack_from(chunk, good_length)[3]
        return HEADER_SIZE + body_size > rest

    def _entry_size_at(self, position: int) -> int:
        header = os.pread(self._log_fd, HEADER_SIZE, position)
        if len(header) < HEADER_SIZE:
            return HEADER_SIZE
        return HEADER_SIZE + ENTRY_HEADER.unpack(header)[3]

    def locate(self, offset: int) -> int:
        """Byte position of the entry at ``offset``, or of the first one after it if compaction
        removed it (the end, for ``next_offset`` or past the last entry of a compacted segment)."""
        if offset == self.next_offset:
            return self.size
        try:
            return self._locate_from_index(offset)
        except _MisplacedIndexPoint as error:
            logger.warning("rebuilding index %s: %s", self.index_path, error)
            self._rebuild_index()
            return self._locate_from_index(offset)

    def _locate_from_index(self, offset: int) -> int:
        relative_offset, position = self.index.floor(offset - self.base_offset)
        lowest_offset = self.base_offset + relative_offset  # an index point's entry has exactly its offset
        at_index_point = position > 0
        while position < self.size:
            chunk = os.pread(self._log_fd, min(_LOCATE_CHUNK, self.size - position), position)
            walked = 0
            while walked + HEADER_SIZE <= len(chunk):
                entry_offset, _, _, body_size, _ = ENTRY_HEADER.unpack_from(chunk, walked)
                if at_index_point and entry_offset != lowest_offset:
                    raise _MisplacedIndexPoint(f"point for offset {lowest_offset} lands on offset {entry_offset}")
                if entry_offset < lowest_offset:
                    raise CorruptEntry(
                        f"{self.log_path}, byte {position + walked}: offset {entry_offset} after "
                        f"offset {lowest_offset - 1}"
                    )
                if entry_offset >= offset:
                    return position + walked
                at_index_point = False
                walked += HEADER_SIZE + body_size
                lowest_offset = entry_offset + 1
            if walked == 0:
                break
            position += walked
        if position == self.size and self.may_end_early:
            return position
        raise CorruptEntry(f"{self.log_path}: no entry for offset {offset}")

    def offset_for_timestamp(self, timestamp: int) -> int | None:
        """First offset whose timestamp is >= ``timestamp``; None if the segment has none."""
        last = self.last_timestamp
        if last is None or last < timestamp:
            return None
        relative_offset, position = self.index.floor_by(
            lambda _, point_position: self._timestamp_at(point_position) < timestamp
        )
        for offset, _, entry_timestamp, _, _ in self._walk(
            position, self.base_offset + relative_offset, check_crc=False, chunk_size=_LOCATE_CHUNK
        ):
            if entry_timestamp >= timestamp:
                return offset
        return None

    def _timestamp_at(self, position: int) -> int:
        return ENTRY_HEADER.unpack(os.pread(self._log_fd, HEADER_SIZE, position))[1]

    @property
    def first_timestamp(self) -> int | None:
        if self._first_timestamp is None and not self.is_empty:
            self._first_timestamp = self._timestamp_at(0)
        return self._first_timestamp

    @property
    def last_timestamp(self) -> int | None:
        """Timestamp of the last entry, found from the last index point on first use."""
        if self._last_timestamp is None and not self.is_empty:
            relative_offset, position = self.index.last_point()
            for _, _, timestamp, _, _ in self._walk(
                position, self.base_offset + relative_offset, check_crc=False
            ):
                self._last_timestamp = timestamp
        return self._last_timestamp

    def first_damaged_offset(self, until_offset: int | None = None) -> int | None:
        """The first offset of this segment whose entry is damaged or missing, found by
        CRC-checking every entry from the start (up to ``until_offset``); None if all are whole."""
        expected_offset, walked_to = self.base_offset, 0
        for offset, _, _, _, end in self._walk(0, self.base_offset, check_crc=True):
            expected_offset, walked_to = offset + 1, end
            if until_offset is not None and expected_offset > until_offset:
                return None
        if walked_to == self.size and self.may_end_early:
            return None
        return expected_offset if expected_offset < self.next_offset else None

    def entry_epochs(self, from_offset: int) -> Iterator[tuple[int, int]]:
        """(offset, leader epoch) of every entry from ``from_offset`` on, read from the headers."""
        try:
            position, first_offset = self.locate(from_offset), from_offset
        except CorruptEntry:  # the damaged entries are reported when read; here, the walk stops at them
            position, first_offset = 0, self.base_offset
        for offset, epoch, _, _, _ in self._walk(position, first_offset, check_crc=False):
            if offset >= from_offset:
                yield offset, epoch

    def first_entry_from(self, offset: int) -> tuple[int, int] | None:
        """(offset, leader epoch) of the first entry at or after ``offset``, None if the segment
        has none; ValueError if there is no whole header there."""
        position = self.locate(offset)
        if position == self.size:
            return None
        header = os.pread(self._log_fd, HEADER_SIZE, position)
        if len(header) < HEADER_SIZE:
            raise ValueError(f"no whole entry at byte {position} of {self.log_path}")
        return offset_and_epoch(header)

    def last_entry_before(self, offset: int) -> tuple[int, int] | None:
        """(offset, leader epoch) of the last entry below ``offset``, None if the segment has none."""
        if offset <= self.base_offset:
            return None
        relative_offset, position = self.index.floor(offset - 1 - self.base_offset)
        last = None
        for entry_offset, epoch, _, _, _ in self._walk(position, self.base_offset + relative_offset, check_crc=False):
            if entry_offset >= offset:
                break
            last = entry_offset, epoch
        return last

    def _walk(
        self, position: int, expected_offset: int, check_crc: bool, chunk_size: int = _WALK_CHUNK
    ) -> Iterator[WalkedEntry]:
        """Entries from ``position`` to the end, the first at ``expected_offset`` or after it,
        stopping quietly at the first torn, damaged or out-of-order one (or one too far from the
        base for the index); positions are in the file."""
        while position < self.size:
            first_entry_size = self._entry_size_at(position)
            chunk = os.pread(
                self._log_fd, min(max(chunk_size, first_entry_size), self.size - position), position
            )
            consumed = 0
            try:
                for offset, epoch, timestamp, start, end in scan(chunk, check_crc=check_crc):
                    if not expected_offset <= offset <= self.base_offset + _MAX_RELATIVE_OFFSET:
                        return
                    yield offset, epoch, timestamp, position + start, position + end
                    expected_offset = offset + 1
                    consumed = end
            except CorruptEntry:
                pass  # a torn entry at the chunk's end is read whole next time round
            if consumed == 0:
                return
            position += consumed


_OFFSET = struct.Struct(">q")  # an entry header's first field
_ZERO_HEADER = bytes(HEADER_SIZE)
_NONZERO = re.compile(rb"[^\x00]")


def _common_prefix(first: bytes, second: bytes) -> bytes:
    length = 0
    while length < len(first) and first[length] == second[length]:
        length += 1
    return first[:length]


def _open_appendable(path: Path) -> int:
    # Private: a segment of an older version's data dir (0644) becomes 0600 when first used.
    return durable.open_private(path, os.O_RDWR | os.O_APPEND)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
