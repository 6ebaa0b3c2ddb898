"""The real replication shells (LeaderEndpoint, FollowerLoop) between two real replicas, over the
in-memory bus and its faults instead of a nats-server (tests/integration/test_replication_shells.py
runs them over a real one)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from nats.errors import NoRespondersError

from bascule.partition.follower import FollowerLoop, FollowerSettings
from bascule.partition.leader import LeaderEndpoint
from bascule.partition.log import CommitLog
from bascule.partition.replica import PartitionReplica, SyncPolicy
from bascule.testing.bus import Faults, MemoryBus
from bascule.wire.entry import Record
from bascule.wire.subjects import Subjects

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(10)]

WHOLE_LOG = 1 << 30


@dataclass
class Pair:
    """Leader L of s/0 (ISR L and F) serving fetches on the bus, and F following it."""

    bus: MemoryBus
    leader: PartitionReplica
    follower: PartitionReplica
    reports: list[tuple[str, int]] = field(default_factory=list)
    written: int = 0

    def write(self, count: int, prefix: bytes) -> None:
        self.leader.submit([Record(b"%s-%d" % (prefix, i)) for i in range(count)])
        self.written += count

    def __str__(self) -> str:
        return (f"leader end {self.leader.log.next_offset} HW {self.leader.high_watermark}, follower end "
                f"{self.follower.log.next_offset}; reports {self.reports}; {self.bus.tally}")

    def in_sync(self) -> bool:
        """The leader's log holds all that was written, the follower exactly the same, and the
        leader's HW (its last committed offset) covers all of it."""
        end = self.written
        return (
            self.leader.log.next_offset == self.follower.log.next_offset == end
            and self.leader.high_watermark == end - 1
            and self.follower.log.read_raw(0, WHOLE_LOG) == self.leader.log.read_raw(0, WHOLE_LOG)
        )


@contextlib.asynccontextmanager
async def leader_and_follower(
    tmp_path, bus: MemoryBus, settings: FollowerSettings, max_bytes: int = 1 << 20
) -> AsyncIterator[Pair]:
    subjects = Subjects("bus")
    leader = PartitionReplica("s", 0, CommitLog.open(tmp_path / "leader"), SyncPolicy(), time.monotonic)
    leader.become_leader(
        "L", 1, 0, ("L", "F"), ("L", "F"), min_isr=1, max_lag_time=30.0, leader_timeout=settings.leader_timeout
    )
    endpoint = LeaderEndpoint(bus.node("L"), subjects, leader, max_bytes)
    await endpoint.start()
    follower = PartitionReplica("s", 0, CommitLog.open(tmp_path / "follower"), SyncPolicy(), time.monotonic)
    follower.become_follower("L", 1)
    pair = Pair(bus, leader, follower)

    async def report(_replica: PartitionReplica, leader_id: str, leader_epoch: int) -> None:
        pair.reports.append((leader_id, leader_epoch))

    loop = FollowerLoop(bus.node("F"), subjects, follower, "F", settings, report)
    loop.start()
    try:
        yield pair
    finally:
        await loop.stop()
        await endpoint.stop()
        leader.close()
        follower.close()


async def until(predicate, timeout: float, what: str, pair: Pair) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {pair}"
        await asyncio.sleep(0.01)


async def test_over_a_lossy_bus_the_follower_ends_with_exactly_the_leaders_log(tmp_path) -> None:
    """A fifth of every message lost, duplicated replies and requests, delays that reorder them: the
    follower still ends with the leader's log byte for byte, and the leader's HW covers it."""
    bus = MemoryBus(seed=26, faults=Faults(drop=0.2, duplicate=0.2, delay=(0.0, 0.01)))
    # Small responses: many fetches, so many faults.
    async with leader_and_follower(tmp_path, bus, FollowerSettings(0.03, 3.0, 0.02), max_bytes=1024) as pair:
        for burst in range(10):
            pair.write(30, b"burst-%d" % burst)
            await asyncio.sleep(0.03)
        await until(pair.in_sync, 4.0, "the follower to hold the leader's log, under the leader's HW", pair)
        assert bus.tally.sent > 30 and bus.tally.dropped and bus.tally.duplicated
        assert pair.reports == []


CUTS = {
    "both ways": lambda bus: bus.partition({"L"}, {"F"}),
    "leader to follower only": lambda bus: bus.cut_one_way("L", "F"),  # fetches arrive, answers do not
}


@pytest.mark.parametrize("cut", CUTS.values(), ids=CUTS.keys())
async def test_a_follower_cut_off_reports_the_leader_and_catches_up_after_heal(tmp_path, cut) -> None:
    """Cut off for longer than the leader timeout, the follower reports its leader; healed, it
    fetches what the leader wrote meanwhile."""
    bus = MemoryBus(seed=7)
    async with leader_and_follower(tmp_path, bus, FollowerSettings(0.1, 0.6, 0.05)) as pair:
        pair.write(20, b"before")
        await until(pair.in_sync, 2.0, "the follower to catch up", pair)
        cut(bus)
        pair.write(20, b"during")
        await until(lambda: pair.reports, 2.0, "the follower to report the leader", pair)
        assert pair.reports[0] == ("L", 1)
        assert pair.follower.log.next_offset == 20 and pair.leader.high_watermark == 19
        bus.heal()
        await until(pair.in_sync, 2.0, "the follower to catch up after heal", pair)


class DeadLeaderNode:
    """A follower node's transport to a nats-server where its leader's node is gone: each request
    fails at once (NoRespondersError), as nats-py's does; when each was made is kept."""

    max_payload = 1 << 20

    def __init__(self) -> None:
        self.requests: list[float] = []

    async def request(self, subject: str, payload: bytes, timeout: float):
        self.requests.append(time.monotonic())
        raise NoRespondersError


async def test_a_follower_of_a_dead_leader_node_asks_less_and_less_often_and_reports_it_on_time(tmp_path) -> None:
    """Failed requests pause 50 ms, then twice as long each time up to a quarter of the leader
    timeout (0.5 s here), not 50 ms each (40 requests a second's leader timeout): the report still
    comes a leader timeout after the loop started."""
    settings = FollowerSettings(fetch_timeout=0.5, leader_timeout=2.0, max_idle_wait=0.5)
    nc = DeadLeaderNode()
    follower = PartitionReplica("s", 0, CommitLog.open(tmp_path / "follower"), SyncPolicy(), time.monotonic)
    follower.become_follower("L", 1)
    reports: list[float] = []

    async def report(_replica: PartitionReplica, leader_id: str, leader_epoch: int) -> None:
        reports.append(time.monotonic())

    started = time.monotonic()
    loop = FollowerLoop(nc, Subjects("bus"), follower, "F", settings, report)  # type: ignore[arg-type]
    loop.start()
    try:
        while not reports:
            assert time.monotonic() - started < 4.0, f"no report after {len(nc.requests)} requests"
            await asyncio.sleep(0.01)
        assert 2.0 <= reports[0] - started < 2.5
        # 0.05, 0.1, 0.2, 0.4, then 0.5 s apart: 8 by the report.
        assert 5 <= len(nc.requests) <= 10
        assert nc.requests[1] - nc.requests[0] < 0.2  # the first retry is prompt
        before = len(nc.requests)
        await asyncio.sleep(1.0)
        assert len(nc.requests) - before <= 3
    finally:
        await loop.stop()
        follower.close()
