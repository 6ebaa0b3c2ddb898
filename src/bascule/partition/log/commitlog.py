"""The commit log of one partition: an ordered run of segments plus its two checkpoints.

Single-threaded by design (the asyncio loop): reads may interleave freely with appends, and
see every byte appended before them. Only the callable ``begin_sync`` returns runs elsewhere.

Disk errors come in two kinds. A write that fails (a full disk) is undone: the log ends where
it did and the OSError is raised, so a retry appends once. A failed fsync cannot be undone: the
kernel may already have dropped the pages it could not write and marked them clean, so a later
fsync that succeeds proves nothing about them (PostgreSQL's "fsyncgate"). The log is then
failed for good: every later write and sync raises LogFailed, and nothing written since the last
good fsync may be acknowledged. Damage found on disk (see ``damaged_from``) is reported, never
served.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import NoReturn

from bascule import durable
from bascule.partition.log import checkpoint, compaction, retention
from bascule.partition.log.compaction import CompactionJob, SealedSegment
from bascule.partition.log.epochs import EpochHistory
from bascule.partition.log.fsync_times import fsync_seconds
from bascule.partition.log.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    PartialWriteLeft,
    Segment,
    parse_segment_name,
    segment_name,
)
from bascule.wire.entry import (
    CorruptEntry,
    Entry,
    EntryWalk,
    Record,
    WalkedEntry,
    decode_entries,
    encode_entries,
    scan,
    stored_prefix,
)

logger = logging.getLogger(__name__)

_MAX_SEGMENT_BYTES = 0xFFFFFFFF  # index positions are uint32
_MAX_SEGMENT_ENTRIES = 0xFFFFFFFF  # index relative offsets are uint32
_NS_PER_SECOND = 1_000_000_000
# Opening walks the entries past the leader-epoch checkpoint's end (1M entries took 1.3 s): the checkpoint is
# rewritten once the log has grown this many offsets past it, and at every clean close.
EPOCH_CHECKPOINT_LAG = 50_000


class OffsetOutOfRange(Exception):
    """A read outside [oldest_offset, next_offset]."""

    def __init__(self, offset: int, oldest_offset: int, next_offset: int) -> None:
        super().__init__(f"offset {offset} is outside the log [{oldest_offset}, {next_offset}]")
        self.offset = offset
        self.oldest_offset = oldest_offset
        self.next_offset = next_offset


class LogFailed(OSError):
    """The log can no longer vouch for its files: an fsync failed, or a failed write could not be
    undone. It keeps the errno of the error that failed it. Raised by every append, sync and
    truncation from then on; the replica must be closed and its data fetched again."""

    def __init__(self, directory: Path, what: str, cause: OSError) -> None:
        super().__init__(
            cause.errno,
            f"the commit log failed ({what}: {cause.strerror or cause}); nothing written to it "
            "since its last good fsync can be trusted, and it takes no more writes",
            str(directory),
        )


@dataclass(frozen=True)
class LogConfig:
    segment_max_bytes: int = 256 * 1024 * 1024
    segment_max_age: float = 0  # seconds, 0 = no age-based roll
    retention_max_bytes: int = 0  # 0 = unlimited
    retention_max_messages: int = 0
    retention_max_age: float = 0  # seconds
    index_interval_bytes: int = 4096

    def __post_init__(self) -> None:
        if not 0 < self.segment_max_bytes <= _MAX_SEGMENT_BYTES:
            raise ValueError(f"segment_max_bytes must be in (0, {_MAX_SEGMENT_BYTES}]")
        if self.index_interval_bytes <= 0:
            raise ValueError("index_interval_bytes must be positive")
        for name in (
            "segment_max_age",
            "retention_max_bytes",
            "retention_max_messages",
            "retention_max_age",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")

    @property
    def retention_limits(self) -> retention.RetentionLimits:
        return retention.RetentionLimits(
            self.retention_max_bytes, self.retention_max_messages, int(self.retention_max_age * _NS_PER_SECOND)
        )


class _TrackedEpochHistory(EpochHistory):
    """An epoch history that counts its changes, so that the next sync knows to rewrite the
    checkpoint; callers may change the log's ``epochs`` directly (a new leader assigning its
    epoch)."""

    __slots__ = ("version",)

    def __init__(self, entries: list[tuple[int, int]]) -> None:
        super().__init__(entries)
        self.version = 0

    def assign(self, epoch: int, start_offset: int) -> bool:
        assigned = super().assign(epoch, start_offset)
        self.version += assigned
        return assigned

    def truncate_from_end(self, end_offset: int) -> None:
        self._counting_changes(super().truncate_from_end, end_offset)

    def truncate_from_start(self, start_offset: int) -> None:
        self._counting_changes(super().truncate_from_start, start_offset)

    def _counting_changes(self, change: Callable[[int], None], offset: int) -> None:
        before = self.entries
        change(offset)
        self.version += self.entries != before


class CommitLog:
    """Append-only log of entries at rising offsets, split into segment files. Appends as leader
    take consecutive offsets; compaction (and a follower storing its leader's compacted log) leaves
    gaps, which every read steps over."""

    def __init__(
        self,
        directory: Path,
        config: LogConfig,
        clock: Callable[[], int],
        segments: list[Segment],
    ) -> None:
        self.directory = directory
        self.config = config
        self._clock = clock
        self._segments = segments
        self._epochs = _TrackedEpochHistory([])
        self._checkpointed_epochs_version = 0
        self._checkpointed_epochs_end = 0  # the log end the epoch checkpoint on disk covers
        self._high_watermark = -1
        self._checkpointed_high_watermark: int | None = None
        self._checkpoint_lock = threading.Lock()
        self._last_timestamp = 0
        self._directory_unsynced = False
        self._closed = False
        self._failure: LogFailed | None = None
        self._synced_end = 0  # the log end the last successful sync covered (see synced_end)
        self._cuts = 0  # truncations and restarts: a sync begun before one covers nothing after it
        self._damaged_from: int | None = None
        self._damage_cut_off = False  # the damaged entries are out of the log, only missing
        # Changed by whatever changes the sealed segments (truncation, retention, compaction): a
        # compaction prepared in a thread is swapped in only if it did not change meanwhile.
        self._layout = 0
        self._cleaned_to = 0  # see compaction.read_cleaned_to
        self._compacted_at: tuple[int, int, int] | None = None  # (layout, HW, segments) of the last compaction
        # What was appended (as leader or follower) since the log was opened, for the metrics.
        self.appended_entries = 0
        self.appended_bytes = 0

    # --- opening ---------------------------------------------------------------------------

    @classmethod
    def open(
        cls, path: Path, config: LogConfig = LogConfig(), clock: Callable[[], int] = time.time_ns
    ) -> CommitLog:
        """Open (or create) the log in ``path``, recovering from a crash if there was one."""
        directory = Path(path)
        durable.make_private_directories(directory)
        compaction.recover(directory)
        base_offsets = _discover_segments(directory)
        interval = config.index_interval_bytes
        if base_offsets:
            segments = [
                Segment.open_sealed(directory, base, next_base, interval)
                for base, next_base in zip(base_offsets, base_offsets[1:])
            ]
            active, tail = Segment.recover(directory, base_offsets[-1], interval)
            segments.append(active)
        else:
            segments = [Segment.create(directory, 0, interval)]
            tail = None
        log = cls(directory, config, clock, segments)
        log._cleaned_to = compaction.read_cleaned_to(directory)
        for segment in segments[:-1]:
            segment.may_end_early = segment.next_offset <= log._cleaned_to
        log._directory_unsynced = not base_offsets
        log._last_timestamp = log._timestamp_of_last_entry()
        log._load_epochs()
        log._load_high_watermark()
        log._synced_end = log.next_offset
        if tail is not None and tail.damaged_from is not None:
            log._record_damage(tail.damaged_from, cut_off=True)
        return log

    def _load_epochs(self) -> None:
        """The saved history, checked against the entries it describes and extended by those
        written after it; rebuilt from every entry when it does not hold. The checkpoint is
        rewritten by syncs, after the data, so it may lag the log, or describe entries that a
        truncation since replaced."""
        saved = checkpoint.read_epochs(self.directory)
        checked = self._checked(saved) if saved is not None else None
        if checked is None:
            if saved is not None or self.next_offset > self.oldest_offset:
                logger.warning("rebuilding the leader-epoch history of %s from its entries", self.directory)
            checked = _TrackedEpochHistory([]), self.oldest_offset
        history, checked_end = checked
        for epoch, start_offset in self._epoch_starts_from(checked_end):
            history.assign(epoch, start_offset)
        history.version = int(saved is None or history.entries != saved.history.entries)
        self._epochs = history
        self._checkpointed_epochs_end = checked_end

    def _checked(self, saved: checkpoint.EpochCheckpoint) -> tuple[_TrackedEpochHistory, int] | None:
        """``saved`` trimmed to the offsets it covers, and the end of those; None unless the first
        and the last entry of every epoch run in it are of that epoch (epochs never decrease along
        a log, so the whole run is then of it). A run that compaction left without entries has
        nothing to contradict it."""
        end_offset = min(saved.end_offset if saved.end_offset is not None else self.next_offset, self.next_offset)
        if end_offset <= self.oldest_offset:
            return _TrackedEpochHistory([]), self.oldest_offset
        history = _TrackedEpochHistory(saved.history.entries)
        history.truncate_from_end(end_offset)
        history.truncate_from_start(self.oldest_offset)
        runs = history.entries
        if not runs or runs[0][1] != self.oldest_offset:
            return None
        ends = [start for _, start in runs[1:]] + [end_offset]
        try:
            for (epoch, start), end in zip(runs, ends):
                first = self._first_entry_from(start)
                if first is None or first[0] >= end:
                    continue
                last = self._last_entry_before(end)
                if first[1] != epoch or last is None or last[1] != epoch:
                    return None
        except (OSError, ValueError):
            return None
        return history, end_offset

    def _first_entry_from(self, offset: int) -> tuple[int, int] | None:
        """(offset, epoch) of the first entry at or after ``offset``."""
        for segment in self._segments[self._segment_index_for(offset):]:
            found = segment.first_entry_from(max(offset, segment.base_offset))
            if found is not None:
                return found
        return None

    def _last_entry_before(self, offset: int) -> tuple[int, int] | None:
        """(offset, epoch) of the last entry below ``offset``."""
        for segment in reversed(self._segments[: self._segment_index_for(offset - 1) + 1]):
            found = segment.last_entry_before(offset)
            if found is not None:
                return found
        return None

    def _epoch_starts_from(self, offset: int) -> Iterator[tuple[int, int]]:
        """(epoch, start) of each epoch the entries from ``offset`` on begin, read from them. An
        epoch whose first entry follows a gap is taken to start right after the entry before it:
        the gap's offsets may have been of either epoch, and of the two, the earlier start is the
        safe answer to a follower asking where the epoch before ended (it truncates more, never
        keeps an entry this log lacks)."""
        if offset >= self.next_offset:
            return
        current, start = None, offset
        for segment in self._segments[self._segment_index_for(offset):]:
            for entry_offset, epoch in segment.entry_epochs(max(offset, segment.base_offset)):
                if epoch != current:
                    yield epoch, start
                    current = epoch
                start = entry_offset + 1

    def _load_high_watermark(self) -> None:
        saved = checkpoint.read_high_watermark(self.directory)
        if saved is None:
            if self.next_offset > self.oldest_offset:
                logger.info("no high-watermark checkpoint in %s, using -1", self.directory)
            saved = -1
        if saved > self.newest_offset:
            logger.warning(
                "high watermark %d of %s is past the log's end, lowering it to %d",
                saved,
                self.directory,
                self.newest_offset,
            )
            saved = self.newest_offset
        self._high_watermark = saved
        self._checkpointed_high_watermark = saved

    def __enter__(self) -> CommitLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # --- state -----------------------------------------------------------------------------

    @property
    def oldest_offset(self) -> int:
        return self._segments[0].base_offset

    @property
    def next_offset(self) -> int:
        return self._active.next_offset

    @property
    def newest_offset(self) -> int:
        return self.next_offset - 1

    @property
    def size_bytes(self) -> int:
        """Bytes of entries in the segments' log files (their indexes left out)."""
        return sum(segment.size for segment in self._segments)

    @property
    def epochs(self) -> EpochHistory:
        """The leader-epoch history; any change to it is checkpointed at once."""
        return self._epochs

    @property
    def synced_end(self) -> int:
        """The log end that the last successful sync covered (what open found, at first): after a
        failed fsync, entries from here on may be readable and still not on the disk."""
        return min(self._synced_end, self.next_offset)

    @property
    def failure(self) -> LogFailed | None:
        """Why the log takes no more writes (see LogFailed), None while it is sound."""
        return self._failure

    @property
    def damaged_from(self) -> int | None:
        """The first offset whose entry this log lost to damage on disk and has not got back, None
        if it lost none. Set when opening moved a damaged stretch aside (the log now ends there),
        or when a read or ``find_damage`` met a damaged entry (still in the log, unreadable).
        Cleared once the damaged entries are truncated away and the log has grown past the offset
        again (a follower re-fetched them), or retention removed them. A replica with damage must
        not lead: it may lack committed entries that other replicas have."""
        return self._damaged_from

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    @high_watermark.setter
    def high_watermark(self, offset: int) -> None:
        if not -1 <= offset <= self.newest_offset:
            raise ValueError(f"high watermark {offset} is outside [-1, {self.newest_offset}]")
        self._high_watermark = offset

    def checkpoint(self, epochs_lag: int | None = None) -> None:
        write = self.begin_checkpoint(epochs_lag)
        if write is not None:
            write()

    def rewrite_high_watermark_checkpoint(self) -> None:
        """Write the HW checkpoint, current or not: a durable write, which raises while the disk
        fails one (a log reopened after a failure proves the disk this way)."""
        with self._checkpoint_lock:
            checkpoint.write_high_watermark(self.directory, self._high_watermark)
            self._checkpointed_high_watermark = self._high_watermark

    @property
    def epochs_changed(self) -> bool:
        """Whether the epoch history changed since its checkpoint was last written."""
        return self._epochs.version != self._checkpointed_epochs_version

    def begin_checkpoint(self, epochs_lag: int | None = None) -> Callable[[], None] | None:
        """The HW and epoch checkpoints as they are now, as a blocking call to run in another
        thread; None when both are current (the epoch checkpoint: unchanged, and covering the log
        but for at most ``epochs_lag`` offsets, EPOCH_CHECKPOINT_LAG unless given)."""
        # A failed log keeps its last HW checkpoint: the HW in memory may cover data that never
        # reached the disk.
        high_watermark = self._high_watermark
        hw_due = self._failure is None and high_watermark != self._checkpointed_high_watermark
        epochs = self._epochs_to_checkpoint(epochs_lag)
        if not hw_due and epochs is None:
            return None

        def write() -> None:
            if hw_due:
                # One writer at a time: every checkpoint goes through the same temporary file.
                with self._checkpoint_lock:
                    checkpoint.write_high_watermark(self.directory, high_watermark)
                    self._checkpointed_high_watermark = high_watermark
            if epochs is not None:
                self._checkpoint_epochs(*epochs)

        return write

    def _epochs_to_checkpoint(self, lag: int | None = None) -> tuple[int, EpochHistory, int] | None:
        """(version, history, log end) for the epoch checkpoint, None if it is current. The
        checkpoint may be written before the data it covers is on disk: opening checks it against
        the entries."""
        lag = EPOCH_CHECKPOINT_LAG if lag is None else lag
        if not self.epochs_changed and self.next_offset - self._checkpointed_epochs_end <= lag:
            return None
        return self._epochs.version, EpochHistory(self._epochs.entries), self.next_offset

    @property
    def _active(self) -> Segment:
        return self._segments[-1]

    # --- appending -------------------------------------------------------------------------

    def append(self, records: Sequence[Record], leader_epoch: int) -> tuple[int, int]:
        """Append as leader: assign offsets and timestamps; returns (first, last) offsets.

        Timestamps never go below the previous entry's, so timestamp lookups can bisect.
        """
        if not records:
            raise ValueError("nothing to append")
        self._check_not_failed()
        self._check_epoch_is_current(leader_epoch)
        now = max(self._clock(), self._last_timestamp)
        first_offset = self.next_offset
        data, walked = encode_entries(first_offset, leader_epoch, records, now, floor=self._last_timestamp)
        self._write(data, walked, [(leader_epoch, first_offset)])
        return first_offset, self.newest_offset

    def append_raw(self, data: bytes, walked: list[WalkedEntry] | None = None) -> int:
        """Append as follower: entries encoded by the leader, stored byte for byte.

        They must be intact, at rising offsets from ``next_offset`` on (the gaps of a leader's
        compacted log are stored as they are); otherwise nothing is appended (CorruptEntry,
        ValueError). A new epoch after a gap starts where the gap does (see
        ``_epoch_starts_from``). Returns the new ``next_offset``. ``walked`` is
        ``list(scan(data))`` when the caller already has it (checked), saving a second pass.
        """
        self._check_not_failed()
        entries = list(scan(data)) if walked is None else walked
        expected_offset = self.next_offset
        latest_epoch = self._epochs.latest_epoch
        epoch_starts = []
        for offset, epoch, _, _, _ in entries:
            if offset < expected_offset:
                raise ValueError(
                    f"entry offset {offset} does not continue the log at {expected_offset}"
                )
            if epoch < latest_epoch:
                raise ValueError(
                    f"entry {offset} has leader epoch {epoch}, older than the log's {latest_epoch}"
                )
            if epoch > latest_epoch:
                epoch_starts.append((epoch, expected_offset))
                latest_epoch = epoch
            expected_offset = offset + 1
        if entries:
            self._write(bytes(data), entries, epoch_starts)
        return self.next_offset

    def _check_epoch_is_current(self, leader_epoch: int) -> None:
        if leader_epoch < self._epochs.latest_epoch:
            raise ValueError(
                f"leader epoch {leader_epoch} is older than the log's {self._epochs.latest_epoch}"
            )

    def _write(
        self, data: bytes, entries: list[WalkedEntry], epoch_starts: list[tuple[int, int]]
    ) -> None:
        """All or nothing: an OSError leaves the log as it was (the segment cuts off what part of
        the write reached it), so a writer may retry without duplicating entries."""
        try:
            self._roll_if_due(len(data), entries[-1][0] + 1 - self.next_offset)
            self._active.append(data, entries)
        except PartialWriteLeft as error:
            self._raise_failure("cutting off a failed append", error)
        self.appended_entries += len(entries)
        self.appended_bytes += len(data)
        for epoch, start_offset in epoch_starts:
            self._epochs.assign(epoch, start_offset)
        self._last_timestamp = max(self._last_timestamp, entries[-1][2])
        damaged_from = self._damaged_from
        if self._damage_cut_off and damaged_from is not None and self.next_offset > damaged_from:
            logger.info("%s holds offset %d again: its damage is repaired", self.directory, damaged_from)
            self._damaged_from = None

    def _roll_if_due(self, incoming_bytes: int, incoming_offsets: int) -> None:
        active = self._active
        if active.is_empty:
            return
        too_big = active.size + incoming_bytes > self.config.segment_max_bytes
        too_many = active.next_offset - active.base_offset + incoming_offsets > _MAX_SEGMENT_ENTRIES
        max_age_ns = int(self.config.segment_max_age * _NS_PER_SECOND)
        first_timestamp = active.first_timestamp
        too_old = max_age_ns > 0 and first_timestamp is not None and self._clock() - first_timestamp >= max_age_ns
        if too_big or too_many or too_old:
            self._segments.append(
                Segment.create(self.directory, self.next_offset, self.config.index_interval_bytes)
            )
            self._directory_unsynced = True

    # --- reading ---------------------------------------------------------------------------

    def read_raw(self, offset: int, max_bytes: int, check_crc: bool = True, max_entries: int = sys.maxsize) -> bytes:
        """Stored bytes of whole entries from ``offset`` (or from the first entry after it, when
        compaction removed it) below ``offset + max_entries``: at least one entry even if it is
        bigger than ``max_bytes``, b"" at the end of the log. Every entry is CRC-checked: the
        bytes stop before a damaged entry, and reading from one raises CorruptEntry.
        ``check_crc=False`` is for bytes whose receiver checks them (replication)."""
        return self._read_raw(offset, max_bytes, max_entries, check_crc)[0]

    def read_through(
        self, offset: int, max_bytes: int, max_entries: int = sys.maxsize, walk: EntryWalk = stored_prefix
    ) -> tuple[bytes, int]:
        """What ``walk`` makes of the entries ``read_raw`` would return (CRC-checked by the walk
        itself), and how many offsets from ``offset`` they account for (the next read starts that
        far on: past the gaps too): one pass over each entry for a reader that turns them into
        something else (Subscribe's Messages)."""
        return self._read_raw(offset, max_bytes, max_entries, walk=walk)

    def read(self, offset: int, max_entries: int = 1000, max_bytes: int = 1 << 20) -> list[Entry]:
        """Decoded entries from ``offset`` below ``offset + max_entries`` (fewer where compaction
        left gaps), at most ``max_bytes`` of stored bytes unless the first entry alone is bigger."""
        return decode_entries(self._read_raw(offset, max_bytes, max_entries)[0], check_crc=False)

    def _read_raw(
        self, offset: int, max_bytes: int, max_entries: int, check_crc: bool = True, walk: EntryWalk = stored_prefix
    ) -> tuple[bytes, int]:
        """Whole entries from ``offset``, every one CRC-checked. They stop before a damaged
        entry, and CorruptEntry is raised when reading from one, never its bytes returned."""
        if not self.oldest_offset <= offset <= self.next_offset:
            raise OffsetOutOfRange(offset, self.oldest_offset, self.next_offset)
        if offset == self.next_offset or max_entries <= 0:
            return b"", 0
        parts: list[bytes] = []
        remaining_bytes = max_bytes
        remaining_entries = max_entries
        for segment in self._segments[self._segment_index_for(offset) :]:
            try:
                chunk, count, length = segment.read_entries(
                    offset, remaining_bytes, remaining_entries, at_least_one=not parts, check_crc=check_crc, walk=walk
                )
            except CorruptEntry:
                self._note_damage_in(segment, offset)
                raise
            if chunk:
                parts.append(chunk)
            offset += count
            remaining_bytes -= length
            remaining_entries -= count
            if offset < segment.next_offset or remaining_bytes <= 0 or remaining_entries == 0:
                break
        return b"".join(parts), max_entries - remaining_entries

    def _note_damage_in(self, segment: Segment, offset: int) -> None:
        """A read from ``offset`` met damage: find and record its first damaged entry (a reader
        may stumble on it a few entries later, where an entry header no longer lines up)."""
        if self._damaged_from is not None and self._damaged_from <= offset:
            return
        damaged = segment.first_damaged_offset(until_offset=offset)
        self._record_damage(offset if damaged is None else damaged, cut_off=False)

    def find_damage(self) -> int | None:
        """CRC-check every entry of every segment (opening checks only the active segment's tail);
        record and return the first damaged or missing offset, None if there is none. Reads the
        whole log: call it from the thread that owns the log, or before the log is in use."""
        for segment in self._segments:
            damaged = segment.first_damaged_offset()
            if damaged is not None:
                if self._damaged_from is None or damaged < self._damaged_from:
                    self._record_damage(damaged, cut_off=False)
                return damaged
        return None

    def _record_damage(self, offset: int, cut_off: bool) -> None:
        if self._damaged_from is not None and self._damaged_from <= offset:
            return
        self._damaged_from, self._damage_cut_off = offset, cut_off
        logger.error(
            "the log in %s lost its entry at offset %d to damage on disk (%s); it must fetch "
            "it again and must not lead meanwhile",
            self.directory,
            offset,
            "moved aside" if cut_off else "it stays unreadable",
        )

    def _segment_index_for(self, offset: int) -> int:
        return max(bisect_right(self._segments, offset, key=_base_offset) - 1, 0)

    def offset_for_timestamp(self, timestamp_ns: int) -> int:
        """First offset whose timestamp is >= ``timestamp_ns``; ``next_offset`` if none is."""
        for segment in self._segments:
            found = segment.offset_for_timestamp(timestamp_ns)
            if found is not None:
                return found
        return self.next_offset

    def _timestamp_of_last_entry(self) -> int:
        for segment in reversed(self._segments):
            if segment.last_timestamp is not None:
                return segment.last_timestamp
        return 0

    # --- truncation and retention ----------------------------------------------------------

    def truncate(self, offset: int) -> None:
        """Remove the entry at ``offset`` and everything after it (a follower dropping entries
        the leader does not have). Below ``oldest_offset`` the log is emptied and restarts at
        ``offset``."""
        if offset < 0:
            raise ValueError(f"cannot truncate to negative offset {offset}")
        self._check_not_failed()
        if offset < self.next_offset:
            self._layout += 1
            try:
                self._truncate_segments(offset)
            except OSError as error:
                self._raise_failure("truncating", error)
            self._last_timestamp = self._timestamp_of_last_entry()
            if self._damaged_from is not None and offset <= self._damaged_from:
                self._damage_cut_off = True
        self._epochs.truncate_from_end(offset)
        self._checkpointed_epochs_end = min(self._checkpointed_epochs_end, offset)
        self._high_watermark = min(self._high_watermark, offset - 1)
        self._synced_end = min(self._synced_end, offset)
        self._cuts += 1

    def _truncate_segments(self, offset: int) -> None:
        keep = self._segment_index_for(offset) + 1 if offset >= self.oldest_offset else 0
        for segment in reversed(self._segments[keep:]):
            segment.delete()
        del self._segments[keep:]
        if self._segments:
            self._active.truncate(offset)
        else:
            self._segments.append(
                Segment.create(self.directory, offset, self.config.index_interval_bytes)
            )
        self._directory_unsynced = True

    def restart_at(self, offset: int) -> None:
        """Empty the log and restart it at ``offset``, which may be past its end (a follower whose
        leader's log starts after this log's end)."""
        if offset < 0:
            raise ValueError(f"cannot restart at negative offset {offset}")
        self._check_not_failed()
        self._layout += 1
        try:
            for segment in self._segments:
                segment.delete()
            self._segments = [
                Segment.create(self.directory, offset, self.config.index_interval_bytes)
            ]
            self._directory_unsynced = True
        except OSError as error:
            self._raise_failure("restarting the log", error)
        if self._damaged_from is not None:
            self._damage_cut_off = True
            if offset > self._damaged_from:
                self._damaged_from = None  # the log now starts after it: nothing is missing
        self._last_timestamp = 0
        self._epochs.truncate_from_end(0)
        self._high_watermark = offset - 1
        self._synced_end = offset
        self._cuts += 1

    def enforce_retention(self) -> int:
        """Delete the oldest whole segments that retention lets go (see ``retention``); returns how many."""
        count = retention.segments_to_delete(
            self._segments[:-1], self._active, self.config.retention_limits, self._high_watermark, self._clock()
        )
        for segment in self._segments[:count]:
            segment.delete()
            logger.info("retention deleted %s", segment.log_path)
        del self._segments[:count]
        if count:
            self._layout += 1
            self._directory_unsynced = True
            self._forget_below_oldest()
        return count

    def _forget_below_oldest(self) -> None:
        self._epochs.truncate_from_start(self.oldest_offset)
        if self._damaged_from is not None and self._damaged_from < self.oldest_offset:
            self._damaged_from = None

    # --- compaction ------------------------------------------------------------------------

    def begin_compaction(self) -> CompactionJob | None:
        """A compaction of the sealed segments below the high watermark (see ``compaction``), for
        its ``prepare`` to run in a thread and ``finish_compaction`` to swap in; None when there is
        nothing new to compact (no sealed segment, or nothing committed since the last one)."""
        if self._failure is not None or self._closed or len(self._segments) < 2:
            return None
        if self._compacted_at == (self._layout, self._high_watermark, len(self._segments)):
            return None
        active = self._active
        return CompactionJob(
            self.directory,
            [SealedSegment(s.base_offset, s.next_offset, s.may_end_early) for s in self._segments[:-1]],
            active.base_offset,
            active.size,
            self._high_watermark,
            self.config.index_interval_bytes,
            self._cleaned_to,
            self._layout,
        )

    def finish_compaction(self, job: CompactionJob) -> Callable[[], None]:
        """Swap in what ``job`` prepared, unless the log changed meanwhile (then it is discarded);
        returns the directory's fsync, to run in a thread. A rename that fails fails the log."""
        if self._failure is not None or self._closed or job.layout != self._layout:
            job.discard()
            return _nothing_to_sync
        self._cleaned_to = job.cleaned_to
        by_base = {segment.base_offset: segment for segment in self._segments}
        try:
            for rewrite in job.rewrites:
                self._swap_in(job, rewrite, by_base[rewrite.base_offset])
        except OSError as error:
            self._raise_failure("swapping in a compacted segment", error)
        self._compacted_at = self._layout + bool(job.rewrites), job.high_watermark, len(job.segments) + 1 - sum(
            rewrite.emptied for rewrite in job.rewrites
        )
        if not job.rewrites:
            return _nothing_to_sync
        self._layout += 1
        self._directory_unsynced = True
        self._forget_below_oldest()
        logger.info(
            "compacted %s: %d entries removed from %d segments",
            self.directory, sum(rewrite.removed for rewrite in job.rewrites), len(job.rewrites),
        )
        directory = self.directory

        def sync_directory() -> None:
            try:
                durable.sync_directory(directory)
            except OSError as error:
                self._raise_failure("fsync of the directory after compaction", error)

        return sync_directory

    def _swap_in(self, job: CompactionJob, rewrite: compaction.Rewrite, old: Segment) -> None:
        position = self._segments.index(old)
        if rewrite.emptied:
            old.delete()
            del self._segments[position]
            if position > 0:
                previous = self._segments[position - 1]
                previous.next_offset, previous.may_end_early = rewrite.next_offset, True
            return
        base = rewrite.base_offset
        swap = job.swap_log(base)
        os.rename(job.cleaned_log(base), swap)  # the commit point: see compaction.recover
        os.rename(job.cleaned_index(base), old.index_path)
        os.rename(swap, old.log_path)
        old.close()
        compacted = Segment.open_sealed(self.directory, base, rewrite.next_offset, self.config.index_interval_bytes)
        compacted.may_end_early = True
        self._segments[position] = compacted

    # --- durability ------------------------------------------------------------------------

    def sync(self) -> None:
        """fsync what was written since the last sync, then rewrite the epoch checkpoint if it
        changed; nothing to do costs nothing. A failed fsync fails the log (LogFailed)."""
        self.begin_sync()()

    def begin_sync(self) -> Callable[[], None]:
        """What sync() would do now, as a blocking call to run in another thread. Appends may go
        on meanwhile; the next sync covers them (group commit). The call raises LogFailed if its
        fsync fails, and also if any other sync failed before it returned: its own success says
        nothing about the pages the other one lost."""
        self._check_not_failed()
        fds = [fd for segment in self._segments for fd in segment.take_unsynced()]
        directory = self.directory if self._directory_unsynced else None
        self._directory_unsynced = False
        epochs = self._epochs_to_checkpoint()
        end, cuts = self.next_offset, self._cuts

        def run() -> None:
            started = time.monotonic()
            try:
                for fd in fds:
                    os.fsync(fd)
                if directory is not None:
                    durable.sync_directory(directory)
            except OSError as error:
                self._raise_failure("fsync", error)
            finally:
                for fd in fds:
                    os.close(fd)
            if fds or directory is not None:
                fsync_seconds.observe(time.monotonic() - started)
            self._check_not_failed()
            if cuts == self._cuts:
                self._synced_end = max(self._synced_end, end)
            if epochs is not None:
                self._checkpoint_epochs(*epochs)

        return run

    def _checkpoint_epochs(self, version: int, history: EpochHistory, end_offset: int) -> None:
        # A checkpoint that cannot be written costs only a longer check at the next open.
        with self._checkpoint_lock:
            if (version, end_offset) <= (self._checkpointed_epochs_version, self._checkpointed_epochs_end):
                return  # a newer one is on disk already
            try:
                checkpoint.write_epochs(self.directory, history, end_offset)
            except OSError as error:
                logger.warning("could not write the leader-epoch checkpoint of %s: %s", self.directory, error)
                return
            self._checkpointed_epochs_version, self._checkpointed_epochs_end = version, end_offset

    def _check_not_failed(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _raise_failure(self, what: str, error: OSError) -> NoReturn:
        """Fail the log for good (the first failure is the one kept) and raise its LogFailed."""
        if self._failure is None:
            self._failure = LogFailed(self.directory, what, error)
            self._failure.__cause__ = error  # kept however often the failure is raised again
            logger.error("%s", self._failure)
        raise self._failure

    def close(self) -> None:
        """Sync, checkpoint the high watermark and close every file. A failed log only closes its
        files; a sync that fails here fails the log and raises, the files closed all the same."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._failure is None:
                self.sync()
                self.checkpoint(epochs_lag=0)
        finally:
            for segment in self._segments:
                segment.close()


    def abandon(self) -> None:
        """Close every file without syncing or checkpointing: what a killed process leaves behind
        (the files hold what was written; what was not synced is the disk's to lose)."""
        self._closed = True
        for segment in self._segments:
            segment.close()


def _nothing_to_sync() -> None:
    pass


def _base_offset(segment: Segment) -> int:
    return segment.base_offset


def _discover_segments(directory: Path) -> list[int]:
    """Base offsets of the segments in ``directory``, after removing leftovers of a crash."""
    base_offsets = []
    index_stems = set()
    for entry in os.scandir(directory):
        stem, _, suffix = entry.name.partition(".")
        if entry.name.endswith(durable.TEMPORARY_SUFFIX):
            os.unlink(entry.path)  # a checkpoint (or quarantine) write that never got renamed
        elif (base_offset := parse_segment_name(stem)) is None:
            continue
        elif "." + suffix == LOG_SUFFIX:
            base_offsets.append(base_offset)
        elif "." + suffix == INDEX_SUFFIX:
            index_stems.add(stem)
    for stem in index_stems - {segment_name(base) for base in base_offsets}:
        os.unlink(directory / (stem + INDEX_SUFFIX))  # its log was deleted just before a crash
    return sorted(base_offsets)
