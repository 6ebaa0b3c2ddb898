"""A fetch session's rounds and answers on the wire, incremental and the previous version's full
ones (bascule.wire.sessions), and the rule that decides which parked followers must fetch
(bascule.partition.replication.session)."""

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


SET = [(0, ITEMS[0]), (4095, ITEMS[1])]


def test_an_incremental_round_and_its_answer_travel_whole():
    for round_ in (
        sessions.SessionRound("node-b", 0, 0, 0.0, SET, []),
        sessions.SessionRound("node-b", (1 << 64) - 1, (1 << 64) - 1, 12.5, [], [7, 4095]),
        sessions.SessionRound("node-b", 5, 3, 1.0, SET[:1], [1]),
    ):
        assert sessions.decode_session_round(sessions.encode_session_round(round_)) == round_
        assert sessions.decode_request(sessions.encode_session_round(round_)) == round_
    for news in ([], [0, 17, 4095], None):
        answer = sessions.decode_session_answer(sessions.encode_session_answer(3.25, news))
        assert answer == sessions.SessionAnswer(3.25, news)


def test_a_leader_reads_the_previous_version_s_full_rounds_too():
    assert sessions.decode_request(sessions.encode_round("node-b", 1.5, ITEMS)) == sessions.Round("node-b", 1.5, ITEMS)


def _session_round(body) -> bytes:
    return encode(MsgType.FETCH_SESSION_ROUND, msgpack.packb(body))


GOOD_SET = [0, "s", 0, 1, 2, 1]


@pytest.mark.parametrize("body", [
    None, [], ["b", 1, 0, 1.0, []], ["", 1, 0, 1.0, [], []], [7, 1, 0, 1.0, [], []],
    ["b", -1, 0, 1.0, [], []], ["b", 1.0, 0, 1.0, [], []], ["b", True, 0, 1.0, [], []],
    ["b", 1, -1, 1.0, [], []], ["b", 1, "0", 1.0, [], []], ["b", 1, 0, -1.0, [], []], ["b", 1, 0, math.nan, [], []],
    ["b", 1, 0, 1.0, {}, []], ["b", 1, 0, 1.0, [], {}], ["b", 1, 0, 1.0, [[]], []], ["b", 1, 0, 1.0, [7], []],
    ["b", 1, 0, 1.0, [[4096, "s", 0, 1, 2, 1]], []], ["b", 1, 0, 1.0, [[-1, "s", 0, 1, 2, 1]], []],
    ["b", 1, 0, 1.0, [[True, "s", 0, 1, 2, 1]], []], ["b", 1, 0, 1.0, [[0, "s", 0, 1, 2]], []],
    ["b", 1, 0, 1.0, [[0, "s", -1, 1, 2, 1]], []], ["b", 1, 0, 1.0, [[0, b"s", 0, 1, 2, 1]], []],
    ["b", 1, 0, 1.0, [], [4096]], ["b", 1, 0, 1.0, [], [-1]], ["b", 1, 0, 1.0, [], [0.5]], ["b", 1, 0, 1.0, [], [[0]]],
    ["b", 1, 0, 1.0, [GOOD_SET, GOOD_SET], []],  # a slot set twice
    ["b", 1, 0, 1.0, [GOOD_SET], [0]],  # a slot set and emptied
    ["b", 1, 0, 1.0, [], [3, 3]],
    ["b", 1, 0, 1.0, [[slot, "s", 0, 1, 2, 1] for slot in range(4000)], list(range(4000, 4097))],  # 4,097 slots
])
def test_a_malformed_incremental_round_is_refused(body):
    with pytest.raises(EnvelopeError):
        sessions.decode_session_round(_session_round(body))
    with pytest.raises(EnvelopeError):
        sessions.decode_request(_session_round(body))


@pytest.mark.parametrize("body", [
    None, [], [1.0], [1.0, [], 1], [-1.0, []], [math.inf, []], ["1", []], [1.0, {}], [1.0, [4096]], [1.0, [-1]],
    [1.0, [2, 1]], [1.0, [1, 1]], [1.0, [0.5]], [1.0, [True]], [1.0, ["0"]],
])
def test_a_malformed_answer_is_refused(body):
    with pytest.raises(EnvelopeError):
        sessions.decode_session_answer(encode(MsgType.FETCH_SESSION_ANSWER, msgpack.packb(body)))


def test_an_answer_or_round_in_another_envelope_is_refused():
    with pytest.raises(EnvelopeError):
        sessions.decode_session_answer(sessions.encode_reply(1.0, []))
    with pytest.raises(EnvelopeError):
        sessions.decode_session_round(sessions.encode_session_answer(1.0, []))
    with pytest.raises(EnvelopeError):
        sessions.decode_request(sessions.encode_session_answer(1.0, []))
    with pytest.raises(EnvelopeError):
        sessions.decode_request(encode(MsgType.PARTITION_NOTIFICATIONS, msgpack.packb([])))


@given(st.binary(max_size=200))
def test_incremental_garbage_is_refused_or_decoded_never_anything_else(data):
    framings = (data, _session_round(data), encode(MsgType.FETCH_SESSION_ANSWER, data),
                encode(MsgType.FETCH_SESSION_REQUEST, data))
    for framed in framings:
        for decode in (sessions.decode_session_round, sessions.decode_session_answer, sessions.decode_request):
            try:
                decode(framed)
            except EnvelopeError:
                pass


@given(st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 64) - 1) | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=7), max_leaves=40,
))
def test_msgpack_of_any_shape_is_refused_or_decoded_never_anything_else(body):
    """Well-formed msgpack of any shape, the garbage a byte fuzzer rarely makes."""
    for kind, decode in ((MsgType.FETCH_SESSION_ROUND, sessions.decode_session_round),
                         (MsgType.FETCH_SESSION_ANSWER, sessions.decode_session_answer)):
        try:
            decode(encode(kind, msgpack.packb(body)))
        except EnvelopeError:
            pass


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


def test_notifications_are_cut_at_the_item_bound_and_at_a_message_s_size():
    from bascule.partition.session import fitting

    many = [("s", p) for p in range(sessions.MAX_ITEMS * 2 + 1)]
    chunks = fitting(many, 64 << 20)
    assert [len(c) for c in chunks] == [sessions.MAX_ITEMS, sessions.MAX_ITEMS, 1]
    assert [key for chunk in chunks for key in chunk] == many
    long_names = [("x" * 1000, p) for p in range(40)]
    for chunk in fitting(long_names, 8192):
        assert len(sessions.encode_notifications(chunk)) <= 8192


def test_a_full_session_of_the_longest_names_fits_its_message_with_every_other_slot_emptied():
    """``items_budget``: a round's set slots (at ``item_size`` each) and up to every slot emptied
    fit one message, whatever the integers."""
    max_payload = 64 * 1024
    stream = "ü" * 300
    per_item = sessions.item_size(stream)
    count = sessions.items_budget(max_payload) // per_item
    big = ParkedItem(stream, (1 << 31) - 1, (1 << 64) - 1, (1 << 63) - 1, (1 << 63) - 1)
    round_ = sessions.SessionRound(
        "f" * 64, (1 << 64) - 1, (1 << 64) - 1, 1e300, [(4095 - i, big) for i in range(count)],
        list(range(sessions.MAX_ITEMS - count)),
    )
    assert len(sessions.encode_session_round(round_)) <= max_payload
