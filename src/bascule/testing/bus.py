"""An in-memory message bus for many nodes in one process, with network faults driven by a seed.

Each node's end is a replication transport (``bascule.natsio.transport.Transport``,
satisfied structurally: this package never imports the server's)::

    bus = MemoryBus(seed=7, faults=Faults(drop=0.2, duplicate=0.1, delay=(0.0, 0.01)))
    leader, follower = bus.node("L"), bus.node("F")
    bus.partition({"L"}, {"F"})     # nothing crosses, either way
    bus.cut_one_way("L", "F")       # F hears nothing from L; L still hears F
    bus.heal()
    bus.disconnect("F")             # F crashed: its subscriptions and handlers are gone

Subjects behave as the shells use NATS: a message goes to every subscription of exactly its subject
(no wildcards: the shells use none), each subscription's handler takes its messages one at a time in
the order they arrive, a message nobody subscribes is dropped, and a request publishes with a reply
subject of its own (``_INBOX.<node>.<n>``) and waits for the first reply. A request nobody answers
times out (TimeoutError); nats-py against a server with headers fails such a request at once
(NoRespondersError), which the follower loop takes as no answer alike, only sooner.

Every fault is drawn from one ``random.Random(seed)``, in the order of the publishes, so the same
publishes on the same seed meet the same fates (``trace``); under a loop on virtual time the whole run
replays. Each delivery (one per matching subscription) is dropped with probability ``drop``, else
arrives twice with probability ``duplicate``, each copy after its own delay drawn from ``delay``:
copies and messages whose delays cross arrive out of order, which is how the bus reorders. A cut
between two nodes (``partition``, ``cut_one_way``) drops what the sender publishes while it lasts and
what was in flight when it began.

Bounds: at most ``max_pending`` deliveries in flight or queued for a handler (beyond it a delivery is
dropped and counted as ``overflowed``); ``trace`` keeps the last ``trace_size`` fates; one transport
per node name; at most one cut per ordered pair of names; subscriptions are the nodes' own (a request's
inbox lasts until its reply or its timeout).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

MAX_PENDING = 100_000
TRACE_SIZE = 100_000
MAX_PAYLOAD = 1024 * 1024  # nats-server's default max_payload


@dataclass(frozen=True)
class Faults:
    """What happens to each delivery: probabilities in [0, 1], delays in seconds."""

    drop: float = 0.0
    duplicate: float = 0.0
    delay: tuple[float, float] = (0.0, 0.0)

    def __post_init__(self) -> None:
        if not (0.0 <= self.drop <= 1.0 and 0.0 <= self.duplicate <= 1.0):
            raise ValueError(f"probabilities must be within [0, 1]: drop {self.drop}, duplicate {self.duplicate}")
        if not 0.0 <= self.delay[0] <= self.delay[1]:
            raise ValueError(f"a delay range is (low, high) with 0 <= low <= high, not {self.delay}")


@dataclass(frozen=True)
class BusMessage:
    subject: str
    data: bytes
    reply: str = ""


@dataclass(frozen=True)
class Fate:
    """One step of one copy of a delivery: it left with ``delay``, or was dropped, cut (as it left, or
    as it arrived, after its "sent") or over the bound."""

    sender: str
    receiver: str
    subject: str
    outcome: str  # "sent", "dropped", "cut" or "overflowed": each the name of its counter in Tally
    delay: float | None = None


@dataclass
class Tally:
    sent: int = 0  # copies scheduled, duplicates included
    delivered: int = 0  # copies handed to a handler
    dropped: int = 0
    duplicated: int = 0
    cut: int = 0  # at publish or on arrival
    overflowed: int = 0
    unrouted: int = 0  # publishes no subscription took, and copies that arrived after an unsubscribe


Handler = Callable[[BusMessage], Awaitable[None]]


@dataclass(eq=False)
class BusSubscription:
    node: str
    subject: str
    handler: Handler
    bus: MemoryBus
    queue: deque[BusMessage] = field(default_factory=deque)
    draining: bool = False
    active: bool = True
    drain: asyncio.Task[None] | None = None

    async def unsubscribe(self) -> None:
        self.bus.remove(self)


class MemoryBus:
    def __init__(
        self, seed: int, faults: Faults | None = None, max_pending: int = MAX_PENDING,
        trace_size: int = TRACE_SIZE, max_payload: int = MAX_PAYLOAD,
    ) -> None:
        self.random = random.Random(seed)
        self.faults = faults or Faults()
        self.max_pending = max_pending
        self.max_payload = max_payload
        self.trace: deque[Fate] = deque(maxlen=trace_size)
        self.tally = Tally()
        self.pending = 0
        self._nodes: dict[str, BusTransport] = {}
        self._subscriptions: dict[str, list[BusSubscription]] = {}
        self._cuts: set[tuple[str, str]] = set()
        self._inbox_numbers = itertools.count()

    def node(self, name: str) -> BusTransport:
        return self._nodes.setdefault(name, BusTransport(self, name))

    def disconnect(self, name: str) -> None:
        """The node ``name`` is gone, as a killed process's connection is: its subscriptions end,
        the handlers it was running are cancelled, and its transport sends nothing more. Copies it
        sent that are in flight still arrive. ``node(name)`` then gives a new, connected transport."""
        transport = self._nodes.pop(name, None)
        if transport is not None:
            transport.connected = False
        for subscriptions in list(self._subscriptions.values()):
            for subscription in [s for s in subscriptions if s.node == name]:
                self.remove(subscription)
                if subscription.drain is not None:
                    subscription.drain.cancel()

    def partition(self, *groups: Iterable[str]) -> None:
        """Cut every node of each group from every node of the others, both ways."""
        sets = [set(group) for group in groups]
        for one, other in itertools.permutations(sets, 2):
            self._cuts.update(itertools.product(one, other))

    def cut_one_way(self, sender: str, receiver: str) -> None:
        self._cuts.add((sender, receiver))

    def heal(self) -> None:
        self._cuts.clear()

    @property
    def subscription_count(self) -> int:
        return sum(len(subscriptions) for subscriptions in self._subscriptions.values())

    def new_inbox(self, node: str) -> str:
        return f"_INBOX.{node}.{next(self._inbox_numbers)}"

    def subscribe(self, node: str, subject: str, handler: Handler) -> BusSubscription:
        subscription = BusSubscription(node, subject, handler, self)
        self._subscriptions.setdefault(subject, []).append(subscription)
        return subscription

    def publish(self, sender: str, message: BusMessage) -> None:
        if len(message.data) > self.max_payload:
            raise ValueError(f"a payload of {len(message.data)} bytes is over the bus's {self.max_payload}")
        subscriptions = self._subscriptions.get(message.subject, [])
        if not subscriptions:
            self.tally.unrouted += 1
        for subscription in subscriptions:
            self._route(sender, subscription, message)

    def _route(self, sender: str, subscription: BusSubscription, message: BusMessage) -> None:
        faults, receiver = self.faults, subscription.node
        if (sender, receiver) in self._cuts:
            self._decide(Fate(sender, receiver, message.subject, "cut"))
            return
        if self.random.random() < faults.drop:
            self._decide(Fate(sender, receiver, message.subject, "dropped"))
            return
        copies = 2 if self.random.random() < faults.duplicate else 1
        self.tally.duplicated += copies - 1
        for _ in range(copies):
            if self.pending >= self.max_pending:
                self._decide(Fate(sender, receiver, message.subject, "overflowed"))
                continue
            delay = self.random.uniform(*faults.delay)
            self._decide(Fate(sender, receiver, message.subject, "sent", delay))
            self.pending += 1
            asyncio.get_running_loop().call_later(delay, self._arrive, sender, subscription, message)

    def _decide(self, fate: Fate) -> None:
        self.trace.append(fate)
        setattr(self.tally, fate.outcome, getattr(self.tally, fate.outcome) + 1)

    def _arrive(self, sender: str, subscription: BusSubscription, message: BusMessage) -> None:
        if not subscription.active:
            self.pending -= 1
            self.tally.unrouted += 1
            return
        if (sender, subscription.node) in self._cuts:
            self.pending -= 1
            self._decide(Fate(sender, subscription.node, message.subject, "cut"))
            return
        subscription.queue.append(message)
        if not subscription.draining:
            subscription.draining = True
            subscription.drain = asyncio.get_running_loop().create_task(self._drain(subscription))

    async def _drain(self, subscription: BusSubscription) -> None:
        """Hand the subscription its messages one at a time, as a NATS subscription does."""
        try:
            while subscription.active and subscription.queue:
                message = subscription.queue.popleft()
                self.pending -= 1
                self.tally.delivered += 1
                try:
                    await subscription.handler(message)
                except Exception:
                    log.exception("a handler on %s (node %s) failed", subscription.subject, subscription.node)
        finally:
            subscription.draining = False
            subscription.drain = None

    def remove(self, subscription: BusSubscription) -> None:
        if not subscription.active:
            return
        subscription.active = False
        self.pending -= len(subscription.queue)
        subscription.queue.clear()
        subscriptions = self._subscriptions[subscription.subject]
        subscriptions.remove(subscription)
        if not subscriptions:
            del self._subscriptions[subscription.subject]


class BusTransport:
    """One node's end of the bus: a ``Transport``."""

    def __init__(self, bus: MemoryBus, name: str) -> None:
        self.bus = bus
        self.name = name
        self.connected = True  # until the bus disconnects the node

    def new_inbox(self) -> str:
        return self.bus.new_inbox(self.name)

    @property
    def max_payload(self) -> int:
        return self.bus.max_payload

    async def publish(self, subject: str, payload: bytes, reply: str = "") -> None:
        if self.connected:
            self.bus.publish(self.name, BusMessage(subject, payload, reply))

    async def subscribe(self, subject: str, cb: Handler) -> BusSubscription:
        subscription = self.bus.subscribe(self.name, subject, cb)
        if not self.connected:
            self.bus.remove(subscription)
        return subscription

    async def request(self, subject: str, payload: bytes, timeout: float) -> BusMessage:
        first_reply: asyncio.Future[BusMessage] = asyncio.get_running_loop().create_future()

        async def take(message: BusMessage) -> None:
            if not first_reply.done():
                first_reply.set_result(message)

        inbox = self.bus.subscribe(self.name, self.bus.new_inbox(self.name), take)
        try:
            if self.connected:
                self.bus.publish(self.name, BusMessage(subject, payload, inbox.subject))
            async with asyncio.timeout(timeout):
                return await first_reply
        finally:
            self.bus.remove(inbox)

    async def flush(self) -> None:
        """Nothing to wait for: the bus has a publish, and a subscription, when the call returns."""
