"""A fetch session's rounds and what they tell the parked items (bascule.partition.session), on the
in-memory bus: an answered round is contact for every parked item, a failed or refused one wakes its
items and the session starts again with a full round, a leader node of the previous version gets
its full rounds; and a leader node's notifications."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from bascule.partition.replication.session import MAX_SESSIONS_PER_FOLLOWER
from bascule.partition.session import FetchSession, Notifications
from bascule.testing.bus import MemoryBus
from bascule.wire import sessions
from bascule.wire.envelope import MsgType, decode
from bascule.wire.sessions import ParkedItem
from bascule.wire.subjects import Subjects

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(10)]

SUBJECTS = Subjects("contact")


def item(partition: int) -> ParkedItem:
    return ParkedItem("s", partition, 1, 5, 4)


def session_on(bus: MemoryBus, request_timeout: float = 5.0) -> FetchSession:
    ids = iter(range(1, 1000))
    return FetchSession(
        bus.node("F"), SUBJECTS, "F", "L", interval=0.01, request_timeout=request_timeout, clock=lambda: 42.0,
        new_session_id=lambda: next(ids),
    )


async def eventually(predicate, what: str) -> None:
    for _ in range(500):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def test_an_item_parked_while_a_round_is_on_its_way_takes_its_answer_as_contact() -> None:
    """The next round echoes the answer's leader time for every parked item: an item parked after
    the round left must not report the leader before that echo allows, so it takes the contact too."""
    bus = MemoryBus(seed=1)
    leader = bus.node("L")
    asked, answer = asyncio.Event(), asyncio.Event()

    async def on_round(msg) -> None:
        round_ = sessions.decode_session_round(msg.data)
        assert [i.partition for _, i in round_.upserts] == [0]
        asked.set()
        await answer.wait()
        await leader.publish(msg.reply, sessions.encode_session_answer(7.5, []))

    await leader.subscribe(SUBJECTS.fetch_session("L"), cb=on_round)
    session = session_on(bus)
    first = session.park(item(0), asyncio.Event())
    rounds = asyncio.create_task(session.run())
    try:
        await asyncio.wait_for(asked.wait(), 5)
        second = session.park(item(1), asyncio.Event())  # after the round left
        answer.set()
        await eventually(lambda: session.rounds, "the answer")
        session.unpark(first)
        session.unpark(second)
        assert first.contact == second.contact == (42.0, 7.5)
        assert not first.wake.is_set() and not second.wake.is_set()
    finally:
        rounds.cancel()


async def test_a_round_without_an_answer_wakes_its_items_as_failed() -> None:
    bus = MemoryBus(seed=1)  # nobody answers for L
    session = session_on(bus, request_timeout=0.05)
    parked = session.park(item(0), asyncio.Event())
    rounds = asyncio.create_task(session.run())
    try:
        await asyncio.wait_for(parked.wake.wait(), 5)
        session.unpark(parked)
        assert parked.failed and parked.contact is None
    finally:
        rounds.cancel()


async def test_a_refused_round_wakes_its_items_and_the_session_starts_again_in_full() -> None:
    """The leader no longer holds the session (it restarted, say): the items fetch on their own,
    and the next round is round 0 of a new session, carrying every item parked."""
    bus = MemoryBus(seed=1)
    leader = bus.node("L")
    seen: list[sessions.SessionRound] = []

    async def on_round(msg) -> None:
        round_ = sessions.decode_session_round(msg.data)
        seen.append(round_)
        refused = len(seen) == 2  # the second round: as a leader that restarted since the first
        await leader.publish(msg.reply, sessions.encode_session_answer(1.0, None if refused else []))

    await leader.subscribe(SUBJECTS.fetch_session("L"), cb=on_round)
    session = session_on(bus)
    parked = session.park(item(0), asyncio.Event())
    rounds = asyncio.create_task(session.run())
    try:
        await asyncio.wait_for(parked.wake.wait(), 5)
        assert parked.failed
        session.unpark(parked)
        again = session.park(item(0), asyncio.Event())
        await eventually(lambda: len(seen) >= 3, "the round after")
        assert [(r.session, r.number) for r in seen[:3]] == [(1, 0), (1, 1), (2, 0)]
        assert seen[2].upserts == [(again.slot, item(0))]
    finally:
        rounds.cancel()


async def test_after_an_unanswered_round_a_leader_of_the_previous_version_gets_its_full_rounds() -> None:
    """A leader node of the previous version drops incremental rounds: after one goes unanswered the
    session sends full rounds of type 102, whose reply it takes as before."""
    bus = MemoryBus(seed=1)
    leader = bus.node("L")
    kinds: list[MsgType] = []

    async def previous_version(msg) -> None:
        kind, _ = decode(msg.data)
        kinds.append(kind)
        if kind == MsgType.FETCH_SESSION_REQUEST:
            round_ = sessions.decode_round(msg.data)
            await leader.publish(msg.reply, sessions.encode_reply(3.0, [len(round_.items) - 1]))

    await leader.subscribe(SUBJECTS.fetch_session("L"), cb=previous_version)
    session = session_on(bus, request_timeout=0.3)  # the first round's, unanswered; the others' answers come at once
    failing = session.park(item(0), asyncio.Event())
    rounds = asyncio.create_task(session.run())
    try:
        await asyncio.wait_for(failing.wake.wait(), 5)
        session.unpark(failing)
        kept, news = session.park(item(1), asyncio.Event()), session.park(item(2), asyncio.Event())
        await asyncio.wait_for(news.wake.wait(), 5)
        assert not news.failed and not kept.wake.is_set()
        assert kinds[:2] == [MsgType.FETCH_SESSION_ROUND, MsgType.FETCH_SESSION_REQUEST]
        assert session.contact == (42.0, 3.0)
    finally:
        rounds.cancel()


async def test_a_follower_node_parks_at_most_its_sessions_worth_of_items() -> None:
    """Each session holds what one round's message fits; past MAX_SESSIONS_PER_FOLLOWER sessions a
    partition is handed back to its machine at once, as by a failed round (it waits on its own)."""
    per_session = 3
    max_payload = sessions.ROUND_OVERHEAD + sessions.MAX_ITEMS * sessions.EMPTIED_SLOT_SIZE
    bus = MemoryBus(seed=1, max_payload=max_payload + per_session * sessions.item_size("s"))
    session = session_on(bus)
    parked = [session.park(item(p), asyncio.Event()) for p in range(MAX_SESSIONS_PER_FOLLOWER * per_session)]
    assert not any(p.failed or p.wake.is_set() for p in parked)
    assert len({p.lane.rounds.session for p in parked if p.lane is not None}) == MAX_SESSIONS_PER_FOLLOWER
    no_room = session.park(item(10_000), asyncio.Event())
    assert no_room.lane is None and no_room.failed and no_room.wake.is_set()
    session.unpark(no_room)
    session.unpark(parked[0])
    room = session.park(item(10_000), asyncio.Event())
    assert room.lane is parked[0].lane and not room.failed


async def test_notifications_keep_each_partition_once_per_follower_node_and_go_in_the_next_turn() -> None:
    """Their bound: one entry per (follower node, partition), however often it is notified in a
    turn, and nothing pending once the turn's messages went."""
    bus = MemoryBus(seed=1)
    leader, follower = bus.node("L"), bus.node("F")
    received: list[list[tuple[str, int]]] = []

    async def on_notification(msg) -> None:
        received.append(sessions.decode_notifications(msg.data))

    await follower.subscribe(SUBJECTS.notify("F"), cb=on_notification)
    spawned: list[asyncio.Task] = []
    notifications = Notifications(leader, SUBJECTS, lambda work, name: spawned.append(asyncio.create_task(work)))
    replicas = [SimpleNamespace(stream="s", partition=p) for p in range(3)]
    for _ in range(100):
        for replica in replicas:
            notifications.notify(replica, ["F"])  # type: ignore[arg-type]
    notifications.notify(replicas[0], [])  # type: ignore[arg-type]
    assert sum(len(partitions) for partitions in notifications._pending.values()) == 3
    await asyncio.sleep(0)
    assert notifications._pending == {}
    await asyncio.gather(*spawned)
    await eventually(lambda: received, "the notification")
    assert received == [[("s", 0), ("s", 1), ("s", 2)]]
