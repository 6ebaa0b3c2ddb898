"""The metadata Raft under delayed and repeated messages (issue 25): pysyncobj 0.3.17 let a leader count
an AppendEntries success from an earlier term, and let a follower drop entries it had acknowledged, so a
command acknowledged as committed could be lost and a node keep a state the group never had.

Each test plays one delivery order a network of FIFO connections can produce (tests/unit/raft_network.py),
on the real pysyncobj code and MetadataStore, and checks Raft's promise at the end: every member applied
the same commands, and every command acknowledged as committed is among them.
"""

from __future__ import annotations

import pytest
from raft_network import Member, Network

from bascule.metadata.raft_fixes import DivergedBeyondRepair


def assert_consistent(net: Network) -> None:
    states = {member.address: member.brokers for member in net.members}
    assert len({tuple(brokers) for brokers in states.values()}) == 1, states
    acked = {broker for member in net.members for broker in member.acked}
    assert acked <= set(net.members[0].brokers), (acked, states)


def test_a_success_from_an_earlier_term_does_not_count_towards_a_commit() -> None:
    net = Network(5)
    a, b, c, d, e = net.members
    net.elect(a, b, c, d, e)
    net.settle(*net.members)
    # Term 1: a's entries 3-6 reach b alone, and b's acknowledgements are held up on their way back.
    for broker in ("t1-3", "t1-4", "t1-5", "t1-6"):
        a.propose(broker)
    net.deliver(a, b)
    for other in (c, d, e):
        net.drop(a, other)
    # Term 2: e leads with c and d; its no-op at 3 reaches a alone, which cuts its own 3-6.
    net.elect(e, c, d)
    for other in (b, c, d):
        net.drop(e, other)
    net.deliver(e, a)
    net.drop(a, e)
    assert a.log[-1] == (3, 2)
    # Term 3: a leads with c and d, and its command z at 5 reaches c: a and c hold it, two of five.
    net.elect(a, c, d)
    net.deliver(a, c)
    net.deliver(c, a)
    a.heartbeat()
    a.propose("z")
    net.deliver(a, c)
    net.deliver(c, a)
    # b's acknowledgements of term 1 arrive: they say nothing about a's log of term 3.
    net.deliver(b, a)
    assert "z" not in a.acked
    # Term 4: e leads with b and d, which do not hold z.
    net.deliver(a, e, 1)  # a's request for votes of term 3 moves e to that term
    for source in (a, b, c, d):
        net.drop(source, e)
    net.elect(e, b, d)
    e.propose("y")
    net.settle(e, b, d)
    net.heal()
    assert_consistent(net)


def test_a_repeated_append_entries_does_not_drop_entries_the_follower_acknowledged() -> None:
    net = Network(3)
    a, b, c = net.members
    net.elect(a, b, c)
    net.settle(a, b, c)
    # c is cut off from here on. b misses 3 (a connection drop), so it refuses 4 and 5, twice asking for 3.
    a.propose("e3")
    net.drop(a, b)
    a.propose("e4")
    net.deliver(a, b)
    a.propose("e5")
    net.deliver(a, b)
    # Each request makes a resend of 3-5 in two messages (3-4, 5); the second is a repeat of the first.
    net.deliver(b, a, 1)
    a.heartbeat()
    net.deliver(b, a, 1)
    a.heartbeat()
    # b takes the first resend and the repeat's first message; the connection drops with the rest.
    net.deliver(a, b, 3)
    net.drop(a, b)
    net.deliver(b, a)  # b acknowledged 3-5: a commits them and says so to its client
    assert a.acked == ["e3", "e4", "e5"]
    isolate(net, a)
    net.elect(b, c)
    net.settle(b, c)
    b.propose("x")
    net.settle(b, c)
    net.heal()
    assert_consistent(net)


def isolate(net: Network, member: Member) -> None:
    for other in net.members:
        if other is not member:
            net.drop(member, other)
            net.drop(other, member)


# ---- a leader that committed wrongly (an older node, a journal that lost data) ----------------------


def replace_entry(net: Network, leader: Member, follower: Member, index: int, broker: str) -> None:
    """An AppendEntries of a later term whose entry at ``index`` differs from what ``follower`` holds."""
    term = follower.raft.raftCurrentTerm + 5
    net.inject(leader, follower, {
        "type": "append_entries", "term": term, "commit_index": index, "prevLogIdx": index - 1,
        "prevLogTerm": dict(follower.log)[index - 1], "entries": [(leader.journaled(broker), index, term)],
    })


def replicate(net: Network, leader: Member, *brokers: str) -> None:
    for broker in brokers:
        leader.propose(broker)
    net.settle(*net.members)
    leader.heartbeat()  # the commit index reaches the followers
    net.settle(*net.members)


def test_a_follower_whose_applied_entries_are_replaced_rebuilds_its_state_from_the_journal() -> None:
    net = Network(3)
    a, b, c = net.members
    net.elect(a, b, c)
    replicate(net, a, "e3", "e4", "e5")
    assert b.brokers == ["e3", "e4", "e5"]
    replace_entry(net, c, b, 4, "y")
    assert b.brokers == ["e3", "y"]
    assert (b.log[-1], b.raft.raftLastApplied) == ((4, b.raft.raftCurrentTerm), 4)


def test_the_rebuild_starts_from_the_full_dump_of_a_compacted_journal(tmp_path) -> None:
    net = Network(3, tmp_path)
    a, b, c = net.members
    net.elect(a, b, c)
    replicate(net, a, "e3", "e4")
    b.raft.forceLogCompaction()
    b.tick()  # writes the dump
    b.tick()  # drops the journal's prefix
    replicate(net, a, "e5", "e6")
    assert b.log[0][0] > 1
    replace_entry(net, c, b, 6, "y")
    assert b.brokers == ["e3", "e4", "e5", "y"]


def test_entries_to_replace_already_in_the_full_dump_stop_the_follower(tmp_path) -> None:
    net = Network(3, tmp_path)
    a, b, c = net.members
    net.elect(a, b, c)
    replicate(net, a, "e3", "e4")
    b.raft.forceLogCompaction()
    b.tick()
    b.tick()
    with pytest.raises(DivergedBeyondRepair, match="remove its raft directory"):
        replace_entry(net, c, b, b.log[1][0], "y")
    assert b.brokers == ["e3", "e4"]
