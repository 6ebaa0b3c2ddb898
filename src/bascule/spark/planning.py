"""What a read takes, as pure rules: offsets in and decisions out (or a `BasculeSparkError` saying
why there is none). The brokers' answers come in as values; asking them is `lookups`' part.

Offsets are "next offset to read" per partition, as in Spark's Kafka source: a range [start, end)
holds the messages start .. end-1. In Spark's checkpoint they are JSON: {"stream": {"0": 12}}.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from bascule.spark.errors import BasculeSparkError
from bascule.spark.options import EARLIEST, LATEST, OffsetSpec, Selection

Offsets = dict[str, dict[int, int]]  # stream -> partition -> next offset
Partition = tuple[str, int]  # (stream, partition id)


# ---- the checkpoint form -------------------------------------------------------------------------


def offsets_to_json(offsets: Mapping[str, Mapping[int, int]]) -> dict[str, dict[str, int]]:
    """The checkpoint form: streams and partitions in a fixed order, so that equal offsets give
    equal JSON (Spark compares offsets as JSON text to tell whether there is new data)."""
    return {
        stream: {str(p): int(offsets[stream][p]) for p in sorted(offsets[stream])}
        for stream in sorted(offsets)
    }


def offsets_from_json(value: Mapping[str, Mapping[str, int]] | None) -> Offsets:
    if not value:
        return {}
    try:
        return {str(s): {int(p): int(o) for p, o in parts.items()} for s, parts in value.items()}
    except (AttributeError, TypeError, ValueError) as exc:
        raise BasculeSparkError(f"checkpointed offsets {value!r} are not bascule offsets: {exc}") from None


# ---- ranges --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OffsetRange:
    """Messages start .. end-1 of one partition. `strict_start` False: data missing at the
    start is expected (the range begins at "earliest") and is no data loss. `compacted`: the
    stream is compacted by key, so offsets missing inside its log are expected too."""

    stream: str
    partition: int
    start: int
    end: int
    strict_start: bool = True
    compacted: bool = False

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)

    def loses(self, first_missing: int) -> bool:
        """Whether offsets the log skips from `first_missing` on are data loss: not in a compacted
        stream (compaction leaves gaps by design), nor at the start of a range that begins at
        "earliest" (retention may have moved the oldest offset since planning). A log that ends
        before the range is another matter: loss whatever the range (the reader's to tell)."""
        return not self.compacted and (self.strict_start or first_missing > self.start)


def compacted_streams(statuses: Iterable[Mapping[str, object]]) -> frozenset[str]:
    """The streams that the admin API's partition statuses (as the client's dicts) say are
    compacted. A status without the field (from a node older than it) says not, so that stream's
    gaps stay data loss."""
    return frozenset(
        name for s in statuses if s.get("compacted") is True and isinstance(name := s.get("stream"), str)
    )


def split_ranges(
    ranges: Iterable[OffsetRange], min_partitions: int | None = None, max_records: int | None = None
) -> list[OffsetRange]:
    """Empty ranges dropped; then, as Spark's Kafka source does, ranges split so that there are
    at least `min_partitions` (each range in parts proportional to its size) and none holds more
    than `max_records` messages. Only a range's first part keeps its `strict_start` False."""
    ranges = [r for r in ranges if r.size > 0]
    total = sum(r.size for r in ranges)
    out: list[OffsetRange] = []
    for r in ranges:
        parts = 1
        if min_partitions and len(ranges) < min_partitions and total > 0:
            parts = max(parts, round(r.size / total * min_partitions))
        if max_records:
            parts = max(parts, math.ceil(r.size / max_records))
        parts = max(1, min(parts, r.size))
        for i in range(parts):
            start = r.start + r.size * i // parts
            end = r.start + r.size * (i + 1) // parts
            out.append(replace(r, start=start, end=end, strict_start=r.strict_start or i > 0))
    return out


# ---- what is selected ----------------------------------------------------------------------------


def check_streams_exist(missing: Sequence[str], brokers: Sequence[str]) -> None:
    if not missing:
        return
    names = ", ".join(repr(m) for m in missing)
    where = f"(brokers {','.join(brokers)})"
    raise BasculeSparkError(
        f"stream {names} does not exist {where}" if len(missing) == 1 else f"streams {names} do not exist {where}"
    )


def partitions_to_read(selection: Selection, stream: str, ids: Sequence[int]) -> list[int]:
    """The partitions of `stream` (which has `ids`) that `selection` reads: all of them, or those
    `assign` names, which must exist."""
    if selection.assign is None:
        return list(ids)
    absent = sorted(set(selection.assign[stream]) - set(ids))
    if absent:
        raise BasculeSparkError(
            f"assign names partitions {absent} of stream {stream!r}, which has partitions {sorted(ids)}"
        )
    return list(selection.assign[stream])


# ---- start and end offsets -----------------------------------------------------------------------


@dataclass(frozen=True)
class AtTimestamp:
    """The first committed message whose timestamp is at or after `ms` (milliseconds)."""

    ms: int


Request = int | AtTimestamp  # an offset >= 0, EARLIEST, LATEST, or a time


def requests(
    spec: OffsetSpec, partitions: Mapping[str, Sequence[int]], *, default: int, option: str
) -> dict[Partition, Request]:
    """What `spec` (named `option` in errors) asks of each selected partition (`partitions`: stream
    -> its partition ids). Partitions a per-partition spec leaves out get `default`: EARLIEST or LATEST."""
    _check_named(spec, partitions, option)
    return {(s, p): _request(spec, s, p, default) for s, ids in partitions.items() for p in ids}


def _check_named(spec: OffsetSpec, partitions: Mapping[str, Sequence[int]], option: str) -> None:
    for stream, named in spec.offsets.items():
        if stream not in partitions:
            raise BasculeSparkError(f"{option} names stream {stream!r}, which does not exist")
        unknown = sorted(set(named) - set(partitions[stream]))
        if unknown:
            ids = sorted(partitions[stream])
            has = f"partitions {ids[0]}..{ids[-1]}" if ids else "no partitions"
            raise BasculeSparkError(f"{option} names partitions {unknown} of stream {stream!r}, which has {has}")


def _request(spec: OffsetSpec, stream: str, partition: int, default: int) -> Request:
    if spec.kind in ("timestamp", "timestamps"):
        ms = spec.timestamp_ms if spec.kind == "timestamp" else spec.offsets.get(stream, {}).get(partition)
        return default if ms is None else AtTimestamp(ms)
    if spec.kind == "earliest":
        return EARLIEST
    if spec.kind == "latest":
        return LATEST
    return spec.offsets.get(stream, {}).get(partition, default)


def resolve(
    requested: Mapping[Partition, Request],
    latest: Offsets,
    found: Mapping[Partition, int],
    *,
    option: str,
    strict_timestamps: bool,
) -> tuple[Offsets, set[Partition]]:
    """Concrete offsets for the `requested` ones, given each partition's `latest` offset (HW+1) and
    what the brokers `found` for its EARLIEST (the oldest offset) or AtTimestamp request (absent: no
    message that recent); and the partitions whose offset stands for "earliest" (their range may
    find its first messages removed without that being data loss). `strict_timestamps`: a time no
    message reaches is an error, not the latest offset."""

    def offset(stream: str, partition: int, request: Request) -> int:
        end = latest[stream][partition]
        if isinstance(request, AtTimestamp):
            if (stream, partition) in found:
                return found[stream, partition]
            if strict_timestamps:
                raise BasculeSparkError(
                    f"{option}: no message of {stream}/{partition} has a timestamp at or after {request.ms} ms "
                    f"(set startingOffsetsByTimestampStrategy to 'latest' to start at the end instead)"
                )
            return end
        if request == EARLIEST:
            return found[stream, partition]
        if request == LATEST:
            return end
        if request > end:
            raise BasculeSparkError(
                f"{option}: offset {request} of {stream}/{partition} is beyond its last committed message "
                f"(the next offset there is {end})"
            )
        return request

    offsets: Offsets = {}
    for (stream, partition), request in requested.items():
        offsets.setdefault(stream, {})[partition] = offset(stream, partition, request)
    return offsets, {p for p, request in requested.items() if request == EARLIEST}


def batch_ranges(
    start: Offsets, end: Offsets, from_earliest: set[Partition], compacted: Set[str] = frozenset()
) -> list[OffsetRange]:
    """The ranges of a batch read, by stream and partition; those of the `compacted` streams say so."""
    ranges = []
    for stream in sorted(end):
        for partition in sorted(end[stream]):
            b, e = start[stream][partition], end[stream][partition]
            if b > e:
                raise BasculeSparkError(
                    f"the starting offset {b} of {stream}/{partition} is after its ending offset {e}"
                )
            strict = (stream, partition) not in from_earliest
            ranges.append(OffsetRange(stream, partition, b, e, strict, stream in compacted))
    return ranges


# ---- streaming micro-batches ---------------------------------------------------------------------


@dataclass(frozen=True)
class Bounds:
    """What the brokers report of the selected partitions: `latest`, the next offset after each
    one's HW; `newest`, the next after its newest message, committed or not; `earliest`, the oldest
    offset still in the log of partitions new to the query, when a read limit needs it."""

    latest: Offsets
    newest: Offsets
    earliest: Offsets = field(default_factory=dict)


class Rewind(NamedTuple):
    """A partition whose log now ends before what the query read (failOnDataLoss false): it is read
    again from its start."""

    stream: str
    partition: int
    read_up_to: int
    ends_at: int


def streams_not_created_yet(missing: Sequence[str], begin: Offsets | None, fail_on_data_loss: bool) -> list[str]:
    """Of the named streams that do not exist, those the query has not read (yet to be created).
    One the query was reading was deleted: data loss, or with failOnDataLoss false it drops out."""
    if fail_on_data_loss and begin is not None:
        for stream in missing:
            if stream in begin:
                raise BasculeSparkError(
                    f"data loss: stream {stream!r} was deleted while the query still reads it "
                    f"(last offsets {offsets_to_json({stream: begin[stream]})[stream]}). Set failOnDataLoss "
                    "to false to go on without it."
                )
    return [stream for stream in missing if begin is None or stream not in begin]


def next_end(
    begin: Offsets | None, bounds: Bounds, *, max_rows: int | None, target: Offsets | None, fail_on_data_loss: bool
) -> tuple[Offsets, list[Rewind]]:
    """Where the micro-batch starting at `begin` (None: not known yet) ends: the latest offsets,
    checked against `begin` (`check_progress`), limited to about `max_rows` messages, and capped at
    `target` under Trigger.AvailableNow. A stream that is gone drops out of the offsets."""
    if begin is None:
        return (bounds.latest if target is None else cap(bounds.latest, target, {})), []
    end, rewinds = check_progress(begin, bounds.latest, bounds.newest, fail_on_data_loss)
    if max_rows is not None:
        end = rate_limit(_with_new_partitions(begin, bounds.earliest), end, max_rows)
    if target is not None:
        end = cap(end, target, begin)
    return end, rewinds


def waits_for_more(
    begin: Offsets, latest: Offsets, min_rows: int, *, since_last_batch_ms: float | None, max_delay_ms: int
) -> bool:
    """Kafka's minOffsetsPerTrigger: whether to skip this trigger (end the micro-batch where it
    begins) because fewer than `min_rows` new messages are there, until `max_delay_ms`
    (maxTriggerDelay) has passed since the last batch (None: no batch yet, so never skipped).
    A partition missing from `begin` counts from offset 0, as in Kafka's source."""
    if since_last_batch_ms is None or since_last_batch_ms >= max_delay_ms:
        return False
    new = sum(e - begin.get(s, {}).get(p, 0) for s, parts in latest.items() for p, e in parts.items())
    return new < min_rows


def _with_new_partitions(begin: Offsets, earliest: Offsets) -> Offsets:
    """`begin`, and for partitions it lacks, their earliest offset: where a rate limit counts from."""
    merged = {s: dict(parts) for s, parts in begin.items()}
    for s, parts in earliest.items():
        for p, offset in parts.items():
            merged.setdefault(s, {}).setdefault(p, offset)
    return merged


def check_progress(
    begin: Offsets, latest: Offsets, newest: Offsets, fail_on_data_loss: bool
) -> tuple[Offsets, list[Rewind]]:
    """`latest` checked against the checkpointed `begin`. A partition whose end is below its start:
    a lagging HW on a new leader (its log, `newest`, still reaches the start: wait there), or a log
    that lost messages (data loss, or with failOnDataLoss false a `Rewind`)."""
    if fail_on_data_loss:
        _check_no_partition_vanished(begin, latest)
    checked: Offsets = {}
    rewinds = []
    for s, parts in latest.items():
        for p, e in parts.items():
            b = begin.get(s, {}).get(p, e)
            log_end = newest.get(s, {}).get(p, e)
            if e < b <= log_end:
                e = b
            elif e < b:
                if fail_on_data_loss:
                    raise BasculeSparkError(
                        f"data loss: stream {s!r} partition {p} now ends at offset {log_end - 1}, but the query "
                        f"already read up to offset {b - 1} (the stream was deleted and created again, or "
                        "its log was truncated). Set failOnDataLoss to false to read it again from its start."
                    )
                rewinds.append(Rewind(s, p, b, e))
            checked.setdefault(s, {})[p] = e
    return checked, rewinds


def _check_no_partition_vanished(begin: Offsets, latest: Offsets) -> None:
    for s, parts in begin.items():
        vanished = sorted(set(parts) - set(latest.get(s, parts)))
        if vanished:
            raise BasculeSparkError(
                f"data loss: partitions {vanished} of stream {s!r} no longer exist (the stream was deleted and "
                "created again with fewer partitions). Set failOnDataLoss to false to go on without them."
            )


def rate_limit(start: Offsets, end: Offsets, limit: int) -> Offsets:
    """End offsets moved back so that about `limit` messages are read in all, shared among the
    partitions in proportion to what each has to read (Spark's Kafka source rule: a partition with
    anything to read gets at least one message)."""
    sizes = {
        (s, p): e - start[s][p]
        for s, parts in end.items()
        for p, e in parts.items()
        if s in start and p in start[s] and e - start[s][p] > 0
    }
    total = sum(sizes.values())
    if total <= limit:
        return {s: dict(parts) for s, parts in end.items()}
    limited: Offsets = {}
    for s, parts in end.items():
        limited[s] = {}
        for p, e in parts.items():
            size = sizes.get((s, p))
            if size is None:
                limited[s][p] = e
                continue
            prorate = limit * (size / total)
            step = math.ceil(prorate) if prorate < 1 else math.floor(prorate)
            limited[s][p] = min(e, start[s][p] + step)
    return limited


def cap(end: Offsets, target: Offsets, start: Offsets) -> Offsets:
    """For Trigger.AvailableNow: no partition beyond the target taken when the query began;
    partitions that appeared since are left for a later run."""
    capped: Offsets = {}
    for s, parts in end.items():
        for p, e in parts.items():
            if s in target and p in target[s]:
                capped.setdefault(s, {})[p] = min(e, max(target[s][p], start.get(s, {}).get(p, target[s][p])))
            elif s in start and p in start[s]:
                capped.setdefault(s, {})[p] = start[s][p]
    return capped


def plan_ranges(start: Offsets, end: Offsets, compacted: Set[str] = frozenset()) -> list[OffsetRange]:
    """The ranges of one micro-batch; those of the `compacted` streams say so. A partition absent
    from `start` is new: read from its beginning (offset 0, no data loss if its oldest messages are
    gone). One whose end is below its start was reset (deleted and created again); `check_progress`
    has decided it may be read from 0."""
    ranges = []
    for s in sorted(end):
        for p in sorted(end[s]):
            e = end[s][p]
            b = start.get(s, {}).get(p)
            if b is None or e < b:
                ranges.append(OffsetRange(s, p, 0, e, strict_start=False, compacted=s in compacted))
            elif e > b:
                ranges.append(OffsetRange(s, p, b, e, compacted=s in compacted))
    return ranges
