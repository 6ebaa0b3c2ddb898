import pytest
from hypothesis import given
from hypothesis import strategies as st

from bascule.wire.envelope import EnvelopeError, MsgType, encode
from bascule.wire.replicate import ReplicateResponse, decode_response, encode_response

epochs = st.integers(min_value=0, max_value=2**64 - 1)
high_watermarks = st.integers(min_value=-1, max_value=2**63 - 1)


def test_layout():
    data = encode_response(leader_epoch=2, hw=-1, leader_time=1.5, entries=b"E")
    assert data == (
        b"\xb9\x0e\x43\xb4\x00\x08\x00\x03"
        + (2).to_bytes(8, "big")
        + b"\xff" * 8
        + bytes.fromhex("3ff8000000000000")  # 1.5, an IEEE 754 double
        + b"E"
    )


clock_readings = st.floats(min_value=0.0, allow_infinity=False)


@given(epochs, high_watermarks, clock_readings, st.binary(max_size=200))
def test_round_trip(leader_epoch: int, hw: int, leader_time: float, entries: bytes):
    response = decode_response(encode_response(leader_epoch, hw, leader_time, entries))
    assert (response.leader_epoch, response.hw, response.leader_time, bytes(response.entries)) == (
        leader_epoch,
        hw,
        leader_time,
        entries,
    )


@pytest.mark.parametrize("reading", [float("nan"), float("inf"), float("-inf"), -1.0])
def test_a_leader_time_no_clock_gives_reads_as_none(reading: float):
    from bascule.wire.replicate import encode_fragment

    assert decode_response(encode_response(1, 0, reading, b"")).leader_time == 0.0
    assert decode_response(encode_fragment(1, 0, reading, 10, 0, b"x")).leader_time == 0.0


def test_encode_accepts_a_memoryview_of_entries():
    log = b"....entries...."
    data = encode_response(1, 0, 2.0, memoryview(log)[4:11])
    assert bytes(decode_response(data).entries) == b"entries"


def test_entries_are_a_view_of_the_received_bytes():
    data = encode_response(1, 5, 2.0, b"entries")
    response = decode_response(data)
    assert isinstance(response, ReplicateResponse)
    assert response.entries.obj is data


def test_no_entries():
    assert decode_response(encode_response(3, 10, 2.0, b"")) == ReplicateResponse(3, 10, 2.0, memoryview(b""))


def test_decode_accepts_a_crc_envelope():
    payload = (4).to_bytes(8, "big") + (9).to_bytes(8, "big") + bytes(8) + b"x"
    response = decode_response(encode(MsgType.REPLICATION_RESPONSE, payload, with_crc=True))
    assert (response.leader_epoch, response.hw, response.leader_time, bytes(response.entries)) == (4, 9, 0.0, b"x")


@pytest.mark.parametrize("body_length", [0, 1, 15, 23])
def test_short_body(body_length: int):
    with pytest.raises(EnvelopeError, match="too short"):
        decode_response(encode(MsgType.REPLICATION_RESPONSE, b"\x00" * body_length))


def test_wrong_envelope_type():
    with pytest.raises(EnvelopeError, match="REPLICATION_RESPONSE"):
        decode_response(encode(MsgType.REPLICATION_REQUEST, b"\x00" * 24))


def test_not_an_envelope():
    with pytest.raises(EnvelopeError, match="magic"):
        decode_response(b"\x00" * 32)


@given(st.binary(max_size=64))
def test_garbage_raises_only_envelope_error(data: bytes):
    try:
        decode_response(data)
    except EnvelopeError:
        pass


@given(st.binary(max_size=40))
def test_garbage_after_a_valid_header_raises_only_envelope_error(body: bytes):
    try:
        decode_response(encode(MsgType.REPLICATION_RESPONSE, b"") + body)
    except EnvelopeError:
        pass


def test_a_fragment_round_trips_and_says_where_its_piece_goes():
    from bascule.wire.replicate import encode_fragment

    response = decode_response(encode_fragment(7, 41, 3.25, 1000, 600, b"p" * 400))
    assert (response.leader_epoch, response.hw, response.leader_time, response.fragment_of,
            response.fragment_start) == (7, 41, 3.25, 1000, 600)
    assert bytes(response.entries) == b"p" * 400
    assert decode_response(encode_response(7, 41, 3.25, b"")).fragment_of is None


@pytest.mark.parametrize("entry_size,start,piece", [(1000, 900, b"p" * 200), (10, 0, b""), (0, 0, b"x"),
                                                    (2 ** 64 - 1, 2 ** 64 - 1, b"xy")])
def test_fragments_that_do_not_fit_their_entry_are_refused(entry_size, start, piece):
    from bascule.wire.replicate import encode_fragment

    with pytest.raises(EnvelopeError):
        decode_response(encode_fragment(1, 0, 1.0, entry_size, start, piece))


def test_a_truncated_fragment_header_is_refused():
    with pytest.raises(EnvelopeError, match="too short"):
        decode_response(encode(MsgType.REPLICATION_FRAGMENT, b"\x00" * 39))
