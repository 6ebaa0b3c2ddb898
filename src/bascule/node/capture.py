"""Turning NATS messages on a stream's subject into records, and acks back into NATS.

A payload that is a Liftbridge Publish envelope keeps its key, headers and ack
request; anything else (including a broken envelope, which is logged) is stored
whole as the value, because plain publishers must never lose a message to parsing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from bascule.wire import envelope
from bascule.wire.entry import Record
from bascule.wire.pb import api_pb2

log = logging.getLogger(__name__)

LEADER, ALL, NONE = api_pb2.AckPolicy.LEADER, api_pb2.AckPolicy.ALL, api_pb2.AckPolicy.NONE


@dataclass(frozen=True, slots=True)
class AckRequest:
    inbox: str
    correlation_id: str
    policy: int
    msg_subject: str


def record_from_nats(
    data: bytes, subject: str, reply: str
) -> tuple[Record, AckRequest | None]:
    headers = {"subject": subject.encode(), "reply": reply.encode()}
    if envelope.is_envelope(data):
        try:
            message = envelope.decode_message(data, envelope.MsgType.PUBLISH, api_pb2.Message)
        except envelope.EnvelopeError as exc:
            log.warning("storing a malformed envelope on %s as a plain value: %s", subject, exc)
        else:
            return _record_from_publish(message, headers, subject)
    return Record(value=data, headers=headers), None


def _record_from_publish(
    message: api_pb2.Message, headers: dict[str, bytes], subject: str
) -> tuple[Record, AckRequest | None]:
    record = Record(
        value=message.value,
        key=message.key if message.key else None,
        headers={**message.headers, **headers},
    )
    ack = None
    if message.ackInbox and message.ackPolicy != NONE:
        ack = AckRequest(message.ackInbox, message.correlationId, message.ackPolicy, subject)
    return record, ack


def ack_message(
    stream: str,
    partition_subject: str,
    offset: int,
    request: AckRequest,
    reception_ns: int,
    commit_ns: int,
) -> api_pb2.Ack:
    return api_pb2.Ack(
        stream=stream,
        partitionSubject=partition_subject,
        msgSubject=request.msg_subject,
        offset=offset,
        ackInbox=request.inbox,
        correlationId=request.correlation_id,
        ackPolicy=request.policy,
        receptionTimestamp=reception_ns,
        commitTimestamp=commit_ns,
    )


def encode_ack(ack: api_pb2.Ack) -> bytes:
    return envelope.encode_message(ack, envelope.MsgType.ACK)
