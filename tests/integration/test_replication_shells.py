"""The replication shells (LeaderEndpoint, FollowerLoop) between two real replicas over a real
nats-server, without a node around them: what a failure inside the follower loop does."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import nats
import pytest
from conftest import rot_entry, until

from bascule.natsio.flush import flush
from bascule.natsio.sealed import SealedNats
from bascule.partition.follower import FollowerLoop, FollowerSettings
from bascule.partition.leader import LeaderEndpoint
from bascule.partition.log import CommitLog
from bascule.partition.replica import PartitionReplica, SyncPolicy
from bascule.testing.local import LocalNatsServer
from bascule.wire import envelope, replicate
from bascule.wire.entry import Record, encode_entries
from bascule.wire.pb import internal_pb2
from bascule.wire.seal import Rejection, Sealer, derive_key
from bascule.wire.subjects import Subjects

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@contextlib.asynccontextmanager
async def loopback_nats(tmp_path):
    """A real nats-server on loopback and a connection to it, for the shells to talk over."""
    server = LocalNatsServer(tmp_path / "nats.log")
    server.start()
    try:
        nc = await nats.connect(server.url)
        try:
            yield SealedNats(nc, Sealer(derive_key("the cluster's secret"))), Subjects("shells")
        finally:
            await nc.close()
    finally:
        server.stop()


async def leader_and_follower(
    tmp_path, nc: SealedNats, subjects: Subjects, leader_timeout: float
) -> tuple[PartitionReplica, LeaderEndpoint, PartitionReplica]:
    """Leader L of stream s/0 (ISR L and F) serving fetches over ``nc``, and F's replica following it."""
    leader = PartitionReplica("s", 0, CommitLog.open(tmp_path / "leader"), SyncPolicy(), time.monotonic)
    leader.become_leader("L", 1, 0, ("L", "F"), ("L", "F"), min_isr=1, max_lag_time=30.0, leader_timeout=leader_timeout)
    endpoint = LeaderEndpoint(nc, subjects, leader, 1 << 20)
    await endpoint.start()
    follower_replica = PartitionReplica("s", 0, CommitLog.open(tmp_path / "follower"), SyncPolicy(), time.monotonic)
    follower_replica.become_follower("L", 1)
    return leader, endpoint, follower_replica




async def test_a_failed_follower_loop_is_logged_and_starts_again(tmp_path, caplog) -> None:
    """The follower's first append raises (a bug, a transient disk error): the loop logs it, starts
    again from its log and catches up; it never silently stops fetching."""
    caplog.set_level(logging.ERROR, logger="bascule.partition.follower")
    async with loopback_nats(tmp_path) as (nc, subjects):
        leader, endpoint, follower_replica = await leader_and_follower(tmp_path, nc, subjects, leader_timeout=3.0)
        real_append = follower_replica.append_replicated
        failures = []

        def append_failing_once(data, walked):
            if not failures:
                failures.append(len(walked))
                raise OSError(5, "Input/output error (injected)")
            return real_append(data, walked)

        follower_replica.append_replicated = append_failing_once

        async def no_report(*_: object) -> None:
            return None

        loop = FollowerLoop(nc, subjects, follower_replica, "F", FollowerSettings(0.5, 3.0, 1.0), no_report)
        loop.start()
        try:
            leader.submit([Record(b"m-%d" % i) for i in range(10)])
            await until(lambda: follower_replica.log.next_offset == 10, 15, "the follower to catch up")
            assert failures, "the injected failure never happened"
            assert [e.value for e in follower_replica.log.read(0, 100)] == [b"m-%d" % i for i in range(10)]
            assert any("follower loop failed" in r.getMessage() for r in caplog.records), caplog.text
        finally:
            await loop.stop()
            await endpoint.stop()
            leader.close()
            follower_replica.close()


async def test_a_follower_below_a_damaged_entry_on_the_leader_reports_the_leader(tmp_path) -> None:
    """A byte of entry 5 rots on the leader's disk: the follower keeps 0..4, never takes the damaged
    bytes for an answer (it used to idle there as if caught up, forever) and reports the leader
    after the leader timeout, so that the metadata leader replaces it."""
    async with loopback_nats(tmp_path) as (nc, subjects):
        leader_log = CommitLog.open(tmp_path / "leader")
        leader_log.append([Record(b"value-%d" % i) for i in range(10)], 1)
        leader_log.sync()
        rot_entry(tmp_path / "leader", b"value-5")
        leader = PartitionReplica("s", 0, leader_log, SyncPolicy(), time.monotonic)
        leader.become_leader("L", 1, 0, ("L", "F"), ("L", "F"), min_isr=1, max_lag_time=30.0, leader_timeout=3.0)
        endpoint = LeaderEndpoint(nc, subjects, leader, 1 << 20)
        await endpoint.start()
        follower_replica = PartitionReplica("s", 0, CommitLog.open(tmp_path / "follower"), SyncPolicy(), time.monotonic)
        follower_replica.become_follower("L", 1)
        reports: list[tuple[str, int]] = []

        async def report(_replica, leader_id: str, leader_epoch: int) -> None:
            reports.append((leader_id, leader_epoch))

        loop = FollowerLoop(nc, subjects, follower_replica, "F", FollowerSettings(0.3, 1.5, 0.5), report)
        loop.start()
        try:
            await until(lambda: reports, 10, "the follower to report the leader")
            assert reports[0] == ("L", 1)
            assert follower_replica.log.next_offset == 5
            assert [e.value for e in follower_replica.log.read(0, 100)] == [b"value-%d" % i for i in range(5)]
        finally:
            await loop.stop()
            await endpoint.stop()
            leader.close()
            follower_replica.close()


async def test_a_report_still_on_its_way_when_the_leader_answers_again_is_withdrawn(tmp_path) -> None:
    """The leader is silent (a NATS outage, say) and the follower reports it, but the report waits (no
    metadata leader yet). Once the leader answers again, the report is withdrawn: delivered late,
    it would depose a leader that works."""
    async with loopback_nats(tmp_path) as (nc, subjects):
        leader, endpoint, follower_replica = await leader_and_follower(tmp_path, nc, subjects, leader_timeout=1.0)
        await endpoint.stop()
        reported, withdrawn = asyncio.Event(), asyncio.Event()

        async def report_waiting_for_a_metadata_leader(*_: object) -> None:
            reported.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                withdrawn.set()
                raise

        loop = FollowerLoop(nc, subjects, follower_replica, "F", FollowerSettings(0.3, 1.0, 0.5),
                            report_waiting_for_a_metadata_leader)
        loop.start()
        try:
            await asyncio.wait_for(reported.wait(), 10)
            assert not withdrawn.is_set()
            endpoint = LeaderEndpoint(nc, subjects, leader, 1 << 20)
            await endpoint.start()
            leader.submit([Record(b"back")])
            await asyncio.wait_for(withdrawn.wait(), 10)
        finally:
            await loop.stop()
            await endpoint.stop()
            leader.close()
            follower_replica.close()


async def test_a_replaced_leader_with_a_damaged_entry_cuts_it_and_fetches_it_again(tmp_path) -> None:
    """Entry 5 rots on leader A's disk while B already holds 0..9 (committed). B's next fetch
    at 5 is refused; A's re-read (checked, because the follower asked again) records the damage
    (A's election position now ends at 5), and once B leads, A as follower cuts its log at 5 and
    fetches 5..9 from B: every replica again holds every committed entry."""
    async with loopback_nats(tmp_path) as (nc, subjects):
        a = PartitionReplica("s", 0, CommitLog.open(tmp_path / "a"), SyncPolicy(), time.monotonic)
        b = PartitionReplica("s", 0, CommitLog.open(tmp_path / "b"), SyncPolicy(), time.monotonic)
        for replica in (a, b):
            replica.log.append([Record(b"value-%d" % i) for i in range(10)], 1)
            replica.log.high_watermark = 4
            replica.log.sync()
        rot_entry(tmp_path / "a", b"value-5")
        b.log.truncate(5)  # B is behind: it will ask A for 5 onwards

        async def no_report(*_: object) -> None:
            return None

        settings = FollowerSettings(0.3, 1.5, 0.5)
        a.become_leader("A", 1, 0, ("A", "B"), ("A", "B"), min_isr=1, max_lag_time=30.0, leader_timeout=3.0)
        endpoint = LeaderEndpoint(nc, subjects, a, 1 << 20)
        await endpoint.start()
        b.become_follower("A", 1)
        loop = FollowerLoop(nc, subjects, b, "B", settings, no_report)
        loop.start()
        try:
            await until(lambda: a.log.damaged_from == 5, 10, "the leader to find its damage")
            assert a.position() == (1, 5)
            await loop.stop()
            await endpoint.stop()
            b.log.append([Record(b"value-%d" % i) for i in range(5, 10)], 1)  # as B had fetched them
            a.become_follower("B", 2)
            b.become_leader("B", 2, 1, ("A", "B"), ("B",), min_isr=1, max_lag_time=30.0, leader_timeout=3.0)
            endpoint = LeaderEndpoint(nc, subjects, b, 1 << 20)
            await endpoint.start()
            loop = FollowerLoop(nc, subjects, a, "A", settings, no_report)
            loop.start()
            await until(lambda: a.log.damaged_from is None and a.log.next_offset == 10, 10, "A to fetch 5..9 again")
            assert [e.value for e in a.log.read(0, 100)] == [b"value-%d" % i for i in range(10)]
        finally:
            await loop.stop()
            await endpoint.stop()
            a.close()
            b.close()


async def test_forged_fetches_and_forged_answers_change_nothing(tmp_path) -> None:
    """Anyone on the NATS server can reach the replication subjects. A fetch without the cluster
    key's seal (or sealed with another key, or replayed) is dropped: it cannot fence the leader with
    a huge leader epoch or move its HW. An answer to a follower's fetch without the seal is no
    answer: forged entries never reach the follower's log."""
    async with loopback_nats(tmp_path) as (internal, subjects):
        nc = internal.client
        leader_replica = PartitionReplica("s", 0, CommitLog.open(tmp_path / "leader"), SyncPolicy(), time.monotonic)
        leader_replica.become_leader(
            "L", 1, 0, ("L", "F"), ("L", "F"), min_isr=1, max_lag_time=30.0, leader_timeout=3.0
        )
        leader_replica.log.append([Record(b"value-%d" % i) for i in range(5)], 1)
        endpoint = LeaderEndpoint(internal, subjects, leader_replica, 1 << 20)
        await endpoint.start()
        fetch = envelope.encode_message(
            internal_pb2.ReplicationRequest(replicaID="F", offset=-1, leaderEpoch=1),
            envelope.MsgType.REPLICATION_REQUEST,
        )
        fenced = envelope.encode_message(
            internal_pb2.ReplicationRequest(replicaID="F", offset=-1, leaderEpoch=2**62),
            envelope.MsgType.REPLICATION_REQUEST,
        )
        subject = subjects.replicate("s", 0)
        other_key = Sealer(derive_key("another cluster"))
        sealed_once = internal.sealer.seal(subject, fetch, int(time.time()))
        try:
            for forged in (fetch, fenced, other_key.seal(subject, fetch, int(time.time())), b"\x00" * 40):
                with pytest.raises(nats.errors.TimeoutError):
                    await nc.request(subject, forged, timeout=0.3)
            assert (await nc.request(subject, sealed_once, timeout=2)).data  # sealed: answered
            with pytest.raises(nats.errors.TimeoutError):
                await nc.request(subject, sealed_once, timeout=0.3)  # the same, again: a replay
            assert leader_replica.is_leader and leader_replica.leader_epoch == 1
            rejected = dict(internal.rejected)
            assert rejected[Rejection.BAD_TAG] + rejected[Rejection.MALFORMED] == 4
            assert rejected[Rejection.REPLAYED] == 1

            follower_replica = PartitionReplica("s", 0, CommitLog.open(tmp_path / "f"), SyncPolicy(), time.monotonic)
            follower_replica.become_follower("X", 1)  # a leader nobody real serves: the forger answers

            async def forge(msg) -> None:
                entries, _ = encode_entries(0, 1, [Record(b"forged")], 1)
                await nc.publish(msg.reply, replicate.encode_response(1, 0, 1.0, entries))

            forger = await nc.subscribe(subject, cb=forge)
            await endpoint.stop()  # only the forger answers now

            async def no_report(*_: object) -> None:
                return None

            loop = FollowerLoop(internal, subjects, follower_replica, "F", FollowerSettings(0.2, 30.0, 0.2), no_report)
            loop.start()
            try:

                def forged_answers() -> int:
                    return internal.rejected[Rejection.BAD_TAG] - rejected[Rejection.BAD_TAG]

                await until(lambda: forged_answers() >= 2, 10, "forged answers to be dropped")
                assert follower_replica.log.next_offset == 0
            finally:
                await loop.stop()
                await forger.unsubscribe()
                follower_replica.close()
        finally:
            await endpoint.stop()
            leader_replica.close()


async def test_a_fetch_or_epoch_query_of_another_epoch_is_told_not_leader_at_once(tmp_path) -> None:
    """During a handoff a follower's first request may reach only the old leader's endpoint: it
    answers "not leader" (so the follower asks again within a retry pause, not a request
    timeout), and a deposed leader gives no entries."""
    async with loopback_nats(tmp_path) as (internal, subjects):
        replica = PartitionReplica("s", 0, CommitLog.open(tmp_path / "leader"), SyncPolicy(), time.monotonic)
        replica.become_leader("L", 3, 0, ("L", "F"), ("L", "F"), min_isr=1, max_lag_time=30.0, leader_timeout=3.0)
        replica.log.append([Record(b"v")], 3)
        endpoint = LeaderEndpoint(internal, subjects, replica, 1 << 20)
        await endpoint.start()
        try:
            older = envelope.encode_message(internal_pb2.ReplicationRequest(replicaID="F", offset=-1, leaderEpoch=2),
                                            envelope.MsgType.REPLICATION_REQUEST)
            newer_query = envelope.encode_message(
                internal_pb2.LeaderEpochOffsetRequest(leaderEpoch=3, currentLeaderEpoch=4),
                envelope.MsgType.LEADER_EPOCH_OFFSET_REQUEST,
            )
            reply = await internal.request(subjects.replicate("s", 0), older, timeout=2)
            assert reply.data == envelope.NOT_LEADER_REPLY and replica.is_leader
            reply = await internal.request(subjects.epoch_offset("s", 0), newer_query, timeout=2)
            assert reply.data == envelope.NOT_LEADER_REPLY
            assert not replica.is_leader  # fenced by the newer epoch
        finally:
            await endpoint.stop()


async def test_a_leader_its_followers_stopped_hearing_from_acks_nothing_until_they_hear_from_it_again(tmp_path) -> None:
    """The follower stops fetching (cut off, or the leader was paused): once it could have reported
    the leader, a write is stored but not acknowledged, as a new leader may hold another message at
    its offset. The follower's fetches, echoing the leader's clock, bring the ack."""
    async with loopback_nats(tmp_path) as (nc, subjects):
        leader, endpoint, follower_replica = await leader_and_follower(tmp_path, nc, subjects, leader_timeout=1.0)

        async def no_report(*_: object) -> None:
            return None

        settings = FollowerSettings(0.3, 1.0, 0.4)
        acks: dict[bytes, tuple[int | None, BaseException | None]] = {}

        def write(value: bytes) -> None:
            leader.submit([Record(value)], lambda offset, error: acks.setdefault(value, (offset, error)))

        loop = FollowerLoop(nc, subjects, follower_replica, "F", settings, no_report)
        loop.start()
        try:
            write(b"a")
            await until(lambda: b"a" in acks, 5, "the first ack")
            assert acks[b"a"] == (0, None)
            await loop.stop()
            await asyncio.sleep(1.0)  # longer than 0.9 of the leader timeout since F last heard
            write(b"b")
            await until(lambda: leader.log.next_offset == 2, 5, "b to be stored")
            await asyncio.sleep(0.5)
            assert b"b" not in acks
            loop = FollowerLoop(nc, subjects, follower_replica, "F", settings, no_report)
            loop.start()
            await until(lambda: b"b" in acks, 5, "the ack once F vouches for the leader again")
            assert acks[b"b"] == (1, None)
            await until(lambda: follower_replica.log.next_offset == 2, 5, "F to catch up")
        finally:
            await loop.stop()
            await endpoint.stop()
            leader.close()
            follower_replica.close()


async def test_a_stranger_answering_every_request_first_does_not_stop_the_sealed_answer(tmp_path) -> None:
    """A plain NATS client answering every request on the namespace at once: its replies do not
    open and are dropped; the sealed answer that comes after them is the one the request gets. With
    only the stranger answering, the request times out (no answer), and with nobody subscribed NATS
    says so at once."""
    async with loopback_nats(tmp_path) as (internal, subjects):
        nc = internal.client
        subject = subjects.propagate
        stranger_nc = await nats.connect(nc.connected_url.geturl())

        async def stranger(msg) -> None:
            await stranger_nc.publish(msg.reply, b"x")

        async def member(msg) -> None:
            await asyncio.sleep(0.05)  # after the stranger's
            await internal.publish(msg.reply, b"sealed answer to " + msg.data)

        try:
            with pytest.raises(nats.errors.NoRespondersError):
                await internal.request(subject, b"anyone?", timeout=2)
            await stranger_nc.subscribe(subject, cb=stranger)
            await flush(stranger_nc)  # nats-py's own flush can PONG before the SUB reaches the server
            with pytest.raises(TimeoutError):
                await internal.request(subject, b"only the stranger", timeout=0.3)
            await internal.subscribe(subject, cb=member)
            await internal.flush()
            for i in range(20):
                reply = await internal.request(subject, b"question %d" % i, timeout=2)
                assert reply.data == b"sealed answer to question %d" % i
            assert internal.rejected[Rejection.MALFORMED] + internal.rejected[Rejection.BAD_TAG] >= 21
        finally:
            await stranger_nc.close()
