"""The commit log as its users see it: the partition replica and the follower loop, and through a
replica's ``log`` the node's cleaner, reconcile and metrics. ``CommitLog`` implements it; its
segments, index, checkpoints and retention stay behind it."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from bascule.partition.log.commitlog import LogFailed
from bascule.partition.log.compaction import CompactionJob
from bascule.partition.log.epochs import EpochHistory
from bascule.wire.entry import Entry, EntryWalk, Record, WalkedEntry, stored_prefix


class PartitionLog(Protocol):
    # --- where it stands (see CommitLog for each) ---

    @property
    def directory(self) -> Path: ...

    @property
    def oldest_offset(self) -> int: ...

    @property
    def next_offset(self) -> int: ...

    @property
    def newest_offset(self) -> int: ...

    @property
    def size_bytes(self) -> int: ...

    @property
    def high_watermark(self) -> int: ...

    @high_watermark.setter
    def high_watermark(self, offset: int) -> None: ...

    @property
    def epochs(self) -> EpochHistory: ...

    @property
    def epochs_changed(self) -> bool: ...

    @property
    def synced_end(self) -> int: ...

    @property
    def failure(self) -> LogFailed | None: ...

    @property
    def damaged_from(self) -> int | None: ...

    @property
    def appended_entries(self) -> int: ...

    @property
    def appended_bytes(self) -> int: ...

    # --- writing ---

    def append(self, records: Sequence[Record], leader_epoch: int) -> tuple[int, int]: ...

    def append_raw(self, data: bytes, walked: list[WalkedEntry] | None = None) -> int: ...

    def truncate(self, offset: int) -> None: ...

    def restart_at(self, offset: int) -> None: ...

    # --- reading ---

    def read(self, offset: int, max_entries: int = 1000, max_bytes: int = 1 << 20) -> list[Entry]: ...

    def read_raw(
        self, offset: int, max_bytes: int, check_crc: bool = True, max_entries: int = sys.maxsize
    ) -> bytes: ...

    def read_through(
        self, offset: int, max_bytes: int, max_entries: int = sys.maxsize, walk: EntryWalk = stored_prefix
    ) -> tuple[bytes, int]: ...

    def offset_for_timestamp(self, timestamp_ns: int) -> int: ...

    # --- durability ---

    def begin_sync(self) -> Callable[[], None]: ...

    def begin_checkpoint(self) -> Callable[[], None] | None: ...

    def checkpoint(self) -> None: ...

    def close(self) -> None: ...

    def abandon(self) -> None:
        """Close the files as a crash does: no sync, no checkpoint (the simulator's crash)."""
        ...

    # --- cleaning ---

    def enforce_retention(self) -> int: ...

    def begin_compaction(self) -> CompactionJob | None: ...

    def finish_compaction(self, job: CompactionJob) -> Callable[[], None]: ...
