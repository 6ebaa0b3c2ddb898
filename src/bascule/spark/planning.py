"""Offset arithmetic of the Spark source, as pure functions.

Offsets are "next offset to read" per partition, as in Spark's Kafka source: a range [start, end)
holds the messages start .. end-1. In Spark's checkpoint they are JSON: {"stream": {"0": 12}}.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from bascule.spark.options import BasculeSparkError

Offsets = dict[str, dict[int, int]]  # stream -> partition -> next offset


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


@dataclass(frozen=True)
class OffsetRange:
    """Messages start .. end-1 of one partition. `strict_start` False: data missing at the
    start is expected (the range begins at "earliest") and is no data loss."""

    stream: str
    partition: int
    start: int
    end: int
    strict_start: bool = True

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


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
            out.append(OffsetRange(r.stream, r.partition, start, end, r.strict_start or i > 0))
    return out


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


def plan_ranges(start: Offsets, end: Offsets) -> list[OffsetRange]:
    """The ranges of one micro-batch. A partition absent from `start` is new: read from its
    beginning (offset 0, no data loss if its oldest messages are gone). One whose end is below its
    start was reset (deleted and created again); the caller has decided it may be read from 0."""
    ranges = []
    for s in sorted(end):
        for p in sorted(end[s]):
            e = end[s][p]
            b = start.get(s, {}).get(p)
            if b is None or e < b:
                ranges.append(OffsetRange(s, p, 0, e, strict_start=False))
            elif e > b:
                ranges.append(OffsetRange(s, p, b, e))
    return ranges
