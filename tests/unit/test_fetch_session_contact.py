"""A fetch session's rounds and what they tell the parked items (bascule.partition.session), on the
in-memory bus: an answered round is contact for every parked item, a failed one wakes its items;
and a leader node's notifications."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from bascule.partition.session import FetchSession, Notifications
from bascule.testing.bus import MemoryBus
from bascule.wire import sessions
from bascule.wire.sessions import ParkedItem
from bascule.wire.subjects import Subjects

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(10)]

SUBJECTS = Subjects("contact")


def item(partition: int) -> ParkedItem:
    return ParkedItem("s", partition, 1, 5, 4)


async def test_an_item_parked_while_a_round_is_on_its_way_takes_its_answer_as_contact() -> None:
    """The next round echoes the answer's leader time for every parked item: an item parked after
    the round left must not report the leader before that echo allows, so it takes the contact too."""
    bus = MemoryBus(seed=1)
    leader, follower = bus.node("L"), bus.node("F")
    asked, answer = asyncio.Event(), asyncio.Event()

    async def on_round(msg) -> None:
        round_ = sessions.decode_round(msg.data)
        assert [i.partition for i in round_.items] == [0]
        asked.set()
        await answer.wait()
        await leader.publish(msg.reply, sessions.encode_reply(7.5, []))

    await leader.subscribe(SUBJECTS.fetch_session("L"), cb=on_round)
    session = FetchSession(follower, SUBJECTS, "F", "L", interval=0.01, request_timeout=5.0, clock=lambda: 42.0)
    first = session.park(item(0), asyncio.Event())
    rounds = asyncio.create_task(session.run())
    try:
        await asyncio.wait_for(asked.wait(), 5)
        second = session.park(item(1), asyncio.Event())  # after the round left
        answer.set()
        for _ in range(500):
            if session.rounds:
                break
            await asyncio.sleep(0.01)
        assert first.contact == second.contact == (42.0, 7.5)
        assert not first.wake.is_set() and not second.wake.is_set()
    finally:
        rounds.cancel()


async def test_a_round_without_an_answer_wakes_its_items_as_failed() -> None:
    bus = MemoryBus(seed=1)
    follower = bus.node("F")  # nobody answers for L
    session = FetchSession(follower, SUBJECTS, "F", "L", interval=0.01, request_timeout=0.05, clock=lambda: 1.0)
    parked = session.park(item(0), asyncio.Event())
    rounds = asyncio.create_task(session.run())
    try:
        await asyncio.wait_for(parked.wake.wait(), 5)
        assert parked.failed and parked.contact is None
    finally:
        rounds.cancel()


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
    for _ in range(100):
        if received:
            break
        await asyncio.sleep(0.01)
    assert received == [[("s", 0), ("s", 1), ("s", 2)]]
