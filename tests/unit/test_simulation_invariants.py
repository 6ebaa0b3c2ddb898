"""The simulator's invariants on hand-made histories: what breaks them, and what power cuts excuse."""

from __future__ import annotations

import pytest

from bascule.simulation.invariants import Invariants, Violation

KEY = ("s", 0)


def log(*values: bytes):
    """A reader over a log holding ``values`` from offset 0."""
    return lambda start, count: [(o, values[o]) for o in range(start, min(len(values), start + count))]


def test_one_offset_acked_by_two_leaderships_breaks_them() -> None:
    invariants = Invariants(lambda: 0.0)
    invariants.ack(KEY, 0, b"a", "n0", 1)
    with pytest.raises(Violation, match="acked twice"):
        invariants.ack(KEY, 0, b"b", "n1", 2)


def test_two_values_below_the_hw_at_one_offset_break_them() -> None:
    invariants = Invariants(lambda: 0.0)
    invariants.observe("n0.1", KEY, 1, 1, log(b"a", b"b"))
    with pytest.raises(Violation, match="offset 1"):
        invariants.observe("n1.1", KEY, 1, None, log(b"a", b"c"))


def test_a_leaders_hw_going_down_within_its_epoch_breaks_them() -> None:
    invariants = Invariants(lambda: 0.0)
    invariants.observe("n0.1", KEY, 1, 3, log(b"a", b"b"))
    with pytest.raises(Violation, match="went down"):
        invariants.observe("n0.1", KEY, 0, 3, log(b"a"))
    invariants.observe("n0.1", KEY, 0, 4, log(b"a"))  # a new epoch starts its own count


def test_an_ack_missing_at_the_end_breaks_them() -> None:
    invariants = Invariants(lambda: 0.0)
    invariants.ack(KEY, 1, b"b", "n0", 1)
    with pytest.raises(Violation, match="is lost"):
        invariants.final(KEY, log(b"a"), 1, {})


def test_replicas_must_end_with_the_leaders_log() -> None:
    invariants = Invariants(lambda: 0.0)
    with pytest.raises(Violation, match="differs"):
        invariants.final(KEY, log(b"a", b"b"), 2, {"n1": log(b"a", b"x")})


def test_entries_every_isr_copy_of_which_a_power_cut_took_are_exempt_each_time() -> None:
    invariants = Invariants(lambda: 0.0)
    invariants.ack(KEY, 0, b"a", "n0", 1)
    invariants.observe("n0.1", KEY, 0, 1, log(b"a"))
    assert invariants.forget_lost(KEY, lambda offset, value: False) == [0]
    invariants.observe("n1.1", KEY, 0, None, log(b"stale"))  # a replica out of the ISR, not yet truncated
    invariants.ack(KEY, 0, b"b", "n0", 2)  # the offset is taken again
    assert invariants.forget_lost(KEY, lambda offset, value: False) == [0]  # and lost again
    invariants.ack(KEY, 0, b"c", "n0", 3)
    invariants.final(KEY, log(b"c"), 1, {})
    assert invariants.exempt_acks == 2


def test_an_entry_an_isr_member_still_holds_is_not_exempt() -> None:
    invariants = Invariants(lambda: 0.0)
    invariants.ack(KEY, 0, b"a", "n0", 1)
    assert invariants.forget_lost(KEY, lambda offset, value: value == b"a") == []
    with pytest.raises(Violation, match="is lost"):
        invariants.final(KEY, log(b"z"), 1, {})
