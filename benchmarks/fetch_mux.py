"""Multiplexed fetches (issue 32): what replicating a write to every one of N partitions costs, with
each follower loop fetching through its node pair's FetchMux or with a request of its own.

One process holds both sides over a real nats-server, sealed as on a node: a leader node's replicas
with their LeaderEndpoints (and its MuxEndpoint), and a follower node's replicas and FollowerLoops.
Each round writes one entry to every partition and wakes every follower loop in one turn, as a
node's notifications message does, then waits until every follower holds the entry and its HW. The
figures: the process's CPU per round and per partition-round (both nodes' work, sealing included),
and the requests on NATS per round.

Usage: .venv/bin/python benchmarks/fetch_mux.py [--partitions 1000] [--rounds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import nats

from bascule.natsio.sealed import SealedNats
from bascule.partition.fetchmux import FetchMux, MuxEndpoint
from bascule.partition.follower import FollowerLoop, FollowerSettings
from bascule.partition.leader import LeaderEndpoint
from bascule.partition.log import CommitLog
from bascule.partition.replica import PartitionReplica, SyncPolicy
from bascule.testing.local import LocalNatsServer
from bascule.wire.entry import Record
from bascule.wire.seal import Sealer, derive_key
from bascule.wire.subjects import Subjects

SETTINGS = FollowerSettings(fetch_timeout=5.0, leader_timeout=600.0, max_idle_wait=300.0)
SUBJECTS = Subjects("bench")


async def _sealed(url: str) -> SealedNats:
    return SealedNats(await nats.connect(url), Sealer(derive_key("benchmark")))


async def run(directory: Path, url: str, partitions: int, rounds: int, multiplexed: bool) -> dict[str, Any]:
    leader_nc, follower_nc, spy = await _sealed(url), await _sealed(url), await nats.connect(url)
    requests = [0]

    async def count(_msg: Any) -> None:
        requests[0] += 1

    await spy.subscribe(f"{SUBJECTS.namespace}.*.*.replicate", cb=count)
    await spy.subscribe(SUBJECTS.fetch_mux("L"), cb=count)  # a second subscriber: it never answers
    await spy.flush()
    mux = FetchMux(follower_nc, SUBJECTS, "F", "L", lambda work, name: asyncio.ensure_future(work), time.monotonic)
    endpoints: dict[int, LeaderEndpoint] = {}
    await MuxEndpoint(leader_nc, SUBJECTS, "L", lambda stream, p: endpoints.get(p)).start()

    async def report(replica: PartitionReplica, leader: str, epoch: int) -> None:
        raise RuntimeError(f"{replica.partition}: leader reported")

    leaders, followers, loops = [], [], []
    for p in range(partitions):
        leader = PartitionReplica("s", p, CommitLog.open(directory / f"L{p}"), SyncPolicy(), time.monotonic)
        leader.become_leader("L", 1, 0, ("L", "F"), ("L", "F"), min_isr=1, max_lag_time=600.0,
                             leader_timeout=SETTINGS.leader_timeout)
        endpoints[p] = LeaderEndpoint(leader_nc, SUBJECTS, leader, 1 << 20)
        await endpoints[p].start()
        follower = PartitionReplica("s", p, CommitLog.open(directory / f"F{p}"), SyncPolicy(), time.monotonic)
        follower.become_follower("L", 1)
        loops.append(FollowerLoop(follower_nc, SUBJECTS, follower, "F", SETTINGS, report,
                                  mux=mux if multiplexed else None))
        leaders.append(leader)
        followers.append(follower)
    await leader_nc.flush()
    for loop in loops:
        loop.start()
    cpu = wall = 0.0
    sent = 0
    for round_ in range(rounds + 1):  # the first round warms up: epoch queries, first fetches
        before, cpu_before, wall_before = requests[0], time.process_time(), time.perf_counter()
        for leader in leaders:
            leader.submit([Record(b"round %d" % round_)])
        for loop in loops:
            loop.notify()
        await _until(partial(_all_at, followers, round_))
        if round_:
            cpu += time.process_time() - cpu_before
            wall += time.perf_counter() - wall_before
            sent += requests[0] - before
    for loop in loops:
        await loop.stop()
    for replica in leaders + followers:
        replica.close()
    for connection in (spy, follower_nc.client, leader_nc.client):
        await connection.close()
    return {
        "multiplexed": multiplexed, "cpu_ms_per_round": round(cpu / rounds * 1e3, 1),
        "cpu_us_per_partition_round": round(cpu / rounds / partitions * 1e6, 1),
        "wall_ms_per_round": round(wall / rounds * 1e3, 1), "requests_per_round": round(sent / rounds, 1),
    }


def _all_at(followers: list[PartitionReplica], hw: int) -> bool:
    return all(follower.high_watermark == hw for follower in followers)


async def _until(done: Callable[[], bool]) -> None:
    while True:
        if done():
            return
        await asyncio.sleep(0.001)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}; {args.partitions} partitions, {args.rounds} rounds")
    with tempfile.TemporaryDirectory(prefix="fetch-mux-") as work:
        server = LocalNatsServer(Path(work) / "nats.log")
        server.start()
        try:
            results: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
            for trial in range(args.trials):
                for multiplexed in (False, True):
                    directory = Path(work) / f"{trial}-{multiplexed}"
                    result = await run(directory, server.url, args.partitions, args.rounds, multiplexed)
                    results[multiplexed].append(result)
                    print(result, flush=True)
        finally:
            server.stop()
    single, mux = (sorted(r["cpu_us_per_partition_round"] for r in results[m])[args.trials // 2] for m in (False, True))
    print(f"median CPU per partition-round: single {single} us, multiplexed {mux} us, "
          f"ratio {mux / single:.2f}; load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    asyncio.run(main())
