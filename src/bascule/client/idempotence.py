"""Idempotent publishing: each message the client publishes carries an id of its own in the
``Nats-Msg-Id`` header, made once before its first attempt and sent again by every retry, so that
the partition's leader stores a message whose ack was lost (a leader that died, a connection cut
after the write) once, and acks its retry with the first copy's offset (issue 31; the leader's side
is described in `bascule.wire.dedup`)."""

from __future__ import annotations

import secrets
from collections.abc import Mapping

from bascule.wire.dedup import MESSAGE_ID_HEADER

# 16 random bytes: two ids meet once in 2**64 messages. In base64url they are 22 bytes, which the
# leader's window keeps as they are (``wire.dedup.MAX_KEPT_ID_BYTES``).
ID_RANDOM_BYTES = 16


def new_message_id() -> bytes:
    return secrets.token_urlsafe(ID_RANDOM_BYTES).encode()


def with_message_id(headers: Mapping[str, bytes] | None, idempotent: bool) -> dict[str, bytes]:
    """The headers to send: ``headers`` and a new message id, unless idempotence is off or they
    carry an id already (the caller's, sent as given, even empty: the server then sees none)."""
    sent = dict(headers or {})
    if idempotent and MESSAGE_ID_HEADER not in sent:
        sent[MESSAGE_ID_HEADER] = new_message_id()
    return sent
