"""The metadata leader's standing (bascule.metadata.standing): two-way NATS contact with a majority of the
voters, itself included, within the contact timeout."""

from __future__ import annotations

import math

from bascule.metadata.standing import NatsContact, loop_alive

A, B, C, D, E = "a:1", "b:1", "c:1", "d:1", "e:1"
THREE = [A, B, C]
TIMEOUT = 2.0


def _contact() -> NatsContact:
    return NatsContact(A, TIMEOUT)


def test_a_lone_voter_always_stands() -> None:
    assert _contact().standing_until([A]) == math.inf


def test_a_node_that_is_no_voter_never_stands() -> None:
    contact = _contact()
    contact.heartbeat(B, [A], [B, C], now=1.0)
    assert contact.standing_until([B, C]) == -math.inf


def test_nobody_heard_no_standing() -> None:
    assert _contact().standing_until(THREE) == -math.inf


def test_one_other_voter_heard_both_ways_makes_a_majority_of_three_until_the_timeout() -> None:
    contact = _contact()
    contact.heartbeat(B, [A, C], THREE, now=10.0)
    assert contact.standing_until(THREE) == 10.0 + TIMEOUT


def test_hearing_a_voter_that_does_not_hear_this_node_is_no_contact() -> None:
    """A one-way cut: this node's heartbeats do not reach B, though B's reach it."""
    contact = _contact()
    contact.heartbeat(B, [C], THREE, now=10.0)
    contact.heartbeat(C, [B], THREE, now=10.0)
    assert contact.standing_until(THREE) == -math.inf
    assert contact.heard(10.0) == [B, C]  # what this node says it heard, for the others' two-way check


def test_the_freshest_contacts_count_and_five_voters_need_two_others() -> None:
    five = [A, B, C, D, E]
    contact = _contact()
    contact.heartbeat(B, [A], five, now=1.0)
    assert contact.standing_until(five) == -math.inf
    contact.heartbeat(C, [A], five, now=3.0)
    contact.heartbeat(D, [A], five, now=2.0)
    assert contact.standing_until(five) == 2.0 + TIMEOUT  # C and D, the two freshest


def test_a_later_heartbeat_that_no_longer_names_this_node_keeps_the_earlier_contact_until_it_expires() -> None:
    contact = _contact()
    contact.heartbeat(B, [A], THREE, now=1.0)
    contact.heartbeat(B, [], THREE, now=2.0)
    assert contact.standing_until(THREE) == 1.0 + TIMEOUT


def test_heard_lists_only_voters_heard_within_the_timeout() -> None:
    contact = _contact()
    contact.heartbeat(B, [], THREE, now=1.0)
    contact.heartbeat(C, [], THREE, now=5.0)
    assert contact.heard(1.0 + TIMEOUT) == [B, C]
    assert contact.heard(5.0) == [C]


def test_own_heartbeats_and_strangers_are_ignored_and_departed_voters_forgotten() -> None:
    contact = _contact()
    contact.heartbeat(A, [A], THREE, now=1.0)
    contact.heartbeat(D, [A], THREE, now=1.0)
    assert contact.standing_until(THREE) == -math.inf
    assert contact.heard(1.0) == []
    contact.heartbeat(B, [A], THREE, now=1.0)
    contact.heartbeat(C, [A], [A, C], now=1.5)  # B left the group
    assert contact.heard(1.5) == [C]
    assert contact.standing_until([A, C]) == 1.5 + TIMEOUT


def test_after_a_nats_outage_that_hit_everyone_standing_returns_with_the_first_two_way_heartbeat() -> None:
    contact = _contact()
    contact.heartbeat(B, [A], THREE, now=1.0)
    assert contact.standing_until(THREE) < 60.0
    contact.heartbeat(B, [], THREE, now=60.0)  # B heard nobody yet
    assert contact.standing_until(THREE) < 60.0
    contact.heartbeat(B, [A], THREE, now=60.25)
    assert contact.standing_until(THREE) == 60.25 + TIMEOUT


def test_a_node_this_leader_admits_over_nats_counts_as_heard_both_ways_for_the_timeout() -> None:
    """A lone leader admitting a second voter keeps standing until the newcomer's heartbeats come (issue 29:
    it used to stop leading for a second or so, and the next join waited for a new leader)."""
    contact = _contact()
    contact.joined(C, now=10.0)
    contact.heartbeat(B, [], [A], now=10.1)  # another node's heartbeat before C is a voter here: C is kept
    assert contact.standing_until([A, C]) == 10.0 + TIMEOUT
    contact.heartbeat(C, [A], [A, C], now=11.0)  # its own heartbeats take over
    assert contact.standing_until([A, C]) == 11.0 + TIMEOUT


def test_a_node_admitted_that_never_becomes_a_voter_is_forgotten_after_the_timeout() -> None:
    contact = _contact()
    contact.joined(C, now=10.0)
    contact.heartbeat(B, [A], [A, B], now=12.5)
    assert contact.heard(12.5) == [B]
    assert contact.standing_until([A, C]) == -math.inf


def test_a_loop_that_runs_late_still_heartbeats_one_stuck_past_the_limit_does_not() -> None:
    """Issue 32: a failover's load held a node's loop for seconds; that is no reason to lose the standing."""
    assert loop_alive(seen=100.0, now=104.9, limit=10.0)
    assert not loop_alive(seen=100.0, now=110.0, limit=10.0)
