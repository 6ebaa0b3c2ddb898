"""The retention rule without a disk: examples, and the rule against a brute-force statement of it."""

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from bascule.partition.log.retention import RetentionLimits, segments_to_delete

SECOND = 10**9
NOW = 1_000 * SECOND


@dataclass(frozen=True)
class Facts:
    base_offset: int
    next_offset: int
    size: int
    last_timestamp: int | None


def segments(*counts: int, bytes_each: int = 100, newest_at: int = NOW) -> list[Facts]:
    """Contiguous segments of ``counts`` entries, the entries a second apart, the newest at ``newest_at``."""
    total = sum(counts)
    made, base = [], 0
    for count in counts:
        newest = newest_at - (total - base - count) * SECOND
        made.append(Facts(base, base + count, count * bytes_each, newest if count else None))
        base += count
    return made


def delete(every: list[Facts], limits: RetentionLimits, high_watermark: int | None = None, now: int = NOW) -> int:
    committed = every[-1].next_offset - 1 if high_watermark is None else high_watermark
    return segments_to_delete(every[:-1], every[-1], limits, committed, now)


def test_zero_limits_are_no_limits():
    assert delete(segments(10, 10, 10), RetentionLimits(0, 0, 0)) == 0


def test_bytes_keep_the_newest_segments_within_the_limit():
    assert delete(segments(10, 10, 10, 10), RetentionLimits(max_bytes=2_500)) == 2
    assert delete(segments(10, 10, 10, 10), RetentionLimits(max_bytes=2_000)) == 2
    assert delete(segments(10, 10, 10, 10), RetentionLimits(max_bytes=1_999)) == 3


def test_messages_keep_the_newest_segments_within_the_limit():
    assert delete(segments(10, 10, 10, 5), RetentionLimits(max_messages=25)) == 1
    assert delete(segments(10, 10, 10, 5), RetentionLimits(max_messages=24)) == 2


def test_the_active_segment_stays_even_alone_over_a_limit():
    assert delete(segments(10, 10, 50), RetentionLimits(max_bytes=1, max_messages=1, max_age_ns=1)) == 2
    assert delete(segments(50), RetentionLimits(max_bytes=1, max_messages=1, max_age_ns=1)) == 0


def test_age_deletes_the_oldest_run_of_segments_whose_newest_entry_is_too_old():
    # newest entries at NOW - 30 s, NOW - 20 s, NOW - 10 s, NOW
    assert delete(segments(10, 10, 10, 10), RetentionLimits(max_age_ns=15 * SECOND), now=NOW) == 2
    assert delete(segments(10, 10, 10, 10), RetentionLimits(max_age_ns=20 * SECOND), now=NOW) == 1


def test_the_most_demanding_limit_decides():
    limits = RetentionLimits(max_bytes=3_000, max_messages=15, max_age_ns=25 * SECOND)
    assert delete(segments(10, 10, 10, 10), limits) == 3


def test_segments_with_entries_above_the_high_watermark_stay():
    every = segments(10, 10, 10, 10)
    assert delete(every, RetentionLimits(max_messages=1), high_watermark=19) == 2
    assert delete(every, RetentionLimits(max_messages=1), high_watermark=18) == 1
    assert delete(every, RetentionLimits(max_messages=1), high_watermark=-1) == 0


class Unread:
    """A segment whose newest timestamp is costly to get (a sealed one's is read from its file)."""

    base_offset, next_offset, size = 20, 30, 1_000

    @property
    def last_timestamp(self) -> int | None:
        raise AssertionError("read")


def test_age_reads_timestamps_only_until_a_segment_is_young_enough():
    old, young = segments(10, 10, 10, newest_at=NOW - 100 * SECOND)[:2]  # newest at NOW - 120 s, NOW - 110 s
    limits = RetentionLimits(max_age_ns=115 * SECOND)
    assert segments_to_delete([old, young, Unread()], Unread(), limits, 29, NOW) == 1
    assert segments_to_delete([young, Unread()], Unread(), RetentionLimits(max_bytes=5), 29, NOW) == 2


def brute_force(every: list[Facts], limits: RetentionLimits, high_watermark: int, now: int) -> int:
    """The rule as stated: the most any limit asks, at most the committed sealed segments."""
    sealed = len(every) - 1
    candidates = range(sealed + 1)

    def kept_within(deleted: int, limit: int, measure) -> bool:
        return not limit or deleted == sealed or sum(measure(segment) for segment in every[deleted:]) <= limit

    def too_old(segment: Facts) -> bool:
        stamp = segment.last_timestamp
        return bool(limits.max_age_ns) and stamp is not None and stamp < now - limits.max_age_ns

    by_bytes = min(k for k in candidates if kept_within(k, limits.max_bytes, lambda s: s.size))
    by_messages = min(
        k for k in candidates if kept_within(k, limits.max_messages, lambda s: s.next_offset - s.base_offset)
    )
    by_age = max(k for k in candidates if all(too_old(segment) for segment in every[:k]))
    committed = max(k for k in candidates if all(s.next_offset - 1 <= high_watermark for s in every[:k]))
    return min(committed, max(by_bytes, by_messages, by_age))


@st.composite
def logs(draw) -> tuple[list[Facts], int, int]:
    """Segments at rising offsets and timestamps (the last one active), a HW within them, and a time;
    small numbers, so that totals often meet the limits exactly."""
    every, base, stamp = [], draw(st.integers(0, 5)), draw(st.integers(0, 5))
    for _ in range(draw(st.integers(1, 6))):
        count = draw(st.integers(0, 6))
        stamp += draw(st.integers(0, 5)) if count else 0
        every.append(Facts(base, base + count, draw(st.integers(0, 20)) if count else 0, stamp if count else None))
        base += count + draw(st.integers(0, 2))  # compaction may leave gaps between segments
    high_watermark = draw(st.integers(every[0].base_offset - 1, every[-1].next_offset - 1))
    return every, high_watermark, stamp + draw(st.integers(0, 10))


def limit(most: int) -> st.SearchStrategy[int]:
    return st.one_of(st.just(0), st.integers(1, most))  # often none, so that another limit decides


@settings(max_examples=1_000)
@given(logs(), limit(100), limit(30), limit(30))
def test_the_rule_is_its_brute_force_statement(log, max_bytes, max_messages, max_age_ns):
    every, high_watermark, now = log
    limits = RetentionLimits(max_bytes, max_messages, max_age_ns)
    expected = brute_force(every, limits, high_watermark, now)
    assert segments_to_delete(every[:-1], every[-1], limits, high_watermark, now) == expected
