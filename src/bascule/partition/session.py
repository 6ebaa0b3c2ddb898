"""Fetch sessions over NATS (or any ``Transport``): one request per round for every caught-up
partition a follower node shares with a leader node (the rules: ``partition.replication.session``).

A follower loop whose machine is caught up parks here instead of fetching again after its idle
wait; its ``wake`` event is set when the round brings news for it, when a round fails (its
machine then takes over: it fetches on its own, and reports a silent leader), or by the leader's
notification, as before. An idle partition so costs its nodes one item of a round per idle wait,
instead of a sealed request and reply each; and rounds are incremental: after a session's first,
an idle partition costs nothing in a round but its session's place in the leader's memory.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from nats.errors import Error as NatsError

from bascule.natsio.transport import Transport, TransportMessage, TransportSubscription
from bascule.partition.replica import PartitionReplica
from bascule.partition.replication.session import MAX_SESSIONS_PER_FOLLOWER, HeldSessions, SessionRounds
from bascule.wire import sessions
from bascule.wire.envelope import EnvelopeError
from bascule.wire.sessions import ParkedItem
from bascule.wire.subjects import Subjects

log = logging.getLogger(__name__)

# Starts a session's rounds under their owner (the server's task group); sends a notification.
StartTask = Callable[[Coroutine[Any, Any, None], str], object]
# After a round goes unanswered, this many rounds go as the previous version's full rounds (type 102),
# which a leader node of either version answers: one of the previous version drops rounds it cannot
# read. About a minute at the default idle wait; then incremental rounds are tried again.
LEGACY_ROUNDS = 64


def random_session_id() -> int:
    """A session id no other session of any process is likely ever to have (64 random bits)."""
    return secrets.randbits(64)


@dataclass(eq=False)
class Lane:
    """One session of a node pair, and the loops parked in its slots."""

    rounds: SessionRounds
    parked: dict[int, Parked] = field(default_factory=dict)


@dataclass(eq=False)
class Parked:
    item: ParkedItem
    wake: asyncio.Event
    lane: Lane | None  # None: no session had room for it
    slot: int
    # Set as it unparks: (when the follower heard, leader's clock reading) of the newest round
    # answered (``FetchSession.contact``): the leader was alive, as a caught-up fetch reply would have said.
    contact: tuple[float, float] | None = None
    failed: bool = False  # a round carrying it went unanswered


class FetchSession:
    """The follower side of one node pair: the partitions parked for one leader node, in sessions
    of at most ``wire.sessions.MAX_ITEMS`` items and one message's worth of bytes each (``Lane``),
    at most ``MAX_SESSIONS_PER_FOLLOWER`` of them."""

    def __init__(
        self, nc: Transport, subjects: Subjects, server_id: str, leader: str, interval: float,
        request_timeout: float, clock: Callable[[], float], new_session_id: Callable[[], int] = random_session_id,
    ) -> None:
        self.nc = nc
        self.subject = subjects.fetch_session(leader)
        self.server_id = server_id
        self.leader = leader
        self.interval = interval
        self.request_timeout = request_timeout
        self.clock = clock
        self.new_session_id = new_session_id
        self._lanes: list[Lane] = []
        # (when this node heard, the leader's clock reading) of the newest round answered: contact for
        # every item parked, as the next round echoes its reading for all of them (an item parked while
        # the round was on its way too: it must not report the leader before that echo allows, the
        # leader's lease). A later contact only ever delays a report.
        self.contact: tuple[float, float] | None = None
        self._legacy_rounds = 0  # left to send in the previous version's format (LEGACY_ROUNDS)
        self.rounds = 0

    def park(self, item: ParkedItem, wake: asyncio.Event) -> Parked:
        """Park ``item``, to be woken by ``wake``. When every session is full (or the item alone
        would not fit a round) it is handed back to its machine at once, as by a failed round: it
        waits and fetches on its own, as before sessions."""
        lane = next((lane for lane in self._lanes if lane.rounds.fits(item)), None)
        if lane is None and len(self._lanes) < MAX_SESSIONS_PER_FOLLOWER:
            budget = sessions.items_budget(self.nc.max_payload)
            lane = Lane(SessionRounds(self.server_id, self.new_session_id(), budget))
            self._lanes.append(lane)
        if lane is None or not lane.rounds.fits(item):
            wake.set()
            return Parked(item, wake, None, -1, failed=True)
        slot = lane.rounds.park(item)
        parked = lane.parked[slot] = Parked(item, wake, lane, slot)
        return parked

    def unpark(self, parked: Parked) -> None:
        lane = parked.lane
        if lane is not None and lane.parked.get(parked.slot) is parked:
            del lane.parked[parked.slot]
            lane.rounds.unpark(parked.slot)
            parked.contact = self.contact

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            legacy = self._legacy_rounds > 0
            self._legacy_rounds -= legacy
            await asyncio.gather(*(self._round(lane, legacy) for lane in self._lanes))

    async def _round(self, lane: Lane, legacy: bool) -> None:
        echo = self.contact[1] if self.contact else 0.0
        if legacy:
            await self._legacy_round(lane, echo)
            return
        round_ = lane.rounds.next_round(echo)
        if round_ is None:
            return
        try:
            reply = await self.nc.request(
                self.subject, sessions.encode_session_round(round_), timeout=self.request_timeout
            )
        except (TimeoutError, NatsError) as exc:
            self._legacy_rounds = LEGACY_ROUNDS
            self._fail(lane, exc)
            return
        try:
            answer = sessions.decode_session_answer(reply.data)
            if answer.news is None:
                raise ValueError(f"round {round_.number} of session {round_.session} refused")
            lane.rounds.answered(answer.news)
        except ValueError as exc:  # EnvelopeError among them
            self._fail(lane, exc)
            return
        self._answered(answer.leader_time, [lane.parked.get(slot) for slot in answer.news])

    async def _legacy_round(self, lane: Lane, echo: float) -> None:
        chunk = list(lane.parked.values())
        if not chunk:
            return
        request = sessions.encode_round(self.server_id, echo, [parked.item for parked in chunk])
        try:
            reply = await self.nc.request(self.subject, request, timeout=self.request_timeout)
            answer = sessions.decode_reply(reply.data, len(chunk))
        except (TimeoutError, NatsError, EnvelopeError) as exc:
            self._fail(lane, exc)
            return
        self._answered(answer.leader_time, [chunk[index] for index in answer.news])

    def _fail(self, lane: Lane, why: Exception) -> None:
        """No answer, or not one to take: hand every item of the session back to its machine, and
        start the session again (a full round, a new id)."""
        log.debug("fetch session round to %s failed: %r", self.leader, why)
        for parked in lane.parked.values():
            parked.failed = True
            parked.wake.set()
        lane.rounds.end(self.new_session_id())

    def _answered(self, leader_time: float, news: list[Parked | None]) -> None:
        self.rounds += 1
        contact = (self.clock(), leader_time)
        if self.contact is None or contact[1] >= self.contact[1]:
            self.contact = contact
        for parked in news:
            if parked is not None:  # None: it left its slot since
                parked.wake.set()


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
        self.held = HeldSessions()
        self._subscription: TransportSubscription | None = None

    async def start(self) -> None:
        self._subscription = await self.nc.subscribe(self.subject, cb=self._on_round)

    async def _on_round(self, msg: TransportMessage) -> None:
        if not msg.reply:
            return
        try:
            request = sessions.decode_request(msg.data)
        except EnvelopeError as exc:
            log.warning("dropping malformed fetch session round on %s: %s", msg.subject, exc)
            return
        if isinstance(request, sessions.Round):  # a follower node of the previous version
            indexes = self._news(request.follower, request.leader_time, dict(enumerate(request.items)))
            await self.nc.publish(msg.reply, sessions.encode_reply(self.clock(), indexes))
            return
        items = self.held.take(request)
        if items is None:
            log.debug("refusing round %d of %s's session %d", request.number, request.follower, request.session)
        news = None if items is None else self._news(request.follower, request.leader_time, items)
        await self.nc.publish(msg.reply, sessions.encode_session_answer(self.clock(), news))

    def _news(self, follower: str, leader_time: float, items: Mapping[int, ParkedItem]) -> list[int]:
        """Each item as the fetch it stands for; the keys of those that must fetch on their own, ascending."""
        return sorted(key for key, item in items.items() if self._must_fetch(follower, leader_time, item))

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
            for chunk in fitting(list(partitions), self.nc.max_payload):
                notification = sessions.encode_notifications(chunk)
                self.spawn(self.nc.publish(self.subjects.notify(follower), notification), "notify")


def fitting(partitions: list[tuple[str, int]], max_payload: int) -> list[list[tuple[str, int]]]:
    """``partitions`` in order, cut into runs that each fit one notification of ``max_payload``
    bytes and ``sessions.MAX_ITEMS`` items."""
    budget = max_payload - sessions.ROUND_OVERHEAD
    chunks: list[list[tuple[str, int]]] = [[]]
    size = 0
    for key in partitions:
        cost = sessions.item_size(key[0])
        if chunks[-1] and (size + cost > budget or len(chunks[-1]) == sessions.MAX_ITEMS):
            chunks.append([])
            size = 0
        chunks[-1].append(key)
        size += cost
    return chunks
