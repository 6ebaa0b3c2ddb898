"""Publishes forwarded to a partition's leader on another node, a burst at a time: the batch a node
sends and the reply it gets, sans I/O.

A node that takes API publishes for a partition led elsewhere sends them as one batch, sealed on the
leader's forwarding subject; the leader appends the batch as it appends a burst of its own API
publishes, and answers once every publish that asked for an ack is acked or failed, with the
gRPC-framed PublishResponses it would have sent its own client: the forwarding node passes them on
untouched. Big-endian throughout.

    batch:  version (1) | partition (4) | count (4) | stream length (2) | stream | inbox length (2)
            | inbox (the ack inbox the acks name: the forwarding node's client call's)
            then per publish: ack policy (1) | expected offset (8, signed) | correlation id length (2)
            | key length (4) | value length (4) | header count (2) | correlation id | key | value
            | per header: name length (2) | value length (4) | name | value
    reply:  version (1) | REFUSED (1) | error kind (1) | message: the whole batch failed
            version (1) | ANSWERED (1) | part count (4) | parts, each:
                ACKED (1) | index count (4) | indices (4 each) | length (4) | gRPC-framed PublishResponses
                FAILED (1) | index count (4) | indices (4 each) | length (4) | error kind (1) | message

Every length is checked against what is left, every index against the batch: bad input raises
``ForwardingError`` with what was wrong, never a half-read batch.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

VERSION = 1
_BATCH = struct.Struct(">BIIH")
_ENTRY = struct.Struct(">BqHIIH")
_HEADER = struct.Struct(">HI")
_REPLY = struct.Struct(">BB")
_PART = struct.Struct(">BI")
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
_KIND = struct.Struct(">B")
ANSWERED, REFUSED = 0, 1
ACKED, FAILED = 0, 1
MAX_POLICY = 2  # Liftbridge's AckPolicy values: LEADER 0, ALL 1, NONE 2
MAX_HEADERS = 0xFFFF
ENTRY_OVERHEAD = _ENTRY.size


def forward_subject(namespace: str, server_id: str) -> str:
    """Where a node takes the batches forwarded to the partitions it leads."""
    return f"{namespace}.forward.{server_id}"


class ForwardingError(ValueError):
    """A batch or a reply that does not parse."""


class ErrorKind(enum.IntEnum):
    """Why forwarded publishes failed, as the forwarding node tells its client (the failure it would
    have met appending them itself)."""

    NOT_LEADER = 1  # refused before anything was written: another leader may take them
    INCORRECT_OFFSET = 2
    UNAVAILABLE = 3  # leadership lost or the partition closed once written: maybe stored
    ENCRYPTION = 4
    STORE = 5  # the leader's disk refused them
    INVALID = 6  # a record the log cannot store
    MALFORMED = 7  # the batch did not parse
    TIMEOUT = 8
    INTERNAL = 9


class Unforwarded(Exception):
    """The leader refused a batch before writing any of it (it no longer leads, say): safe to send
    again, to whichever node leads now."""


@dataclass(slots=True)
class ForwardedBatch:
    """A batch as parallel lists: publish ``i`` is ``values[i]``, ``keys[i]``, and so on."""

    stream: str
    partition: int
    policies: list[int]
    expected_offsets: list[int]
    correlation_ids: list[str]
    keys: list[bytes]
    values: list[bytes]
    headers: list[dict[str, bytes] | None]
    inbox: str = ""


@dataclass(slots=True)
class ReplyPart:
    """The outcome of publishes ``indices``: their framed responses, or an error."""

    indices: list[int]
    framed: bytes = b""
    error: ErrorKind | None = None
    message: str = ""


def entry_size(key: bytes, value: bytes, correlation_id: bytes, headers: dict[str, bytes] | None) -> int:
    """What one publish takes in a batch, to know where a batch must end."""
    size = ENTRY_OVERHEAD + len(key) + len(value) + len(correlation_id)
    if headers:
        size += sum(_HEADER.size + len(name.encode()) + len(data) for name, data in headers.items())
    return size


def encode_header(stream: str, partition: int, count: int, inbox: str = "") -> bytes:
    encoded, encoded_inbox = stream.encode(), inbox.encode()
    if len(encoded) > 0xFFFF or len(encoded_inbox) > 0xFFFF:
        raise ForwardingError("stream name or ack inbox too long to forward")
    return b"".join((_BATCH.pack(VERSION, partition, count, len(encoded)), encoded,
                     _U16.pack(len(encoded_inbox)), encoded_inbox))


def encode_entry(policy: int, expected_offset: int, correlation_id: bytes, key: bytes, value: bytes,
                 headers: dict[str, bytes] | None) -> bytes:
    """One publish of a batch (``correlation_id`` already UTF-8)."""
    fixed = _ENTRY.pack(policy, expected_offset, len(correlation_id), len(key), len(value),
                        len(headers) if headers else 0)
    if not headers:
        return b"".join((fixed, correlation_id, key, value))
    parts = [fixed, correlation_id, key, value]
    for name, data in headers.items():
        encoded = name.encode()
        parts += (_HEADER.pack(len(encoded), len(data)), encoded, data)
    return b"".join(parts)


def decode_batch(data: bytes) -> ForwardedBatch:
    view = memoryview(data)
    if len(data) < _BATCH.size:
        raise ForwardingError(f"batch of {len(data)} bytes is shorter than its header")
    version, partition, count, stream_length = _BATCH.unpack_from(data)
    if version != VERSION:
        raise ForwardingError(f"batch version {version}, expected {VERSION}")
    at = _BATCH.size
    stream = _text(view, at, stream_length, "stream name")
    at += stream_length
    if at + _U16.size > len(data):
        raise ForwardingError("batch cut short before its ack inbox")
    (inbox_length,) = _U16.unpack_from(data, at)
    at += _U16.size
    inbox = _text(view, at, inbox_length, "ack inbox")
    at += inbox_length
    batch = ForwardedBatch(stream, partition, [], [], [], [], [], [], inbox)
    if count > (len(data) - at) // _ENTRY.size:
        raise ForwardingError(f"batch claims {count} publishes in {len(data) - at} bytes")
    policies, expected, ids, keys, values, headers = (batch.policies, batch.expected_offsets, batch.correlation_ids,
                                                     batch.keys, batch.values, batch.headers)
    for _ in range(count):
        if at + _ENTRY.size > len(data):
            raise ForwardingError(f"publish {len(policies)} cut short")
        policy, offset, id_length, key_length, value_length, header_count = _ENTRY.unpack_from(data, at)
        if policy > MAX_POLICY:
            raise ForwardingError(f"publish {len(policies)}: unknown ack policy {policy}")
        at += _ENTRY.size
        end = at + id_length + key_length + value_length
        if end > len(data):
            raise ForwardingError(f"publish {len(policies)} runs past the batch's end")
        ids.append(_text(view, at, id_length, "correlation id"))
        keys.append(data[at + id_length:at + id_length + key_length])
        values.append(data[at + id_length + key_length:end])
        at = end
        if header_count:
            found, at = _headers(data, view, at, header_count)
            headers.append(found)
        else:
            headers.append(None)
        policies.append(policy)
        expected.append(offset)
    if at != len(data):
        raise ForwardingError(f"{len(data) - at} bytes after the batch's last publish")
    return batch


def _headers(data: bytes, view: memoryview, at: int, count: int) -> tuple[dict[str, bytes], int]:
    found: dict[str, bytes] = {}
    for _ in range(count):
        if at + _HEADER.size > len(data):
            raise ForwardingError("header cut short")
        name_length, value_length = _HEADER.unpack_from(data, at)
        at += _HEADER.size
        if at + name_length + value_length > len(data):
            raise ForwardingError("header runs past the batch's end")
        found[_text(view, at, name_length, "header name")] = data[at + name_length:at + name_length + value_length]
        at += name_length + value_length
    return found, at


def _text(view: memoryview, at: int, length: int, what: str) -> str:
    if at + length > len(view):
        raise ForwardingError(f"{what} runs past the end")
    try:
        return str(view[at:at + length], "utf-8")
    except UnicodeDecodeError as exc:
        raise ForwardingError(f"{what} is not UTF-8: {exc}") from None


def encode_refusal(kind: ErrorKind, message: str) -> bytes:
    return _REPLY.pack(VERSION, REFUSED) + _KIND.pack(kind) + message.encode()


def encode_reply(parts: list[ReplyPart]) -> bytes:
    encoded = [_REPLY.pack(VERSION, ANSWERED), _U32.pack(len(parts))]
    for part in parts:
        body = part.framed if part.error is None else _KIND.pack(part.error) + part.message.encode()
        encoded += (_PART.pack(ACKED if part.error is None else FAILED, len(part.indices)),
                    struct.pack(f">{len(part.indices)}I", *part.indices), _U32.pack(len(body)), body)
    return b"".join(encoded)


def decode_reply(data: bytes, count: int) -> list[ReplyPart]:
    """The parts of a reply to a batch of ``count`` publishes; a refusal is one FAILED part with
    every index. Each index is answered at most once."""
    if len(data) < _REPLY.size + 1:
        raise ForwardingError(f"reply of {len(data)} bytes is shorter than its header")
    version, status = _REPLY.unpack_from(data)
    if version != VERSION:
        raise ForwardingError(f"reply version {version}, expected {VERSION}")
    if status == REFUSED:
        kind = _error_kind(data[_REPLY.size])
        return [ReplyPart(list(range(count)), error=kind, message=_reply_text(data[_REPLY.size + 1:]))]
    if status != ANSWERED:
        raise ForwardingError(f"unknown reply status {status}")
    if len(data) < _REPLY.size + _U32.size:
        raise ForwardingError("reply cut short")
    (part_count,) = _U32.unpack_from(data, _REPLY.size)
    at = _REPLY.size + _U32.size
    parts: list[ReplyPart] = []
    answered: set[int] = set()
    for _ in range(part_count):
        part, at = _reply_part(data, at, count)
        if answered.intersection(part.indices) or len(set(part.indices)) != len(part.indices):
            raise ForwardingError("a publish is answered twice")
        answered.update(part.indices)
        parts.append(part)
    if at != len(data):
        raise ForwardingError(f"{len(data) - at} bytes after the reply's last part")
    return parts


def _reply_part(data: bytes, at: int, count: int) -> tuple[ReplyPart, int]:
    if at + _PART.size > len(data):
        raise ForwardingError("reply part cut short")
    outcome, index_count = _PART.unpack_from(data, at)
    at += _PART.size
    if outcome not in (ACKED, FAILED) or index_count > count:
        raise ForwardingError(f"bad reply part: outcome {outcome}, {index_count} indices of {count}")
    if at + 4 * index_count + _U32.size > len(data):
        raise ForwardingError("reply part's indices cut short")
    indices = list(struct.unpack_from(f">{index_count}I", data, at))
    at += 4 * index_count
    if any(index >= count for index in indices):
        raise ForwardingError(f"reply answers a publish beyond the batch's {count}")
    (length,) = _U32.unpack_from(data, at)
    at += _U32.size
    body = data[at:at + length]
    if len(body) != length:
        raise ForwardingError("reply part's body cut short")
    at += length
    if outcome == ACKED:
        _check_framed(body, index_count)
        return ReplyPart(indices, framed=body), at
    if not body:
        raise ForwardingError("failed part without an error kind")
    return ReplyPart(indices, error=_error_kind(body[0]), message=_reply_text(body[1:])), at


def _check_framed(framed: bytes, count: int) -> None:
    """That ``framed`` is ``count`` whole gRPC messages (uncompressed), as a client must get them."""
    at = 0
    for _ in range(count):
        if at + 5 > len(framed) or framed[at] != 0:
            raise ForwardingError("acked part is not gRPC-framed responses")
        at += 5 + _U32.unpack_from(framed, at + 1)[0]
    if at != len(framed):
        raise ForwardingError(f"acked part holds other than {count} responses")


def _error_kind(value: int) -> ErrorKind:
    try:
        return ErrorKind(value)
    except ValueError:
        raise ForwardingError(f"unknown error kind {value}") from None


def _reply_text(data: bytes) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise ForwardingError("error message is not UTF-8") from None
