"""Kafka's streaming source metrics, computed from a query's progress.

Spark's Kafka source reports how far each micro-batch ends behind the newest offsets
(`avgOffsetsBehindLatest`, `maxOffsetsBehindLatest`, `minOffsetsBehindLatest`) in
`progress.sources[].metrics`, through the JVM interface `ReportsSourceMetrics`. PySpark's Python data
sources cannot implement it (Spark 4.3: the JVM stream behind them reports no metrics, so
`metrics` stays `{}`), but they do report the latest offsets (`reportLatestOffset`), which Spark
puts in the same progress as `latestOffset`, beside the batch's `endOffset`: the metrics are
computed from those two, as Kafka's source computes them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def offsets_behind_latest(source_progress: Mapping[str, Any]) -> dict[str, str]:
    """Kafka's three metrics for one source of a StreamingQueryProgress (`query.lastProgress
    ["sources"][0]`, or a listener's `event.progress.sources[0]`): per partition, the latest offset
    minus the batch's end offset; {} when the progress has no offsets (no batch yet). Values are
    strings, as in Kafka's `metrics` map (the minimum and maximum integers, the average a float)."""
    latest, end = _offsets(source_progress.get("latestOffset")), _offsets(source_progress.get("endOffset"))
    if not latest or end is None:
        return {}
    behind = [
        offset - end.get(stream, {}).get(partition, 0)
        for stream, partitions in latest.items()
        for partition, offset in partitions.items()
    ]
    if not behind:
        return {}
    return {
        "minOffsetsBehindLatest": str(min(behind)),
        "maxOffsetsBehindLatest": str(max(behind)),
        "avgOffsetsBehindLatest": str(sum(behind) / len(behind)),
    }


def _offsets(value: Any) -> dict[str, dict[str, int]] | None:
    """Offsets as progress gives them: JSON text (PySpark's SourceProgress), a dict, or null."""
    if isinstance(value, str):
        value = json.loads(value)
    return value if isinstance(value, dict) else None
