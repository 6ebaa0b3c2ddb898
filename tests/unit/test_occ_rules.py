"""Optimistic concurrency control: the pure admission rule, which streams it applies to, and the
expected offsets read from captured NATS payloads (garbage included)."""

import dataclasses

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from bascule.config import Config, ConfigError, load_config
from bascule.partition.replication.concurrency import NO_EXPECTATION, admitted
from bascule.wire import capture, envelope
from bascule.wire.names import ACTIVITY_STREAM, CURSORS_STREAM
from bascule.wire.pb import api_pb2
from bascule.wire.settings import effective_settings

INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
# Expectations near the log end, so that both verdicts occur, and anything else an int64 holds.
EXPECTATION = st.one_of(st.just(NO_EXPECTATION), st.integers(0, 12), INT64)
GROUPS = st.lists(st.lists(EXPECTATION, min_size=1, max_size=4), max_size=12)


def test_a_record_expecting_the_next_offset_or_nothing_is_admitted():
    assert admitted(7, [[7], [NO_EXPECTATION], [9, NO_EXPECTATION, 11]]) == [True, True, True]


def test_two_publishers_expecting_the_same_offset_get_one_admission():
    assert admitted(3, [[3], [3]]) == [True, False]
    # The refused one took no offset: the next expectation is measured from the admitted ones.
    assert admitted(3, [[3], [3], [4]]) == [True, False, True]


def test_zero_is_an_expectation_not_an_absence():
    """proto3's default 0 (a client that never sets expectedOffset, a plain NATS message) expects
    offset 0, as in Liftbridge: only -1 expects nothing."""
    assert admitted(0, [[0], [0]]) == [True, False]
    assert admitted(5, [[0]]) == [False]


def test_a_group_is_admitted_whole_or_not_at_all():
    assert admitted(0, [[0, 5], [0, 1]]) == [False, True]


@given(next_offset=st.integers(0, 1 << 40), groups=GROUPS)
def test_admitted_records_get_exactly_the_offsets_they_expect(next_offset, groups):
    offset = next_offset
    for group, verdict in zip(groups, admitted(next_offset, groups), strict=True):
        fits = all(expected in (NO_EXPECTATION, offset + index) for index, expected in enumerate(group))
        assert verdict == fits  # admitted exactly when it fits where the log then ends
        if verdict:
            offset += len(group)


@given(next_offset=st.integers(0, 1 << 40), groups=GROUPS)
def test_groups_without_expectations_are_always_admitted(next_offset, groups):
    free = [[NO_EXPECTATION] * len(group) for group in groups]
    assert admitted(next_offset, free) == [True] * len(groups)


@given(next_offset=st.integers(0, 1 << 40), expected=INT64)
def test_an_expectation_behind_the_log_end_or_otherwise_impossible_is_refused(next_offset, expected):
    assume(expected != NO_EXPECTATION and expected != next_offset)
    assert admitted(next_offset, [[expected]]) == [False]


@given(next_offset=st.integers(0, 1 << 40), racers=st.integers(2, 20))
def test_of_racers_expecting_the_same_offset_exactly_one_wins(next_offset, racers):
    assert admitted(next_offset, [[next_offset]] * racers).count(True) == 1


def concurrency_control(stream: str, settings: dict, server_default: bool) -> bool:
    defaults = dataclasses.replace(Config().stream_defaults, concurrency_control=server_default)
    return effective_settings(stream, settings, defaults).concurrency_control


def test_a_streams_own_setting_wins_over_the_server_default():
    setting = "optimistic_concurrency_control"
    assert concurrency_control("s", {setting: True}, server_default=False)
    assert not concurrency_control("s", {setting: False}, server_default=True)
    assert concurrency_control("s", {}, server_default=True)
    assert not concurrency_control("s", {}, server_default=False)


def test_the_server_setting_is_the_default():
    config = load_config(None, {"streams.concurrency.control": True})
    assert effective_settings("s", {}, config.stream_defaults).concurrency_control


def test_the_internal_streams_never_check_expected_offsets():
    for name in (CURSORS_STREAM, ACTIVITY_STREAM):
        assert not concurrency_control(name, {}, server_default=True)


def _publish(offset: int, with_crc: bool = False) -> bytes:
    message = api_pb2.Message(value=b"v", offset=offset, ackInbox="inbox", ackPolicy=api_pb2.AckPolicy.LEADER)
    return envelope.encode_message(message, envelope.MsgType.PUBLISH, with_crc)


def test_captured_messages_expect_their_envelopes_offset_and_plain_ones_zero():
    deliveries = [("s", "", _publish(-1)), ("s", "", _publish(42, with_crc=True)), ("s", "", b"plain"),
                  ("s", "", _publish(0)), ("s", "", envelope.MAGIC + b"\x00broken")]
    assert capture.expected_offsets(deliveries) == [-1, 42, 0, 0, 0]


@given(payload=st.binary(max_size=64))
def test_garbage_payloads_expect_offset_zero_or_what_they_decode_to(payload):
    for data in (payload, envelope.MAGIC + payload, envelope.header(envelope.MsgType.PUBLISH) + payload):
        (expected,) = capture.expected_offsets([("s", "", data)])
        assert -(1 << 63) <= expected < 1 << 63


@given(offset=INT64)
def test_any_int64_expectation_survives_the_envelope(offset):
    assert capture.expected_offsets([("s", "", _publish(offset))]) == [offset]


def test_a_refusal_is_acked_with_its_error_and_no_offset():
    request = capture.AckRequest("inbox.1", "c-1", api_pb2.AckPolicy.ALL, "s.x")
    inbox, data = capture.encode_refusal("s", "s", request, api_pb2.Ack.Error.INCORRECT_OFFSET, 10, 20)
    ack = envelope.decode_message(data, envelope.MsgType.ACK, api_pb2.Ack)
    assert inbox == "inbox.1"
    assert ack.ackError == api_pb2.Ack.Error.INCORRECT_OFFSET and ack.offset == 0
    assert (ack.stream, ack.msgSubject, ack.correlationId, ack.ackInbox) == ("s", "s.x", "c-1", "inbox.1")
    assert (ack.receptionTimestamp, ack.commitTimestamp) == (10, 20)


def test_the_server_default_is_read_from_liftbridges_key():
    assert load_config(None, {"streams.concurrency.control": True}).streams.concurrency_control
    assert not load_config(None, {}).streams.concurrency_control
    with pytest.raises(ConfigError, match="streams.concurrency.control: expected true or false"):
        load_config(None, {"streams.concurrency.control": "sometimes"})
