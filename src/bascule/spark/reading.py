"""Reading one offset range of one partition, as Arrow record batches: a subscription through
bascule's client, resumed from the next offset on a fresh client after a leader change or a node
restart; offsets missing from the log are data loss (`failOnDataLoss`) or skipped, except the gaps
of a compacted stream, which are its nature."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Iterator

import grpc
import pyarrow as pa

from bascule.client import BasculeError, Client, Message
from bascule.spark.arrow import record_batch
from bascule.spark.connections import connect, iterate
from bascule.spark.errors import BasculeSparkError
from bascule.spark.options import ReadOptions
from bascule.spark.planning import OffsetRange
from bascule.spark.retry import READ_RETRY

log = logging.getLogger("bascule.spark")


def read(options: ReadOptions, r: OffsetRange, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """`read_range` on its own fresh event loop."""
    return iterate(lambda: read_range(options, r, schema))


async def read_range(options: ReadOptions, r: OffsetRange, schema: pa.Schema) -> AsyncGenerator[pa.RecordBatch, None]:
    """The committed messages r.start .. r.end-1 of one partition, as record batches of `schema`.

    Offsets the log skips are skipped quietly in a compacted stream, and at the start of a range
    that begins at "earliest"; elsewhere they are data loss. A log that ends before the range (or
    a partition gone) is data loss in any stream."""
    expected, failures = r.start, 0
    while expected < r.end:
        client = await connect(options.brokers, options.request_timeout, options.tls)
        messages = client.subscribe(
            r.stream, r.partition, offset=expected, stop_offset=r.end - 1, read_isr_replica=options.read_isr_replica
        )
        reader = _SubscriptionReader(options, r, expected, messages)
        try:
            while not reader.ended and reader.failure is None:
                await reader.fill()
                if reader.batch:
                    yield record_batch(reader.take(), r.stream, r.partition, schema)
            expected = reader.expected
            if isinstance(reader.failure, TimeoutError):
                await _timed_out(client, options, r, expected)
                return
            if isinstance(reader.failure, BasculeError):
                failures += 1
                expected = await _after_failure(options, r, expected, reader.failure, failures)
            elif expected < r.end:
                # The subscription reached its stop offset before the range's end: the messages in
                # between are not in the log any more.
                if r.loses(expected):
                    _loss(options, r, expected, r.end - 1, "the log no longer has them")
                expected = r.end
        finally:
            await messages.aclose()  # type: ignore[attr-defined]  # an async generator
            await client.close()


class _SubscriptionReader:
    """One subscription's part of a range: `fill` takes messages into `batch` until it is full, the
    subscription ends (`ended`) or fails (`failure`); `expected` is the next offset the range needs."""

    def __init__(self, options: ReadOptions, r: OffsetRange, expected: int, messages: AsyncIterator[Message]) -> None:
        self.options, self.r, self.expected, self.messages = options, r, expected, messages
        self.batch: list[Message] = []
        self.ended = False
        self.failure: TimeoutError | BasculeError | None = None

    def take(self) -> list[Message]:
        batch, self.batch = self.batch, []
        return batch

    async def fill(self) -> None:
        """A TimeoutError (no message came for pollTimeoutMs) or a BasculeError ends the
        subscription as its `failure`, once the messages before it are taken."""
        try:
            await self._fill()
        except (TimeoutError, BasculeError) as exc:
            self.failure = exc

    async def _fill(self) -> None:
        loop = asyncio.get_running_loop()
        timeout = self.options.poll_timeout_ms / 1000
        limit, r, batch, messages = self.options.max_batch_rows, self.r, self.batch, self.messages
        expected, end = self.expected, r.end
        try:
            async with asyncio.timeout(timeout) as deadline:
                # The deadline moves on as messages come, but at most once a second: reading the
                # clock costs, so it is looked at every 256 messages only.
                move_at = loop.time() + 1.0
                while len(batch) < limit:
                    try:
                        message = await messages.__anext__()
                    except StopAsyncIteration:
                        self.ended = True
                        return
                    offset = message.offset
                    if offset != expected:
                        if offset < expected:
                            continue
                        if offset >= end:
                            self.ended = True
                            return
                        if r.loses(expected):
                            _loss(self.options, r, expected, offset - 1, "the log skips over them")
                    batch.append(message)
                    expected = offset + 1
                    if expected >= end:
                        self.ended = True
                        return
                    if not len(batch) & 255:
                        now = loop.time()
                        if now > move_at:
                            deadline.reschedule(now + timeout)
                            move_at = now + 1.0
        finally:
            self.expected = expected


async def _after_failure(options: ReadOptions, r: OffsetRange, expected: int, exc: BasculeError, failures: int) -> int:
    """Where reading goes on after the subscription failed at `expected`: past the range when the
    partition is gone (data loss), at `expected` again after a pause (`READ_RETRY`); or an error."""
    if exc.code == grpc.StatusCode.NOT_FOUND:
        _loss(options, r, expected, r.end - 1, f"the partition is gone: {exc.message}")
        return r.end
    if not READ_RETRY.retries(exc.code, failures):
        raise BasculeSparkError(
            f"reading stream {r.stream!r} partition {r.partition} at offset {expected} failed: {exc}"
        ) from exc
    delay = READ_RETRY.delay(failures)
    log.info("reading %s/%s at %d: %s; resuming in %.1f s", r.stream, r.partition, expected, exc, delay)
    await asyncio.sleep(delay)
    return expected


def _loss(options: ReadOptions, r: OffsetRange, first_missing: int, last_missing: int, why: str) -> None:
    text = (
        f"data loss in stream {r.stream!r} partition {r.partition}: offsets {first_missing}..{last_missing} "
        f"are gone ({why}) but the query still needed them (range {r.start}..{r.end - 1})"
    )
    if options.fail_on_data_loss:
        raise BasculeSparkError(
            text + ". Retention or a deletion removed them before they were read. Set failOnDataLoss to "
            "false to skip ahead instead, or restart the query from a later offset."
        )
    log.warning("%s; skipping them (failOnDataLoss is false)", text)


async def _timed_out(client: Client, options: ReadOptions, r: OffsetRange, expected: int) -> None:
    """No message came for pollTimeoutMs: a log now shorter than when the range was planned
    (truncated after a leader change, or the stream deleted and created again) is data loss;
    anything else an error saying where reading stalled."""
    try:
        info = await client.fetch_partition_metadata(r.stream, r.partition)
    except BasculeError as exc:
        info, state = None, f"its metadata is unavailable: {exc}"
    else:
        state = f"its high watermark is now {info.high_watermark}, newest offset {info.newest_offset}"
    if info is not None and info.newest_offset + 1 < r.end:
        _loss(options, r, expected, r.end - 1, f"the log now ends before them; {state}")
        return
    raise BasculeSparkError(
        f"no message of stream {r.stream!r} partition {r.partition} arrived for {options.poll_timeout_ms} ms "
        f"while reading offset {expected} of the range {r.start}..{r.end - 1}; {state} (pollTimeoutMs)"
    )
