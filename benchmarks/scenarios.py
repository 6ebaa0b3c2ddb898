"""The scenarios: what each runs against which systems, and which of its metrics make the table."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from benchmarks.failover import run_failover
from benchmarks.harness import BASCULE, JETSTREAM, NATS, Context
from benchmarks.restart import run_restart
from benchmarks.rolling import run_rolling_restart
from benchmarks.stability import run_stability
from benchmarks.throughput import (
    run_acked_r3,
    run_capture_r1,
    run_capture_r3,
    run_ceiling,
    run_consume_r3,
    run_durable_r1,
    run_scale,
)


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    systems: tuple[str, ...]
    run: Callable[[Context, str], Awaitable[list[dict[str, Any]]]]
    # Rows of the table: a metric name, or (label, bascule's metric, JetStream's metric) when the two
    # differ; the ratio is bascule / JetStream.
    rows: tuple[str | tuple[str, str, str], ...] = ("rate",)
    profile: bool = False
    node_client: bool = False  # runs benchmarks/node/grpc_bench.js against bascule (node_grpc_* metrics)


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("capture_r1", "capture R1: plain NATS publishes into a 1-replica stream",
             (BASCULE, JETSTREAM), run_capture_r1, ("rate", "server_cpu_us_per_msg", "publish_rate"), True),
    Scenario("capture_r3", "capture R3: plain NATS publishes into a 3-replica stream (3 nodes)",
             (BASCULE, JETSTREAM), run_capture_r3, ("rate", "server_cpu_us_per_msg", "publish_rate"), True),
    Scenario("acked_r3", "acked R3: pipelined publishes, ack ALL, window 1000",
             (BASCULE, JETSTREAM), run_acked_r3,
             (("grpc_rate", "grpc_rate", "rate"), ("grpc_p50_ms", "grpc_p50_ms", "p50_ms"),
              ("grpc_p99_ms", "grpc_p99_ms", "p99_ms"), ("grpc_cpu_us_per_msg", "grpc_cpu_us_per_msg",
                                                         "server_cpu_us_per_msg"),
              ("nats_rate", "nats_rate", "rate"), ("nats_p50_ms", "nats_p50_ms", "p50_ms"),
              ("nats_p99_ms", "nats_p99_ms", "p99_ms"), ("nats_cpu_us_per_msg", "nats_cpu_us_per_msg",
                                                         "server_cpu_us_per_msg"),
              ("node_grpc_rate", "node_grpc_rate", "rate"), ("node_grpc_p50_ms", "node_grpc_p50_ms", "p50_ms"),
              ("node_grpc_p99_ms", "node_grpc_p99_ms", "p99_ms"),
              ("node_grpc_cpu_us_per_msg", "node_grpc_cpu_us_per_msg", "server_cpu_us_per_msg"),
              ("raw_grpc_rate", "raw_grpc_rate", "rate"), ("raw_grpc_p50_ms", "raw_grpc_p50_ms", "p50_ms"),
              ("raw_grpc_p99_ms", "raw_grpc_p99_ms", "p99_ms"),
              ("raw_grpc_cpu_us_per_msg", "raw_grpc_cpu_us_per_msg", "server_cpu_us_per_msg"),
              "raw_grpc_leader_cpu_us_per_msg",
              ("raw_grpc_ids_rate", "raw_grpc_ids_rate", "rate"),
              ("raw_grpc_ids_p50_ms", "raw_grpc_ids_p50_ms", "p50_ms"),
              ("raw_grpc_ids_p99_ms", "raw_grpc_ids_p99_ms", "p99_ms"),
              ("raw_grpc_ids_cpu_us_per_msg", "raw_grpc_ids_cpu_us_per_msg", "server_cpu_us_per_msg"),
              "raw_grpc_ids_leader_cpu_us_per_msg",
              "grpc_floor_rate", "grpc_floor_cpu_us_per_msg"), True, node_client=True),
    Scenario("consume_r3", "consume: read a prefilled R3 stream from the start (bascule's client; gRPC Subscribe)",
             (BASCULE, JETSTREAM), run_consume_r3,
             ("rate", "first_ms", "server_cpu_us_per_msg", ("grpc_rate", "grpc_rate", "rate"),
              ("grpc_first_ms", "grpc_first_ms", "first_ms"),
              ("grpc_server_cpu_us_per_msg", "grpc_server_cpu_us_per_msg", "server_cpu_us_per_msg"),
              ("node_grpc_rate", "node_grpc_rate", "rate"),
              ("node_grpc_server_cpu_us_per_msg", "node_grpc_server_cpu_us_per_msg", "server_cpu_us_per_msg"),
              "grpc_floor_rate", "grpc_floor_cpu_us_per_msg"), True, node_client=True),
    Scenario("durable_r1", "durable R1: fsync before ack (sync=always / sync_interval: always)",
             (BASCULE, JETSTREAM), run_durable_r1,
             ("capture_rate", "capture_cpu_us_per_msg",
              ("grpc_rate", "grpc_rate", "acked_rate"), ("grpc_p50_ms", "grpc_p50_ms", "acked_p50_ms"),
              ("grpc_p99_ms", "grpc_p99_ms", "acked_p99_ms"),
              ("grpc_cpu_us_per_msg", "grpc_cpu_us_per_msg", "acked_cpu_us_per_msg"),
              ("nats_rate", "nats_rate", "acked_rate"), ("nats_p50_ms", "nats_p50_ms", "acked_p50_ms"),
              ("nats_p99_ms", "nats_p99_ms", "acked_p99_ms"),
              ("nats_cpu_us_per_msg", "nats_cpu_us_per_msg", "acked_cpu_us_per_msg"))),
    Scenario("ceiling", "ceiling: one nats-py process receiving from another (no stream)",
             (NATS,), run_ceiling, ("rate", "publish_rate")),
    Scenario("failover", "failover: SIGKILL of the partition/stream leader, until an ack-ALL publish succeeds",
             (BASCULE, JETSTREAM), run_failover, ("failover_median_s", "failover_worst_s")),
    Scenario("stability", "false failovers: 4 R3 streams captured at full rate with the default failure "
             "detection while a CPU hog takes a core; leader changes and ISR losses seen (all false)",
             (BASCULE, JETSTREAM), run_stability, ("leader_changes", "isr_losses", "rate", "loaded_s")),
    Scenario("rolling_restart", "rolling restart of 3 nodes under ack-ALL probes every 5 ms, leader first "
             "(bascule: SIGTERM, then SIGKILL as its baseline; default leader timeout); JetStream: SIGTERM",
             (BASCULE, JETSTREAM), run_rolling_restart,
             ("stall_max_ms", "stall_leader_ms", "stall_follower_ms", "steady_gap_ms", "unacked", "lost",
              "forced_stops", "kill_stall_max_ms", "kill_stall_leader_ms", "kill_stall_follower_ms", "kill_unacked",
              "kill_lost")),
    Scenario("scale", "scale: bascule capture rate over partitions",
             (BASCULE,), run_scale, ()),
    Scenario("restart", "memory and restart of one node holding N messages",
             (BASCULE, JETSTREAM), run_restart,
             ("rss_start_mib", "rss_idle_100_mib", "idle_100_cpu_pct", "capture_rate", "rss_capture_peak_mib",
              "rss_after_capture_mib", "read_rate", "rss_read_peak_mib", "rss_after_read_mib",
              "restart_graceful_s", "restart_kill_s", "restart_rss_mib")),
)}
GROUPS = {"capture": ["capture_r1", "capture_r3"], "acked": ["acked_r3"], "consume": ["consume_r3"],
          "durable": ["durable_r1"], "memory": ["restart"],
          "rolling": ["rolling_restart"]}


def select_scenarios(names: list[str]) -> list[str]:
    """The scenarios named (names or groups, comma-separated), in the order named; all if none.
    ValueError for a name that is neither."""
    if not names:
        return list(SCENARIOS)
    chosen: list[str] = []
    for item in names:
        for name in filter(None, (x.strip() for x in item.split(","))):
            for one in GROUPS.get(name, [name]):
                if one not in SCENARIOS:
                    raise ValueError(f"unknown scenario {one!r}; known: {', '.join(SCENARIOS)}")
                if one not in chosen:
                    chosen.append(one)
    return chosen
