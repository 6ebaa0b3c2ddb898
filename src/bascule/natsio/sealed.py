"""The node-to-node side of a NATS connection: everything sent sealed with the cluster key,
everything received opened, and what does not open dropped and counted (``bascule.wire.seal``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError

from bascule.natsio.flush import flush
from bascule.wire.seal import SEAL_SIZE, Rejection, Sealer

log = logging.getLogger(__name__)

Handler = Callable[[Msg], Awaitable[None]]


class UnauthenticatedReply(NatsError):
    """A reply that does not carry the cluster key's seal: treated as no reply."""


_HINTS = {
    Rejection.MALFORMED: "; is it from a node of this cluster, with the same clustering.raft.password?",
    Rejection.BAD_TAG: "; is it from a node of this cluster, with the same clustering.raft.password?",
    Rejection.UNTIMELY: "; a node just started with a clock far from this one's: check NTP on both",
}


def _now_s() -> int:
    return int(time.time())


class SealedNats:
    """The subset of a nats-py client the replication, metadata and admin shells use."""

    def __init__(self, client: NATS, sealer: Sealer) -> None:
        self.client = client
        self.sealer = sealer

    @property
    def max_payload(self) -> int:
        return self.client.max_payload - SEAL_SIZE

    def new_inbox(self) -> str:
        return self.client.new_inbox()

    @property
    def rejected(self) -> dict[Rejection, int]:
        return self.sealer.rejected

    async def publish(self, subject: str, payload: bytes, reply: str = "") -> None:
        await self.client.publish(subject, self.sealer.seal(subject, payload, _now_s()), reply=reply)

    async def request(self, subject: str, payload: bytes, timeout: float) -> Msg:
        reply = await self.client.request(subject, self.sealer.seal(subject, payload, _now_s()), timeout=timeout)
        if not self._opened(reply):
            raise UnauthenticatedReply(f"the reply to a request on {subject} was not sealed with the cluster key")
        return reply

    async def subscribe(self, subject: str, cb: Handler) -> Subscription:
        async def opened(msg: Msg) -> None:
            if self._opened(msg):
                await cb(msg)

        return await self.client.subscribe(subject, cb=opened)

    async def flush(self) -> None:
        await flush(self.client)

    def _opened(self, msg: Msg) -> bool:
        """Replace ``msg``'s data by its payload; False (logged, counted) when it does not open."""
        payload = self.sealer.open(msg.subject, msg.data, _now_s())
        if isinstance(payload, Rejection):
            count = self.sealer.rejected[payload]
            if count & (count - 1) == 0:  # the 1st, 2nd, 4th, 8th...: visible, never a flood
                log.warning("dropped a message on %s: %s (%d so far)%s", msg.subject, payload.value, count,
                            _HINTS.get(payload, ""))
            return False
        msg.data = payload
        return True
