import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bascule.metadata import state as state_rules
from bascule.metadata.placement import PlacementError, place, replica_count
from bascule.metadata.state import (
    ALREADY_EXISTS,
    FAILED_PRECONDITION,
    NOT_FOUND,
    MetadataState,
)
from bascule.wire.commands import CommandError, Pause, command_from_map, decode_command, encode_command


class Machine:
    """The successive states of a state machine, as a node holds them."""

    def __init__(self) -> None:
        self.state = MetadataState()

    def apply(self, command):
        self.state, result = self.state.apply(command)
        return result

    def __getattr__(self, name):
        return getattr(self.state, name)


def apply(machine, op, **fields):
    return machine.apply(decode_command(encode_command(command_from_map({"op": op, **fields}))))


def stream_state(replicas=(("a", "b", "c"),)):
    state = Machine()
    for broker in "abc":
        apply(state, "register_broker", id=broker, host="h", port=1, raft=f"h:{ord(broker)}")
    assert apply(state, "create_stream", name="s", subject="foo", group="", created=1,
                 settings={}, replicas=[list(r) for r in replicas]) is None
    return state


def test_create_stream_places_leader_first_and_full_isr():
    state = stream_state()
    p = state.partition("s", 0)
    assert (p.leader, p.isr, p.leader_epoch, p.epoch) == ("a", ("a", "b", "c"), 0, 0)


def test_duplicate_stream_is_already_exists():
    state = stream_state()
    result = apply(state, "create_stream", name="s", subject="x", group="", created=2, settings={}, replicas=[["a"]])
    assert result[0] == ALREADY_EXISTS


def test_delete_unknown_stream_is_not_found():
    assert apply(Machine(), "delete_stream", name="nope")[0] == NOT_FOUND


def test_leader_change_needs_current_epoch_and_isr_member():
    state = stream_state()
    assert apply(state, "change_leader", name="s", partition=0, leader="b", leader_epoch=0, isr=["b", "c"]) is None
    p = state.partition("s", 0)
    assert (p.leader, p.leader_epoch, p.isr) == ("b", 1, ("b", "c"))
    stale = apply(state, "change_leader", name="s", partition=0, leader="c", leader_epoch=0, isr=["c"])
    assert stale[0] == FAILED_PRECONDITION and state.partition("s", 0).leader == "b"


def _item(partition, leader, leader_epoch, epoch, isr, name="s"):
    return {"name": name, "partition": partition, "leader": leader, "leader_epoch": leader_epoch, "epoch": epoch,
            "isr": isr}


def test_change_leaders_applies_each_item_on_change_leaders_conditions():
    """One command elects many partitions; an item that is stale (leader epoch, partition epoch), names
    a leader outside the ISR or a partition that is gone changes nothing, and the others apply."""
    state = stream_state(replicas=[("a", "b", "c")] * 6)
    assert apply(state, "change_leader", name="s", partition=1, leader="b", leader_epoch=0, isr=["b", "c"]) is None
    assert apply(state, "change_isr", name="s", partition=2, replica="c", add=False, leader="a",
                 leader_epoch=0, epoch=0) is None
    before = state.state
    result = apply(state, "change_leaders", items=[
        _item(0, "b", 0, 0, ["b", "c"]),  # fresh: applies
        _item(1, "c", 0, 1, ["c"]),  # stale leader epoch (1 now)
        _item(2, "c", 0, 0, ["b", "c"]),  # stale partition epoch (the shrink made it 1)
        _item(3, "c", 0, 0, ["a", "c"]),  # fresh: applies, keeping a
        _item(4, "d", 0, 0, ["d"]),  # d is not in the ISR
        _item(0, "b", 0, 0, ["b"], name="gone"),  # no such stream
    ])
    assert result is None
    changed = {p: state.partition("s", p) for p in range(6)}
    assert (changed[0].leader, changed[0].leader_epoch, changed[0].epoch, changed[0].isr) == ("b", 1, 1, ("b", "c"))
    assert (changed[3].leader, changed[3].leader_epoch, changed[3].epoch, changed[3].isr) == ("c", 1, 1, ("a", "c"))
    for untouched in (1, 2, 4, 5):
        assert changed[untouched] is before.partition("s", untouched)
    # Exactly what ChangeLeader makes of each item, one at a time.
    single = Machine()
    single.state = before
    apply(single, "change_leader", **_item(0, "b", 0, 0, ["b", "c"]))
    apply(single, "change_leader", **_item(3, "c", 0, 0, ["a", "c"]))
    assert {**single.state.snapshot(), "version": 0} == {**state.state.snapshot(), "version": 0}


def test_change_leaders_clears_the_unclean_mark_as_change_leader_does():
    state = stream_state(replicas=[("a", "b", "c")] * 2)
    apply(state, "register_broker", id="b", host="h", port=1, raft="h:98", incarnation="b2", unclean=True)
    assert state.partition("s", 0).unclean == ("b",)
    epoch = state.partition("s", 0).epoch
    assert apply(state, "change_leaders", items=[_item(0, "b", 0, epoch, ["b", "c"]),
                                                 _item(1, "c", 0, epoch, ["a", "c"])]) is None
    assert state.partition("s", 0).unclean == () and state.partition("s", 0).leader_incarnation == "b2"
    assert state.partition("s", 1).unclean == ()  # b left that ISR


def _isr_item(partition, replica, add, leader, leader_epoch, epoch, name="s"):
    return {"name": name, "partition": partition, "replica": replica, "add": add, "leader": leader,
            "leader_epoch": leader_epoch, "epoch": epoch}


def test_change_isrs_applies_each_item_on_change_isrs_conditions_and_names_the_refused():
    """A leader's ISR changes in one command: each item as ChangeIsr applies it, in order (a second
    change of one partition meets the epoch the first made); the refused items change nothing and
    the result names each with its reason."""
    state = stream_state(replicas=[("a", "b", "c")] * 4)
    before = state.state
    result = apply(state, "change_isrs", items=[
        _isr_item(0, "c", False, "a", 0, 0),  # applies
        _isr_item(0, "b", False, "a", 0, 0),  # decided on epoch 0, which the first item moved
        _isr_item(1, "c", False, "b", 0, 0),  # b does not lead
        _isr_item(2, "c", False, "a", 0, 0),  # applies
        _isr_item(3, "a", False, "a", 0, 0),  # the leader cannot leave
        _isr_item(0, "c", False, "a", 0, 0, name="gone"),
    ])
    assert result[0] == state_rules.ITEMS_REFUSED
    assert state_rules.refused_items(result[1]) == {
        1: (FAILED_PRECONDITION, "ISR change refused: stale partition epoch"),
        2: (FAILED_PRECONDITION, "ISR change refused: stale leader"),
        4: (FAILED_PRECONDITION, "ISR change refused: cannot remove the leader"),
        5: (NOT_FOUND, "no such partition"),
    }
    assert state.partition("s", 0).isr == ("a", "b") and state.partition("s", 0).epoch == 1
    assert state.partition("s", 2).isr == ("a", "b")
    for untouched in (1, 3):
        assert state.partition("s", untouched) is before.partition("s", untouched)
    single = Machine()
    single.state = before
    apply(single, "change_isr", **_isr_item(0, "c", False, "a", 0, 0))
    apply(single, "change_isr", **_isr_item(2, "c", False, "a", 0, 0))
    assert {**single.state.snapshot(), "version": 0} == {**state.state.snapshot(), "version": 0}
    # All applied: no result.
    assert apply(state, "change_isrs", items=[_isr_item(0, "c", True, "a", 0, 1),
                                              _isr_item(2, "c", True, "a", 0, 1)]) is None
    assert state.partition("s", 0).isr == state.partition("s", 2).isr == ("a", "b", "c")


def test_isr_change_from_stale_leader_is_rejected():
    state = stream_state()
    apply(state, "change_leader", name="s", partition=0, leader="b", leader_epoch=0, isr=["a", "b", "c"])
    zombie = apply(state, "change_isr", name="s", partition=0, replica="c", add=False, leader="a", leader_epoch=0)
    assert zombie[0] == FAILED_PRECONDITION
    assert state.partition("s", 0).isr == ("a", "b", "c")
    assert apply(state, "change_isr", name="s", partition=0, replica="c", add=False, leader="b", leader_epoch=1) is None
    assert state.partition("s", 0).isr == ("a", "b")


def test_pause_resume_all_and_readonly():
    state = stream_state(replicas=(("a",), ("b",)))
    apply(state, "pause", name="s", partitions=[], resume_all=True, at=5)
    assert all(p.paused for p in state.streams["s"].partitions.values())
    apply(state, "resume", name="s", partition=1)
    assert not any(p.paused for p in state.streams["s"].partitions.values())
    apply(state, "set_readonly", name="s", partitions=[1], readonly=True, at=7)
    assert state.partition("s", 1).readonly and not state.partition("s", 0).readonly
    assert apply(state, "set_readonly", name="s", partitions=[9], readonly=True, at=7)[0] == NOT_FOUND


def test_snapshot_restore_round_trip():
    state = stream_state()
    apply(state, "pause", name="s", partitions=[0], resume_all=False, at=3)
    packed = msgpack.packb(state.snapshot(), use_bin_type=True)
    restored = MetadataState.restore(msgpack.unpackb(packed, raw=False, strict_map_key=False))
    assert restored.snapshot() == state.snapshot()


@pytest.mark.parametrize("garbage", [b"", b"\xc1", b"\x93\x01\x02\x03", msgpack.packb({"op": "explode"}),
                                     msgpack.packb({"op": "delete_stream", "name": 3}),
                                     msgpack.packb({"op": "delete_stream", "name": "s", "x": 1}),
                                     msgpack.packb({"op": "resume", "name": "s", "partition": True})])
def test_garbage_commands_are_refused(garbage):
    with pytest.raises(CommandError):
        decode_command(garbage)


@given(st.binary(max_size=64))
def test_random_bytes_never_crash_the_decoder(data):
    try:
        decode_command(data)
    except CommandError:
        pass


def test_replica_count_rules():
    assert replica_count(0, 3) == 1 and replica_count(-1, 3) == 3 and replica_count(2, 3) == 2
    with pytest.raises(PlacementError):
        replica_count(4, 3)
    with pytest.raises(PlacementError):
        replica_count(-2, 3)


def test_placement_spreads_replicas_and_leaders_evenly():
    brokers = ["a", "b", "c"]
    placed = place(brokers, {}, {}, 2, 6)
    replicas = [b for p in placed for b in p]
    assert {b: replicas.count(b) for b in brokers} == {"a": 4, "b": 4, "c": 4}
    leaders = [p[0] for p in placed]
    assert {b: leaders.count(b) for b in brokers} == {"a": 2, "b": 2, "c": 2}
    assert all(len(set(p)) == 2 for p in placed)


def test_placement_prefers_least_loaded_brokers():
    assert place(["a", "b", "c"], {"a": 5, "b": 0, "c": 1}, {"a": 5}, 1, 1) == [["b"]]


HOSTILE_COMMANDS = [
    {"op": "pause", "name": "s", "partitions": [[0]], "resume_all": False, "at": 1},  # wedged Raft once
    {"op": "pause", "name": "s", "partitions": [-1], "resume_all": False, "at": 1},
    {"op": "set_readonly", "name": "s", "partitions": [2 ** 40], "readonly": True, "at": 1},
    {"op": "create_stream", "name": "../../x", "subject": "x", "group": "", "created": 1, "settings": {},
     "replicas": [["a"]]},
    {"op": "create_stream", "name": "/etc", "subject": "x", "group": "", "created": 1, "settings": {},
     "replicas": [["a"]]},
    {"op": "create_stream", "name": "x", "subject": "x\r\nPUB y 1", "group": "", "created": 1, "settings": {},
     "replicas": [["a"]]},
    {"op": "create_stream", "name": "x", "subject": "x", "group": "g\r\nUNSUB 1", "created": 1, "settings": {},
     "replicas": [["a"]]},
    {"op": "create_stream", "name": "x", "subject": "x", "group": "", "created": 1,
     "settings": {"segment_max_bytes": -1}, "replicas": [["a"]]},
    {"op": "create_stream", "name": "x", "subject": "x", "group": "", "created": 1,
     "settings": {"retention_max_age": float("nan")}, "replicas": [["a"]]},
    {"op": "create_stream", "name": "x", "subject": "x", "group": "", "created": 1,
     "settings": {"rm -rf": True}, "replicas": [["a"]]},
    {"op": "create_stream", "name": "x", "subject": "x", "group": "", "created": 1, "settings": {},
     "replicas": []},
    {"op": "create_stream", "name": "x", "subject": "x", "group": "", "created": 1, "settings": {},
     "replicas": [[]]},
    {"op": "create_stream", "name": "x", "subject": "x", "group": "", "created": 1, "settings": {},
     "replicas": [["a", "a"]]},
    {"op": "create_stream", "name": "x", "subject": "x", "group": "", "created": 1, "settings": {},
     "replicas": [["a"]] * 5000},
    {"op": "change_leader", "name": "s", "partition": 0, "leader": "a", "leader_epoch": -5, "isr": ["a"]},
    {"op": "change_leader", "name": "s", "partition": 0, "leader": "a", "leader_epoch": 0, "isr": "a"},
    {"op": "change_isr", "name": "s", "partition": 0, "replica": "b\n", "add": True, "leader": "a",
     "leader_epoch": 0},
    {"op": "change_leaders", "items": []},
    {"op": "change_leaders", "items": [_item(0, "a", 0, 0, ["a"])] * 2},  # one partition twice
    {"op": "change_leaders", "items": [_item(p % 1024, "a", 0, 0, ["a"], name=f"s{p // 1024}")
                                       for p in range(1025)]},  # over MAX_BATCH_ITEMS
    {"op": "change_leaders", "items": [{k: v for k, v in _item(0, "a", 0, 0, ["a"]).items() if k != "epoch"}]},
    {"op": "change_leaders", "items": [{**_item(0, "a", 0, 0, ["a"]), "extra": 1}]},
    {"op": "change_leaders", "items": [_item(0, "a", -1, 0, ["a"])]},
    {"op": "change_leaders", "items": [_item(0, "a", 0, 0, ["a", "a"])]},
    {"op": "change_leaders", "items": [_item(0, "a.b", 0, 0, ["a"])]},
    {"op": "change_leaders", "items": ["s/0"]},
    {"op": "change_leaders", "items": {"0": _item(0, "a", 0, 0, ["a"])}},
    {"op": "change_isrs", "items": []},
    {"op": "change_isrs", "items": [_isr_item(0, "b", False, "a", 0, 0)] * 2},
    {"op": "change_isrs", "items": [{k: v for k, v in _isr_item(0, "b", False, "a", 0, 0).items() if k != "epoch"}]},
    {"op": "change_isrs", "items": [{**_isr_item(0, "b", False, "a", 0, 0), "add": 1}]},
    {"op": "register_broker", "id": "x.y", "host": "h", "port": 1, "raft": "h:1"},
    {"op": "register_broker", "id": "x", "host": "h", "port": 99999, "raft": "h:1"},
    {"op": "resume", "name": "s"},
]


@pytest.mark.parametrize("command", HOSTILE_COMMANDS, ids=range(len(HOSTILE_COMMANDS)))
def test_hostile_commands_are_refused_before_they_reach_the_state(command):
    with pytest.raises(CommandError):
        decode_command(msgpack.packb(command, use_bin_type=True))
    with pytest.raises(CommandError):
        encode_command(command_from_map(command))


def test_the_journaled_apply_never_raises_and_is_a_no_op(monkeypatch):
    """pysyncobj retries a raising apply forever on every node: a command that gets past the schema
    and still cannot be applied is refused, the same way everywhere."""
    from bascule.metadata.raft import MetadataStore

    store = MetadataStore(on_applied=lambda: None)
    store.state = stream_state().state
    before = store.state.snapshot()
    monkeypatch.setitem(state_rules._RULES, "pause", lambda self, c: 1 / 0)  # a rule that raises
    result = store.apply_journaled(encode_command(Pause(name="s", partitions=[0], resume_all=False, at=1)))
    assert result[0] == "INVALID_ARGUMENT"
    assert store.state.snapshot() == before


@pytest.mark.parametrize("op,args", [
    ("create_stream", {"name": "x", "subject": "x", "group": "", "replication_factor": 1,
                       "partitions": 2 ** 31, "settings": {}}),
    ("create_stream", {"name": "x", "subject": "x", "group": "", "replication_factor": 10 ** 6,
                       "partitions": 1, "settings": {}}),
    ("create_stream", {"name": "x", "subject": "x", "group": "a b", "replication_factor": 1,
                       "partitions": 1, "settings": {}}),
    ("create_stream", {"name": "x", "subject": "x", "group": "", "replication_factor": 1,
                       "partitions": 1, "settings": {"min_isr": -3}}),
    ("create_stream", {"name": "x", "subject": "x", "group": "", "replication_factor": 1,
                       "partitions": 1, "settings": {}, "replicas": [["a"]]}),
    ("report_leader", {"stream": "s", "partition": 0, "leader": "a", "leader_epoch": 2 ** 64,
                       "reporter": "b"}),
    ("leader_returned", {"stream": "s", "partition": 0, "leader": "a", "leader_epoch": 0,
                         "last_epoch": 0, "log_end_offset": -7}),
    ("report_leaders", {"items": []}),
    ("report_leaders", {"items": [{"stream": "s", "partition": 0, "leader": "a", "leader_epoch": 0,
                                   "reporter": "b"}] * 2}),
    ("report_leaders", {"items": [{"stream": "s", "partition": 0, "leader": "a", "leader_epoch": 0}]}),
    ("leaders_returned", {"items": [{"stream": "s", "partition": 0, "leader": "a", "leader_epoch": 0,
                                     "last_epoch": -2, "log_end_offset": 0}]}),
    ("change_isrs", {"items": [{"name": "s", "partition": 0, "replica": "b", "add": False, "leader": "a",
                                "leader_epoch": 0}]}),  # a batch's ISR change names its partition epoch
    ("change_isrs", {"items": [{"name": "s", "partition": p, "replica": "b", "add": False, "leader": "a",
                                "leader_epoch": 0, "epoch": 0} for p in range(1024)] * 2}),
    ("explode", {}),
    ("pause", {"name": "s", "partitions": [[0]], "resume_all": False, "at": 1}),
    ("delete_stream", []),
])
def test_hostile_requests_for_the_metadata_leader_are_refused(op, args):
    from bascule.wire.commands import validate_request

    with pytest.raises(CommandError):
        validate_request(op, args)


def test_reserved_streams_journaled_earlier_still_apply():
    state = stream_state()
    assert apply(state, "create_stream", name="__cursors", subject="__cursors", group="", created=1,
                 settings={}, replicas=[["a"]]) is None


def test_the_nodes_may_ask_for_the_internal_cursor_stream():
    from bascule.wire.commands import validate_request

    validate_request("create_stream", {"name": "__cursors", "subject": "__cursors", "group": "",
                                       "replication_factor": 1, "partitions": 1, "settings": {}})


# ---- the activity stream's events ------------------------------------------------------------


def test_each_applied_stream_change_is_an_activity_event_in_order_and_refused_ones_are_not():
    from bascule.metadata.state import ActivityEvent

    state = stream_state(replicas=(("a",), ("b",)))
    assert apply(state, "pause", name="s", partitions=[1], resume_all=True, at=5) is None
    assert apply(state, "resume", name="s", partition=1) is None
    assert apply(state, "set_readonly", name="s", partitions=[], readonly=True, at=6) is None
    assert apply(state, "delete_stream", name="nope")[0] == NOT_FOUND  # refused: no event
    assert apply(state, "delete_stream", name="s") is None
    assert state.activity == (
        ActivityEvent(1, "create_stream", "s", (0, 1)),
        ActivityEvent(2, "pause", "s", (1,), resume_all=True),
        ActivityEvent(3, "resume", "s", (1,)),
        ActivityEvent(4, "set_readonly", "s", (), readonly=True),
        ActivityEvent(5, "delete_stream", "s"),
    )
    assert apply(state, "activity_published", id=3) is None
    assert [e.id for e in state.activity] == [4, 5] and state.activity_ids == 5
    restored = MetadataState.restore(msgpack.unpackb(msgpack.packb(state.snapshot()), raw=False))
    assert restored == state.state


def test_unpublished_activity_is_bounded():
    from bascule.metadata.state import MAX_PENDING_ACTIVITY

    state = stream_state(replicas=(("a",),))
    for i in range(MAX_PENDING_ACTIVITY + 10):
        apply(state, "set_readonly", name="s", partitions=[], readonly=i % 2 == 0, at=i)
    assert len(state.activity) == MAX_PENDING_ACTIVITY and state.activity[-1].id == state.activity_ids
    assert state.activity_dropped == 11  # the create_stream event and the first ten changes


def test_a_snapshot_without_activity_restores_with_none():
    snapshot = stream_state().snapshot()
    for key in ("activity", "activity_ids", "activity_dropped"):
        del snapshot[key]
    assert MetadataState.restore(snapshot).activity == ()


# -- unclean restarts ---------------------------------------------------------------------------


def register(state, broker, incarnation, unclean):
    return apply(state, "register_broker", id=broker, host="h", port=1, raft=f"h:{ord(broker)}",
                 incarnation=incarnation, unclean=unclean)


def test_an_unclean_restart_marks_the_brokers_isr_memberships_unclean():
    state = stream_state(replicas=(("a", "b", "c"), ("a", "c")))
    before = state.partition("s", 0).epoch
    assert register(state, "b", "b-2", unclean=True) is None
    assert state.partition("s", 0).unclean == ("b",)
    assert state.partition("s", 0).epoch == before + 1  # changes decided on the old view are refused
    assert state.partition("s", 1).unclean == ()  # not a replica there
    register(state, "a", "a-2", unclean=True)
    assert state.partition("s", 0).unclean == ("a", "b") and state.partition("s", 1).unclean == ("a",)


def test_a_clean_restart_or_the_same_incarnation_again_marks_nothing():
    state = stream_state()
    register(state, "b", "b-2", unclean=False)
    register(state, "c", "c-2", unclean=True)
    register(state, "c", "c-2", unclean=True)  # registered again (say, a new host): no new loss
    assert state.partition("s", 0).unclean == ("c",)
    apply(state, "change_isr", name="s", partition=0, replica="c", add=True, leader="a", leader_epoch=0)
    register(state, "c", "c-2", unclean=True)
    assert state.partition("s", 0).unclean == ()


def test_an_unclean_member_is_cleared_by_its_expansion_and_dropped_by_its_shrink():
    state = stream_state()
    register(state, "b", "b-2", unclean=True)
    register(state, "c", "c-2", unclean=True)
    isr_change = dict(name="s", partition=0, leader="a", leader_epoch=0)
    assert apply(state, "change_isr", replica="b", add=True, **isr_change) is None
    assert apply(state, "change_isr", replica="c", add=False, **isr_change) is None
    p = state.partition("s", 0)
    assert (p.isr, p.unclean) == (("a", "b"), ())
    assert apply(state, "change_isr", replica="b", add=True, **isr_change)[0] == FAILED_PRECONDITION


def test_a_new_leader_is_clean_and_the_unclean_stay_within_the_isr():
    state = stream_state()
    register(state, "b", "b-2", unclean=True)
    register(state, "c", "c-2", unclean=True)
    assert apply(state, "change_leader", name="s", partition=0, leader="b", leader_epoch=0, isr=["b", "c"]) is None
    p = state.partition("s", 0)
    assert (p.leader, p.isr, p.unclean) == ("b", ("b", "c"), ("c",))
    apply(state, "change_leader", name="s", partition=0, leader="b", leader_epoch=1, isr=["b"])
    assert state.partition("s", 0).unclean == ()


def test_unclean_members_survive_a_snapshot():
    state = stream_state()
    register(state, "b", "b-2", unclean=True)
    restored = MetadataState.restore(msgpack.unpackb(msgpack.packb(state.state.snapshot()), raw=False))
    assert restored.partition("s", 0) == state.partition("s", 0)
    old = state.state.snapshot()
    for stream in old["streams"]:
        for p in stream["partitions"]:
            del p["unclean"]  # a snapshot taken before unclean members existed
    assert MetadataState.restore(old).partition("s", 0).unclean == ()


def test_register_broker_refuses_a_non_boolean_unclean():
    with pytest.raises(CommandError, match="unclean"):
        command_from_map({"op": "register_broker", "id": "b", "host": "h", "port": 1, "raft": "h:1", "unclean": "yes"})


def test_a_replica_whose_log_failed_marks_itself_unclean_while_in_the_isr():
    state = stream_state()
    before = state.partition("s", 0).epoch
    assert apply(state, "mark_unclean", name="s", partition=0, replica="b") is None
    assert (state.partition("s", 0).unclean, state.partition("s", 0).epoch) == (("b",), before + 1)
    assert apply(state, "mark_unclean", name="s", partition=0, replica="b") is None  # already: no change
    assert state.partition("s", 0).epoch == before + 1
    apply(state, "change_isr", name="s", partition=0, replica="c", add=False, leader="a", leader_epoch=0)
    assert apply(state, "mark_unclean", name="s", partition=0, replica="c") is None  # not in the ISR
    assert state.partition("s", 0).unclean == ("b",)
    assert apply(state, "mark_unclean", name="s", partition=9, replica="c")[0] == NOT_FOUND
