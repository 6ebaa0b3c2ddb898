"""A partition leader's deduplication window, sans I/O: which message ids it has written, and where.

An id is remembered while its message is among the partition's newest ``max_messages`` offsets and
younger than ``max_age`` seconds: both bounds are positions and timestamps in the log, so the window
a new leader rebuilds from its log's tail (``partition.replica``) is the one its predecessor had.
It holds at most twice ``max_messages`` ids of at most ``wire.dedup.MAX_KEPT_ID_BYTES`` bytes each.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DedupLimits:
    """The window's bounds; either being 0 turns deduplication off."""

    max_age: float  # seconds
    max_messages: int

    @property
    def enabled(self) -> bool:
        return self.max_age > 0 and self.max_messages > 0


class DedupWindow:
    """Ids and their offsets in a dict, and the times of the runs of offsets remembered together:
    an id leaves the window when its offset falls below ``lowest``, which ``expire`` raises, and
    the dict sheds the ids below it only once it holds twice ``max_messages`` (nothing per id
    expires one at a time: a tuple per id and its removal were most of the window's cost)."""

    def __init__(self, limits: DedupLimits, remembered: Iterable[tuple[bytes, int, float]] = ()) -> None:
        """``remembered``: (key, offset, time written) of messages already in the log, oldest first."""
        self.limits = limits
        self._offsets: dict[bytes, int] = {}
        self._runs: deque[tuple[int, float]] = deque()  # (first offset, time written), ascending
        self.lowest = 0  # ids at offsets below this have left the window
        for key, offset, written in remembered:
            self.remember(key, offset, written)

    def offset_of(self, key: bytes) -> int | None:
        """Where the message with this id was written, if the window still holds it."""
        offset = self._offsets.get(key)
        return offset if offset is not None and offset >= self.lowest else None

    def holds_any(self, keys: list[bytes | None]) -> bool:
        """Whether one of ``keys`` (None: no id) is in the window, or there twice."""
        distinct, nones = set(keys), keys.count(None)  # C loops: no Python step per id
        if nones:
            distinct.discard(None)
        if len(distinct) < len(keys) - nones:
            return True
        if self._offsets.keys().isdisjoint(distinct):
            return False
        return any(key is not None and self.offset_of(key) is not None for key in distinct)

    def remember_run(self, first_offset: int, keys: list[bytes | None], written: float) -> None:
        """``remember`` for messages written one per offset from ``first_offset``, with these ids
        (None: no id)."""
        if None not in keys:  # the usual case: every message has an id
            if keys:
                self._offsets.update(zip(keys, range(first_offset, first_offset + len(keys))))  # type: ignore[arg-type]
                self._runs.append((first_offset, written))
            return
        pairs = [(key, offset) for offset, key in enumerate(keys, first_offset) if key is not None]
        if pairs:
            self._offsets.update(pairs)
            self._runs.append((pairs[0][1], written))

    def remember(self, key: bytes, offset: int, written: float) -> None:
        """A message with id ``key`` was written at ``offset`` at time ``written``. An id written
        again (the window had let it go) now means its newest message."""
        self._offsets[key] = offset
        self._runs.append((offset, written))

    def expire(self, log_end: int, now: float) -> None:
        """Let go of the ids that left the window: below the newest ``max_messages`` offsets of a
        log ending at ``log_end``, or older than ``max_age`` at ``now``."""
        runs, limits = self._runs, self.limits
        oldest_time = now - limits.max_age
        while runs and runs[0][1] < oldest_time:
            runs.popleft()
        lowest = max(self.lowest, log_end - limits.max_messages, runs[0][0] if runs else log_end)
        self.lowest = lowest
        while len(runs) > 1 and runs[1][0] <= lowest:
            runs.popleft()
        if len(self._offsets) > 2 * limits.max_messages:
            self._offsets = {key: offset for key, offset in self._offsets.items() if offset >= lowest}
