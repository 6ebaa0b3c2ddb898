"""What a fetch session's round costs its leader node, per round and per parked partition.

One process, the in-memory bus: N partitions led by "L" (ISR L and F, one entry each, F caught up)
are parked by F in its fetch session to L, and rounds go every ``--interval``. Times the leader's
handler of each round in CPU time (``SessionEndpoint._on_round``: decode, record every item as the
fetch it stands for, answer) and the process CPU per round (both sides and the bus), over ``--rounds``
rounds after a warm-up (the first round's figure too: a session's round 0 carries every item).
Nothing is written meanwhile: the rounds of an idle cluster. It drives the fetch session through
``park`` and the leader's ``_on_round`` only, so it measures full rounds (60b5419 and before) and
incremental ones alike.
Usage: python benchmarks/session_rounds.py [--partitions 1000,4096] [--rounds 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from bascule.partition.log import CommitLog
from bascule.partition.replica import PartitionReplica, SyncPolicy
from bascule.partition.session import FetchSession, SessionEndpoint
from bascule.testing.bus import MemoryBus
from bascule.wire.entry import Record
from bascule.wire.sessions import ParkedItem
from bascule.wire.subjects import Subjects

SUBJECTS = Subjects("bench")
WARM_UP = 3


async def measure(partitions: int, rounds: int, interval: float, directory: Path) -> dict:
    bus = MemoryBus(seed=1)
    leaders = {}
    for p in range(partitions):
        replica = PartitionReplica("s", p, CommitLog.open(directory / str(p)), SyncPolicy(), time.monotonic)
        replica.become_leader("L", 1, 0, ("L", "F"), ("L", "F"), min_isr=1, max_lag_time=30, leader_timeout=30)
        replica.submit([Record(b"x")])
        leaders["s", p] = replica
    await asyncio.sleep(0)  # the appends
    endpoint = SessionEndpoint(bus.node("L"), SUBJECTS, "L", lambda s, p: leaders.get((s, p)), time.monotonic)
    handled: list[float] = []
    on_round = endpoint._on_round
    warm, done = asyncio.Event(), asyncio.Event()

    async def timed(msg) -> None:
        started = time.thread_time()  # CPU: the machine is shared, wall time would count the others
        await on_round(msg)
        handled.append(time.thread_time() - started)
        if len(handled) == WARM_UP:
            warm.set()
        elif len(handled) == WARM_UP + rounds:
            done.set()

    endpoint._on_round = timed  # type: ignore[method-assign]
    await endpoint.start()
    session = FetchSession(bus.node("F"), SUBJECTS, "F", "L", interval, 5.0, time.monotonic)
    for p in range(partitions):
        session.park(ParkedItem("s", p, 1, 1, 0), asyncio.Event())
    task = asyncio.create_task(session.run())
    try:
        await warm.wait()
        cpu = time.process_time()
        await done.wait()
        cpu_per_round = (time.process_time() - cpu) / rounds
        times = handled[WARM_UP:]
    finally:
        task.cancel()
        for replica in leaders.values():
            replica.close()
    median = statistics.median(times)
    return {
        "partitions": partitions,
        "rounds": len(times),
        "first_round_us": round(handled[0] * 1e6),
        "leader_us_per_round_median": round(median * 1e6),
        "leader_us_per_item": round(median * 1e6 / partitions, 2),
        "process_cpu_us_per_round": round(cpu_per_round * 1e6),
        "all_in_isr": all(not r.isr_requests() for r in leaders.values()),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--partitions", default="1000,4096", help="comma-separated counts")
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--interval", type=float, default=0.02, help="seconds between rounds")
    args = parser.parse_args()
    for count in (int(n) for n in args.partitions.split(",")):
        with tempfile.TemporaryDirectory(dir="/dev/shm") as directory:
            print(json.dumps(await measure(count, args.rounds, args.interval, Path(directory))))


if __name__ == "__main__":
    asyncio.run(main())
