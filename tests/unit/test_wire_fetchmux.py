"""The multiplexed fetch codec (bascule.wire.fetchmux): round trips, its bounds, and garbage."""

import msgpack
import pytest

from bascule.wire import fetchmux
from bascule.wire.envelope import EnvelopeError, MsgType, encode
from bascule.wire.fetchmux import Code, MuxItem


def test_a_request_and_its_answer_round_trip():
    items = [MuxItem("orders", 0, b"\x00request"), MuxItem("s", 7, b"")]
    request = fetchmux.decode_request(fetchmux.encode_request("node-1", items))
    assert request.follower == "node-1" and request.items == items
    answers = [(Code.ANSWERED, b"reply"), (Code.NO_ROOM, b"")]
    assert fetchmux.decode_answer(fetchmux.encode_answer(answers), 2) == answers


def test_requests_are_cut_at_the_item_limit_and_within_a_message():
    small = [MuxItem("s", p, b"r" * 40) for p in range(fetchmux.MAX_ITEMS + 5)]
    runs = fetchmux.requests_of(small, lambda item: item, 1 << 20)
    assert [len(run) for run in runs] == [fetchmux.MAX_ITEMS, 5]
    big = [MuxItem("s", p, b"r" * 3000) for p in range(10)]
    max_payload = fetchmux.REQUEST_OVERHEAD + 3 * fetchmux.item_size(big[0])
    runs = fetchmux.requests_of(big, lambda item: item, max_payload)
    assert [len(run) for run in runs] == [3, 3, 3, 1]
    assert all(len(fetchmux.encode_request("f" * 100, run)) <= max_payload for run in runs)
    assert [item for run in runs for item in run] == big


GARBLED_REQUESTS = [
    b"",
    b"\x00" * 10,
    encode(MsgType.FETCH_MUX_ANSWER, msgpack.packb([])),  # another kind
    encode(MsgType.FETCH_MUX_REQUEST, b"\xc1"),  # not msgpack
    encode(MsgType.FETCH_MUX_REQUEST, msgpack.packb({"follower": "f"})),
    encode(MsgType.FETCH_MUX_REQUEST, msgpack.packb(["f", []])),  # no items
    encode(MsgType.FETCH_MUX_REQUEST, msgpack.packb(["f", [["s", 0, b"r"]] * (fetchmux.MAX_ITEMS + 1)])),
    encode(MsgType.FETCH_MUX_REQUEST, msgpack.packb(["f", [["s", -1, b"r"]]])),
    encode(MsgType.FETCH_MUX_REQUEST, msgpack.packb(["f", [["s", 0, "not bytes"]]])),
    encode(MsgType.FETCH_MUX_REQUEST, msgpack.packb(["f", [[b"s", 0, b"r"]]])),
    encode(MsgType.FETCH_MUX_REQUEST, msgpack.packb(["f", [["s", True, b"r"]]])),
    encode(MsgType.FETCH_MUX_REQUEST, msgpack.packb([7, [["s", 0, b"r"]]])),
]


@pytest.mark.parametrize("data", GARBLED_REQUESTS)
def test_a_garbled_request_is_refused_with_a_clear_error(data):
    with pytest.raises(EnvelopeError):
        fetchmux.decode_request(data)


GARBLED_ANSWERS = [
    b"",
    encode(MsgType.FETCH_MUX_REQUEST, msgpack.packb([[0, b""]])),  # another kind
    encode(MsgType.FETCH_MUX_ANSWER, b"\xc1"),
    encode(MsgType.FETCH_MUX_ANSWER, msgpack.packb([[0, b"a"], [0, b"b"]])),  # two replies for one item
    encode(MsgType.FETCH_MUX_ANSWER, msgpack.packb([[9, b""]])),  # unknown code
    encode(MsgType.FETCH_MUX_ANSWER, msgpack.packb([[int(Code.NO_ROOM), b"bytes"]])),
    encode(MsgType.FETCH_MUX_ANSWER, msgpack.packb([[0, "text"]])),
    encode(MsgType.FETCH_MUX_ANSWER, msgpack.packb([[0.0, b""]])),
    encode(MsgType.FETCH_MUX_ANSWER, msgpack.packb({"0": b""})),
]


@pytest.mark.parametrize("data", GARBLED_ANSWERS)
def test_a_garbled_answer_is_refused_with_a_clear_error(data):
    with pytest.raises(EnvelopeError):
        fetchmux.decode_answer(data, 1)
