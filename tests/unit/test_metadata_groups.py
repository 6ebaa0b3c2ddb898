"""Consumer groups: what the commands do to the metadata, the assignment rule, the coordinator
choice and failover witnesses, the subscription fencing, and the validation of every field."""

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bascule.metadata.groups import (
    ALREADY_MEMBER,
    GROUP_NOT_FOUND,
    NOT_ASSIGNED,
    NOT_MEMBER,
    ConsumerGroup,
    CoordinatorReports,
    assignments,
    choose_coordinator,
    subscription_error,
)
from bascule.metadata.state import FAILED_PRECONDITION, NOT_FOUND, MetadataState
from bascule.node.activity import encode_event
from bascule.wire.commands import CommandError, command_from_map, decode_command, encode_command, validate_request
from bascule.wire.pb import api_pb2


class Machine:
    def __init__(self) -> None:
        self.state = MetadataState()

    def apply(self, op, **fields):
        self.state, result = self.state.apply(decode_command(encode_command(command_from_map({"op": op, **fields}))))
        return result


def with_streams(**partitions):
    machine = Machine()
    for broker in "ab":
        machine.apply("register_broker", id=broker, host="h", port=1, raft=f"h:{ord(broker)}")
    for name, count in partitions.items():
        assert machine.apply("create_stream", name=name, subject=name, group="", created=1, settings={},
                             replicas=[["a"]] * count) is None
    return machine


def join(machine, consumer, streams, group="g", coordinator="a"):
    return machine.apply("join_consumer_group", group=group, consumer=consumer, streams=streams,
                         coordinator=coordinator)


# ---- state rules ----------------------------------------------------------------------------------


def test_first_join_creates_the_group_with_the_chosen_coordinator():
    machine = with_streams(foo=2)
    assert join(machine, "c1", ["foo"]) is None
    group = machine.state.groups["g"]
    assert (group.coordinator, group.epoch, dict(group.members)) == ("a", machine.state.version, {"c1": ("foo",)})
    assert machine.state.group_assignments("g") == {"c1": {"foo": (0, 1)}}


def test_joins_and_leaves_move_the_epoch_and_rebalance():
    machine = with_streams(foo=2)
    join(machine, "c1", ["foo"])
    assert join(machine, "c2", ["foo"], coordinator="b") is None
    group = machine.state.groups["g"]
    assert group.coordinator == "a"  # the coordinator is chosen when the group is created only
    assert group.epoch == machine.state.version
    assert machine.state.group_assignments("g") == {"c1": {"foo": (0,)}, "c2": {"foo": (1,)}}
    before = group.epoch
    assert machine.apply("leave_consumer_group", group="g", consumer="c1", expired=False) is None
    assert machine.state.groups["g"].epoch > before
    assert machine.state.group_assignments("g") == {"c2": {"foo": (0, 1)}}


def test_last_leave_deletes_the_group_and_a_new_one_never_repeats_an_epoch():
    machine = with_streams(foo=1)
    join(machine, "c1", ["foo"])
    old = machine.state.groups["g"].epoch
    assert machine.apply("leave_consumer_group", group="g", consumer="c1", expired=True) is None
    assert "g" not in machine.state.groups
    join(machine, "c1", ["foo"])
    assert machine.state.groups["g"].epoch > old


def test_refusals_in_liftbridge_words():
    machine = with_streams(foo=1)
    assert join(machine, "c1", ["nope"]) == (FAILED_PRECONDITION, "stream does not exist")
    join(machine, "c1", ["foo"])
    assert join(machine, "c1", ["foo"]) == (FAILED_PRECONDITION, ALREADY_MEMBER)
    assert machine.apply("leave_consumer_group", group="x", consumer="c1", expired=False) == (
        NOT_FOUND, GROUP_NOT_FOUND)
    assert machine.apply("leave_consumer_group", group="g", consumer="c9", expired=False) == (
        FAILED_PRECONDITION, NOT_MEMBER)


def test_coordinator_change_is_conditional_on_the_coordinator_and_epoch_seen():
    machine = with_streams(foo=1)
    join(machine, "c1", ["foo"])
    stale = machine.apply("change_group_coordinator", group="g", coordinator="b", previous="a", epoch=7)
    assert stale[0] == FAILED_PRECONDITION and "generation mismatch" in stale[1]
    epoch = machine.state.groups["g"].epoch
    assert machine.apply("change_group_coordinator", group="g", coordinator="b", previous="a", epoch=epoch) is None
    group = machine.state.groups["g"]
    assert (group.coordinator, group.epoch) == ("b", machine.state.version)
    assert machine.apply("change_group_coordinator", group="x", coordinator="b", previous="a", epoch=1)[0] == NOT_FOUND


def test_a_deleted_stream_leaves_the_members_who_stay():
    machine = with_streams(foo=1, bar=2)
    join(machine, "c1", ["foo", "bar"])
    assert machine.apply("delete_stream", name="foo") is None
    group = machine.state.groups["g"]
    assert dict(group.members) == {"c1": ("bar",)} and group.epoch == machine.state.version
    assert machine.state.group_assignments("g") == {"c1": {"bar": (0, 1)}}


def test_groups_survive_a_snapshot_and_old_snapshots_restore_without_them():
    machine = with_streams(foo=2)
    join(machine, "c1", ["foo"])
    join(machine, "c2", ["foo"])
    snapshot = msgpack.unpackb(msgpack.packb(machine.state.snapshot()), strict_map_key=False)
    assert MetadataState.restore(snapshot) == machine.state
    del snapshot["groups"]
    for event in snapshot["activity"]:
        for key in ("group", "consumer", "streams", "expired"):
            event.pop(key)
    assert MetadataState.restore(snapshot).groups == {}


def test_joins_and_leaves_are_activity_events():
    machine = with_streams(foo=1)
    join(machine, "c1", ["foo"])
    machine.apply("leave_consumer_group", group="g", consumer="c1", expired=True)
    joined, left = machine.state.activity[-2:]
    event = encode_event(joined)
    assert event.op == api_pb2.JOIN_CONSUMER_GROUP
    assert (event.joinConsumerGroupOp.groupId, event.joinConsumerGroupOp.consumerId,
            list(event.joinConsumerGroupOp.streams)) == ("g", "c1", ["foo"])
    event = encode_event(left)
    assert event.op == api_pb2.LEAVE_CONSUMER_GROUP
    assert (event.leaveConsumerGroupOp.consumerId, event.leaveConsumerGroupOp.expired) == ("c1", True)


# ---- assignment ---------------------------------------------------------------------------------

members_strategy = st.dictionaries(
    st.sampled_from(["c1", "c2", "c3", "c4", "c5"]),
    st.lists(st.sampled_from(["s1", "s2", "s3"]), min_size=1, max_size=3, unique=True).map(lambda s: tuple(sorted(s))),
    min_size=1,
)
counts_strategy = st.fixed_dictionaries({s: st.integers(0, 9) for s in ["s1", "s2", "s3"]})


@given(members_strategy, counts_strategy)
def test_each_partition_goes_to_exactly_one_subscriber_and_loads_are_balanced(members, counts):
    result = assignments(ConsumerGroup("g", "a", 1, members), counts)
    assert set(result) == set(members)
    for stream, count in counts.items():
        subscribers = [c for c, streams in members.items() if stream in streams]
        given_out = sorted(p for c in subscribers for p in result[c].get(stream, ()))
        assert given_out == (list(range(count)) if subscribers else [])
        per_member = [len(result[c].get(stream, ())) for c in subscribers]
        if len(set(members.values())) == 1 and per_member:  # every member has the same streams
            assert max(per_member) - min(per_member) <= 1
    for consumer, assigned in result.items():
        assert set(assigned) <= set(members[consumer])


@given(members_strategy, counts_strategy)
def test_assignment_does_not_depend_on_the_order_members_are_listed(members, counts):
    reordered = dict(reversed(list(members.items())))
    assert assignments(ConsumerGroup("g", "a", 1, members), counts) == \
        assignments(ConsumerGroup("g", "a", 1, reordered), counts)


def test_two_members_split_a_two_partition_stream():
    group = ConsumerGroup("g", "a", 1, {"c2": ("foo",), "c1": ("foo",)})
    assert assignments(group, {"foo": 2}) == {"c1": {"foo": (0,)}, "c2": {"foo": (1,)}}


# ---- coordinators ---------------------------------------------------------------------------------


def test_the_least_loaded_candidate_coordinates():
    groups = [ConsumerGroup("g1", "a", 0), ConsumerGroup("g2", "a", 0), ConsumerGroup("g3", "b", 0)]
    assert choose_coordinator(groups, {"a", "b", "c"}) == "c"
    assert choose_coordinator(groups, {"a", "b"}) == "b"
    assert choose_coordinator(groups, set()) is None


def test_a_coordinator_moves_once_more_than_half_of_the_members_report_it():
    group = ConsumerGroup("g", "a", 5, {"c1": ("s",), "c2": ("s",), "c3": ("s",)})
    reports = CoordinatorReports(timeout=10.0)
    assert not reports.report(group, "c1", now=0.0)
    assert not reports.report(group, "c1", now=1.0)  # a witness counts once
    assert reports.report(group, "c2", now=2.0)
    assert not reports.report(group, "c1", now=3.0)  # counting starts over after a move


def test_coordinator_reports_expire_and_start_over_for_another_generation():
    group = ConsumerGroup("g", "a", 5, {"c1": ("s",), "c2": ("s",)})
    reports = CoordinatorReports(timeout=10.0)
    assert not reports.report(group, "c1", now=0.0)
    assert not reports.report(group, "c2", now=11.0)  # c1's report timed out
    moved = ConsumerGroup("g", "b", 9, group.members)
    assert not reports.report(moved, "c1", now=12.0)  # c2 reported another coordinator
    assert reports.report(moved, "c2", now=13.0)
    assert reports.report(ConsumerGroup("solo", "a", 0, {"c": ("s",)}), "c", now=0.0)


# ---- subscription fencing -------------------------------------------------------------------------


def test_only_a_current_member_with_the_partition_assigned_may_read_it():
    group = ConsumerGroup("g", "a", 4, {"c1": ("foo",)})
    assigned = {"foo": (0,)}
    assert subscription_error(group, "c1", 4, assigned, "foo", 0) is None
    assert subscription_error(group, "c1", 3, assigned, "foo", 0) == NOT_ASSIGNED
    assert subscription_error(group, "c1", 4, assigned, "foo", 1) == NOT_ASSIGNED
    assert subscription_error(group, "c1", 4, assigned, "bar", 0) == NOT_ASSIGNED
    assert subscription_error(group, "c9", 4, {}, "foo", 0) == NOT_MEMBER
    assert subscription_error(None, "c1", 4, {}, "foo", 0) == GROUP_NOT_FOUND


# ---- validation -----------------------------------------------------------------------------------

GOOD_JOIN = {"group": "g", "consumer": "c", "streams": ["foo"], "coordinator": "a"}


@pytest.mark.parametrize("field, value", [
    ("group", ""), ("group", "x" * 256), ("group", "a\nb"), ("group", 7), ("group", None),
    ("consumer", ""), ("consumer", "\x00"), ("consumer", b"c"), ("consumer", ["c"]),
    ("streams", []), ("streams", "foo"), ("streams", ["foo", "foo"]), ("streams", ["../x"]), ("streams", [1]),
    ("streams", ["s"] * 1025),
    ("coordinator", ""), ("coordinator", "a.b"), ("coordinator", 1),
])
def test_join_commands_are_validated_in_full(field, value):
    with pytest.raises(CommandError):
        encode_command(command_from_map({"op": "join_consumer_group", **GOOD_JOIN, field: value}))


@pytest.mark.parametrize("command", [
    {"op": "leave_consumer_group", "group": "g", "consumer": "c"},
    {"op": "leave_consumer_group", "group": "g", "consumer": "c", "expired": 1},
    {"op": "leave_consumer_group", "group": "g", "consumer": "c", "expired": False, "extra": 1},
    {"op": "change_group_coordinator", "group": "g", "coordinator": "b", "previous": "a", "epoch": -1},
    {"op": "change_group_coordinator", "group": "g", "coordinator": "b", "previous": "a", "epoch": 1 << 63},
    {"op": "change_group_coordinator", "group": "g", "coordinator": "b", "epoch": 1},
])
def test_other_group_commands_are_validated_in_full(command):
    with pytest.raises(CommandError):
        decode_command(msgpack.packb(command))


@pytest.mark.parametrize("op, args", [
    ("join_consumer_group", {"group": "g", "consumer": "c", "streams": ["foo"], "coordinator": "a"}),
    ("join_consumer_group", {"group": "g", "consumer": "", "streams": ["foo"]}),
    ("report_group_coordinator", {"group": "g", "consumer": "c", "coordinator": "a", "epoch": "1"}),
    ("report_group_coordinator", {"group": "g", "consumer": "c", "coordinator": "a b", "epoch": 1}),
    ("report_group_coordinator", {"group": "g", "consumer": "c", "coordinator": "a"}),
])
def test_group_requests_to_the_metadata_leader_are_validated(op, args):
    with pytest.raises(CommandError):
        validate_request(op, args)


msgpack_values = st.one_of(
    st.none(), st.integers(-(1 << 63), (1 << 64) - 1), st.text(max_size=3), st.binary(max_size=3),
    st.lists(st.text(max_size=3), max_size=3),
)


@given(st.dictionaries(
    st.sampled_from(["group", "consumer", "streams", "coordinator", "previous", "expired", "epoch", "x"]),
    msgpack_values,
))
def test_garbage_group_commands_are_refused_or_apply_cleanly(fields):
    machine = with_streams(foo=1)
    for op in ("join_consumer_group", "leave_consumer_group", "change_group_coordinator"):
        try:
            command = decode_command(msgpack.packb({"op": op, **fields}))
        except CommandError:
            continue
        machine.state.apply(command)  # whatever validates must apply without raising


def test_one_member_of_a_group_reads_a_partition_and_older_epochs_are_refused():
    from bascule.api.subscribe import GroupReaders

    readers = GroupReaders()
    first = readers.take("foo", 0, "g", "c1", 3)
    assert first is not None
    assert readers.take("foo", 0, "g", "c2", 2) is None  # older epoch
    second = readers.take("foo", 0, "g", "c2", 3)
    assert second is not None and first.displaced.is_set() and not second.displaced.is_set()
    assert readers.take("foo", 1, "g", "c1", 1) is not None  # another partition
    assert readers.take("foo", 0, "h", "c1", 1) is not None  # another group
    readers.release("foo", 0, "g", first)  # displaced: releases nothing
    assert readers.take("foo", 0, "g", "c3", 2) is None
    readers.release("foo", 0, "g", second)
    assert readers.take("foo", 0, "g", "c3", 2) is not None
