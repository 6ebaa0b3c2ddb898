"""Leader-epoch history of a partition: which leader epoch started at which offset.

Pure and in memory; the commit log persists it to ``leader-epoch-checkpoint``. The rules follow
Kafka's leader-epoch cache (KIP-101, KIP-279) so that a follower can find where its log diverges
from the leader's.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable

NO_EPOCH = -1
NO_OFFSET = -1


class EpochHistory:
    """Ordered (epoch, start_offset) pairs: strictly increasing epochs, non-decreasing starts."""

    __slots__ = ("_entries",)

    def __init__(self, entries: Iterable[tuple[int, int]] = ()) -> None:
        self._entries: list[tuple[int, int]] = []
        for epoch, start_offset in entries:
            _check_non_negative(epoch, start_offset)
            if self._entries:
                last_epoch, last_start = self._entries[-1]
                if epoch <= last_epoch or start_offset < last_start:
                    raise ValueError(
                        f"epoch history out of order: ({epoch}, {start_offset}) "
                        f"after ({last_epoch}, {last_start})"
                    )
            self._entries.append((int(epoch), int(start_offset)))

    @property
    def entries(self) -> list[tuple[int, int]]:
        return list(self._entries)

    @property
    def latest_epoch(self) -> int:
        return self._entries[-1][0] if self._entries else NO_EPOCH

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset``; False if the epoch is not new.

        A start below the latest entry's start means the log was rewritten under an older
        epoch's entries (a new leader with a shorter log), so those entries no longer describe it.
        """
        _check_non_negative(epoch, start_offset)
        if epoch <= self.latest_epoch:
            return False
        if self._entries and start_offset < self._entries[-1][1]:
            self._entries = [entry for entry in self._entries if entry[1] < start_offset]
        self._entries.append((epoch, start_offset))
        return True

    def epoch_at(self, offset: int) -> int:
        """Epoch of the entry at ``offset``; -1 if the offset is before every recorded epoch."""
        index = bisect_right(self._entries, offset, key=_start_of) - 1
        return self._entries[index][0] if index >= 0 else NO_EPOCH

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(largest epoch <= ``epoch``, exclusive end offset of that epoch), Kafka's rule.

        Returns (-1, -1) when the epoch predates the whole history, and the log end offset for
        the current (latest) epoch or anything newer.
        """
        if not self._entries or epoch < self._entries[0][0]:
            return NO_EPOCH, NO_OFFSET
        if epoch >= self.latest_epoch:
            return self.latest_epoch, log_end_offset
        index = bisect_right(self._entries, epoch, key=_epoch_of) - 1
        return self._entries[index][0], self._entries[index + 1][1]

    def truncate_from_end(self, end_offset: int) -> None:
        """Forget epochs that started at or after ``end_offset`` once the log was cut there."""
        self._entries = [entry for entry in self._entries if entry[1] < end_offset]

    def truncate_from_start(self, start_offset: int) -> None:
        """Forget epochs wholly below ``start_offset`` once retention removed those offsets."""
        first_kept = 0
        while (
            first_kept + 1 < len(self._entries) and self._entries[first_kept + 1][1] <= start_offset
        ):
            first_kept += 1
        del self._entries[:first_kept]
        if self._entries and self._entries[0][1] < start_offset:
            self._entries[0] = (self._entries[0][0], start_offset)

    def __len__(self) -> int:
        return len(self._entries)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EpochHistory):
            return NotImplemented
        return self._entries == other._entries

    def __repr__(self) -> str:
        return f"EpochHistory({self._entries!r})"


def _start_of(entry: tuple[int, int]) -> int:
    return entry[1]


def _epoch_of(entry: tuple[int, int]) -> int:
    return entry[0]


def _check_non_negative(epoch: int, start_offset: int) -> None:
    if epoch < 0 or start_offset < 0:
        raise ValueError(f"epoch and start offset must be >= 0, got ({epoch}, {start_offset})")
