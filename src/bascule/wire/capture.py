"""Turning NATS messages on a stream's subject into records, and acks back into NATS.

A payload that is a Liftbridge Publish envelope keeps its key, headers and ack
request; anything else (including a broken envelope, which is logged) is stored
whole as the value, because plain publishers must never lose a message to parsing.
A message id in the NATS headers (Nats-Msg-Id) is stored as the record's header, unless
the envelope's own headers carry one.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from bascule.wire import envelope
from bascule.wire.dedup import MESSAGE_ID_HEADER, headers_with_id, message_id, message_ids
from bascule.wire.entry import Record, encode_headers, native
from bascule.wire.messages import varint
from bascule.wire.names import is_protocol_token
from bascule.wire.pb import api_pb2

log = logging.getLogger(__name__)

LEADER, ALL, NONE = api_pb2.AckPolicy.LEADER, api_pb2.AckPolicy.ALL, api_pb2.AckPolicy.NONE

# A captured NATS message: (subject, reply, payload), and its NATS header Nats-Msg-Id's value as
# a fourth item when it has one. Most messages have none, and their tuples stay as small.
Delivery = tuple[str, str, bytes] | tuple[str, str, bytes, bytes]


@dataclass(slots=True)  # not frozen: that costs three times as much to build, once per message
class AckRequest:
    inbox: str
    correlation_id: str
    policy: api_pb2.AckPolicy
    msg_subject: str


# Told how one publish ended: (ack, None) on success, (None, error) otherwise.
AckOutcome = Callable[[api_pb2.Ack | None, BaseException | None], None]
# Told how a burst's acks of one kind ended: (their indices, their gRPC-framed PublishResponses,
# None), or (their indices, None, error).
BurstOutcome = Callable[[list[int], bytes | None, BaseException | None], None]

HEADER_CACHE_SIZE = 4096
_header_cache: dict[tuple[str, str], tuple[dict[str, bytes], bytes]] = {}


def stored_headers(subject: str, reply: str) -> tuple[dict[str, bytes], bytes]:
    """The subject/reply headers of a plain message and their encoding, shared by every
    message with the same pair (wildcard streams see many subjects: the cache is bounded)."""
    cached = _header_cache.get((subject, reply))
    if cached is None:
        if len(_header_cache) >= HEADER_CACHE_SIZE:
            _header_cache.clear()
        headers = {"subject": subject.encode(), "reply": reply.encode()}
        cached = _header_cache[(subject, reply)] = (headers, encode_headers(headers))
    return cached


@dataclass(slots=True)
class CapturedBatch:
    """The records of one burst of NATS messages, the acks they ask for, and their message ids."""

    records: list[Record]
    acks: list[tuple[int, AckRequest]]  # (index of the record in records, its ack request)
    # Each record's message id (dedup.message_id of its headers); None when no record has one.
    ids: list[bytes | None] | None


def capture_batch(deliveries: list[Delivery]) -> CapturedBatch:
    if native is None:
        return capture_batch_python(deliveries)
    return CapturedBatch(*native.capture_records(
        deliveries, Record, stored_headers, _record_from_envelope, envelope.MAGIC))


def capture_batch_python(deliveries: list[Delivery]) -> CapturedBatch:
    """``capture_batch`` as a Python loop: the C module's reference."""
    records: list[Record] = []
    acks: list[tuple[int, AckRequest]] = []
    subject = reply = None
    own_headers = False  # a record sharing the subject's headers has no id: only others are looked at
    for delivery in deliveries:
        if len(delivery) == 3:
            delivery_subject, delivery_reply, payload = delivery
            nats_id = None
        else:
            delivery_subject, delivery_reply, payload, nats_id = delivery
        # The capture connection hands out one str per distinct subject: identity finds repeats.
        if delivery_subject is not subject or delivery_reply is not reply:
            subject, reply = delivery_subject, delivery_reply
            headers, header_block = stored_headers(subject, reply)
        record, ack = _record(payload, subject, headers, header_block, nats_id)
        if ack is not None:
            acks.append((len(records), ack))
        records.append(record)
        if record.headers is not headers:
            own_headers = True
    return CapturedBatch(records, acks, message_ids(records) if own_headers else None)


def expected_offsets(deliveries: list[Delivery]) -> list[int]:
    """The offset each captured message expects to get, for optimistic concurrency control: a
    Publish envelope's Message offset; 0 for anything else (a malformed envelope included, stored
    as a plain value), as Liftbridge counts a plain message."""
    return [_expected_offset(delivery[2]) for delivery in deliveries]


def _expected_offset(payload: bytes) -> int:
    if envelope.is_envelope(payload):
        try:
            return envelope.decode_message(payload, envelope.MsgType.PUBLISH, api_pb2.Message).offset
        except envelope.EnvelopeError:
            pass
    return 0


def record_from_nats(
    data: bytes, subject: str, reply: str
) -> tuple[Record, AckRequest | None]:
    return _record(data, subject, *stored_headers(subject, reply), None)


def _record(
    data: bytes, subject: str, headers: dict[str, bytes], header_block: bytes, nats_id: bytes | None
) -> tuple[Record, AckRequest | None]:
    if envelope.is_envelope(data):
        return _record_from_envelope(data, subject, headers, header_block, nats_id)
    if nats_id:
        return _plain_record(data, headers, header_block, nats_id), None
    return Record(data, None, headers, 0, header_block), None  # most messages: built here, a call saved


def _plain_record(data: bytes, headers: dict[str, bytes], header_block: bytes, nats_id: bytes | None) -> Record:
    if nats_id:  # an empty id is none (dedup.message_id)
        headers, header_block = headers_with_id(nats_id, headers, header_block)
    return Record(data, None, headers, 0, header_block)


def _record_from_envelope(
    data: bytes, subject: str, headers: dict[str, bytes], header_block: bytes, nats_id: bytes | None
) -> tuple[Record, AckRequest | None]:
    try:
        message = envelope.decode_message(data, envelope.MsgType.PUBLISH, api_pb2.Message)
    except envelope.EnvelopeError as exc:
        log.warning("storing a malformed envelope on %s as a plain value: %s", subject, exc)
        return _plain_record(data, headers, header_block, nats_id), None
    return _record_from_publish(message, headers, header_block, subject, nats_id)


def _record_from_publish(
    message: api_pb2.Message, headers: dict[str, bytes], header_block: bytes, subject: str, nats_id: bytes | None
) -> tuple[Record, AckRequest | None]:
    key = message.key or None
    own = message.headers
    if nats_id and not message_id(own):  # an id in the envelope's own headers wins
        record = Record(message.value, key, {**own, MESSAGE_ID_HEADER: nats_id, **headers})
    elif own:
        record = Record(message.value, key, {**own, **headers})
    else:
        record = Record(message.value, key, headers, header_block=header_block)
    ack = None
    inbox = message.ackInbox
    if inbox and message.ackPolicy != NONE:
        if is_protocol_token(inbox):
            ack = AckRequest(inbox, message.correlationId, message.ackPolicy, subject)
        else:
            log.warning("not acking a message on %s: its ack inbox %r is not a NATS subject", subject, inbox[:100])
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


def encode_refusal(
    stream: str, partition_subject: str, request: AckRequest, error: api_pb2.Ack.Error,
    reception_ns: int, commit_ns: int,
) -> tuple[str, bytes]:
    """(inbox, enveloped Ack) telling a publisher its message was refused with ``error``, as
    Liftbridge acks a refusal: with no offset."""
    ack = ack_message(stream, partition_subject, 0, request, reception_ns, commit_ns)
    ack.ackError = error
    return request.inbox, envelope.encode_message(ack, envelope.MsgType.ACK)


def encode_acks(
    stream: str,
    partition_subject: str,
    first_offset: int,
    acks: list[tuple[int, AckRequest]],
    reception_ns: int,
    commit_ns: int,
) -> list[tuple[str, bytes]]:
    """(inbox, enveloped Ack) for each ack of a batch whose first record is at ``first_offset``."""
    header = envelope.header(envelope.MsgType.ACK)
    return [
        (request.inbox, header + ack)
        for request, ack in _encoded_acks(stream, partition_subject, first_offset, acks, reception_ns, commit_ns)
    ]


def publish_responses(
    stream: str,
    subject: str,
    policy: api_pb2.AckPolicy,
    first_offset: int,
    indices: list[int],
    correlation_ids: list[str],
    reception_ns: int,
    commit_ns: int,
    inbox: str = "",
) -> bytes:
    """gRPC-framed PublishResponses acking the records ``indices`` of a burst of API publishes to
    ``subject`` with ack policy ``policy`` (``correlation_ids[i]`` is ``indices[i]``'s), whose first
    record is at ``first_offset``, their acks naming ``inbox``. In C when built."""
    shared = api_pb2.Ack(
        stream=stream, partitionSubject=subject, msgSubject=subject, ackPolicy=policy, ackInbox=inbox,
        receptionTimestamp=reception_ns, commitTimestamp=commit_ns,
    ).SerializeToString()
    if native is None:
        return publish_responses_python(first_offset, indices, correlation_ids, shared)
    return native.publish_responses(first_offset, indices, correlation_ids, shared)


def publish_responses_python(first_offset: int, indices: list[int], correlation_ids: list[str], shared: bytes) -> bytes:
    """``publish_responses`` as a Python loop, the C module's reference: each Ack is its own
    fields (offset, correlation id) followed by ``shared``, the fields every ack of the burst has
    (protobuf parses concatenated encodings as one message with every field set)."""
    if len(indices) != len(correlation_ids):
        raise ValueError("as many correlation ids as indices are needed")
    framed: list[bytes] = []
    for index, correlation_id in zip(indices, correlation_ids):
        if index < 0 or not 0 <= first_offset + index < 1 << 63:
            raise ValueError("an ack's offset is outside [0, 2**63)")
        encoded = correlation_id.encode()
        own = _ACK_OFFSET + varint(first_offset + index)
        tail = b""
        if encoded:
            own += _ACK_CORRELATION_ID + varint(len(encoded)) + encoded
            tail = _RESPONSE_CORRELATION_ID + varint(len(encoded)) + encoded
        ack = own + shared
        response = _RESPONSE_ACK + varint(len(ack)) + ack + tail
        framed += (b"\x00", _GRPC_LENGTH.pack(len(response)), response)
    return b"".join(framed)


_RESPONSE_ACK, _RESPONSE_CORRELATION_ID = b"\x0a", b"\x1a"  # PublishResponse fields 1 and 3
_GRPC_LENGTH = struct.Struct(">I")  # after each gRPC message's compressed flag
_ACK_OFFSET, _ACK_INBOX, _ACK_CORRELATION_ID = b"\x20", b"\x2a", b"\x32"  # Ack fields 4, 5 and 6


def _encoded_acks(
    stream: str,
    partition_subject: str,
    first_offset: int,
    acks: list[tuple[int, AckRequest]],
    reception_ns: int,
    commit_ns: int,
) -> Iterator[tuple[AckRequest, bytes]]:
    """Each ack's request and serialized Ack. The fields a batch's acks share are serialized once
    and appended to each ack's own fields: protobuf parses concatenated encodings as one message
    with every field set."""
    shared: dict[tuple[str, int], bytes] = {}
    for index, request in acks:
        common = shared.get((request.msg_subject, request.policy))
        if common is None:
            common = shared[(request.msg_subject, request.policy)] = api_pb2.Ack(
                stream=stream, partitionSubject=partition_subject, msgSubject=request.msg_subject,
                ackPolicy=request.policy, receptionTimestamp=reception_ns, commitTimestamp=commit_ns,
            ).SerializeToString()
        own = [_ACK_OFFSET, varint(first_offset + index)]
        for tag, text in ((_ACK_INBOX, request.inbox), (_ACK_CORRELATION_ID, request.correlation_id)):
            if text:
                encoded = text.encode()
                own += (tag, varint(len(encoded)), encoded)
        own.append(common)
        yield request, b"".join(own)
