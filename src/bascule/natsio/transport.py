"""What a node's parts need from the network: ``Transport``.

The leader endpoint, the follower loop, the node's partition notifications, the metadata service and
the admin queries talk through it.
On a node it is ``bascule.natsio.sealed.SealedNats`` (which satisfies it structurally, sealing every
message); in tests and the simulator, ``bascule.testing.bus.MemoryBus``, which can drop, delay,
duplicate and partition. NATS semantics: a message goes to every subscription of exactly its
subject, at most once, and a request waits for the first reply on a reply subject of its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol


class TransportMessage(Protocol):
    """A message as a subscriber or a requester gets it."""

    @property
    def subject(self) -> str: ...

    @property
    def data(self) -> bytes: ...

    @property
    def reply(self) -> str:
        """Where to answer ("" when the sender waits for no answer)."""
        ...


class TransportSubscription(Protocol):
    async def unsubscribe(self) -> None: ...


MessageHandler = Callable[[TransportMessage], Awaitable[None]]


class Transport(Protocol):
    @property
    def max_payload(self) -> int:
        """The largest payload one message may carry."""
        ...

    def new_inbox(self) -> str:
        """A subject of this node's own to take replies on."""
        ...

    async def request(self, subject: str, payload: bytes, timeout: float) -> TransportMessage:
        """The first reply to ``payload`` sent on ``subject``. Raises TimeoutError when none comes
        within ``timeout`` (nobody subscribed, lost, or just slow); a transport may also raise its
        own errors (SealedNats: ``nats.errors.Error``, such as an unsealed reply), which the
        follower loop takes as no answer too."""
        ...

    async def subscribe(self, subject: str, cb: MessageHandler) -> TransportSubscription:
        """Call ``cb`` with each message on ``subject``, one at a time, in the order they arrive."""
        ...

    async def publish(self, subject: str, payload: bytes, reply: str = "") -> None: ...

    async def flush(self) -> None:
        """Return once the server has everything sent before the call (its subscriptions too)."""
        ...
