"""A run's report: medians per metric and system, the bascule / JetStream ratio, and the table (plain
text or Markdown) they make."""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from benchmarks.harness import BASCULE, JETSTREAM, NATS

if TYPE_CHECKING:
    from benchmarks.scenarios import Scenario

# name -> (unit, higher is better)
METRICS: dict[str, tuple[str, bool]] = {
    "rate": ("msg/s", True),
    "capture_rate": ("msg/s", True),
    "acked_rate": ("msg/s", True),
    "grpc_rate": ("msg/s", True),
    "nats_rate": ("msg/s", True),
    "node_grpc_rate": ("msg/s", True),
    "publish_rate": ("msg/s", True),
    "p50_ms": ("ms", False),
    "p99_ms": ("ms", False),
    "max_ms": ("ms", False),
    "grpc_p50_ms": ("ms", False),
    "grpc_p99_ms": ("ms", False),
    "nats_p50_ms": ("ms", False),
    "nats_p99_ms": ("ms", False),
    "node_grpc_p50_ms": ("ms", False),
    "node_grpc_p99_ms": ("ms", False),
    "acked_p50_ms": ("ms", False),
    "acked_p99_ms": ("ms", False),
    "server_cpu_us_per_msg": ("CPU us/msg", False),
    "capture_cpu_us_per_msg": ("CPU us/msg", False),
    "acked_cpu_us_per_msg": ("CPU us/msg", False),
    "grpc_cpu_us_per_msg": ("CPU us/msg", False),
    "nats_cpu_us_per_msg": ("CPU us/msg", False),
    "node_grpc_cpu_us_per_msg": ("CPU us/msg", False),
    "node_grpc_server_cpu_us_per_msg": ("CPU us/msg", False),
    "failover_median_s": ("s", False),
    "failover_worst_s": ("s", False),
    "rss_start_mib": ("MiB", False),
    "rss_idle_100_mib": ("MiB", False),
    "idle_100_cpu_pct": ("% of a core", False),
    "rss_capture_peak_mib": ("MiB", False),
    "rss_after_capture_mib": ("MiB", False),
    "rss_read_peak_mib": ("MiB", False),
    "rss_after_read_mib": ("MiB", False),
    "read_rate": ("msg/s", True),
    "restart_graceful_s": ("s", False),
    "restart_kill_s": ("s", False),
    "restart_rss_mib": ("MiB", False),
    "first_ms": ("ms", False),
    "unacked": ("probes", False),
    "lost": ("probes", False),
    "kill_unacked": ("probes", False),
    "kill_lost": ("probes", False),
    "forced_stops": ("stops", False),
}


def metric_info(name: str) -> tuple[str, bool]:
    """The unit of a metric and whether higher is better; metrics not listed go by their suffix."""
    if name in METRICS:
        return METRICS[name]
    if name.endswith("_rate"):
        return "msg/s", True
    if name.endswith("_ms"):
        return "ms", False
    if name.endswith("cpu_us_per_msg"):
        return "CPU us/msg", False
    return "", True


def format_value(value: Any) -> str:
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3g}"
    return str(value)


def median(values: Iterable[float]) -> float | None:
    values = [v for v in values if isinstance(v, (int, float))]
    return statistics.median(values) if values else None


def summarize(report: dict[str, Any], scenarios: Mapping[str, Scenario]) -> None:
    """Medians per metric and system, and the bascule/JetStream ratio, into report['scenarios'][*]['summary']."""
    for name, entry in report["scenarios"].items():
        rows = list(scenarios[name].rows) or _rows_found(entry)
        entry["summary"] = [line for line in (_summary_line(entry, row) for row in rows) if line is not None]


def _rows_found(entry: dict[str, Any]) -> list[str]:
    """For a scenario without rows of its own (scale): every rate and CPU cost bascule's trials have, by
    partition count."""
    found = {k for t in entry["trials"].get(BASCULE, []) for k in t if k.endswith(("_rate", "_cpu_us_per_msg"))}
    return sorted(found, key=lambda k: (int(re.sub(r"\D.*", "", k[1:]) or 0), "rate" not in k))


def _summary_line(entry: dict[str, Any], row: str | tuple[str, str, str]) -> dict[str, Any] | None:
    label, b_metric, j_metric = row if isinstance(row, tuple) else (row, row, row)
    medians, spreads = {}, {}
    for system, trials in entry["trials"].items():
        counted = [t for t in trials if not t.get("profiled")]
        metric = j_metric if system == JETSTREAM else b_metric
        values = [t[metric] for t in counted if isinstance(t.get(metric), (int, float))]
        medians[system] = middle = median(values)
        if len(values) > 1 and middle:
            spreads[system] = (max(values) - min(values)) / abs(middle)
    if all(v is None for v in medians.values()):
        return None
    b, j = medians.get(BASCULE), medians.get(JETSTREAM)
    unit, higher = metric_info(b_metric)
    return {"metric": label, "bascule_metric": b_metric, "jetstream_metric": j_metric,
            "unit": unit, "higher_is_better": higher, "medians": medians, "spread": spreads,
            "ratio": (b / j) if b is not None and j else None}


def _cells(row: dict[str, Any], missing: str) -> list[str]:
    """Each system's median, ±half its range as % of the median."""
    med, spread = row["medians"], row.get("spread", {})
    cells = []
    for s in (BASCULE, JETSTREAM, NATS):
        cell = format_value(med.get(s)) if med.get(s) is not None else missing
        if s in spread:
            cell += f" ±{min(999, round(50 * spread[s]))}%"
        cells.append(cell)
    return cells


def format_table(report: dict[str, Any]) -> str:
    out = []
    labels = [row["metric"] for entry in report["scenarios"].values() for row in entry.get("summary", [])]
    width = max([22, *map(len, labels)])
    header = (f"{'scenario':<11} {'metric':<{width}} {'unit':<11} {'bascule':>17} {'JetStream':>17} {'NATS':>17} "
              f"{'b/JS':>7}")
    out.append(header)
    out.append("-" * len(header))
    for name, entry in report["scenarios"].items():
        errors = sum(1 for trials in entry["trials"].values() for t in trials if "error" in t)
        for row in entry.get("summary", []):
            cells = _cells(row, "-")
            ratio = f"{row['ratio']:.2f}" if row["ratio"] is not None else "-"
            better = "" if row["ratio"] is None else ("^" if row["higher_is_better"] else "v")
            out.append(f"{name:<11} {row['metric']:<{width}} {row['unit']:<11} {cells[0]:>17} {cells[1]:>17} "
                       f"{cells[2]:>17} {ratio:>6}{better}")
        if errors:
            out.append(f"{name:<11} ({errors} failed trial(s): see the log or --json)")
    out.append("medians over the counted trials, ±half the range (max-min) as % of the median; "
               "b/JS = bascule / JetStream (^ higher is better, v lower is better)")
    return "\n".join(out)


def format_markdown(report: dict[str, Any]) -> str:
    """The same table as format_table, as Markdown (for benchmarks/RESULTS.md)."""
    out = ["| scenario | metric | unit | bascule | JetStream | NATS | bascule/JetStream |",
           "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for name, entry in report["scenarios"].items():
        for row in entry.get("summary", []):
            cells = _cells(row, "")
            ratio = "" if row["ratio"] is None else f"{row['ratio']:.2f} {'↑' if row['higher_is_better'] else '↓'}"
            out.append(f"| {name} | {row['metric']} | {row['unit']} | {' | '.join(cells)} | {ratio} |")
        errors = [t["error"] for trials in entry["trials"].values() for t in trials if "error" in t]
        if errors:
            out.append(f"| {name} | {len(errors)} failed trial(s) | | | | | |")
    return "\n".join(out) + "\n"
