"""A partition leader's deduplication window, sans I/O: which message ids it has written, and where.

An id is remembered while its message is among the partition's newest ``max_messages`` offsets and
younger than ``max_age`` seconds: both bounds are positions and timestamps in the log, so the window
a new leader rebuilds from its log's tail (``partition.replica``) is the one its predecessor had.
Its memory is at most ``max_messages`` ids of at most ``wire.dedup.MAX_KEPT_ID_BYTES`` bytes each.
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
    def __init__(self, limits: DedupLimits, remembered: Iterable[tuple[bytes, int, float]] = ()) -> None:
        """``remembered``: (key, offset, time written) of messages already in the log, oldest first."""
        self.limits = limits
        self._offsets: dict[bytes, int] = {}
        self._order: deque[tuple[int, float, bytes]] = deque()
        for key, offset, written in remembered:
            self.remember(key, offset, written)

    def __len__(self) -> int:
        return len(self._offsets)

    def offset_of(self, key: bytes) -> int | None:
        """Where the message with this id was written, if the window still holds it."""
        return self._offsets.get(key)

    def holds_any(self, keys: list[bytes | None]) -> bool:
        """Whether one of ``keys`` (None: no id) is in the window, or there twice."""
        given = [key for key in keys if key is not None]
        distinct = set(given)
        return len(distinct) < len(given) or not self._offsets.keys().isdisjoint(distinct)

    def remember_run(self, first_offset: int, keys: list[bytes | None], written: float) -> None:
        """``remember`` for messages written one per offset from ``first_offset``, with these ids
        (None: no id)."""
        if None in keys:
            pairs = [(key, offset) for offset, key in enumerate(keys, first_offset) if key is not None]
        else:
            pairs = list(zip(keys, range(first_offset, first_offset + len(keys))))  # type: ignore[arg-type]
        self._offsets.update(pairs)
        self._order.extend((offset, written, key) for key, offset in pairs)

    def remember(self, key: bytes, offset: int, written: float) -> None:
        """A message with id ``key`` was written at ``offset`` at time ``written``. An id written
        again (the window had let it go) now means its newest message."""
        self._offsets[key] = offset
        self._order.append((offset, written, key))

    def expire(self, log_end: int, now: float) -> None:
        """Let go of the ids that left the window: below the newest ``max_messages`` offsets of a
        log ending at ``log_end``, or older than ``max_age`` at ``now``."""
        lowest_offset = log_end - self.limits.max_messages
        oldest_time = now - self.limits.max_age
        order, offsets = self._order, self._offsets
        while order and (order[0][0] < lowest_offset or order[0][1] < oldest_time):
            offset, _, key = order.popleft()
            if offsets.get(key) == offset:
                del offsets[key]
