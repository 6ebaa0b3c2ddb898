"""The node-to-node side of a NATS connection: everything sent sealed with the cluster key,
everything received opened, and what does not open dropped and counted (``bascule.wire.seal``).

A request takes the first reply that opens: replies on its inbox come through one wildcard
subscription of this connection's (as nats-py's own requests do), and one that does not open (a
stranger on the NATS server answering every request, say) is dropped, not taken for the answer."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import NoRespondersError

from bascule.natsio.flush import flush
from bascule.wire.seal import SEAL_SIZE, Rejection, Sealer

log = logging.getLogger(__name__)

NO_RESPONDERS = "503"  # the status NATS answers a request with when nobody subscribes to its subject

Handler = Callable[[Msg], Awaitable[None]]


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
        self._reply_prefix = ""  # the inbox prefix of the replies' subscription, once made
        self._reply_subscription: asyncio.Future[Subscription] | None = None
        self._waiting: dict[str, asyncio.Future[Msg]] = {}  # reply token -> the request waiting for it
        self._tokens = itertools.count()

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
        """The first reply that opens within ``timeout``; TimeoutError when none comes,
        NoRespondersError when NATS says nobody subscribes to ``subject``."""
        prefix = await self._replies_inbox()
        token = str(next(self._tokens))
        answer: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()
        self._waiting[token] = answer
        try:
            await self.client.publish(subject, self.sealer.seal(subject, payload, _now_s()), reply=prefix + token)
            return await asyncio.wait_for(answer, timeout)
        except TimeoutError:
            raise nats.errors.TimeoutError from None  # as nats-py's requests: a TimeoutError and a nats Error
        finally:
            self._waiting.pop(token, None)

    async def _replies_inbox(self) -> str:
        """The prefix of this connection's reply subjects, once its subscription is made (by the
        first request; again by the next one if making it failed)."""
        subscribing = self._reply_subscription
        if subscribing is None or (subscribing.done() and (subscribing.cancelled() or subscribing.exception())):
            self._reply_prefix = self.client.new_inbox() + "."
            subscribing = self._reply_subscription = asyncio.ensure_future(
                self.client.subscribe(self._reply_prefix + "*", cb=self._on_reply)
            )
        await asyncio.shield(subscribing)
        return self._reply_prefix

    async def _on_reply(self, msg: Msg) -> None:
        answer = self._waiting.get(msg.subject[len(self._reply_prefix):])
        if answer is None or answer.done():
            return
        if msg.headers and msg.headers.get("Status") == NO_RESPONDERS and not msg.data:
            answer.set_exception(NoRespondersError())
        elif self._opened(msg):
            answer.set_result(msg)

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
