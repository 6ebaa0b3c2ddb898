"""Retention, the pure rule: how many of a log's oldest segments its limits let go.

Liftbridge's limits, each 0 for no limit: the log's bytes, its messages, and the age of a segment's
newest entry. Retention deletes whole segments, oldest first, as many as the most demanding limit
asks; never the active segment, nor a segment holding an entry above the high watermark.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class RetentionLimits:
    max_bytes: int = 0
    max_messages: int = 0
    max_age_ns: int = 0


class SegmentFacts(Protocol):
    """What retention reads of a segment (a log's ``Segment`` has them)."""

    @property
    def base_offset(self) -> int: ...

    @property
    def next_offset(self) -> int: ...

    @property
    def size(self) -> int:
        """Bytes of entries."""
        ...

    @property
    def last_timestamp(self) -> int | None:
        """Of its newest entry, ns since the epoch; None when it has none. Read only under an
        age limit, and then only for the oldest segments until one is young enough: a sealed
        segment's may have to be read from its file."""
        ...


def segments_to_delete(
    sealed: Sequence[SegmentFacts], active: SegmentFacts, limits: RetentionLimits, high_watermark: int, now: int
) -> int:
    """How many of the oldest ``sealed`` segments to delete at ``now`` (ns since the epoch). One
    holding entries above ``high_watermark`` stays, with those after it: a follower may still need
    them to be committed."""
    committed = sum(segment.next_offset - 1 <= high_watermark for segment in sealed)
    every = [*sealed, active]
    return min(
        committed,
        max(
            _expired_by_age(sealed, limits.max_age_ns, now),
            _oldest_beyond_limit([segment.size for segment in every], limits.max_bytes),
            _oldest_beyond_limit([segment.next_offset - segment.base_offset for segment in every], limits.max_messages),
        ),
    )


def _expired_by_age(sealed: Sequence[SegmentFacts], max_age_ns: int, now: int) -> int:
    """How many of the oldest segments have a newest entry older than ``max_age_ns``."""
    if not max_age_ns:
        return 0
    cutoff = now - max_age_ns
    count = 0
    for segment in sealed:
        if segment.last_timestamp is None or segment.last_timestamp >= cutoff:
            break
        count += 1
    return count


def _oldest_beyond_limit(sizes: list[int], limit: int) -> int:
    """How many leading items to drop so the newest ones total at most ``limit`` (0 = none).

    The last item, the active segment, always stays even when it alone is over the limit.
    """
    if not limit:
        return 0
    total = 0
    for kept, size in enumerate(reversed(sizes)):
        total += size
        if total > limit and kept > 0:
            return len(sizes) - kept
    return 0
