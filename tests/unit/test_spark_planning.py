"""bascule.spark.planning: which offsets a read takes, as pure rules (no Spark session, no brokers)."""

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("pyspark", reason="PySpark is not installed (pip install -e '.[spark]')")

from bascule.client import _as_dict  # noqa: E402
from bascule.spark.errors import BasculeSparkError  # noqa: E402
from bascule.spark.options import EARLIEST, LATEST, OffsetSpec, Selection  # noqa: E402
from bascule.spark.planning import (  # noqa: E402
    AtTimestamp,
    Bounds,
    OffsetRange,
    Rewind,
    batch_ranges,
    cap,
    check_progress,
    check_streams_exist,
    compacted_streams,
    next_end,
    offsets_from_json,
    offsets_to_json,
    partitions_to_read,
    plan_ranges,
    rate_limit,
    requests,
    resolve,
    split_ranges,
    streams_not_created_yet,
    waits_for_more,
)
from bascule.wire.pb import admin_pb2  # noqa: E402

# ---- the checkpoint form -------------------------------------------------------------------------


def test_offsets_json_is_sorted_so_that_equal_offsets_give_equal_text():
    assert list(offsets_to_json({"b": {10: 1, 2: 5}, "a": {0: 3}}).items()) == [
        ("a", {"0": 3}), ("b", {"2": 5, "10": 1})
    ]
    assert offsets_from_json({"b": {"10": 1, "2": 5}}) == {"b": {10: 1, 2: 5}}
    assert offsets_from_json(None) == offsets_from_json({}) == {}


@pytest.mark.parametrize("garbage", [{"s": {"zero": 1}}, {"s": {"0": "x"}}, {"s": [1, 2]}, {"s": {"0": None}}])
def test_checkpointed_offsets_that_are_not_bascule_offsets_are_refused(garbage):
    with pytest.raises(BasculeSparkError, match="are not bascule offsets"):
        offsets_from_json(garbage)


# ---- ranges --------------------------------------------------------------------------------------


def test_range_size_and_what_counts_as_data_loss():
    assert OffsetRange("s", 0, 5, 3).size == 0
    strict, from_earliest = OffsetRange("s", 0, 10, 20), OffsetRange("s", 0, 10, 20, strict_start=False)
    assert strict.loses(10) and strict.loses(15)
    assert not from_earliest.loses(10)  # retention moved the oldest offset since planning
    assert from_earliest.loses(11)  # a gap inside the range is loss all the same


def test_a_compacted_streams_gaps_are_no_data_loss_wherever_they_are():
    for strict_start in (True, False):
        compacted = OffsetRange("s", 0, 10, 20, strict_start, compacted=True)
        assert not compacted.loses(10) and not compacted.loses(15) and not compacted.loses(19)


# ---- which streams are compacted -----------------------------------------------------------------


def statuses(*messages: admin_pb2.PartitionStatus) -> list[dict]:
    """The partition statuses as the client makes them of what a node sends."""
    return [_as_dict(admin_pb2.PartitionStatus.FromString(m.SerializeToString())) for m in messages]


def test_the_compacted_streams_are_those_the_partition_statuses_say():
    answer = statuses(
        admin_pb2.PartitionStatus(stream="kv", partition=0, compacted=True),
        admin_pb2.PartitionStatus(stream="kv", partition=1, compacted=True),
        admin_pb2.PartitionStatus(stream="plain", partition=0, highWatermark=9),
    )
    assert compacted_streams(answer) == {"kv"}
    assert compacted_streams([]) == frozenset()


def test_a_status_from_a_node_older_than_the_field_says_not_compacted():
    # Written as such a node writes it: fields 1..11 only (proto3 leaves a false bool out, too).
    older = admin_pb2.PartitionStatus(stream="kv", partition=0, leader="a", replicas=["a"], paused=True, readonly=True)
    assert 12 not in {field.number for field, _ in older.ListFields()}
    assert compacted_streams(statuses(older)) == frozenset()
    assert compacted_streams([{"stream": "kv"}, {"stream": "kv", "compacted": 1}, {"compacted": True}]) == frozenset()


@given(st.binary(max_size=200))
def test_garbage_statuses_are_refused_or_name_at_most_their_own_stream(data):
    try:
        status = admin_pb2.PartitionStatus.FromString(data)
    except DecodeError:
        return
    assert compacted_streams([_as_dict(status)]) <= {status.stream}


def test_split_ranges_for_min_partitions_and_max_records():
    ranges = [OffsetRange("s", 0, 0, 900), OffsetRange("s", 1, 0, 100, strict_start=False), OffsetRange("s", 2, 7, 7)]
    parts = split_ranges(ranges, min_partitions=10)
    assert [(r.partition, r.start, r.end, r.strict_start) for r in parts if r.partition == 1] == [(1, 0, 100, False)]
    assert len([r for r in parts if r.partition == 0]) == 9 and len(parts) == 10
    assert [(r.start, r.end) for r in split_ranges([ranges[0]], max_records=400)] == [(0, 300), (300, 600), (600, 900)]
    halves = split_ranges([ranges[1]], max_records=50)
    assert [(r.start, r.end, r.strict_start) for r in halves] == [(0, 50, False), (50, 100, True)]
    compacted = split_ranges([OffsetRange("s", 0, 0, 100, compacted=True)], max_records=30)
    assert len(compacted) == 4 and all(r.compacted for r in compacted)


def test_split_ranges_drops_empty_and_backwards_ranges_and_never_cuts_below_one_message():
    assert split_ranges([]) == []
    assert split_ranges([OffsetRange("s", 0, 7, 7), OffsetRange("s", 1, 9, 3)], min_partitions=4) == []
    tiny = split_ranges([OffsetRange("s", 0, 0, 3)], min_partitions=100, max_records=1)
    assert [(r.start, r.end) for r in tiny] == [(0, 1), (1, 2), (2, 3)]


# ---- what is selected ----------------------------------------------------------------------------


def test_missing_streams_are_named_with_the_brokers_asked():
    check_streams_exist([], ("h:1",))
    with pytest.raises(BasculeSparkError, match=r"stream 'x' does not exist \(brokers h:1,h:2\)"):
        check_streams_exist(["x"], ("h:1", "h:2"))
    with pytest.raises(BasculeSparkError, match="streams 'x', 'y' do not exist"):
        check_streams_exist(["x", "y"], ("h:1",))


def test_partitions_to_read_all_or_those_assigned_which_must_exist():
    assert partitions_to_read(Selection(streams=("s",)), "s", [0, 1, 2]) == [0, 1, 2]
    assert partitions_to_read(Selection(assign={"s": (2, 0)}), "s", [0, 1, 2]) == [2, 0]
    absent = r"assign names partitions \[5, 7\] of stream 's', which has partitions \[0, 1\]"
    with pytest.raises(BasculeSparkError, match=absent):
        partitions_to_read(Selection(assign={"s": (0, 5, 7)}), "s", [1, 0])


# ---- start and end offsets -----------------------------------------------------------------------

PARTITIONS = {"s": [0, 1], "t": [0]}


def test_requests_per_spec_kind():
    assert set(requests(OffsetSpec("earliest"), PARTITIONS, default=LATEST, option="o").values()) == {EARLIEST}
    assert set(requests(OffsetSpec("latest"), PARTITIONS, default=EARLIEST, option="o").values()) == {LATEST}
    assert requests(OffsetSpec("timestamp", timestamp_ms=5), {"s": [0]}, default=LATEST, option="o") == {
        ("s", 0): AtTimestamp(5)
    }
    # Partitions a per-partition spec leaves out get the default.
    assert requests(OffsetSpec("offsets", {"s": {1: 7}}), PARTITIONS, default=EARLIEST, option="o") == {
        ("s", 0): EARLIEST, ("s", 1): 7, ("t", 0): EARLIEST
    }
    assert requests(OffsetSpec("timestamps", {"t": {0: 99}}), PARTITIONS, default=LATEST, option="o") == {
        ("s", 0): LATEST, ("s", 1): LATEST, ("t", 0): AtTimestamp(99)
    }
    assert requests(OffsetSpec("earliest"), {}, default=LATEST, option="o") == {}


def test_requests_naming_what_is_not_selected_are_errors():
    with pytest.raises(BasculeSparkError, match="starting offsets names stream 'u', which does not exist"):
        requests(OffsetSpec("offsets", {"u": {0: 1}}), PARTITIONS, default=LATEST, option="starting offsets")
    unknown = r"o names partitions \[4, 9\] of stream 's', which has partitions 0\.\.1"
    with pytest.raises(BasculeSparkError, match=unknown):
        requests(OffsetSpec("offsets", {"s": {9: 1, 4: 1, 0: 1}}), PARTITIONS, default=LATEST, option="o")


def test_resolve_gives_concrete_offsets_and_which_stand_for_earliest():
    requested = {("s", 0): EARLIEST, ("s", 1): LATEST, ("s", 2): 4, ("s", 3): AtTimestamp(10)}
    latest = {"s": {0: 50, 1: 60, 2: 70, 3: 80}}
    found = {("s", 0): 12, ("s", 3): 77}
    offsets, from_earliest = resolve(requested, latest, found, option="o", strict_timestamps=True)
    assert offsets == {"s": {0: 12, 1: 60, 2: 4, 3: 77}}
    assert from_earliest == {("s", 0)}


def test_an_offset_beyond_the_last_committed_message_is_an_error_and_the_next_one_is_not():
    assert resolve({("s", 0): 50}, {"s": {0: 50}}, {}, option="o", strict_timestamps=True)[0] == {"s": {0: 50}}
    beyond = r"o: offset 51 of s/0 is beyond its last committed message \(the next offset there is 50\)"
    with pytest.raises(BasculeSparkError, match=beyond):
        resolve({("s", 0): 51}, {"s": {0: 50}}, {}, option="o", strict_timestamps=True)


def test_a_time_no_message_reaches_is_an_error_or_the_latest_offset():
    requested = {("s", 0): AtTimestamp(10)}
    too_recent = r"o: no message of s/0 has a timestamp at or after 10 ms .*Strategy to 'latest'"
    with pytest.raises(BasculeSparkError, match=too_recent):
        resolve(requested, {"s": {0: 50}}, {}, option="o", strict_timestamps=True)
    assert resolve(requested, {"s": {0: 50}}, {}, option="o", strict_timestamps=False) == ({"s": {0: 50}}, set())


def test_batch_ranges_and_a_start_after_its_end():
    start = {"t": {0: 0}, "s": {1: 5, 0: 2}}
    end = {"t": {0: 0}, "s": {1: 9, 0: 2}}
    assert batch_ranges(start, end, {("s", 1)}) == [
        OffsetRange("s", 0, 2, 2), OffsetRange("s", 1, 5, 9, strict_start=False), OffsetRange("t", 0, 0, 0)
    ]
    assert batch_ranges({}, {}, set()) == []
    assert batch_ranges(start, end, set(), compacted={"s"}) == [
        OffsetRange("s", 0, 2, 2, compacted=True), OffsetRange("s", 1, 5, 9, compacted=True), OffsetRange("t", 0, 0, 0)
    ]
    with pytest.raises(BasculeSparkError, match="the starting offset 50 of s/0 is after its ending offset 40"):
        batch_ranges({"s": {0: 50}}, {"s": {0: 40}}, set())


# ---- streaming micro-batches ---------------------------------------------------------------------


def test_rate_limit_shares_the_limit_in_proportion_and_starves_no_partition():
    start = {"s": {0: 0, 1: 100, 2: 5}}
    end = {"s": {0: 900, 1: 200, 2: 5}}
    assert rate_limit(start, end, 100) == {"s": {0: 90, 1: 110, 2: 5}}
    assert rate_limit(start, end, 5000) == end
    assert rate_limit({"s": {0: 0, 1: 0}}, {"s": {0: 10_000, 1: 1}}, 10) == {"s": {0: 9, 1: 1}}


def test_rate_limit_leaves_partitions_without_a_start_and_empty_offsets_alone():
    assert rate_limit({}, {}, 5) == {}
    assert rate_limit({"s": {0: 0}}, {"s": {0: 100, 1: 100}}, 10) == {"s": {0: 10, 1: 100}}


def test_new_and_reset_partitions_are_read_from_their_start_and_available_now_caps():
    ranges = plan_ranges({"s": {0: 10, 1: 50}}, {"s": {0: 20, 1: 30, 2: 5}})
    assert ranges == [OffsetRange("s", 0, 10, 20), OffsetRange("s", 1, 0, 30, False), OffsetRange("s", 2, 0, 5, False)]
    assert plan_ranges({"s": {0: 10}}, {"s": {0: 10}}) == []  # nothing new
    assert plan_ranges({"s": {0: 10}, "t": {0: 1}}, {"s": {0: 20, 1: 5}, "t": {0: 2}}, compacted={"s"}) == [
        OffsetRange("s", 0, 10, 20, compacted=True), OffsetRange("s", 1, 0, 5, False, compacted=True),
        OffsetRange("t", 0, 1, 2),
    ]
    # A partition created after the run began waits for the next run.
    assert cap({"s": {0: 90, 1: 4}}, {"s": {0: 50}}, {"s": {0: 10}}) == {"s": {0: 50}}
    # One already read past the target (a restarted run) stays where it is.
    assert cap({"s": {0: 90}}, {"s": {0: 50}}, {"s": {0: 70}}) == {"s": {0: 70}}
    assert cap({"s": {0: 90, 1: 8}}, {}, {"s": {1: 3}}) == {"s": {1: 3}}


def test_a_stream_that_is_gone_is_data_loss_only_when_the_query_was_reading_it():
    begin = {"gone": {0: 10}}
    with pytest.raises(BasculeSparkError, match=r"data loss: stream 'gone' was deleted .*last offsets \{'0': 10\}"):
        streams_not_created_yet(["new", "gone"], begin, fail_on_data_loss=True)
    assert streams_not_created_yet(["new", "gone"], begin, fail_on_data_loss=False) == ["new"]
    assert streams_not_created_yet(["new", "gone"], None, fail_on_data_loss=True) == ["new", "gone"]
    assert streams_not_created_yet([], begin, fail_on_data_loss=True) == []


def test_a_lagging_high_watermark_waits_where_the_query_is():
    # A new leader whose HW (latest 7) lags behind what its log holds (newest 12): no progress, no loss.
    checked, rewinds = check_progress({"s": {0: 10}}, {"s": {0: 7}}, {"s": {0: 12}}, fail_on_data_loss=True)
    assert (checked, rewinds) == ({"s": {0: 10}}, [])


def test_a_log_that_ends_before_what_was_read_is_data_loss_or_a_rewind():
    begin, latest, newest = {"s": {0: 10, 1: 4}}, {"s": {0: 3, 1: 6}}, {"s": {0: 3, 1: 6}}
    truncated = "stream 's' partition 0 now ends at offset 2, but the query already read up to offset 9"
    with pytest.raises(BasculeSparkError, match=truncated):
        check_progress(begin, latest, newest, fail_on_data_loss=True)
    checked, rewinds = check_progress(begin, latest, newest, fail_on_data_loss=False)
    assert checked == {"s": {0: 3, 1: 6}} and rewinds == [Rewind("s", 0, 10, 3)]


def test_partitions_that_vanished_are_data_loss_unless_allowed():
    with pytest.raises(BasculeSparkError, match=r"partitions \[1, 2\] of stream 's' no longer exist"):
        check_progress({"s": {0: 1, 1: 1, 2: 1}}, {"s": {0: 5}}, {"s": {0: 5}}, fail_on_data_loss=True)
    assert check_progress({"s": {0: 1, 1: 1}}, {"s": {0: 5}}, {"s": {0: 5}}, fail_on_data_loss=False) == (
        {"s": {0: 5}}, []
    )


def test_next_end_without_a_start_is_the_latest_capped_under_available_now():
    bounds = Bounds(latest={"s": {0: 100, 1: 5}}, newest={"s": {0: 100, 1: 5}})
    assert next_end(None, bounds, max_rows=10, target=None, fail_on_data_loss=True) == (bounds.latest, [])
    assert next_end(None, bounds, max_rows=None, target={"s": {0: 40}}, fail_on_data_loss=True) == ({"s": {0: 40}}, [])


def test_next_end_limits_rows_counting_new_partitions_from_their_earliest_offset():
    # Partition 1 is new to the query: its backlog counts from its earliest offset (90), not from 0.
    bounds = Bounds(latest={"s": {0: 100, 1: 100}}, newest={"s": {0: 100, 1: 100}}, earliest={"s": {1: 90}})
    end, _ = next_end({"s": {0: 0}}, bounds, max_rows=11, target=None, fail_on_data_loss=True)
    assert end == {"s": {0: 10, 1: 91}}
    capped, _ = next_end({"s": {0: 0}}, bounds, max_rows=None, target={"s": {0: 50}}, fail_on_data_loss=True)
    assert capped == {"s": {0: 50}}  # partition 1 appeared after the run began


def test_next_end_reports_rewinds_and_drops_streams_that_are_gone():
    bounds = Bounds(latest={"s": {0: 3}}, newest={"s": {0: 3}})
    end, rewinds = next_end({"s": {0: 10}, "gone": {0: 5}}, bounds, max_rows=None, target=None, fail_on_data_loss=False)
    assert end == {"s": {0: 3}} and rewinds == [Rewind("s", 0, 10, 3)]
    assert plan_ranges({"s": {0: 10}}, end) == [OffsetRange("s", 0, 0, 3, strict_start=False)]


def test_min_offsets_per_trigger_waits_for_enough_new_messages_or_the_delay():
    begin, latest = {"s": {0: 10, 1: 20}}, {"s": {0: 14, 1: 25}, "t": {0: 3}}  # 4 + 5 + 3 (t is new) = 12 new

    def waits(min_rows: int, since: float | None, delay: int = 1000) -> bool:
        return waits_for_more(begin, latest, min_rows, since_last_batch_ms=since, max_delay_ms=delay)

    assert waits(13, 10) and not waits(12, 10)
    assert not waits(13, None)  # no batch yet: the first trigger is never held back, as in Kafka's source
    assert waits(13, 999) and not waits(13, 1000)  # maxTriggerDelay since the last batch lets it through
