"""Fetch sessions over NATS (or any ``Transport``): one request per round for every caught-up
partition a follower node shares with a leader node (the rule: ``partition.replication.session``).

A follower loop whose machine is caught up parks here instead of fetching again after its idle
wait; its ``wake`` event is set when the round brings news for it, when a round fails (its
machine then takes over: it fetches on its own, and reports a silent leader), or by the leader's
notification, as before. An idle partition so costs its nodes one item of a round per idle wait,
instead of a sealed request and reply each.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from nats.errors import Error as NatsError

from bascule.natsio.transport import Transport, TransportMessage, TransportSubscription
from bascule.partition.replica import PartitionReplica
from bascule.wire import sessions
from bascule.wire.envelope import EnvelopeError
from bascule.wire.sessions import ParkedItem
from bascule.wire.subjects import Subjects

log = logging.getLogger(__name__)
T = TypeVar("T")

# What a round or a notification holds beyond its items' streams' names: the envelope, msgpack,
# the follower id (at most), and each item's integers.
ROUND_OVERHEAD = 1024
ITEM_OVERHEAD = 48

# Starts a session's rounds under their owner (the server's task group); sends a notification.
StartTask = Callable[[Coroutine[Any, Any, None], str], object]


@dataclass(eq=False)
class Parked:
    item: ParkedItem
    wake: asyncio.Event
    # (when the follower heard, leader's clock reading) of the newest round answered since it
    # parked: the leader was alive, as a caught-up fetch reply would have said.
    contact: tuple[float, float] | None = None
    failed: bool = False  # a round carrying it went unanswered


class FetchSession:
    """The follower side of one node pair: the partitions parked for one leader node."""

    def __init__(
        self, nc: Transport, subjects: Subjects, server_id: str, leader: str, interval: float,
        request_timeout: float, clock: Callable[[], float],
    ) -> None:
        self.nc = nc
        self.subject = subjects.fetch_session(leader)
        self.server_id = server_id
        self.leader = leader
        self.interval = interval
        self.request_timeout = request_timeout
        self.clock = clock
        self._parked: dict[Parked, None] = {}  # in parking order
        self._contact: tuple[float, float] | None = None
        self.rounds = 0

    def park(self, item: ParkedItem, wake: asyncio.Event) -> Parked:
        # The newest contact goes with it: its echo in the next round claims no more than that.
        parked = Parked(item, wake, self._contact)
        self._parked[parked] = None
        return parked

    def unpark(self, parked: Parked) -> None:
        self._parked.pop(parked, None)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            if self._parked:
                chunks = fitting(list(self._parked), lambda parked: parked.item.stream, self.nc.max_payload)
                await asyncio.gather(*(self._round(chunk) for chunk in chunks))


    async def _round(self, chunk: list[Parked]) -> None:
        echo = self._contact[1] if self._contact else 0.0
        request = sessions.encode_round(self.server_id, echo, [parked.item for parked in chunk])
        try:
            reply = await self.nc.request(self.subject, request, timeout=self.request_timeout)
            answer = sessions.decode_reply(reply.data, len(chunk))
        except (TimeoutError, NatsError, EnvelopeError) as exc:
            log.debug("fetch session round to %s failed: %r", self.leader, exc)
            for parked in chunk:
                parked.failed = True
                parked.wake.set()
            return
        self.rounds += 1
        contact = (self.clock(), answer.leader_time)
        if self._contact is None or contact[1] >= self._contact[1]:
            self._contact = contact
        # Every parked item, not only this round's: the next round echoes this reading for all of
        # them, and an item parked while this one was on its way must not report the leader before
        # the echo allows (its lease). A later contact only ever delays a report.
        for parked in self._parked:
            if parked.contact is None or parked.contact[1] < contact[1]:
                parked.contact = contact
        for index in answer.news:
            chunk[index].wake.set()


class FetchSessions:
    """This node's fetch sessions as a follower, one per leader node, each with its rounds' task."""

    def __init__(self, new_session: Callable[[str], FetchSession], start_task: StartTask) -> None:
        self.new_session = new_session  # the session to a leader node, by its server id
        self.start_task = start_task
        self._sessions: dict[str, FetchSession] = {}

    def to(self, leader: str) -> FetchSession:
        session = self._sessions.get(leader)
        if session is None:
            session = self._sessions[leader] = self.new_session(leader)
            self.start_task(session.run(), f"fetch session to {leader}")
        return session


class SessionEndpoint:
    """The leader side: answers the rounds of every follower node, item by item."""

    def __init__(
        self, nc: Transport, subjects: Subjects, server_id: str,
        replica: Callable[[str, int], PartitionReplica | None], clock: Callable[[], float],
    ) -> None:
        self.nc = nc
        self.subject = subjects.fetch_session(server_id)
        self.replica = replica
        self.clock = clock
        self._subscription: TransportSubscription | None = None

    async def start(self) -> None:
        self._subscription = await self.nc.subscribe(self.subject, cb=self._on_round)

    async def _on_round(self, msg: TransportMessage) -> None:
        if not msg.reply:
            return
        try:
            round_ = sessions.decode_round(msg.data)
        except EnvelopeError as exc:
            log.warning("dropping malformed fetch session round on %s: %s", msg.subject, exc)
            return
        news = [
            index for index, item in enumerate(round_.items)
            if self._must_fetch(round_.follower, round_.leader_time, item)
        ]
        await self.nc.publish(msg.reply, sessions.encode_reply(self.clock(), news))

    def _must_fetch(self, follower: str, leader_time: float, item: ParkedItem) -> bool:
        replica = self.replica(item.stream, item.partition)
        if replica is None or not replica.serves_epoch(item.leader_epoch):
            return True
        return replica.serve_parked(follower, item.offset, item.hw, item.leader_epoch, leader_time)


class Notifications:
    """The leader side's wake-ups for waiting followers: every partition notified in one turn of
    the loop goes to each follower node in one message (chunked to fit one)."""

    def __init__(self, nc: Transport, subjects: Subjects, spawn: StartTask) -> None:
        self.nc = nc
        self.subjects = subjects
        self.spawn = spawn
        # Follower node -> the partitions to wake there, in order. Bound: one entry per (follower
        # node, partition led here), kept once however often it is notified, and emptied by the
        # next turn of the loop (``_send``, scheduled with the first entry).
        self._pending: dict[str, dict[tuple[str, int], None]] = {}

    def notify(self, replica: PartitionReplica, followers: list[str]) -> None:
        if followers and not self._pending:
            asyncio.get_running_loop().call_soon(self._send)
        for follower in followers:
            self._pending.setdefault(follower, {})[replica.stream, replica.partition] = None

    def _send(self) -> None:
        pending, self._pending = self._pending, {}
        for follower, partitions in pending.items():
            for chunk in fitting(list(partitions), lambda key: key[0], self.nc.max_payload):
                notification = sessions.encode_notifications(chunk)
                self.spawn(self.nc.publish(self.subjects.notify(follower), notification), "notify")


def fitting(items: list[T], stream: Callable[[T], str], max_payload: int) -> list[list[T]]:
    """``items`` in order, cut into runs that each fit one message of ``max_payload`` bytes and
    ``sessions.MAX_ITEMS`` items."""
    budget = max_payload - ROUND_OVERHEAD
    chunks: list[list[T]] = [[]]
    size = 0
    for item in items:
        cost = len(stream(item).encode()) + ITEM_OVERHEAD
        if chunks[-1] and (size + cost > budget or len(chunks[-1]) == sessions.MAX_ITEMS):
            chunks.append([])
            size = 0
        chunks[-1].append(item)
        size += cost
    return chunks
