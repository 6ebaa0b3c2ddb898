import pytest

from bascule.api.positions import EndOfStream, LogBounds, PositionError, check_range, start_offset, stop_offset
from bascule.metadata.placement import PlacementError, replica_count
from bascule.wire.names import partition_subject, stream_name_error, subject_error
from bascule.wire.pb import api_pb2

Start, Stop = api_pb2.StartPosition, api_pb2.StopPosition


@pytest.mark.parametrize("name", ["orders", "a.b", "x-1_y", "A9"])
def test_good_stream_names(name):
    assert stream_name_error(name) is None


@pytest.mark.parametrize("name", ["", "__cursors", "__activity", "../x", "a/b", "a b", "a*", ".hidden",
                                  "a..b", "end.", "x" * 300])
def test_bad_stream_names(name):
    assert stream_name_error(name)


@pytest.mark.parametrize("subject", ["foo", "foo.bar", "foo.*", "foo.>", ">", "a.*.c"])
def test_good_subjects(subject):
    assert subject_error(subject) is None


@pytest.mark.parametrize("subject", ["", "foo..bar", "foo bar", "foo.>.x", ".foo", "foo.", "f*o"])
def test_bad_subjects(subject):
    assert subject_error(subject)


def test_refusals_in_liftbridges_words():
    """Clients match on these texts (tests/conformance holds them to the real Liftbridge)."""
    assert stream_name_error("") == "Name cannot be empty"
    assert stream_name_error("__cursors") == "Stream is reserved"
    assert subject_error("") == subject_error("a..b") == "Subject is invalid"
    assert subject_error("x" * 1025) == "Subject is invalid: longer than 1024 characters"
    for factor, words in [(9, "Invalid replicationFactor 9, cluster size 3"), (-2, "Invalid replicationFactor -2")]:
        with pytest.raises(PlacementError, match=f"^{words}$"):
            replica_count(factor, 3)


def test_partition_subjects():
    assert partition_subject("foo", 0) == "foo" and partition_subject("foo", 3) == "foo.3"


BOUNDS = LogBounds(oldest=10, newest=19)


@pytest.mark.parametrize("request_fields,expected", [
    ({"startPosition": Start.NEW_ONLY}, 20),
    ({"startPosition": Start.EARLIEST}, 10),
    ({"startPosition": Start.LATEST}, 19),
    ({"startPosition": Start.OFFSET, "startOffset": 15}, 15),
    ({"startPosition": Start.OFFSET, "startOffset": 3}, 10),
    ({"startPosition": Start.OFFSET, "startOffset": 99}, 20),
    ({"startPosition": Start.TIMESTAMP, "startTimestamp": 1234}, 1234 // 100),
])
def test_start_positions(request_fields, expected):
    request = api_pb2.SubscribeRequest(**request_fields)
    assert start_offset(request, BOUNDS, lambda ts: ts // 100) == expected


def test_latest_of_empty_log_is_its_start():
    assert start_offset(api_pb2.SubscribeRequest(startPosition=Start.LATEST), LogBounds(0, -1), None) == 0


def test_a_negative_start_offset_starts_at_the_oldest_and_a_negative_stop_offset_is_invalid():
    assert start_offset(api_pb2.SubscribeRequest(startPosition=Start.OFFSET, startOffset=-1), BOUNDS, None) == 10
    with pytest.raises(PositionError):
        stop_offset(api_pb2.SubscribeRequest(stopPosition=Stop.STOP_OFFSET, stopOffset=-5), BOUNDS, None)


def test_unknown_positions_are_invalid():
    with pytest.raises(PositionError):
        start_offset(api_pb2.SubscribeRequest(startPosition=42), BOUNDS, None)
    with pytest.raises(PositionError):
        stop_offset(api_pb2.SubscribeRequest(stopPosition=42), BOUNDS, None)


def test_stop_positions_resolve_to_an_offset_when_the_subscription_starts():
    def request(**fields):
        return api_pb2.SubscribeRequest(**fields)

    assert stop_offset(request(), BOUNDS, None) is None
    assert stop_offset(request(stopPosition=Stop.STOP_LATEST), BOUNDS, None) == 19  # the newest, not the HW
    assert stop_offset(request(stopPosition=Stop.STOP_OFFSET, stopOffset=15), BOUNDS, None) == 15
    stamped = {10: 100, 11: 200, 12: 200, 13: 300}  # offset -> timestamp

    def latest_offset_at(time: int) -> int:
        return max((offset for offset, stamp in stamped.items() if stamp <= time), default=9)

    assert stop_offset(request(stopPosition=Stop.STOP_TIMESTAMP, stopTimestamp=250), BOUNDS, latest_offset_at) == 12
    assert stop_offset(request(stopPosition=Stop.STOP_TIMESTAMP, stopTimestamp=200), BOUNDS, latest_offset_at) == 12
    with pytest.raises(EndOfStream):
        stop_offset(request(stopPosition=Stop.STOP_TIMESTAMP, stopTimestamp=99), BOUNDS, latest_offset_at)
    with pytest.raises(EndOfStream):
        stop_offset(request(stopPosition=Stop.STOP_LATEST), LogBounds(0, -1), None)


@pytest.mark.parametrize("bad", ["a\u00a0b", "a\u200bb", "a\u2028b", "a\tb", "a\r\nb", "a\x00b", "a\x7fb"])
def test_one_rule_keeps_names_out_of_nats_protocol_lines(bad):
    """Subjects, queue groups and broker ids are refused by the same rule the capture connection
    applies, so nothing the metadata accepts is refused later when a partition starts capturing."""
    from bascule.wire.names import broker_id_error, group_error, is_protocol_token

    assert not is_protocol_token(bad)
    assert subject_error(bad) and group_error(bad) and broker_id_error(bad)


def test_a_stop_before_the_start_is_invalid_and_following_or_one_entry_is_not():
    check_range(5, None)
    check_range(5, 5)
    with pytest.raises(PositionError, match="Stop offset is before start offset: 4 < 5"):
        check_range(5, 4)
