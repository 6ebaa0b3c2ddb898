"""bascule.spark.reading: what one subscription's messages make of a range (duplicates after a
resume, gaps, messages past its end, batch size, pollTimeoutMs), fed by a stand-in subscription:
no Spark session, no brokers."""

import asyncio
import logging

import pytest

pytest.importorskip("pyspark", reason="PySpark is not installed (pip install -e '.[spark]')")

from bascule.client import Message  # noqa: E402
from bascule.spark.errors import BasculeSparkError  # noqa: E402
from bascule.spark.options import parse_read_options  # noqa: E402
from bascule.spark.planning import OffsetRange  # noqa: E402
from bascule.spark.reading import _SubscriptionReader  # noqa: E402


def options(**more: str):
    return parse_read_options({"brokers": "h:1", "stream": "s", **more}, streaming=False)


async def subscription(offsets: list[int], then_wait: bool = False):
    for offset in offsets:
        yield Message("s", 0, offset, 0, None, b"", "s", {})
    if then_wait:
        await asyncio.sleep(60)


def fill(r: OffsetRange, offsets: list[int], start: int | None = None, then_wait: bool = False, **more: str):
    """The reader after one `fill` from `start` (the range's start unless given)."""

    async def go():
        reader = _SubscriptionReader(options(**more), r, r.start if start is None else start,
                                     subscription(offsets, then_wait))
        await reader.fill()
        return reader

    return asyncio.run(go())


def offsets_of(reader) -> list[int]:
    return [m.offset for m in reader.batch]


def test_a_whole_range_ends_the_subscription_at_its_last_offset():
    reader = fill(OffsetRange("s", 0, 5, 8), [5, 6, 7, 8, 9])
    assert (offsets_of(reader), reader.expected, reader.ended, reader.failure) == ([5, 6, 7], 8, True, None)


def test_offsets_already_read_are_skipped_after_a_resume():
    reader = fill(OffsetRange("s", 0, 0, 10), [3, 4, 5, 6], start=5)
    assert (offsets_of(reader), reader.expected) == ([5, 6], 7)


def test_a_gap_is_data_loss_or_skipped_when_allowed(caplog):
    r = OffsetRange("s", 0, 0, 10)
    with pytest.raises(BasculeSparkError, match=r"offsets 2\.\.4 are gone \(the log skips over them\)"):
        fill(r, [0, 1, 5])
    with caplog.at_level(logging.WARNING, logger="bascule.spark"):
        reader = fill(r, [0, 1, 5], failOnDataLoss="false")
    assert offsets_of(reader) == [0, 1, 5] and "skipping them (failOnDataLoss is false)" in caplog.text


def test_messages_missing_at_the_start_of_a_range_from_earliest_are_no_loss():
    reader = fill(OffsetRange("s", 0, 0, 10, strict_start=False), [4, 5])
    assert (offsets_of(reader), reader.expected, reader.ended) == ([4, 5], 6, True)


def test_a_message_past_the_end_ends_the_range_without_reading_it():
    reader = fill(OffsetRange("s", 0, 0, 3), [0, 7])
    assert (offsets_of(reader), reader.expected, reader.ended) == ([0], 1, True)


def test_a_batch_holds_at_most_max_batch_rows_messages():
    reader = fill(OffsetRange("s", 0, 0, 100), list(range(100)), maxBatchRows="30")
    assert (len(reader.batch), reader.expected, reader.ended) == (30, 30, False)
    assert [m.offset for m in reader.take()] == list(range(30)) and reader.batch == []


def test_no_message_for_poll_timeout_ms_is_the_subscriptions_failure_after_what_came():
    reader = fill(OffsetRange("s", 0, 0, 10), [0, 1], then_wait=True, pollTimeoutMs="50")
    assert isinstance(reader.failure, TimeoutError)
    assert (offsets_of(reader), reader.expected, reader.ended) == ([0, 1], 2, False)


def test_a_compacted_streams_gaps_are_read_over_without_error_or_warning(caplog):
    with caplog.at_level(logging.INFO, logger="bascule.spark"):
        reader = fill(OffsetRange("s", 0, 0, 10, compacted=True), [2, 5, 6, 9])  # failOnDataLoss true
        after_start = fill(OffsetRange("s", 0, 3, 10, compacted=True), [3, 8, 12])
    assert (offsets_of(reader), reader.expected, reader.ended, reader.failure) == ([2, 5, 6, 9], 10, True, None)
    assert (offsets_of(after_start), after_start.expected, after_start.ended) == ([3, 8], 9, True)
    assert caplog.records == []
