"""A fetch session's rounds (see ``partition.replication.session``) and a node pair's
notifications: bascule's own, msgpack in an envelope.

Round (FETCH_SESSION_ROUND): [follower id, session id, round number, leader time echoed, [[slot,
stream, partition, leader epoch, log end offset, HW], ...] (the slots set), [slot, ...] (the slots
emptied)]. Answer (FETCH_SESSION_ANSWER): [the leader's clock reading, [slots that must fetch now,
ascending]], or [the leader's clock reading, nil] when the leader does not hold the session as the
round expects (a full round is then due). Session and round numbers are below 2**64, slots below
``MAX_ITEMS``, each slot once a round.

The previous version's full rounds, still answered for a node of that version and sent to one
(FETCH_SESSION_REQUEST): [follower id, leader time echoed, [[stream, partition, leader epoch, log
end offset, HW], ...]]; their reply (FETCH_SESSION_RESPONSE): [the leader's clock reading, [indexes
of the items that must fetch now, ascending]]. Notifications (PARTITION_NOTIFICATIONS): [[stream,
partition], ...]; Liftbridge's one-partition PARTITION_NOTIFICATION is read too.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import msgpack

from bascule.wire.envelope import EnvelopeError, MsgType, decode, decode_message, decode_packed, encode
from bascule.wire.pb import internal_pb2

# Bounds what one round costs a leader, and the items a session holds (its slots): a follower with
# more parked partitions has more sessions.
MAX_ITEMS = 4096
_MAX_NUMBER = 1 << 64  # session ids and round numbers: msgpack's unsigned integers
# What a round or a notification holds beyond its items' streams' names: the envelope, msgpack, the
# follower id (at most), and each item's integers (its slot's too). An emptied slot takes 3 bytes.
ROUND_OVERHEAD = 1024
ITEM_OVERHEAD = 48
EMPTIED_SLOT_SIZE = 3


def item_size(stream: str) -> int:
    """What an item of ``stream`` takes in a round or a notification, at most."""
    return len(stream.encode()) + ITEM_OVERHEAD


def items_budget(max_payload: int) -> int:
    """What the items of one round may take for it to fit a message of ``max_payload`` bytes, with
    every other slot emptied in it too."""
    return max_payload - ROUND_OVERHEAD - MAX_ITEMS * EMPTIED_SLOT_SIZE


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


class SessionRound(NamedTuple):
    follower: str
    session: int
    number: int  # 0: a full round
    leader_time: float
    upserts: list[tuple[int, ParkedItem]]  # (slot, the item now in it)
    removals: list[int]  # slots emptied


class SessionAnswer(NamedTuple):
    leader_time: float
    news: list[int] | None  # the slots that must fetch; None: refused, a full round is due


def encode_session_round(round_: SessionRound) -> bytes:
    follower, session, number, leader_time, upserts, removals = round_
    body = [follower, session, number, leader_time, [[slot, *item] for slot, item in upserts], removals]
    return encode(MsgType.FETCH_SESSION_ROUND, msgpack.packb(body))


def decode_session_round(data: bytes | memoryview) -> SessionRound:
    body = decode_packed(data, MsgType.FETCH_SESSION_ROUND)
    if not (isinstance(body, list) and len(body) == 6):
        raise EnvelopeError("a fetch session round is [follower, session, round, leader time, set, emptied]")
    follower, session, number, leader_time, raw_upserts, removals = body
    if not isinstance(follower, str) or not follower or not (_number(session) and _number(number)):
        raise EnvelopeError("a fetch session round needs a follower id, a session id and a round number")
    if not (isinstance(raw_upserts, list) and isinstance(removals, list)):
        raise EnvelopeError("a fetch session round's set and emptied slots are lists")
    if len(raw_upserts) + len(removals) > MAX_ITEMS:
        raise EnvelopeError(f"a fetch session round of {len(raw_upserts) + len(removals)} slots (at most {MAX_ITEMS})")
    upserts = [_upsert(raw) for raw in raw_upserts]
    if not all(_is_slot(slot) for slot in removals):
        raise EnvelopeError(f"an emptied slot is an integer below {MAX_ITEMS}")
    if len({slot for slot, _ in upserts}.union(removals)) != len(upserts) + len(removals):
        raise EnvelopeError("a fetch session round names a slot twice")
    return SessionRound(follower, session, number, _time(leader_time), upserts, removals)


def encode_session_answer(leader_time: float, news: list[int] | None) -> bytes:
    return encode(MsgType.FETCH_SESSION_ANSWER, msgpack.packb([leader_time, news]))


def decode_session_answer(data: bytes | memoryview) -> SessionAnswer:
    body = decode_packed(data, MsgType.FETCH_SESSION_ANSWER)
    if not (isinstance(body, list) and len(body) == 2 and (body[1] is None or isinstance(body[1], list))):
        raise EnvelopeError("a fetch session answer is [leader time, news or nil]")
    news = body[1]
    if news is not None and not (
        all(_is_slot(slot) for slot in news) and all(a < b for a, b in zip(news, news[1:]))
    ):
        raise EnvelopeError(f"a fetch session answer's news are ascending slots below {MAX_ITEMS}")
    return SessionAnswer(_time(body[0]), news)


def decode_request(data: bytes | memoryview) -> SessionRound | Round:
    """A round of either kind a leader node answers: incremental, or the previous version's."""
    kind, _ = decode(data)
    return decode_round(data) if kind == MsgType.FETCH_SESSION_REQUEST else decode_session_round(data)


def encode_round(follower: str, leader_time: float, items: list[ParkedItem]) -> bytes:
    return encode(MsgType.FETCH_SESSION_REQUEST, msgpack.packb([follower, leader_time, items]))


def decode_round(data: bytes | memoryview) -> Round:
    body = decode_packed(data, MsgType.FETCH_SESSION_REQUEST)
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
    body = decode_packed(data, MsgType.FETCH_SESSION_RESPONSE)
    if not (isinstance(body, list) and len(body) == 2 and isinstance(body[1], list)):
        raise EnvelopeError("a fetch session reply is [leader time, news]")
    news = body[1]
    if not all(type(index) is int for index in news):
        raise EnvelopeError("a fetch session reply's news are item indexes")
    if news and (news[0] < 0 or news[-1] >= items or any(a >= b for a, b in zip(news, news[1:]))):
        raise EnvelopeError("a fetch session reply names items the round did not have")
    return RoundReply(_time(body[0]), news)


def _time(value: Any) -> float:
    if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
        raise EnvelopeError("a leader time is a finite number >= 0")
    return float(value)


def _number(value: Any) -> bool:
    return type(value) is int and 0 <= value < _MAX_NUMBER


def _is_slot(value: Any) -> bool:
    return type(value) is int and 0 <= value < MAX_ITEMS


def _upsert(raw: Any) -> tuple[int, ParkedItem]:
    if not (isinstance(raw, list) and raw and _is_slot(raw[0])):
        raise EnvelopeError(f"a set slot is [slot below {MAX_ITEMS}, stream, partition, leader epoch, log end, HW]")
    return raw[0], _item(raw[1:])


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
    body = decode_packed(data, MsgType.PARTITION_NOTIFICATIONS)
    if not isinstance(body, list) or len(body) > MAX_ITEMS:
        raise EnvelopeError(f"notifications are a list of at most {MAX_ITEMS} [stream, partition] pairs")
    if not all(isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str) and type(pair[1]) is int
               and pair[1] >= 0 for pair in body):
        raise EnvelopeError("a notification is [stream, partition]")
    return [(stream, partition) for stream, partition in body]
