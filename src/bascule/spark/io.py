"""The network side of the Spark source and sink: bascule's async client, run on a fresh event loop.

Nothing here is kept between calls: every public function opens its own `Client` (and event loop),
so that no connection ever sits in an object Spark pickles.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc

from bascule.client import BasculeError, Client, Message, PartitionInfo
from bascule.spark.options import EARLIEST, LATEST, BasculeSparkError, OffsetSpec, ReadOptions, Selection
from bascule.spark.planning import OffsetRange, Offsets

log = logging.getLogger("bascule.spark")

T = TypeVar("T")

# Errors after which a call is tried again with a fresh client (new leader lookup): the leader
# moved, a node restarted, or nothing answered in time.
RETRIABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
}
ATTEMPTS = 5
PUBLISH_RETRIABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION}
PUBLISH_ATTEMPTS = 3


# ---- event loops ---------------------------------------------------------------------------------


def run(coroutine_function: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine on a fresh event loop (Spark's Python workers have none of their own).

    `asyncio.Runner` closes the loop as `asyncio.run` does: remaining tasks (gRPC's own among them)
    are cancelled and finished first, so no gRPC completion arrives for a closed loop."""
    with asyncio.Runner() as runner:
        return runner.run(coroutine_function())


def iterate(generator_function: Callable[[], AsyncIterator[T]]) -> Iterator[T]:
    """An async generator as a plain generator, driven on its own fresh event loop; closing the
    plain generator early closes the async one (and with it its connections)."""
    with asyncio.Runner() as runner:
        agen = generator_function()
        try:
            while True:
                try:
                    item = runner.run(_next(agen))
                except StopAsyncIteration:
                    return
                yield item
        finally:
            runner.run(agen.aclose())


async def _next(agen: AsyncIterator[T]) -> T:
    return await agen.__anext__()


async def connect(brokers: tuple[str, ...], timeout: float) -> Client:
    """A client on the first broker that answers a metadata request."""
    failures = []
    for address in brokers:
        client = Client(address, timeout=timeout)
        try:
            await client.fetch_metadata()
            return client
        except BasculeError as exc:
            failures.append(f"{address}: {exc}")
            await client.close()
    raise BasculeSparkError(f"no broker answered ({'; '.join(failures)})")


async def with_client(
    brokers: tuple[str, ...], timeout: float, call: Callable[[Client], Awaitable[T]], what: str
) -> T:
    """`call(client)` with retries, each on a fresh client, after errors a leader change explains."""
    delay = 0.2
    for attempt in range(ATTEMPTS):
        client = await connect(brokers, timeout)
        try:
            return await call(client)
        except BasculeError as exc:
            if exc.code not in RETRIABLE or attempt == ATTEMPTS - 1:
                raise BasculeSparkError(f"{what} failed: {exc}") from exc
            log.info("%s: %s; trying again in %.1f s", what, exc, delay)
        finally:
            await client.close()
        await asyncio.sleep(delay)
        delay *= 2
    raise AssertionError("unreachable")


# ---- partitions and their bounds -----------------------------------------------------------------


@dataclass
class Partitions:
    """The selected partitions, each with its leader's view (HW, newest offset), and the named
    streams that do not exist."""

    infos: dict[str, dict[int, PartitionInfo]] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)

    def latest(self) -> Offsets:
        """Next offset after the last committed message of each partition."""
        return {s: {p: info.high_watermark + 1 for p, info in parts.items()} for s, parts in self.infos.items()}

    def describe(self, stream: str) -> str:
        ids = sorted(self.infos.get(stream, {}))
        return f"partitions {ids[0]}..{ids[-1]}" if ids else "no partitions"


async def discover(client: Client, selection: Selection) -> Partitions:
    if selection.pattern is not None:
        metadata = await client.fetch_metadata()
        names = sorted(n for n, s in metadata.streams.items() if s.exists and selection.matches(n))
    else:
        names = list(selection.streams or selection.assign or ())
        metadata = await client.fetch_metadata(*names)
    result = Partitions()
    wanted: list[tuple[str, int]] = []
    for name in names:
        info = metadata.streams.get(name)
        if info is None or not info.exists:
            result.missing.append(name)
            continue
        ids = sorted(info.partitions)
        if selection.assign is not None:
            absent = sorted(set(selection.assign[name]) - set(ids))
            if absent:
                raise BasculeSparkError(
                    f"assign names partitions {absent} of stream {name!r}, which has partitions {ids}"
                )
            ids = list(selection.assign[name])
        wanted += [(name, p) for p in ids]
    infos = await asyncio.gather(*(client.fetch_partition_metadata(s, p) for s, p in wanted))
    for (stream, partition), info in zip(wanted, infos):
        result.infos.setdefault(stream, {})[partition] = info
    return result


async def first_message(messages: AsyncIterator[Message]) -> Message | None:
    try:
        return await messages.__anext__()
    except StopAsyncIteration:
        return None
    finally:
        await messages.aclose()


async def earliest_offset(client: Client, stream: str, partition: int, info: PartitionInfo) -> int:
    """The oldest committed offset still in the log; HW+1 when there is none."""
    if info.high_watermark < 0:
        return 0
    first = await first_message(client.subscribe(stream, partition, start="earliest", stop_latest=True))
    return first.offset if first is not None else info.high_watermark + 1


async def offset_for_timestamp(client: Client, stream: str, partition: int, info: PartitionInfo, ms: int) -> int | None:
    """The first committed offset whose timestamp is >= `ms` (milliseconds); None when no
    committed message is that recent."""
    hw = info.high_watermark
    if hw < 0:
        return None
    ns = ms * 1_000_000
    last = await first_message(client.subscribe(stream, partition, offset=hw, stop_offset=hw))
    if last is None or last.timestamp < ns:
        return None
    found = await first_message(client.subscribe(stream, partition, timestamp=ns, stop_offset=hw))
    return found.offset if found is not None else hw + 1


async def resolve(
    client: Client,
    spec: OffsetSpec,
    partitions: Partitions,
    *,
    default: str,
    option: str,
    timestamp_strategy: str = "error",
    ending: bool = False,
) -> tuple[Offsets, set[tuple[str, int]]]:
    """Concrete offsets for every selected partition, and the partitions whose offset stands for
    "earliest" (their range may find its first messages removed without that being data loss).
    Partitions a JSON spec leaves out get `default` ("earliest" or "latest")."""
    for stream, parts in spec.offsets.items():
        if stream in partitions.missing or stream not in partitions.infos:
            raise BasculeSparkError(f"{option} names stream {stream!r}, which does not exist")
        unknown = sorted(set(parts) - set(partitions.infos[stream]))
        if unknown:
            raise BasculeSparkError(
                f"{option} names partitions {unknown} of stream {stream!r}, which has {partitions.describe(stream)}"
            )

    async def one(stream: str, partition: int, info: PartitionInfo) -> tuple[int, bool]:
        latest = info.high_watermark + 1
        if spec.kind in ("timestamp", "timestamps"):
            ms = spec.timestamp_ms if spec.kind == "timestamp" else spec.offsets.get(stream, {}).get(partition)
            if ms is None:
                value = EARLIEST if default == "earliest" else LATEST
            else:
                found = await offset_for_timestamp(client, stream, partition, info, ms)
                if found is not None:
                    return found, False
                if not ending and timestamp_strategy == "error":
                    raise BasculeSparkError(
                        f"{option}: no message of {stream}/{partition} has a timestamp at or after {ms} ms "
                        f"(set startingOffsetsByTimestampStrategy to 'latest' to start at the end instead)"
                    )
                return latest, False
        elif spec.kind == "earliest":
            value = EARLIEST
        elif spec.kind == "latest":
            value = LATEST
        else:
            value = spec.offsets.get(stream, {}).get(partition, EARLIEST if default == "earliest" else LATEST)
        if value == LATEST:
            return latest, False
        if value == EARLIEST:
            return await earliest_offset(client, stream, partition, info), True
        if value > latest:
            raise BasculeSparkError(
                f"{option}: offset {value} of {stream}/{partition} is beyond its last committed message "
                f"(the next offset there is {latest})"
            )
        return value, False

    pairs = [(s, p, info) for s, parts in partitions.infos.items() for p, info in parts.items()]
    results = await asyncio.gather(*(one(s, p, info) for s, p, info in pairs))
    offsets: Offsets = {}
    from_earliest: set[tuple[str, int]] = set()
    for (stream, partition, _), (offset, earliest) in zip(pairs, results):
        offsets.setdefault(stream, {})[partition] = offset
        if earliest:
            from_earliest.add((stream, partition))
    return offsets, from_earliest


# ---- reading -------------------------------------------------------------------------------------


def _record_batch(messages: list[Message], stream: str, partition: int, schema: Any) -> Any:
    """Messages of one partition as one Arrow record batch of `schema` (bascule's columns, or a subset)."""
    import pyarrow as pa

    n = len(messages)
    names = schema.names
    columns: dict[str, Any] = {}
    if "stream" in names:
        columns["stream"] = pa.array([stream] * n, pa.string())
    if "partition" in names:
        columns["partition"] = pa.array([partition] * n, pa.int32())
    if "offset" in names:
        columns["offset"] = pa.array([m.offset for m in messages], pa.int64())
    if "key" in names:
        columns["key"] = pa.array([m.key for m in messages], pa.binary())
    if "value" in names:
        columns["value"] = pa.array([m.value for m in messages], pa.binary())
    if "timestamp" in names:
        # Spark timestamps are microseconds: bascule's nanoseconds truncated.
        columns["timestamp"] = pa.array([m.timestamp for m in messages], pa.timestamp("ns", tz="UTC")).cast(
            pa.timestamp("us", tz="UTC"), safe=False
        )
    if "subject" in names:
        columns["subject"] = pa.array([m.subject for m in messages], pa.string())
    if "headers" in names:
        # The client shares one headers dict among messages with identical headers: convert each once.
        pairs: dict[int, list] = {}
        rows = []
        for m in messages:
            headers = m.headers
            converted = pairs.get(id(headers))
            if converted is None:
                converted = pairs[id(headers)] = list(headers.items())
            rows.append(converted)
        columns["headers"] = pa.array(rows, schema.field("headers").type)
    return pa.RecordBatch.from_arrays([columns[name] for name in names], schema=schema)


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


class _RangeReader:
    """One subscription's worth of a range: fills `batch` until it is full or the subscription ends."""

    def __init__(self, options: ReadOptions, r: OffsetRange, expected: int, messages: AsyncIterator[Message]) -> None:
        self.options, self.r, self.expected, self.messages = options, r, expected, messages
        self.batch: list[Message] = []
        self.ended = False

    async def fill(self) -> None:
        """Until the batch is full or the subscription is over (`ended`). Raises TimeoutError when no
        message came for pollTimeoutMs; the deadline moves on (at most once a second) as messages come."""
        loop = asyncio.get_running_loop()
        timeout = self.options.poll_timeout_ms / 1000
        limit, r, batch, messages = self.options.max_batch_rows, self.r, self.batch, self.messages
        expected, end = self.expected, r.end
        try:
            async with asyncio.timeout(timeout) as deadline:
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
                        if r.strict_start or expected > r.start:
                            _loss(self.options, r, expected, offset - 1, "the log skips over them")
                    batch.append(message)
                    expected = offset + 1
                    if expected >= end:
                        self.ended = True
                        return
                    if not len(batch) & 255:  # the clock looked at every 256 messages only
                        now = loop.time()
                        if now > move_at:
                            deadline.reschedule(now + timeout)
                            move_at = now + 1.0
        finally:
            self.expected = expected


async def read_range(options: ReadOptions, r: OffsetRange, schema: Any) -> AsyncIterator[Any]:
    """The committed messages r.start .. r.end-1 of one partition, as Arrow record batches.

    Messages missing at the start of a range that begins at "earliest" are skipped quietly; any
    other missing offset is data loss (`failOnDataLoss`). A leader change or a node restart
    resumes the subscription, from the next offset, on a fresh client."""
    expected = r.start
    delay, attempt = 0.2, 0
    while expected < r.end:
        client = await connect(options.brokers, options.request_timeout)
        messages = client.subscribe(
            r.stream, r.partition, offset=expected, stop_offset=r.end - 1,
            read_isr_replica=options.read_isr_replica,
        )
        reader = _RangeReader(options, r, expected, messages)
        try:
            while not reader.ended:
                try:
                    await reader.fill()
                except TimeoutError:
                    expected = reader.expected
                    if reader.batch:
                        yield _record_batch(reader.batch, r.stream, r.partition, schema)
                        reader.batch = []
                    await _timed_out(client, options, r, expected)
                    return
                if reader.batch:
                    batch, reader.batch = reader.batch, []
                    yield _record_batch(batch, r.stream, r.partition, schema)
            expected = reader.expected
            if expected < r.end:
                # The subscription ended (its stop offset reached) before the range's end: the
                # messages in between are not in the log any more.
                if r.strict_start or expected > r.start:
                    _loss(options, r, expected, r.end - 1, "the log no longer has them")
                expected = r.end
        except BasculeError as exc:
            expected = reader.expected
            if reader.batch:
                batch, reader.batch = reader.batch, []
                yield _record_batch(batch, r.stream, r.partition, schema)
            if exc.code == grpc.StatusCode.NOT_FOUND:
                _loss(options, r, expected, r.end - 1, f"the partition is gone: {exc.message}")
                expected = r.end
            elif exc.code in RETRIABLE and attempt < ATTEMPTS - 1:
                attempt += 1
                log.info("reading %s/%s at %d: %s; resuming in %.1f s", r.stream, r.partition, expected, exc, delay)
                await asyncio.sleep(delay)
                delay *= 2
            else:
                raise BasculeSparkError(
                    f"reading stream {r.stream!r} partition {r.partition} at offset {expected} failed: {exc}"
                ) from exc
        finally:
            await messages.aclose()
            await client.close()


async def _timed_out(client: Client, options: ReadOptions, r: OffsetRange, expected: int) -> None:
    try:
        info = await client.fetch_partition_metadata(r.stream, r.partition)
    except BasculeError as exc:
        info, state = None, f"its metadata is unavailable: {exc}"
    else:
        state = f"its high watermark is now {info.high_watermark}, newest offset {info.newest_offset}"
    if info is not None and info.newest_offset + 1 < r.end:
        # The log is shorter than when the range was planned (truncated after a leader change,
        # or the stream was deleted and created again).
        _loss(options, r, expected, r.end - 1, f"the log now ends before them; {state}")
        return
    raise BasculeSparkError(
        f"no message of stream {r.stream!r} partition {r.partition} arrived for {options.poll_timeout_ms} ms "
        f"while reading offset {expected} of the range {r.start}..{r.end - 1}; {state} (pollTimeoutMs)"
    )


# ---- writing -------------------------------------------------------------------------------------


def key_partition(key: bytes | None, count: int) -> int:
    """Liftbridge's PartitionByKey: CRC-32 (IEEE) of the key, modulo the partition count; no key
    hashes as the empty key."""
    return zlib.crc32(key or b"") % count if count > 0 else 0


@dataclass
class PublishedRange:
    count: int = 0
    first_offset: int = -1
    last_offset: int = -1


class Publisher:
    """Publishes rows, in order per partition, through PublishAsync in pipelined batches."""

    def __init__(self, client: Client, ack_policy: str, batch_size: int, partitioner: str) -> None:
        self.client = client
        self.ack_policy = ack_policy
        self.batch_size = batch_size
        self.partitioner = partitioner
        self.partition_counts: dict[str, int] = {}
        self.published: dict[tuple[str, int], PublishedRange] = {}
        self._next_round_robin = 0

    async def partition_count(self, stream: str) -> int:
        if stream not in self.partition_counts:
            metadata = await self.client.fetch_metadata(stream)
            info = metadata.streams.get(stream)
            if info is None or not info.exists:
                raise BasculeSparkError(f"cannot write to stream {stream!r}: it does not exist")
            self.partition_counts[stream] = len(info.partitions)
        return self.partition_counts[stream]

    async def publish_rows(
        self,
        streams: list[str],
        partitions: list[int | None],
        keys: list[bytes | None],
        values: list[bytes],
        headers: list[Mapping[str, bytes] | None],
    ) -> None:
        groups: dict[tuple[str, int], list[int]] = {}
        for index, stream in enumerate(streams):
            count = await self.partition_count(stream)
            partition = partitions[index]
            if partition is None:
                if self.partitioner == "roundrobin":
                    partition = self._next_round_robin % count
                    self._next_round_robin += 1
                else:
                    partition = key_partition(keys[index], count)
            elif not 0 <= partition < count:
                raise BasculeSparkError(
                    f"cannot write to partition {partition} of stream {stream!r}: it has partitions 0..{count - 1}"
                )
            groups.setdefault((stream, partition), []).append(index)
        await asyncio.gather(
            *(self._publish_group(stream, partition, rows, keys, values, headers)
              for (stream, partition), rows in groups.items())
        )

    async def _publish_group(self, stream, partition, rows, keys, values, headers) -> None:
        done = self.published.setdefault((stream, partition), PublishedRange())
        for begin in range(0, len(rows), self.batch_size):
            chunk = rows[begin : begin + self.batch_size]
            delay = 0.2
            for attempt in range(PUBLISH_ATTEMPTS):
                try:
                    acks = await self.client.publish_many(
                        stream,
                        [values[i] for i in chunk],
                        keys=[keys[i] for i in chunk],
                        headers=[headers[i] for i in chunk],
                        partition=partition,
                        ack_policy=self.ack_policy,
                    )
                    break
                except BasculeError as exc:
                    # A leader that moved or a broker that restarted: the batch again (at least once).
                    # A refused message (an async error, code UNKNOWN) is final.
                    if exc.code in PUBLISH_RETRIABLE and attempt < PUBLISH_ATTEMPTS - 1:
                        log.info("publishing to %s/%s: %s; again in %.1f s", stream, partition, exc, delay)
                        await asyncio.sleep(delay)
                        delay *= 2
                        continue
                    raise BasculeSparkError(
                        f"publishing to stream {stream!r} partition {partition} failed: {exc} (this task had "
                        f"{done.count} messages acknowledged there before the failing batch of {len(chunk)})"
                    ) from exc
            if acks:
                if done.first_offset < 0:
                    done.first_offset = acks[0].offset
                done.last_offset = acks[-1].offset
            done.count += len(chunk)
