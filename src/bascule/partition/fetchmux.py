"""Multiplexed fetches over NATS (or any ``Transport``): the fetch requests a follower node's loops
make of one leader node in one event-loop turn go as one request, answered by one message
(``wire.fetchmux``), as Kafka's fetcher carries every partition a broker pair shares.

It is transport only: each item is the very request a fetch sends on its partition's replicate
subject, answered by that partition's ``LeaderEndpoint`` as the subject would be; the machines on
both sides see single fetches. One request of a node pair is under way at a time, as Kafka's fetcher
keeps one: the fetches made meanwhile go together once it is answered. Partitions written at once
(a notification wakes their followers in one turn) so cost their nodes a request and a reply or two
instead of one each; a leader serves an answer's items in order within one message, and those left
without room go in the next request.

A leader node with no responder for multiplexed fetches runs an earlier version, or is gone (dead,
restarting): one of the fetches sent singly tells which. One that answers it (an earlier version) gets
single requests from this follower node for ``FALLBACK_PERIOD``, then is tried again; to one that does
not, the fetches fail and the next go multiplexed, a request for all of its followers' fetches.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from nats.errors import NoRespondersError

from bascule.natsio.transport import Transport, TransportMessage
from bascule.partition.leader import RESPONSE_OVERHEAD, LeaderEndpoint, NoRoom
from bascule.wire import fetchmux
from bascule.wire.envelope import NOT_LEADER_REPLY, EnvelopeError
from bascule.wire.fetchmux import Code, MuxItem
from bascule.wire.subjects import Subjects

log = logging.getLogger(__name__)

# How long a follower node sends single fetches to a leader node that answers them but had no responder
# for its multiplexed ones: long beside a fetch, short beside an upgrade.
FALLBACK_PERIOD = 5.0
# A reply is served only with this much room left in an answer: a smaller one would hold next to
# nothing, or cut an entry into pieces that would fit whole in the next request.
MIN_ROOM = 4096

# Starts a one-shot task of the node (``Tasks.spawn``); None once the node is closing.
Spawn = Callable[[Coroutine[Any, Any, None], str], "asyncio.Task[Any] | None"]


class MuxFailed(Exception):
    """A multiplexed answer that cannot be read: each of its items failed, as a garbled reply."""


@dataclass(eq=False)
class _Waiting:
    item: MuxItem
    subject: str  # the partition's replicate subject, for a single request
    timeout: float
    reply: asyncio.Future[bytes] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class FetchMux:
    """The follower side of one node pair: the fetches made while a request is under way go together
    once it is answered (those of one turn, when none is)."""

    def __init__(
        self, nc: Transport, subjects: Subjects, server_id: str, leader: str, spawn: Spawn,
        clock: Callable[[], float],
    ) -> None:
        self.nc = nc
        self.subject = subjects.fetch_mux(leader)
        self.server_id = server_id
        self.leader = leader
        self.spawn = spawn
        self.clock = clock
        # At most one request of each follower loop of this pair waits here: bounded by the partitions.
        self._waiting: list[_Waiting] = []
        self._scheduled = False
        self._in_flight = 0  # requests sent and not yet answered
        self._single_until = float("-inf")  # until then, the leader node gets single requests
        self.requests_sent = 0  # multiplexed requests, for tests and metrics

    async def request(self, stream: str, partition: int, subject: str, payload: bytes, timeout: float) -> bytes:
        """The reply to fetch request ``payload`` for ``stream``/``partition`` (whose replicate subject is
        ``subject``); raises TimeoutError or the transport's errors as a single request would."""
        if self.clock() < self._single_until:
            return (await self.nc.request(subject, payload, timeout)).data
        waiting = _Waiting(MuxItem(stream, partition, payload), subject, timeout)
        self._waiting.append(waiting)
        self._schedule()
        return await waiting.reply

    def _schedule(self) -> None:
        """The waiting fetches go after this turn's others, once no request is under way."""
        if self._waiting and not self._scheduled and not self._in_flight:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._go)

    def _go(self) -> None:
        self._scheduled = False
        waiting = [entry for entry in self._waiting if not entry.reply.done()]  # withdrawn ones leave
        self._waiting = []
        if self.clock() < self._single_until:
            self._singly(waiting)
            return
        for chunk in fetchmux.requests_of(waiting, lambda entry: entry.item, self.nc.max_payload):
            self._in_flight += 1
            if self.spawn(self._send(chunk), f"fetches of {len(chunk)} to {self.leader}") is None:
                self._in_flight -= 1
                for entry in chunk:
                    entry.reply.cancel()

    async def _send(self, chunk: list[_Waiting]) -> None:
        try:
            await self._carry(chunk)
        finally:
            self._in_flight -= 1
            self._schedule()

    async def _carry(self, chunk: list[_Waiting]) -> None:
        request = fetchmux.encode_request(self.server_id, [entry.item for entry in chunk])
        timeout = min(entry.timeout for entry in chunk)
        self.requests_sent += 1
        try:
            reply = await self.nc.request(self.subject, request, timeout)
        except NoRespondersError:
            await self._probe(chunk)
            return
        except Exception as exc:  # the transport's: each item failed as its own request would have
            _fail(chunk, exc)
            return
        self._settle(chunk, reply)

    async def _probe(self, chunk: list[_Waiting]) -> None:
        """No responder for the multiplexed subject: the chunk's first fetch goes singly. An answer
        other than "not the leader" comes only from the leader of the epoch it names, this node: an
        earlier version, whose fetches then go singly. Without one the node is gone (or handing its
        leadership over): the fetches fail, and the next are multiplexed again, not sent one by one
        to a dead node by each of its followers."""
        probe, others = chunk[0], chunk[1:]
        try:
            reply = (await self.nc.request(probe.subject, probe.item.request, probe.timeout)).data
        except Exception as exc:  # the transport's: each fetch failed as its own request would have
            _fail(chunk, exc)
            return
        _answer(probe, reply)
        if reply == NOT_LEADER_REPLY:
            _fail(others, NoRespondersError())
            return
        log.info("%s serves no multiplexed fetches: single ones for %.0f s", self.leader, FALLBACK_PERIOD)
        self._single_until = self.clock() + FALLBACK_PERIOD
        self._singly(others)

    def _singly(self, entries: list[_Waiting]) -> None:
        for entry in entries:
            if self.spawn(self._single(entry), f"a fetch of {entry.subject}") is None:
                entry.reply.cancel()

    async def _single(self, entry: _Waiting) -> None:
        try:
            reply = await self.nc.request(entry.subject, entry.item.request, entry.timeout)
        except Exception as exc:
            _fail([entry], exc)
        else:
            _answer(entry, reply.data)

    def _settle(self, chunk: list[_Waiting], reply: TransportMessage) -> None:
        try:
            answers = fetchmux.decode_answer(reply.data, len(chunk))
        except EnvelopeError as exc:
            log.warning("malformed multiplexed fetch answer from %s: %s", self.leader, exc)
            _fail(chunk, MuxFailed(str(exc)))
            return
        again = []
        for entry, (code, data) in zip(chunk, answers, strict=True):
            if code == Code.ANSWERED:
                _answer(entry, data)
            elif code == Code.NO_ROOM:
                again.append(entry)
            elif code == Code.NOT_HERE:
                _fail([entry], NoRespondersError())
            else:  # SILENT: the endpoint would not have answered; failed now, not a timeout later
                _fail([entry], TimeoutError(f"{entry.item.stream}/{entry.item.partition}: no reply"))
        self._waiting.extend(entry for entry in again if not entry.reply.done())  # go in the next request


def _answer(entry: _Waiting, data: bytes) -> None:
    if not entry.reply.done():
        entry.reply.set_result(data)


def _fail(entries: list[_Waiting], error: BaseException) -> None:
    for entry in entries:
        if not entry.reply.done():
            entry.reply.set_exception(error)


class FetchMuxes:
    """A follower node's multiplexers, one per leader node, made on first use."""

    def __init__(self, make: Callable[[str], FetchMux]) -> None:
        self._make = make
        self._by_leader: dict[str, FetchMux] = {}  # one per node of the cluster

    def to(self, leader: str) -> FetchMux:
        mux = self._by_leader.get(leader)
        if mux is None:
            mux = self._by_leader[leader] = self._make(leader)
        return mux


class MuxEndpoint:
    """The leader side: answers a follower node's multiplexed fetches through each partition's
    ``LeaderEndpoint`` (``endpoint_of``), in the request's order, within one message."""

    def __init__(
        self, nc: Transport, subjects: Subjects, server_id: str,
        endpoint_of: Callable[[str, int], LeaderEndpoint | None],
    ) -> None:
        self.nc = nc
        self.subject = subjects.fetch_mux(server_id)
        self.endpoint_of = endpoint_of

    async def start(self) -> None:
        await self.nc.subscribe(self.subject, cb=self._on_request)

    async def _on_request(self, msg: TransportMessage) -> None:
        if not msg.reply:
            return
        try:
            request = fetchmux.decode_request(msg.data)
        except EnvelopeError as exc:
            log.warning("dropping a malformed multiplexed fetch: %s", exc)
            return
        await self.nc.publish(msg.reply, fetchmux.encode_answer(self.answers(request.items)))

    def answers(self, items: list[MuxItem]) -> list[tuple[Code, bytes]]:
        """Each item's (code, reply), the replies within one message together."""
        room = self.nc.max_payload - fetchmux.ANSWER_OVERHEAD - len(items) * fetchmux.ANSWER_ITEM_OVERHEAD
        answers: list[tuple[Code, bytes]] = []
        for item in items:
            endpoint = self.endpoint_of(item.stream, item.partition)
            if endpoint is None:
                answers.append((Code.NOT_HERE, b""))
                continue
            if room < MIN_ROOM:
                answers.append((Code.NO_ROOM, b""))
                continue
            try:
                reply = endpoint.answer_fetch(item.request, self.subject, room - RESPONSE_OVERHEAD)
            except NoRoom:
                answers.append((Code.NO_ROOM, b""))
                continue
            if reply is None:
                answers.append((Code.SILENT, b""))
                continue
            answers.append((Code.ANSWERED, reply))
            room -= len(reply)
        return answers
