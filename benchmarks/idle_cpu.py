"""CPU used by an idle 3-node bascule cluster holding 50 replicated partitions.

Prints the CPU share (of one core) of each node and of the whole cluster over a
quiet window, after the partitions were created and written once.
Usage: python benchmarks/idle_cpu.py [--partitions 50] [--window 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

from bascule.client import Client
from bascule.testing.local import LocalCluster

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime + stime
    return total / TICKS


async def measure(partitions: int, window: float) -> dict:
    with LocalCluster(3) as cluster:
        async with Client(cluster.brokers[0]) as client:
            await client.create_stream("idle", "idle", replication_factor=3, partitions=partitions)
            for p in range(partitions):
                await client.publish("idle", b"x", partition=p, ack_policy="all")
        await asyncio.sleep(5)  # let followers settle into their idle waits
        groups = {node.server_id: node.pids() for node in cluster.nodes}
        before = {name: cpu_seconds(pids) for name, pids in groups.items()}
        nats_before = cpu_seconds(cluster.nats.pids())
        started = time.monotonic()
        await asyncio.sleep(window)
        elapsed = time.monotonic() - started
        shares = {name: (cpu_seconds(pids) - before[name]) / elapsed for name, pids in groups.items()}
        nats_share = (cpu_seconds(cluster.nats.pids()) - nats_before) / elapsed
    return {
        "partitions": partitions,
        "window_s": round(elapsed, 1),
        "node_core_percent": {k: round(v * 100, 2) for k, v in shares.items()},
        "bascule_total_core_percent": round(sum(shares.values()) * 100, 2),
        "nats_server_core_percent": round(nats_share * 100, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--partitions", type=int, default=50)
    parser.add_argument("--window", type=float, default=20.0)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args.partitions, args.window)), indent=2))


if __name__ == "__main__":
    main()
