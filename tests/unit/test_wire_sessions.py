"""A fetch session's round and reply on the wire (bascule.wire.sessions), and the rule that
decides which parked followers must fetch (bascule.partition.replication.session)."""

import math

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bascule.partition.replication.session import has_news
from bascule.wire import sessions
from bascule.wire.envelope import EnvelopeError, MsgType, encode
from bascule.wire.pb import internal_pb2
from bascule.wire.sessions import ParkedItem

ITEMS = [ParkedItem("orders", 0, 3, 120, 119), ParkedItem("ünïcode.stream", 1023, 0, 0, -1)]


def test_a_round_and_its_reply_travel_whole():
    decoded = sessions.decode_round(sessions.encode_round("node-b", 12.5, ITEMS))
    assert decoded == sessions.Round("node-b", 12.5, ITEMS)
    assert sessions.decode_reply(sessions.encode_reply(99.25, [0, 1]), items=2) == sessions.RoundReply(99.25, [0, 1])
    assert sessions.decode_reply(sessions.encode_reply(0, []), items=0) == sessions.RoundReply(0.0, [])


def _round(body) -> bytes:
    return encode(MsgType.FETCH_SESSION_REQUEST, msgpack.packb(body))


@pytest.mark.parametrize("body", [
    None, [], ["b", 1.0], ["", 1.0, []], [7, 1.0, []], ["b", "x", []], ["b", -1.0, []], ["b", math.inf, []],
    ["b", math.nan, []], ["b", 1.0, {}], ["b", 1.0, [["s", 0, 1, 2]]], ["b", 1.0, [["s", 0, 1, 2, 3, 4]]],
    ["b", 1.0, [[b"s", 0, 1, 2, 1]]], ["b", 1.0, [["s", -1, 1, 2, 1]]], ["b", 1.0, [["s", 0, -1, 2, 1]]],
    ["b", 1.0, [["s", 0, 1, -2, 1]]], ["b", 1.0, [["s", 0, 1, 2, -2]]], ["b", 1.0, [["s", 0, 1.5, 2, 1]]],
    ["b", 1.0, [["s", True, 1, 2, 1]]], ["b", 1.0, [["s", 0, 1, 2, 1]] * (sessions.MAX_ITEMS + 1)],
])
def test_a_malformed_round_is_refused(body):
    with pytest.raises(EnvelopeError):
        sessions.decode_round(_round(body))


def test_a_round_in_the_wrong_envelope_or_no_msgpack_is_refused():
    with pytest.raises(EnvelopeError):
        sessions.decode_round(sessions.encode_reply(1.0, []))
    with pytest.raises(EnvelopeError):
        sessions.decode_round(encode(MsgType.FETCH_SESSION_REQUEST, b"\xc1"))
    with pytest.raises(EnvelopeError):
        sessions.decode_round(b"not an envelope")


@pytest.mark.parametrize("news", [[2], [-1], [1, 0], [0, 0], [0.5], ["0"], [True]])
def test_a_reply_naming_items_the_round_did_not_have_is_refused(news):
    with pytest.raises(EnvelopeError):
        sessions.decode_reply(encode(MsgType.FETCH_SESSION_RESPONSE, msgpack.packb([1.0, news])), items=2)


@given(st.binary(max_size=200))
def test_garbage_is_refused_or_decoded_never_anything_else(data):
    for decode in (sessions.decode_round, lambda d: sessions.decode_reply(d, 3)):
        try:
            decode(data)
        except EnvelopeError:
            pass
        try:
            decode(_round(data) if decode is sessions.decode_round else encode(MsgType.FETCH_SESSION_RESPONSE, data))
        except EnvelopeError:
            pass


@pytest.mark.parametrize(("offset", "follower_hw", "leader_end", "leader_hw", "log_start", "news"), [
    (10, 9, 10, 9, 0, False),  # caught up, HW known
    (10, 9, 11, 9, 0, True),  # an entry past its end
    (10, 8, 10, 9, 0, True),  # an HW to take
    (10, 9, 10, 12, 0, False),  # the leader's HW beyond its end is not its to take
    (10, 7, 10, 8, 0, True),
    (10, 9, 10, 9, 11, True),  # the leader's log starts past it: restart there
    (0, -1, 0, -1, 0, False),  # both empty
])
def test_which_parked_follower_must_fetch(offset, follower_hw, leader_end, leader_hw, log_start, news):
    assert has_news(offset, follower_hw, leader_end, leader_hw, log_start) is news


def test_notifications_travel_whole_and_the_one_partition_kind_is_still_read():
    pairs = [("orders", 0), ("ünïcode.stream", 1023)]
    assert sessions.decode_notifications(sessions.encode_notifications(pairs)) == pairs
    # What nodes before fetch sessions send (a rolling upgrade): Liftbridge's PartitionNotification.
    one = encode(MsgType.PARTITION_NOTIFICATION, internal_pb2.PartitionNotification(
        stream="orders", partition=3).SerializeToString())
    assert sessions.decode_notifications(one) == [("orders", 3)]


@pytest.mark.parametrize("body", [
    None, {}, [["s"]], [["s", -1]], [["s", 1.0]], [[b"s", 1]], [["s", 1, 2]], [["s", True]],
    [["s", 0]] * (sessions.MAX_ITEMS + 1),
])
def test_malformed_notifications_are_refused(body):
    with pytest.raises(EnvelopeError):
        sessions.decode_notifications(encode(MsgType.PARTITION_NOTIFICATIONS, msgpack.packb(body)))


@given(st.binary(max_size=100))
def test_garbage_notifications_are_refused_or_read_never_anything_else(data):
    for framed in (data, encode(MsgType.PARTITION_NOTIFICATIONS, data), encode(MsgType.PARTITION_NOTIFICATION, data)):
        try:
            sessions.decode_notifications(framed)
        except EnvelopeError:
            pass


def test_rounds_and_notifications_are_cut_at_the_item_bound_and_at_a_message_s_size():
    from bascule.partition.session import fitting

    many = [("s", p) for p in range(sessions.MAX_ITEMS * 2 + 1)]
    chunks = fitting(many, lambda key: key[0], 64 << 20)
    assert [len(c) for c in chunks] == [sessions.MAX_ITEMS, sessions.MAX_ITEMS, 1]
    assert [key for chunk in chunks for key in chunk] == many
    long_names = [("x" * 1000, p) for p in range(40)]
    for chunk in fitting(long_names, lambda key: key[0], 8192):
        assert len(sessions.encode_notifications(chunk)) <= 8192
