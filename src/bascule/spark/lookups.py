"""What read planning asks the brokers: the selected partitions and their bounds, the oldest offset
still in a log, the first offset at a time. The decisions made with the answers are `planning`'s."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass, field

import grpc

from bascule.client import BasculeError, Client, Message, PartitionInfo
from bascule.spark import planning
from bascule.spark.options import EARLIEST, LATEST, OffsetSpec, ReadOptions, Selection
from bascule.spark.planning import (
    AtTimestamp,
    Bounds,
    OffsetRange,
    Offsets,
    Partition,
    Request,
)

log = logging.getLogger("bascule.spark")


@dataclass
class Partitions:
    """The selected partitions, each with its leader's view (HW, newest offset), and the named
    streams that do not exist."""

    infos: dict[str, dict[int, PartitionInfo]] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)

    def ids(self) -> dict[str, list[int]]:
        return {s: list(parts) for s, parts in self.infos.items()}

    def latest(self) -> Offsets:
        """Next offset after the last committed message of each partition."""
        return {s: {p: info.high_watermark + 1 for p, info in parts.items()} for s, parts in self.infos.items()}

    def newest(self) -> Offsets:
        """Next offset after the newest message of each partition, committed or not."""
        return {s: {p: info.newest_offset + 1 for p, info in parts.items()} for s, parts in self.infos.items()}


async def discover(client: Client, selection: Selection) -> Partitions:
    if selection.pattern is not None:
        metadata = await client.fetch_metadata()
        names = sorted(n for n, s in metadata.streams.items() if s.exists and selection.matches(n))
    else:
        names = list(selection.streams or selection.assign or ())
        metadata = await client.fetch_metadata(*names)
    result = Partitions()
    wanted: list[Partition] = []
    for name in names:
        info = metadata.streams.get(name)
        if info is None or not info.exists:
            result.missing.append(name)
            continue
        wanted += [(name, p) for p in planning.partitions_to_read(selection, name, sorted(info.partitions))]
    infos = await asyncio.gather(*(client.fetch_partition_metadata(s, p) for s, p in wanted))
    for (stream, partition), info in zip(wanted, infos):
        result.infos.setdefault(stream, {})[partition] = info
    return result


# A node that cannot say which streams are compacted: a server without bascule's admin API, or one
# whose authorization does not let this client call it.
_NO_COMPACTION_ANSWER = (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.PERMISSION_DENIED)


async def compacted(client: Client, streams: Collection[str]) -> frozenset[str]:
    """Which of `streams` are compacted by key, as bascule's admin API says (one call: for the one
    stream, or for all). A node that cannot say leaves every stream not compacted (their gaps are
    data loss), with a warning."""
    if not streams:
        return frozenset()
    try:
        statuses = await client.partitions(next(iter(streams)) if len(streams) == 1 else "", metadata_only=True)
    except BasculeError as exc:
        if exc.code not in _NO_COMPACTION_ANSWER:
            raise
        log.warning(
            "cannot tell which streams are compacted (%s): a gap compaction left in one will count as data loss",
            exc,
        )
        return frozenset()
    return planning.compacted_streams(statuses) & frozenset(streams)


# ---- offsets -------------------------------------------------------------------------------------


async def batch_ranges(client: Client, options: ReadOptions) -> list[OffsetRange]:
    """The ranges a batch read takes, from its starting to its ending offsets."""
    parts = await discover(client, options.selection)
    planning.check_streams_exist(parts.missing, options.brokers)
    if not parts.infos and options.selection.pattern is not None:
        log.warning("streamPattern %r matches no stream", options.selection.pattern)
    start, from_earliest = await resolve(
        client, options.starting, parts, default=EARLIEST, option="starting offsets",
        strict_timestamps=options.timestamp_strategy == "error",
    )
    end, _ = await resolve(client, options.ending, parts, default=LATEST, option="ending offsets")
    return planning.batch_ranges(start, end, from_earliest, await compacted(client, list(parts.infos)))


async def initial_offsets(client: Client, options: ReadOptions) -> Offsets:
    """Where a new streaming query starts."""
    parts = await discover(client, options.selection)
    planning.check_streams_exist(parts.missing, options.brokers)
    offsets, _ = await resolve(
        client, options.starting, parts, default=LATEST, option="starting offsets",
        strict_timestamps=options.timestamp_strategy == "error",
    )
    return offsets


async def bounds(client: Client, options: ReadOptions, begin: Offsets | None) -> Bounds:
    """The bounds of the selected partitions, for a micro-batch that starts at `begin` (None: not
    known yet); the earliest offsets of partitions new to it only when a read limit needs them."""
    parts = await discover(client, options.selection)
    for stream in planning.streams_not_created_yet(parts.missing, begin, options.fail_on_data_loss):
        log.warning("stream %r does not exist (yet); reading it once it does", stream)
    earliest: Offsets = {}
    if begin is not None and options.max_messages_per_trigger is not None:
        for s, infos in parts.infos.items():
            for p, info in infos.items():
                if p not in begin.get(s, {}):
                    earliest.setdefault(s, {})[p] = await earliest_offset(client, s, p, info)
    return Bounds(parts.latest(), parts.newest(), earliest)


async def resolve(
    client: Client,
    spec: OffsetSpec,
    partitions: Partitions,
    *,
    default: int,
    option: str,
    strict_timestamps: bool = False,
) -> tuple[Offsets, set[Partition]]:
    """`spec`'s concrete offsets for every selected partition, and those standing for "earliest"
    (see `planning.requests` and `planning.resolve`)."""
    requested = planning.requests(spec, partitions.ids(), default=default, option=option)
    answers = await asyncio.gather(
        *(_look_up(client, s, p, partitions.infos[s][p], request) for (s, p), request in requested.items())
    )
    found = {p: offset for p, offset in zip(requested, answers) if offset is not None}
    return planning.resolve(
        requested, partitions.latest(), found, option=option, strict_timestamps=strict_timestamps
    )


async def _look_up(client: Client, stream: str, partition: int, info: PartitionInfo, request: Request) -> int | None:
    """The brokers' answer a request needs: the oldest offset, or the first at a time; None for an
    offset, which needs none, and for a time no message reaches."""
    if isinstance(request, AtTimestamp):
        return await offset_for_timestamp(client, stream, partition, info, request.ms)
    if request == EARLIEST:
        return await earliest_offset(client, stream, partition, info)
    return None


async def first_message(messages: AsyncIterator[Message]) -> Message | None:
    try:
        return await messages.__anext__()
    except StopAsyncIteration:
        return None
    finally:
        await messages.aclose()  # type: ignore[attr-defined]  # an async generator


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
