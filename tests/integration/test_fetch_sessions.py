"""Fetch sessions between two real sides over a real nats-server: the replicas of a leader node
("L", with its own NATS connection) and of a follower node ("F"), each partition's LeaderEndpoint
and FollowerLoop, F's FetchSession to L and L's SessionEndpoint. Caught-up partitions are carried
by one round per idle wait; a write, a silent leader and garbage each do what they did before."""

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
from bascule.partition.follower import FollowerLoop, FollowerSettings
from bascule.partition.leader import LeaderEndpoint
from bascule.partition.log import CommitLog
from bascule.partition.replica import PartitionReplica, SyncPolicy
from bascule.partition.session import FetchSession, FetchSessions, SessionEndpoint
from bascule.testing.local import LocalNatsServer
from bascule.wire import envelope, sessions
from bascule.wire.entry import Record
from bascule.wire.seal import Sealer, derive_key
from bascule.wire.subjects import Subjects

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

PARTITIONS = 40
LEADER_TIMEOUT = 3.0
MAX_LAG = 2.0
SETTINGS = FollowerSettings(fetch_timeout=0.5, leader_timeout=LEADER_TIMEOUT, max_idle_wait=0.5)
SUBJECTS = Subjects("sessions")


@dataclass
class Pair:
    leader_nc: SealedNats
    follower_nc: SealedNats
    leaders: dict[tuple[str, int], PartitionReplica]
    followers: dict[tuple[str, int], PartitionReplica]
    sessions: FetchSessions
    requests: Counter = field(default_factory=Counter)  # subject -> requests seen on NATS
    round_sizes: list[int] = field(default_factory=list)  # of each round seen, sealed
    reports: list[tuple[int, str, int]] = field(default_factory=list)  # (partition, leader, epoch)


async def _sealed(url: str) -> SealedNats:
    return SealedNats(await nats.connect(url), Sealer(derive_key("the cluster's secret")))


@contextlib.asynccontextmanager
async def node_pair(tmp_path) -> AsyncIterator[Pair]:
    """L leads partitions 0..PARTITIONS-1 of stream s (ISR L and F, one entry each); F follows
    them all through one fetch session."""
    server = LocalNatsServer(tmp_path / "nats.log")
    server.start()
    tasks: list[asyncio.Task] = []
    closing: list = []
    replicas: list[PartitionReplica] = []
    try:
        leader_nc, follower_nc = await _sealed(server.url), await _sealed(server.url)
        spy = await nats.connect(server.url)
        closing += [spy.close, follower_nc.client.close, leader_nc.client.close]
        pair = Pair(leader_nc, follower_nc, {}, {}, FetchSessions(
            lambda leader: FetchSession(
                follower_nc, SUBJECTS, "F", leader, SETTINGS.machine_config().max_idle_wait,
                SETTINGS.request_timeout, time.monotonic,
            ),
            lambda work, name: tasks.append(asyncio.create_task(work, name=name)),
        ))

        async def count(msg) -> None:
            pair.requests[msg.subject] += 1
            if msg.subject == SUBJECTS.fetch_session("L"):
                pair.round_sizes.append(len(msg.data))

        await spy.subscribe(f"{SUBJECTS.namespace}.>", cb=count)
        await spy.flush()
        session_endpoint = SessionEndpoint(
            leader_nc, SUBJECTS, "L", lambda s, p: pair.leaders.get((s, p)), time.monotonic
        )
        await session_endpoint.start()

        async def report(replica: PartitionReplica, leader: str, epoch: int) -> None:
            pair.reports.append((replica.partition, leader, epoch))

        loops = []
        for p in range(PARTITIONS):
            leader = PartitionReplica("s", p, CommitLog.open(tmp_path / f"L{p}"), SyncPolicy(), time.monotonic)
            leader.become_leader("L", 1, 0, ("L", "F"), ("L", "F"), min_isr=1, max_lag_time=MAX_LAG,
                                 leader_timeout=LEADER_TIMEOUT)
            endpoint = LeaderEndpoint(leader_nc, SUBJECTS, leader, 1 << 20)
            await endpoint.start()
            follower = PartitionReplica("s", p, CommitLog.open(tmp_path / f"F{p}"), SyncPolicy(), time.monotonic)
            follower.become_follower("L", 1)
            pair.leaders["s", p], pair.followers["s", p] = leader, follower
            replicas += [leader, follower]
            loop = FollowerLoop(follower_nc, SUBJECTS, follower, "F", SETTINGS, report,
                                session=pair.sessions.to("L"))
            loop.start()
            loops.append(loop)
            leader.submit([Record(b"first-%d" % p)])
            closing += [loop.stop, endpoint.stop]
        await until(lambda: all(f.high_watermark == 0 for f in pair.followers.values()), 20, "every HW at 0")
        yield pair
    finally:
        for close in reversed(closing):
            await close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for replica in replicas:
            replica.close()
        server.stop()




def individual_fetches(pair: Pair) -> int:
    return sum(n for subject, n in pair.requests.items() if subject.endswith(".replicate"))


def rounds(pair: Pair) -> int:
    return pair.requests[SUBJECTS.fetch_session("L")]


async def test_idle_partitions_cost_one_round_per_idle_wait_and_stay_in_the_isr(tmp_path) -> None:
    """Past the lag time with nothing written: no partition fetches on its own, a round per idle
    wait stands for all 40 and carries none of them (incremental rounds: nothing changed), and the
    leader still counts F caught up (no ISR shrink) and holds its lease."""
    async with node_pair(tmp_path) as pair:
        await asyncio.sleep(SETTINGS.machine_config().max_idle_wait * 2)  # every loop parked
        fetches_before, rounds_before = individual_fetches(pair), rounds(pair)
        await asyncio.sleep(MAX_LAG * 2)
        assert individual_fetches(pair) == fetches_before
        assert 5 <= rounds(pair) - rounds_before <= 10
        assert max(pair.round_sizes[rounds_before:]) < 100  # the seal, the envelope, ids and the echo
        now = time.monotonic()
        for leader in pair.leaders.values():
            assert leader.isr_requests() == []
            assert leader.leadership is not None and leader.leadership.tracker.holds_lease(now)
        assert pair.reports == []


async def test_a_write_to_a_parked_partition_reaches_its_follower_through_the_round(tmp_path) -> None:
    """No notification is wired here: the round's news alone wake the followers of the written
    partitions, which fetch on their own; the others stay parked."""
    async with node_pair(tmp_path) as pair:
        await asyncio.sleep(SETTINGS.machine_config().max_idle_wait * 2)
        before = Counter(pair.requests)
        written = range(0, PARTITIONS, 4)
        for p in written:
            pair.leaders["s", p].submit([Record(b"second")])
        await until(lambda: all(pair.followers["s", p].high_watermark == 1 for p in written), 5, "the new HWs")
        fetched = {subject for subject in pair.requests if pair.requests[subject] > before[subject]}
        assert {s for s in fetched if s.endswith(".replicate")} == {SUBJECTS.replicate("s", p) for p in written}
        assert [e.value for e in pair.followers["s", 4].log.read(0, 10)] == [b"first-4", b"second"]


async def test_parked_followers_report_a_leader_that_went_silent(tmp_path) -> None:
    """L's connection closes (its node died): the next round fails, each loop's machine takes
    over, and every partition's leader is reported within a leader timeout of its last contact."""
    async with node_pair(tmp_path) as pair:
        await asyncio.sleep(SETTINGS.machine_config().max_idle_wait * 2)
        await pair.leader_nc.client.close()
        died = time.monotonic()
        await until(lambda: len({p for p, _, _ in pair.reports}) == PARTITIONS, LEADER_TIMEOUT + 3, "every report")
        assert time.monotonic() - died > LEADER_TIMEOUT - SETTINGS.machine_config().max_idle_wait - 0.2
        assert {(leader, epoch) for _, leader, epoch in pair.reports} == {("L", 1)}


async def test_garbage_rounds_are_dropped_and_unknown_partitions_fetch_on_their_own(tmp_path) -> None:
    """A sealed but malformed round gets no answer and changes nothing; a round of a session L does
    not hold is refused; a round naming a partition L does not have, or of another epoch, tells that
    item to fetch on its own, incremental or in the previous version's full form."""
    async with node_pair(tmp_path) as pair:
        subject = SUBJECTS.fetch_session("L")
        garbage_rounds = (
            b"", b"\x00" * 64, sessions.encode_reply(1.0, []), sessions.encode_session_answer(1.0, []),
            envelope.encode(envelope.MsgType.FETCH_SESSION_ROUND, b"\x93\x01\x02"),
        )
        for garbage in garbage_rounds:
            with pytest.raises(nats.errors.TimeoutError):
                await pair.follower_nc.request(subject, garbage, timeout=0.3)
        unknown = sessions.SessionRound("F", 12345, 5, 0.0, [], [])
        reply = await pair.follower_nc.request(subject, sessions.encode_session_round(unknown), timeout=2)
        assert sessions.decode_session_answer(reply.data).news is None
        items = [
            sessions.ParkedItem("s", 0, 1, 1, 0),  # caught up
            sessions.ParkedItem("s", PARTITIONS, 1, 0, -1),  # no such partition here
            sessions.ParkedItem("s", 1, 7, 1, 0),  # a newer epoch: fences L's partition 1
            sessions.ParkedItem("s", 2, 1, 0, -1),  # behind
        ]
        reply = await pair.follower_nc.request(subject, sessions.encode_round("F", 0.0, items), timeout=2)
        assert sessions.decode_reply(reply.data, len(items)).news == [1, 2, 3]
        assert not pair.leaders["s", 1].is_leader and pair.leaders["s", 0].is_leader
        incremental = sessions.SessionRound("F", 12345, 0, 0.0, list(enumerate(items)), [])
        reply = await pair.follower_nc.request(subject, sessions.encode_session_round(incremental), timeout=2)
        assert sessions.decode_session_answer(reply.data).news == [1, 2, 3]
        rounds_before = rounds(pair)
        await until(lambda: rounds(pair) > rounds_before + 1, 5, "the rounds to go on")
        assert pair.leaders["s", 0].is_leader
