"""Message ids: what makes a write idempotent.

A message carrying the ``Nats-Msg-Id`` header (JetStream's name for it, so a NATS publisher moving
between the two keeps its code) is stored once per partition within the stream's deduplication
window: a second message with the same id in that window is not stored again, and its publisher is
acked with the first one's offset. The header is stored with the message, so the window travels
with the replicated log: a new leader rebuilds it from its log's tail.

Every path that writes takes the id from the same header: gRPC publishes (``headers``), Liftbridge
envelopes (their headers), plain NATS messages (the NATS header block), bascule's client and the
Spark sink (which set it).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator, Mapping

from bascule.wire.entry import Record, decode_header_block, header_blocks_holding

MESSAGE_ID_HEADER = "Nats-Msg-Id"
# An id longer than this is remembered by its SHA-256: the window's memory per id stays bounded
# whatever publishers send, and the same id always gives the same key.
MAX_KEPT_ID_BYTES = 64
_UINT16, _UINT32 = struct.Struct(">H"), struct.Struct(">I")
_ID_NAME_BYTES = MESSAGE_ID_HEADER.encode()
_ID_NAME = _UINT16.pack(len(_ID_NAME_BYTES)) + _ID_NAME_BYTES
# For each shared header block: what goes before and after a message's id in its encoding. The
# blocks are capture.stored_headers' (one per subject, bounded alike).
_AROUND_ID_CACHE_SIZE = 4096
_around_id: dict[bytes, tuple[bytes, bytes]] = {}


def message_id(headers: Mapping[str, bytes]) -> bytes | None:
    """The id a message's headers carry, or None (no header, or an empty one)."""
    value = headers.get(MESSAGE_ID_HEADER)
    return value or None


def message_ids(records: list[Record]) -> list[bytes | None] | None:
    """The records' message ids, or None when none has one (the common case costs no more)."""
    ids = [message_id(record.headers) for record in records]
    return ids if any(ids) else None


def headers_with_id(message_id: bytes, shared: Mapping[str, bytes], block: bytes) -> tuple[dict[str, bytes], bytes]:
    """The headers of a message whose only own header is its id, beside ``shared`` (the subject and
    reply ones every message gets, encoded as ``block``), and their encoding: ``block`` with the id
    in front, without encoding the others again (a fifth of ``encode_headers``' time)."""
    parts = _around_id.get(block)
    if parts is None:
        if len(_around_id) >= _AROUND_ID_CACHE_SIZE:
            _around_id.clear()
        parts = _around_id[block] = (_UINT16.pack(_UINT16.unpack_from(block)[0] + 1) + _ID_NAME, block[2:])
    head, tail = parts
    return {MESSAGE_ID_HEADER: message_id, **shared}, head + _UINT32.pack(len(message_id)) + message_id + tail


def stored_message_ids(buf: bytes) -> Iterator[tuple[int, int, bytes]]:
    """(offset, timestamp, message id) of each entry of ``buf`` (whole entries, their CRCs checked
    already) that has one. An id first among the headers, where bascule's writers put it, is read in
    place; elsewhere the entry's headers are decoded."""
    for offset, timestamp, block in header_blocks_holding(buf, _ID_NAME_BYTES):
        if block.startswith(_ID_NAME, 2):
            start = 2 + len(_ID_NAME) + _UINT32.size
            value = block[start:start + _UINT32.unpack_from(block, start - _UINT32.size)[0]]
        else:
            value = decode_header_block(block, offset).get(MESSAGE_ID_HEADER, b"")
        if value:
            yield offset, timestamp, value


def window_key(message_id: bytes) -> bytes:
    """What the deduplication window keeps for ``message_id``."""
    if len(message_id) <= MAX_KEPT_ID_BYTES:
        return message_id
    return hashlib.sha256(message_id).digest()
