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
from collections.abc import Mapping

from bascule.wire.entry import Record

MESSAGE_ID_HEADER = "Nats-Msg-Id"
# An id longer than this is remembered by its SHA-256: the window's memory per id stays bounded
# whatever publishers send, and the same id always gives the same key.
MAX_KEPT_ID_BYTES = 64


def message_id(headers: Mapping[str, bytes]) -> bytes | None:
    """The id a message's headers carry, or None (no header, or an empty one)."""
    value = headers.get(MESSAGE_ID_HEADER)
    return value or None


def message_ids(records: list[Record]) -> list[bytes | None] | None:
    """The records' message ids, or None when none has one (the common case costs no more)."""
    ids = [message_id(record.headers) for record in records]
    return ids if any(ids) else None


def window_key(message_id: bytes) -> bytes:
    """What the deduplication window keeps for ``message_id``."""
    if len(message_id) <= MAX_KEPT_ID_BYTES:
        return message_id
    return hashlib.sha256(message_id).digest()
