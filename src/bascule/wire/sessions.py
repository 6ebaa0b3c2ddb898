"""A fetch session's round (see ``partition.replication.session``) and a node pair's
notifications: bascule's own, msgpack in an envelope.

Request (FETCH_SESSION_REQUEST): [follower id, leader time echoed, [[stream, partition, leader
epoch, log end offset, HW], ...]]. Reply (FETCH_SESSION_RESPONSE): [the leader's clock reading,
[indexes of the items that must fetch now, ascending]]. Notifications (PARTITION_NOTIFICATIONS):
[[stream, partition], ...]; Liftbridge's one-partition PARTITION_NOTIFICATION is read too.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import msgpack

from bascule.wire.envelope import EnvelopeError, MsgType, decode, decode_message, encode
from bascule.wire.pb import internal_pb2

# Bounds what one round costs a leader: a follower with more parked partitions sends more rounds.
MAX_ITEMS = 4096


class ParkedItem(NamedTuple):
    stream: str
    partition: int
    leader_epoch: int
    offset: int  # the follower's log end
    hw: int


class Round(NamedTuple):
    follower: str
    leader_time: float
    items: list[ParkedItem]


class RoundReply(NamedTuple):
    leader_time: float
    news: list[int]


def encode_round(follower: str, leader_time: float, items: list[ParkedItem]) -> bytes:
    return encode(MsgType.FETCH_SESSION_REQUEST, msgpack.packb([follower, leader_time, items]))


def decode_round(data: bytes | memoryview) -> Round:
    body = _body(data, MsgType.FETCH_SESSION_REQUEST)
    if not (isinstance(body, list) and len(body) == 3):
        raise EnvelopeError("a fetch session round is [follower, leader time, items]")
    follower, leader_time, raw_items = body
    if not isinstance(follower, str) or not follower or not isinstance(raw_items, list):
        raise EnvelopeError("a fetch session round needs a follower id and a list of items")
    if len(raw_items) > MAX_ITEMS:
        raise EnvelopeError(f"a fetch session round of {len(raw_items)} items (at most {MAX_ITEMS})")
    return Round(follower, _time(leader_time), [_item(raw) for raw in raw_items])


def encode_reply(leader_time: float, news: list[int]) -> bytes:
    return encode(MsgType.FETCH_SESSION_RESPONSE, msgpack.packb([leader_time, news]))


def decode_reply(data: bytes | memoryview, items: int) -> RoundReply:
    """The reply to a round of ``items`` items: every index must name one of them, once, in order."""
    body = _body(data, MsgType.FETCH_SESSION_RESPONSE)
    if not (isinstance(body, list) and len(body) == 2 and isinstance(body[1], list)):
        raise EnvelopeError("a fetch session reply is [leader time, news]")
    news = body[1]
    if not all(type(index) is int for index in news):
        raise EnvelopeError("a fetch session reply's news are item indexes")
    if news and (news[0] < 0 or news[-1] >= items or any(a >= b for a, b in zip(news, news[1:]))):
        raise EnvelopeError("a fetch session reply names items the round did not have")
    return RoundReply(_time(body[0]), news)


def _body(data: bytes | memoryview, expected: MsgType) -> Any:
    kind, payload = decode(data)
    if kind != expected:
        raise EnvelopeError(f"expected a {expected.name} envelope, got {kind.name}")
    try:
        return msgpack.unpackb(payload, raw=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise EnvelopeError(f"malformed {expected.name}: {exc}") from exc


def _time(value: Any) -> float:
    if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
        raise EnvelopeError("a leader time is a finite number >= 0")
    return float(value)


def _item(raw: Any) -> ParkedItem:
    if not (isinstance(raw, list) and len(raw) == 5 and isinstance(raw[0], str)
            and all(type(field) is int for field in raw[1:])):
        raise EnvelopeError("a parked item is [stream, partition, leader epoch, log end, HW]")
    stream, partition, leader_epoch, offset, hw = raw
    if partition < 0 or leader_epoch < 0 or offset < 0 or hw < -1:
        raise EnvelopeError("a parked item's partition, epoch, log end and HW are >= 0 (HW >= -1)")
    return ParkedItem(stream, partition, leader_epoch, offset, hw)


def encode_notifications(partitions: list[tuple[str, int]]) -> bytes:
    return encode(MsgType.PARTITION_NOTIFICATIONS, msgpack.packb(partitions))


def decode_notifications(data: bytes | memoryview) -> list[tuple[str, int]]:
    kind, _ = decode(data)
    if kind == MsgType.PARTITION_NOTIFICATION:
        one = decode_message(data, kind, internal_pb2.PartitionNotification)
        return [(one.stream, one.partition)]
    body = _body(data, MsgType.PARTITION_NOTIFICATIONS)
    if not isinstance(body, list) or len(body) > MAX_ITEMS:
        raise EnvelopeError(f"notifications are a list of at most {MAX_ITEMS} [stream, partition] pairs")
    if not all(isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str) and type(pair[1]) is int
               and pair[1] >= 0 for pair in body):
        raise EnvelopeError("a notification is [stream, partition]")
    return [(stream, partition) for stream, partition in body]
