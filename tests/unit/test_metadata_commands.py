"""Typed metadata commands on the wire: the bytes earlier versions journaled, both ways."""

import msgpack
import pytest

from bascule.metadata.state import MetadataState
from bascule.wire.commands import (
    COMMANDS,
    ChangeLeader,
    CommandError,
    RegisterBroker,
    command_from_map,
    decode_command,
    encode_command,
)

# Each command as its proposers have always built it (fields in their order): what
# encode_command(op, **fields) journaled before commands were typed.
PROPOSED = [
    ("register_broker", {"id": "a", "host": "h", "port": 1, "raft": "h:1", "incarnation": "i1", "unclean": False}),
    ("register_broker", {"id": "b", "host": "h", "port": 2, "raft": "h:2"}),
    ("create_stream", {"name": "s", "subject": "foo", "group": "", "created": 7,
                       "settings": {"min_isr": 1, "retention_max_age": 0.5}, "replicas": [["a", "b"], ["b", "a"]]}),
    ("delete_stream", {"name": "s"}),
    ("pause", {"name": "s", "partitions": [0, 1], "resume_all": True, "at": 9}),
    ("resume", {"name": "s", "partition": 1}),
    ("set_readonly", {"name": "s", "partitions": [], "readonly": True, "at": 10}),
    ("change_leader", {"name": "s", "partition": 0, "leader": "b", "leader_epoch": 0, "epoch": 3, "isr": ["a", "b"]}),
    ("change_leader", {"name": "s", "partition": 0, "leader": "b", "leader_epoch": 0, "isr": ["b"]}),
    ("change_isr", {"name": "s", "partition": 0, "replica": "b", "add": False, "leader": "a", "leader_epoch": 0,
                    "epoch": 1}),
    ("change_isr", {"name": "s", "partition": 0, "replica": "b", "add": True, "leader": "a", "leader_epoch": 0}),
    ("activity_published", {"id": 4}),
    ("mark_unclean", {"name": "s", "partition": 0, "replica": "a"}),
    ("join_consumer_group", {"group": "g", "consumer": "c", "streams": ["s"], "coordinator": "a"}),
    ("leave_consumer_group", {"group": "g", "consumer": "c", "expired": True}),
    ("change_group_coordinator", {"group": "g", "coordinator": "b", "previous": "a", "epoch": 5}),
    ("change_leaders", {"items": [
        {"name": "s", "partition": 0, "leader": "b", "leader_epoch": 0, "epoch": 3, "isr": ["a", "b"]},
        {"name": "s", "partition": 1, "leader": "a", "leader_epoch": 2, "epoch": 5, "isr": ["a"]},
    ]}),
    ("change_isrs", {"items": [
        {"name": "s", "partition": 0, "replica": "b", "add": False, "leader": "a", "leader_epoch": 0, "epoch": 1},
        {"name": "s", "partition": 0, "replica": "c", "add": True, "leader": "a", "leader_epoch": 0, "epoch": 1},
    ]}),
]


def journaled(op, **fields):
    return msgpack.packb({"op": op, **fields}, use_bin_type=True)


def test_every_command_is_covered():
    assert {op for op, _ in PROPOSED} == set(COMMANDS)


@pytest.mark.parametrize("op, fields", PROPOSED, ids=[op for op, _ in PROPOSED])
def test_a_typed_command_encodes_to_the_bytes_journaled_before(op, fields):
    typed = COMMANDS[op](**fields)
    assert encode_command(typed) == journaled(op, **fields)
    assert decode_command(journaled(op, **fields)) == typed


def test_an_absent_optional_field_stays_absent():
    old = decode_command(journaled("register_broker", id="b", host="h", port=2, raft="h:2"))
    assert (old.incarnation, old.unclean) == (None, None)
    assert b"incarnation" not in encode_command(old)


def test_a_typed_command_with_a_bad_value_is_not_encoded():
    with pytest.raises(CommandError, match="change_leader.isr: item 3"):
        encode_command(ChangeLeader(name="s", partition=0, leader="b", leader_epoch=0, isr=[3]))
    with pytest.raises(CommandError, match="register_broker.incarnation: expected str, got None"):
        command_from_map({"op": "register_broker", "id": "b", "host": "h", "port": 2, "raft": "h:2",
                          "incarnation": None})


# A journal of the first versions: brokers without incarnations, leader and ISR changes
# without partition epochs.
OLD_JOURNAL = [
    journaled("register_broker", id="a", host="h", port=1, raft="h:1"),
    journaled("register_broker", id="b", host="h", port=2, raft="h:2"),
    journaled("create_stream", name="s", subject="foo", group="", created=1, settings={}, replicas=[["a", "b"]]),
    journaled("change_isr", name="s", partition=0, replica="b", add=False, leader="a", leader_epoch=0),
    journaled("change_leader", name="s", partition=0, leader="a", leader_epoch=0, isr=["a"]),
    journaled("change_isr", name="s", partition=0, replica="b", add=True, leader="a", leader_epoch=1),
    journaled("change_leader", name="s", partition=0, leader="c", leader_epoch=1, isr=["a", "b"]),  # refused
    journaled("pause", name="s", partitions=[], resume_all=True, at=5),
    journaled("register_broker", id="a", host="h", port=1, raft="h:1", incarnation="a2", unclean=True),
]


def test_an_old_journal_replays_to_the_state_it_always_made():
    state, results = MetadataState(), []
    for entry in OLD_JOURNAL:
        state, result = state.apply(decode_command(entry))
        results.append(result)
    assert results == [None] * 6 + [("FAILED_PRECONDITION", "c is not in the ISR"), None, None]
    snapshot = state.snapshot()
    assert snapshot["version"] == len(OLD_JOURNAL)
    assert [(b["id"], b["incarnation"]) for b in snapshot["brokers"]] == [("a", "a2"), ("b", "")]
    [stream] = snapshot["streams"]
    assert stream["settings"] == {"resume_all": True}
    [partition] = stream["partitions"]
    assert {k: partition[k] for k in ("leader", "isr", "leader_epoch", "epoch", "paused", "unclean")} == {
        "leader": "a", "isr": ["a", "b"], "leader_epoch": 1, "epoch": 5, "paused": True, "unclean": ["a"],
    }
    assert [(e["id"], e["op"]) for e in snapshot["activity"]] == [(1, "create_stream"), (2, "pause")]
    assert [encode_command(decode_command(entry)) for entry in OLD_JOURNAL] == OLD_JOURNAL


def test_register_broker_defaults_the_fields_old_journals_lack():
    state, _ = MetadataState().apply(RegisterBroker(id="a", host="h", port=1, raft="h:1"))
    assert state.brokers["a"].incarnation == ""
