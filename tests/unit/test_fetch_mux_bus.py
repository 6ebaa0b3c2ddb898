"""Multiplexed fetches (bascule.partition.fetchmux) between real leader replicas and a follower node, on
the in-memory bus: fetches of one turn go as one request and each gets the reply its partition's
subject would give; replies share one message and those without room go again; a leader node
that serves none gets single requests, one that is gone does not."""

from __future__ import annotations

import asyncio
import time

import pytest
from nats.errors import NoRespondersError

from bascule.partition.fetchmux import FALLBACK_PERIOD, FetchMux, MuxEndpoint, MuxFailed
from bascule.partition.leader import LeaderEndpoint
from bascule.partition.log import CommitLog
from bascule.partition.replica import PartitionReplica, SyncPolicy
from bascule.testing.bus import MemoryBus
from bascule.wire import envelope, fetchmux, replicate
from bascule.wire.entry import Record, decode_entries
from bascule.wire.pb import internal_pb2
from bascule.wire.subjects import Subjects

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(10)]

SUBJECTS = Subjects("mux")


def fetch_request(offset: int = 0, epoch: int = 1) -> bytes:
    return envelope.encode_message(
        internal_pb2.ReplicationRequest(replicaID="F", offset=offset - 1, leaderEpoch=epoch),
        envelope.MsgType.REPLICATION_REQUEST,
    )


class Leader:
    """Node L leading partitions 0..count-1 of stream s (ISR L and F), each with its endpoint."""

    def __init__(self, tmp_path, bus: MemoryBus, count: int, serve_mux: bool = True) -> None:
        self.bus, self.node = bus, bus.node("L")
        self.replicas = []
        self.endpoints: dict[int, LeaderEndpoint] = {}
        for partition in range(count):
            replica = PartitionReplica("s", partition, CommitLog.open(tmp_path / f"p{partition}"), SyncPolicy(),
                                       time.monotonic)
            replica.become_leader("L", 1, 0, ("L", "F"), ("L", "F"), min_isr=1, max_lag_time=30.0, leader_timeout=5.0)
            self.replicas.append(replica)
            self.endpoints[partition] = LeaderEndpoint(self.node, SUBJECTS, replica, 1 << 20)
        self.mux = MuxEndpoint(self.node, SUBJECTS, "L", lambda stream, p: self.endpoints.get(p)) if serve_mux else None

    async def start(self) -> None:
        for endpoint in self.endpoints.values():
            await endpoint.start()
        if self.mux is not None:
            await self.mux.start()

    def write(self, partition: int, *values: bytes) -> None:
        self.replicas[partition].submit([Record(value) for value in values])

    def close(self) -> None:
        for replica in self.replicas:
            replica.close()


def recorded_answers(leader: Leader, partitions: list[list[int]] | None = None) -> list[int]:
    """The encoded size of each answer the leader's mux endpoint gives from now on (and into
    ``partitions``, the partitions each request named)."""
    sizes: list[int] = []
    inner = leader.mux.answers  # type: ignore[union-attr]

    def answers(items):
        if partitions is not None:
            partitions.append([item.partition for item in items])
        given = inner(items)
        sizes.append(len(fetchmux.encode_answer(given)))
        return given

    leader.mux.answers = answers  # type: ignore[union-attr,method-assign]
    return sizes


def spawn(work, name):
    return asyncio.ensure_future(work)


def follower_mux(transport, clock=time.monotonic) -> FetchMux:
    return FetchMux(transport, SUBJECTS, "F", "L", spawn, clock)


def values(reply: bytes) -> list[bytes]:
    response = replicate.decode_response(reply)
    return [entry.value for entry in decode_entries(bytes(response.entries))]


async def fetch(mux: FetchMux, partition: int, offset: int = 0) -> bytes:
    return await mux.request("s", partition, SUBJECTS.replicate("s", partition), fetch_request(offset), 2.0)


async def test_fetches_of_one_turn_go_as_one_request_and_each_gets_its_partitions_reply(tmp_path):
    bus = MemoryBus(seed=1)
    leader = Leader(tmp_path, bus, 3)
    await leader.start()
    for partition in range(3):
        leader.write(partition, b"a%d" % partition, b"b%d" % partition)
    mux = follower_mux(bus.node("F"))
    try:
        replies = await asyncio.gather(*(fetch(mux, p) for p in range(3)))
        assert [values(reply) for reply in replies] == [[b"a%d" % p, b"b%d" % p] for p in range(3)]
        assert mux.requests_sent == 1
        # As the partition's own subject answers it.
        direct = await bus.node("F").request(SUBJECTS.replicate("s", 1), fetch_request(), 2.0)
        assert values(direct.data) == values(replies[1])
        # The fetch was the follower's: the leader's HW moved to what F holds.
        await fetch(mux, 0, offset=2)
        assert leader.replicas[0].high_watermark == 1
    finally:
        leader.close()


async def test_replies_share_one_message_and_those_without_room_go_again(tmp_path):
    entry = 40 * 1024
    max_payload = 64 * 1024 + fetchmux.ANSWER_RESERVE
    bus = MemoryBus(seed=1, max_payload=max_payload)
    leader = Leader(tmp_path, bus, 3)
    await leader.start()
    for partition in range(3):
        leader.write(partition, bytes([partition]) * entry)
    sizes = recorded_answers(leader)
    mux = follower_mux(bus.node("F"))
    try:
        replies = await asyncio.gather(*(fetch(mux, p) for p in range(3)))
        assert [values(reply) for reply in replies] == [[bytes([p]) * entry] for p in range(3)]
        assert mux.requests_sent == 3  # one entry fits an answer beside nothing else
        assert len(sizes) == 3 and all(size <= max_payload for size in sizes)
    finally:
        leader.close()


async def test_what_a_partition_would_not_answer_fails_as_its_own_request_would(tmp_path):
    bus = MemoryBus(seed=1)
    leader = Leader(tmp_path, bus, 1)
    await leader.start()
    mux = follower_mux(bus.node("F"))
    try:
        with pytest.raises(NoRespondersError):  # not led here
            await mux.request("s", 5, SUBJECTS.replicate("s", 5), fetch_request(), 2.0)
        with pytest.raises(TimeoutError):  # garbage: the partition's endpoint drops it unanswered
            await mux.request("s", 0, SUBJECTS.replicate("s", 0), b"\x00junk", 2.0)
        stale = await mux.request("s", 0, SUBJECTS.replicate("s", 0), fetch_request(epoch=7), 2.0)
        assert stale == envelope.NOT_LEADER_REPLY
    finally:
        leader.close()


async def test_a_garbled_answer_fails_each_of_its_fetches(tmp_path):
    bus = MemoryBus(seed=1)
    answering = bus.node("L")

    async def garble(msg) -> None:
        await answering.publish(msg.reply, b"\x00garbage")

    await answering.subscribe(SUBJECTS.fetch_mux("L"), cb=garble)
    mux = follower_mux(bus.node("F"))
    outcomes = await asyncio.gather(fetch(mux, 0), fetch(mux, 1), return_exceptions=True)
    assert all(isinstance(outcome, MuxFailed) for outcome in outcomes)


class NoResponders:
    """The follower's transport to a nats-server on which nobody takes the multiplexed subject: such a
    request fails at once, as nats-py's does; the rest goes over the bus."""

    def __init__(self, transport) -> None:
        self.transport = transport
        self.max_payload = transport.max_payload

    async def request(self, subject: str, payload: bytes, timeout: float):
        if subject == SUBJECTS.fetch_mux("L"):
            raise NoRespondersError
        return await self.transport.request(subject, payload, timeout)


async def test_a_leader_node_without_multiplexed_fetches_gets_single_ones_for_a_while(tmp_path):
    bus = MemoryBus(seed=1)
    leader = Leader(tmp_path, bus, 2, serve_mux=False)  # an earlier version
    await leader.start()
    leader.write(0, b"zero")
    leader.write(1, b"one")
    now = [100.0]
    mux = follower_mux(NoResponders(bus.node("F")), clock=lambda: now[0])
    try:
        assert [values(r) for r in await asyncio.gather(fetch(mux, 0), fetch(mux, 1))] == [[b"zero"], [b"one"]]
        assert values(await fetch(mux, 1)) == [b"one"]
        assert mux.requests_sent == 1
        now[0] += FALLBACK_PERIOD
        assert values(await fetch(mux, 0)) == [b"zero"]
        assert mux.requests_sent == 2  # tried again
    finally:
        leader.close()


class Restarting:
    """The follower's transport to a nats-server while node L is gone (dead, restarting): nothing takes
    its subjects, and each request fails at once; once it is ``back``, requests go over the bus."""

    def __init__(self, transport) -> None:
        self.transport = transport
        self.max_payload = transport.max_payload
        self.back = False
        self.subjects: list[str] = []  # of the requests made while L was gone

    async def request(self, subject: str, payload: bytes, timeout: float):
        if self.back:
            return await self.transport.request(subject, payload, timeout)
        self.subjects.append(subject)
        raise NoRespondersError


async def test_a_leader_node_gone_fails_the_fetches_and_is_fetched_multiplexed_once_back(tmp_path):
    bus = MemoryBus(seed=1)
    leader = Leader(tmp_path, bus, 2)
    await leader.start()
    leader.write(0, b"zero")
    transport = Restarting(bus.node("F"))
    mux = follower_mux(transport, clock=lambda: 100.0)  # no fallback period could end
    try:
        for _ in range(2):
            outcomes = await asyncio.gather(fetch(mux, 0), fetch(mux, 1), return_exceptions=True)
            assert all(isinstance(outcome, NoRespondersError) for outcome in outcomes)
        # Each time the multiplexed request, then one fetch singly to tell a dead node from an earlier version.
        assert transport.subjects == [SUBJECTS.fetch_mux("L"), SUBJECTS.replicate("s", 0)] * 2
        transport.back = True
        assert values(await fetch(mux, 0)) == [b"zero"]
        assert mux.requests_sent == 3
    finally:
        leader.close()


async def test_a_not_the_leader_answer_to_the_single_fetch_keeps_the_multiplexed_path(tmp_path):
    """An answer of another epoch's endpoint tells nothing of the node asked: another leader's, or a
    leadership handed over."""
    bus = MemoryBus(seed=1)
    leader = Leader(tmp_path, bus, 2, serve_mux=False)
    await leader.start()
    mux = follower_mux(NoResponders(bus.node("F")), clock=lambda: 100.0)
    stale = fetch_request(epoch=7)
    try:
        outcomes = await asyncio.gather(
            *(mux.request("s", p, SUBJECTS.replicate("s", p), stale, 2.0) for p in range(2)), return_exceptions=True
        )
        assert outcomes[0] == envelope.NOT_LEADER_REPLY and isinstance(outcomes[1], NoRespondersError)
        assert await mux.request("s", 1, SUBJECTS.replicate("s", 1), stale, 2.0) == envelope.NOT_LEADER_REPLY
        assert mux.requests_sent == 2  # multiplexed again
    finally:
        leader.close()


async def test_a_fetch_withdrawn_before_its_turn_ends_leaves_the_request(tmp_path):
    bus = MemoryBus(seed=1)
    leader = Leader(tmp_path, bus, 2)
    await leader.start()
    seen: list[list[int]] = []
    recorded_answers(leader, seen)
    mux = follower_mux(bus.node("F"))
    try:
        withdrawn = asyncio.ensure_future(fetch(mux, 0))
        kept = asyncio.ensure_future(fetch(mux, 1))
        await asyncio.sleep(0)  # both wait in the mux now
        withdrawn.cancel()
        await kept
        assert seen == [[1]]
    finally:
        leader.close()
