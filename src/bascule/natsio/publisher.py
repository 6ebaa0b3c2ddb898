"""Liftbridge publish envelopes over plain NATS, each with its own ack inbox.

A partition leader captures every message on its stream's subject; an envelope that names an ack
inbox gets the leader's Ack there. One wildcard subscription serves every inbox of a publisher, so
a publish costs one NATS message each way.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from bascule.natsio.flush import flush
from bascule.wire import envelope
from bascule.wire.pb import api_pb2

log = logging.getLogger(__name__)

# Envelope header (12), the ack inbox field around the prefix (tag, length, ".<sequence>"), ack policy.
ENVELOPE_OVERHEAD = 64


class EnvelopePublisher:
    """Publishes envelopes on ``nc`` and matches acks to them by inbox."""

    def __init__(self, nc: NATS, prefix: str) -> None:
        self.nc = nc
        self.prefix = prefix
        self._waiters: dict[str, asyncio.Future[api_pb2.Ack]] = {}
        self._from_stream: dict[str, str] = {}  # inbox -> the only stream whose ack it takes
        self._sequence = 0
        self._subscription: Subscription | None = None

    @classmethod
    async def start(cls, nc: NATS, name: str = "bascule") -> EnvelopePublisher:
        """A publisher whose ack subscription the server has processed."""
        publisher = cls(nc, f"_INBOX.{name}.{uuid.uuid4().hex[:12]}")
        publisher._subscription = await nc.subscribe(publisher.prefix + ".*", cb=publisher._on_ack)
        await flush(nc)
        return publisher

    async def close(self) -> None:
        for waiter in self._waiters.values():
            waiter.cancel()
        self._waiters.clear()
        if self._subscription is not None and not self.nc.is_closed:
            await self._subscription.unsubscribe()
        self._subscription = None

    @property
    def max_message_bytes(self) -> int:
        """The largest message value that, as an envelope with this publisher's ack inbox, still
        fits one NATS message (the server's max_payload)."""
        return self.nc.max_payload - ENVELOPE_OVERHEAD - len(self.prefix)

    async def publish(self, subject: str, message: api_pb2.Message) -> None:
        """Publish without waiting for an ack (whatever ack inbox ``message`` names gets one)."""
        await self.nc.publish(subject, envelope.encode_message(message, envelope.MsgType.PUBLISH))

    async def send(
        self, subject: str, message: api_pb2.Message, from_stream: str | None = None
    ) -> asyncio.Future[api_pb2.Ack]:
        """Publish with an ack inbox of this publisher's; the future gets the leader's Ack (of
        ``from_stream``'s leader only, when given: every stream capturing the subject acks).
        The caller bounds the wait (``request`` does) and so decides what a lost ack means."""
        self._sequence += 1
        inbox = f"{self.prefix}.{self._sequence}"
        message.ackInbox = inbox
        waiter = self._waiters[inbox] = asyncio.get_running_loop().create_future()
        if from_stream is not None:
            self._from_stream[inbox] = from_stream

        def forget(_: object) -> None:
            self._waiters.pop(inbox, None)
            self._from_stream.pop(inbox, None)

        waiter.add_done_callback(forget)
        try:
            await self.nc.publish(subject, envelope.encode_message(message, envelope.MsgType.PUBLISH))
        except BaseException:
            waiter.cancel()
            raise
        return waiter

    async def request(
        self, subject: str, message: api_pb2.Message, timeout: float, from_stream: str | None = None
    ) -> api_pb2.Ack:
        """Publish and wait up to ``timeout`` for the ack (asyncio.TimeoutError after it), of
        ``from_stream`` when given. An ack inbox the message already names is kept, as Liftbridge
        keeps it: the ack is awaited there."""
        if message.ackInbox:
            return await self._request_on_own_inbox(subject, message, timeout, from_stream)
        waiter = await self.send(subject, message, from_stream)
        try:
            return await asyncio.wait_for(waiter, timeout)
        finally:
            waiter.cancel()

    async def _request_on_own_inbox(
        self, subject: str, message: api_pb2.Message, timeout: float, from_stream: str | None
    ) -> api_pb2.Ack:
        acked: asyncio.Future[api_pb2.Ack] = asyncio.get_running_loop().create_future()

        async def on_ack(msg: Msg) -> None:
            if not acked.done():
                _settle(acked, msg, from_stream)

        # Subscribed before the publish, on the same connection: the server has it first.
        subscription = await self.nc.subscribe(message.ackInbox, cb=on_ack)
        try:
            await self.nc.publish(subject, envelope.encode_message(message, envelope.MsgType.PUBLISH))
            return await asyncio.wait_for(acked, timeout)
        finally:
            await subscription.unsubscribe()

    async def _on_ack(self, msg: Msg) -> None:
        waiter = self._waiters.get(msg.subject)
        if waiter is None or waiter.done():
            return
        _settle(waiter, msg, self._from_stream.get(msg.subject))


def _settle(waiter: asyncio.Future[api_pb2.Ack], msg: Msg, from_stream: str | None) -> None:
    """``waiter`` gets the Ack in ``msg``, if it is one and comes from ``from_stream`` (any stream
    when None); another stream's ack is not this publish's answer, and garbage is dropped."""
    try:
        ack = envelope.decode_message(msg.data, envelope.MsgType.ACK, api_pb2.Ack)
    except envelope.EnvelopeError as exc:
        log.warning("dropping malformed ack on %s: %s", msg.subject, exc)
        return
    if from_stream is None or ack.stream == from_stream:
        waiter.set_result(ack)
