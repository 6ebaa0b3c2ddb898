"""Turning NATS messages on a stream's subject into records, and acks back into NATS.

A payload that is a Liftbridge Publish envelope keeps its key, headers and ack
request; anything else (including a broken envelope, which is logged) is stored
whole as the value, because plain publishers must never lose a message to parsing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from bascule.wire import envelope
from bascule.wire.entry import Record, encode_headers
from bascule.wire.pb import api_pb2

log = logging.getLogger(__name__)

LEADER, ALL, NONE = api_pb2.AckPolicy.LEADER, api_pb2.AckPolicy.ALL, api_pb2.AckPolicy.NONE


@dataclass(frozen=True, slots=True)
class AckRequest:
    inbox: str
    correlation_id: str
    policy: int
    msg_subject: str


HEADER_CACHE_SIZE = 4096
_header_cache: dict[tuple[str, str], tuple[dict[str, bytes], bytes]] = {}


def _stored_headers(subject: str, reply: str) -> tuple[dict[str, bytes], bytes]:
    """The subject/reply headers of a plain message and their encoding, shared by every
    message with the same pair (wildcard streams see many subjects: the cache is bounded)."""
    cached = _header_cache.get((subject, reply))
    if cached is None:
        if len(_header_cache) >= HEADER_CACHE_SIZE:
            _header_cache.clear()
        headers = {"subject": subject.encode(), "reply": reply.encode()}
        cached = _header_cache[(subject, reply)] = (headers, encode_headers(headers))
    return cached


def record_from_nats(
    data: bytes, subject: str, reply: str
) -> tuple[Record, AckRequest | None]:
    headers, header_block = _stored_headers(subject, reply)
    if envelope.is_envelope(data):
        try:
            message = envelope.decode_message(data, envelope.MsgType.PUBLISH, api_pb2.Message)
        except envelope.EnvelopeError as exc:
            log.warning("storing a malformed envelope on %s as a plain value: %s", subject, exc)
        else:
            return _record_from_publish(message, headers, subject)
    return Record(value=data, headers=headers, header_block=header_block), None


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
