"""Multiplexed fetches between two real sides over a real nats-server: a leader node ("L", its own
NATS connection) with each partition's LeaderEndpoint and its MuxEndpoint, and a follower node ("F")
whose FollowerLoops fetch through one FetchMux to L. Followers woken in one turn (as a node's
notifications wake them) fetch in one request; a leader node of an earlier version, which serves no
multiplexed fetches, gets single ones, and a dead one does not."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import nats
import pytest
from conftest import until

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

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

PARTITIONS = 40
# Idle waits longer than the test: a follower fetches only when woken.
SETTINGS = FollowerSettings(fetch_timeout=1.0, leader_timeout=60.0, max_idle_wait=30.0)
SUBJECTS = Subjects("mux")


@dataclass
class Pair:
    leaders: list[PartitionReplica]
    followers: list[PartitionReplica]
    loops: list[FollowerLoop]
    mux: FetchMux
    leader_nc: SealedNats
    requests: Counter = field(default_factory=Counter)  # replicate subject -> single fetches seen on NATS

    @property
    def single_fetches(self) -> int:
        return sum(self.requests.values())

    def wake_all(self) -> None:
        for loop in self.loops:  # in one turn, as a notifications message does
            loop.notify()

    def caught_up(self, count: int) -> bool:
        return all(f.log.next_offset == count and f.high_watermark == count - 1 for f in self.followers)


async def _sealed(url: str) -> SealedNats:
    return SealedNats(await nats.connect(url), Sealer(derive_key("the cluster's secret")))


@contextlib.asynccontextmanager
async def node_pair(tmp_path, serve_mux: bool = True) -> AsyncIterator[Pair]:
    server = LocalNatsServer(tmp_path / "nats.log")
    server.start()
    closing: list = []
    replicas: list[PartitionReplica] = []
    try:
        leader_nc, follower_nc = await _sealed(server.url), await _sealed(server.url)
        spy = await nats.connect(server.url)
        closing += [spy.close, follower_nc.client.close, leader_nc.client.close]
        mux = FetchMux(follower_nc, SUBJECTS, "F", "L", lambda work, name: asyncio.ensure_future(work), time.monotonic)
        pair = Pair([], [], [], mux, leader_nc)

        async def count(msg) -> None:
            pair.requests[msg.subject] += 1

        # Only the partitions' subjects: a subscriber of the multiplexed one would be its responder.
        await spy.subscribe(f"{SUBJECTS.namespace}.*.*.replicate", cb=count)
        await spy.flush()
        endpoints: dict[int, LeaderEndpoint] = {}
        if serve_mux:
            await MuxEndpoint(leader_nc, SUBJECTS, "L", lambda stream, p: endpoints.get(p)).start()

        async def report(replica: PartitionReplica, leader: str, epoch: int) -> None:
            raise AssertionError(f"{replica.partition}: leader {leader} reported")

        for p in range(PARTITIONS):
            leader = PartitionReplica("s", p, CommitLog.open(tmp_path / f"L{p}"), SyncPolicy(), time.monotonic)
            leader.become_leader("L", 1, 0, ("L", "F"), ("L", "F"), min_isr=1, max_lag_time=30.0,
                                 leader_timeout=SETTINGS.leader_timeout)
            endpoints[p] = LeaderEndpoint(leader_nc, SUBJECTS, leader, 1 << 20)
            await endpoints[p].start()
            follower = PartitionReplica("s", p, CommitLog.open(tmp_path / f"F{p}"), SyncPolicy(), time.monotonic)
            follower.become_follower("L", 1)
            loop = FollowerLoop(follower_nc, SUBJECTS, follower, "F", SETTINGS, report, mux=mux)
            pair.leaders.append(leader)
            pair.followers.append(follower)
            pair.loops.append(loop)
            replicas += [leader, follower]
            closing += [loop.stop, endpoints[p].stop]
        await leader_nc.flush()
        for loop in pair.loops:
            loop.start()
        await until(lambda: pair.caught_up(0), 20, "every follower to start caught up")
        yield pair
    finally:
        for close in reversed(closing):
            await close()
        for replica in replicas:
            replica.close()
        server.stop()




async def test_followers_woken_together_fetch_in_one_request(tmp_path) -> None:
    async with node_pair(tmp_path) as pair:
        await asyncio.sleep(0.2)  # every loop idle
        for write in range(1, 6):
            singles, sent = pair.single_fetches, pair.mux.requests_sent
            for p, leader in enumerate(pair.leaders):
                leader.submit([Record(b"%d-%d" % (p, write))])
            pair.wake_all()
            await until(lambda count=write: pair.caught_up(count), 10, f"write {write} on every follower")
            assert pair.single_fetches == singles  # none of them alone
            # The data, then the HW (a follower learns it on its next fetch): two requests, give or take
            # one for a loop woken a turn later.
            assert pair.mux.requests_sent - sent <= 3
        for p in range(PARTITIONS):
            assert [e.value for e in pair.followers[p].log.read(0, 10)] == [b"%d-%d" % (p, w) for w in range(1, 6)]


async def test_a_leader_node_without_multiplexed_fetches_is_fetched_from_one_partition_at_a_time(tmp_path) -> None:
    async with node_pair(tmp_path, serve_mux=False) as pair:
        for p, leader in enumerate(pair.leaders):
            leader.submit([Record(b"%d" % p)])
        pair.wake_all()
        await until(lambda: pair.caught_up(1), 10, "the write on every follower")
        assert pair.mux.requests_sent == 1  # tried once; single fetches since
        assert pair.single_fetches >= 2 * PARTITIONS  # the data, then the HW


async def test_followers_of_a_dead_leader_node_keep_fetching_multiplexed(tmp_path) -> None:
    """A leader node gone (its connection closed, as by a SIGKILL) has no responder for the multiplexed
    subject either: one fetch goes singly to tell it from an earlier version, gets no answer (the spy
    on the partitions' subjects stays their silent responder: it times out), and the fetches fail and
    go multiplexed again, not one request each for a fallback period."""
    async with node_pair(tmp_path) as pair:
        await pair.leader_nc.client.close()
        singles, sent = pair.single_fetches, pair.mux.requests_sent
        pair.wake_all()
        await asyncio.sleep(3.5)
        multiplexed = pair.mux.requests_sent - sent
        assert multiplexed >= 2  # tried again, each time the loops asked again
        assert pair.single_fetches - singles <= multiplexed  # a probe each
