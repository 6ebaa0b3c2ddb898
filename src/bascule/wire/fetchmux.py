"""Multiplexed fetches: the fetch requests a follower node makes of one leader node in one loop turn,
carried in one NATS request, and their replies in one answer (``partition.fetchmux``).
bascule's own, msgpack in an envelope.

Request (FETCH_MUX_REQUEST): [follower id, [[stream, partition, request], ...]], each request the
bytes a fetch sends on its partition's replicate subject. Answer (FETCH_MUX_ANSWER): [[code, reply],
...], one per item in the request's order, each reply the bytes that subject would have answered
(``ANSWERED``; empty for the other codes).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum
from typing import Any, NamedTuple, TypeVar

import msgpack

from bascule.wire.envelope import EnvelopeError, MsgType, decode_packed, encode

# Bounds the items of one request (and so of one answer): what one request costs a leader, and the
# framing a reply must leave room for (``ANSWER_RESERVE``).
MAX_ITEMS = 1024
# What a request holds beyond its items' streams' names and requests: the envelope, msgpack, the
# follower id; and an item's own framing (its list, the partition, the bytes' header).
REQUEST_OVERHEAD = 1024
ITEM_OVERHEAD = 32
# What an answer holds beyond its replies: the envelope and msgpack's list; per item, its framing.
ANSWER_OVERHEAD = 64
ANSWER_ITEM_OVERHEAD = 8
# An answer's framing beyond its replies' bytes, at most: a fetch's reply leaves this much of a
# message free, so that the first reply of an answer is never cut shorter than it would go alone.
ANSWER_RESERVE = ANSWER_OVERHEAD + MAX_ITEMS * ANSWER_ITEM_OVERHEAD


class Code(IntEnum):
    ANSWERED = 0
    SILENT = 1  # the partition's endpoint gives no reply to this request (it cannot serve it)
    NOT_HERE = 2  # this node has no endpoint for the partition: no responder
    NO_ROOM = 3  # not served: the answer had no room left for its reply; ask again


class MuxItem(NamedTuple):
    stream: str
    partition: int
    request: bytes


class MuxRequest(NamedTuple):
    follower: str
    items: list[MuxItem]


def item_size(item: MuxItem) -> int:
    """What ``item`` takes in a request, at most."""
    return len(item.stream.encode()) + len(item.request) + ITEM_OVERHEAD


T = TypeVar("T")


def requests_of(waiting: list[T], item: Callable[[T], MuxItem], max_payload: int) -> list[list[T]]:
    """``waiting`` in order, cut into runs whose items (``item`` of each) fit one request of
    ``max_payload`` bytes and ``MAX_ITEMS`` items."""
    budget = max_payload - REQUEST_OVERHEAD
    runs: list[list[T]] = []
    size = budget  # the first one starts a run
    for entry in waiting:
        cost = item_size(item(entry))
        if size + cost > budget or len(runs[-1]) == MAX_ITEMS:
            runs.append([])
            size = 0
        runs[-1].append(entry)
        size += cost
    return runs


def encode_request(follower: str, items: list[MuxItem]) -> bytes:
    return encode(MsgType.FETCH_MUX_REQUEST, msgpack.packb([follower, [list(item) for item in items]]))


def decode_request(data: bytes | memoryview) -> MuxRequest:
    body = decode_packed(data, MsgType.FETCH_MUX_REQUEST)
    if not (isinstance(body, list) and len(body) == 2 and isinstance(body[0], str) and isinstance(body[1], list)):
        raise EnvelopeError("a fetch mux request is [follower id, items]")
    follower, raw_items = body
    if not 0 < len(raw_items) <= MAX_ITEMS:
        raise EnvelopeError(f"a fetch mux request holds 1 to {MAX_ITEMS} items, not {len(raw_items)}")
    return MuxRequest(follower, [_item(raw) for raw in raw_items])


def encode_answer(answers: list[tuple[Code, bytes]]) -> bytes:
    return encode(MsgType.FETCH_MUX_ANSWER, msgpack.packb([[int(code), reply] for code, reply in answers]))


def decode_answer(data: bytes | memoryview, items: int) -> list[tuple[Code, bytes]]:
    """The answer to a request of ``items`` items, each (code, reply)."""
    body = decode_packed(data, MsgType.FETCH_MUX_ANSWER)
    if not isinstance(body, list) or len(body) != items:
        raise EnvelopeError(f"a fetch mux answer holds one reply per item ({items})")
    answers = []
    for raw in body:
        if not (isinstance(raw, list) and len(raw) == 2 and type(raw[0]) is int and isinstance(raw[1], bytes)):
            raise EnvelopeError("a fetch mux reply is [code, bytes]")
        try:
            code = Code(raw[0])
        except ValueError:
            raise EnvelopeError(f"unknown fetch mux reply code {raw[0]}") from None
        if code != Code.ANSWERED and raw[1]:
            raise EnvelopeError(f"a {code.name} reply carries no bytes")
        answers.append((code, raw[1]))
    return answers


def _item(raw: Any) -> MuxItem:
    if not (isinstance(raw, list) and len(raw) == 3 and isinstance(raw[0], str) and type(raw[1]) is int
            and raw[1] >= 0 and isinstance(raw[2], bytes)):
        raise EnvelopeError("a fetch mux item is [stream, partition >= 0, request bytes]")
    return MuxItem(raw[0], raw[1], raw[2])
