"""The leader's lease (bascule.partition.replication.lease): never longer than it takes enough
ISR followers to report the leader, for any ISR the metadata may hold."""

import itertools
import math

from hypothesis import given
from hypothesis import strategies as st

from bascule.partition.replication.isr import IsrTracker
from bascule.partition.replication.lease import LEASE_FRACTION, lease_expiry
from bascule.wire.witnesses import witness_quorum

T = 10.0
LEASE = LEASE_FRACTION * T


def test_a_leader_without_followers_holds_its_lease_for_ever():
    assert lease_expiry({}, "L", {"L"}, leader_timeout=T) == math.inf


def test_a_follower_that_never_echoed_could_report_now():
    assert lease_expiry({}, "L", {"L", "F"}, leader_timeout=T) == -math.inf
    assert lease_expiry({"F": None}, "L", {"L", "F"}, leader_timeout=T) == -math.inf


def test_one_follower_must_have_heard_from_the_leader():
    assert lease_expiry({"F": 100.0}, "L", {"L", "F"}, leader_timeout=T) == 100.0 + LEASE


def test_two_followers_both_report_so_the_one_heard_last_decides():
    assert lease_expiry({"F": 100.0, "G": 104.0}, "L", {"L", "F", "G"}, leader_timeout=T) == 104.0 + LEASE
    assert lease_expiry({"F": 100.0}, "L", {"L", "F", "G"}, leader_timeout=T) == 100.0 + LEASE


def test_three_followers_two_reports_so_a_dead_one_does_not_end_the_lease():
    heard = {"F": 100.0, "G": 104.0, "H": None}
    assert lease_expiry(heard, "L", {"L", "F", "G", "H"}, leader_timeout=T) == 100.0 + LEASE


def test_a_pending_shrink_counts_as_done_when_that_is_worse():
    # With G and F in the ISR both must report (the later, G, decides); should the shrink of G
    # have committed unseen, F alone suffices.
    heard = {"F": 100.0, "G": 104.0}
    assert lease_expiry(heard, "L", {"L", "F", "G"}, leaving={"G"}, leader_timeout=T) == 100.0 + LEASE


def test_a_pending_expansion_counts_as_done_when_that_is_worse():
    # F and G in the ISR: both report (G decides at 104). With H added unseen, two of three: F, H.
    heard = {"F": 100.0, "G": 104.0, "H": 90.0}
    assert lease_expiry(heard, "L", {"L", "F", "G"}, joining={"H"}, leader_timeout=T) == 100.0 + LEASE
    assert lease_expiry(heard, "L", {"L"}, joining={"H"}, leader_timeout=T) == 90.0 + LEASE


names = st.sampled_from(["A", "B", "C", "D", "E"])
readings = st.one_of(st.none(), st.floats(min_value=0, max_value=1000))


@given(st.dictionaries(names, readings), st.sets(names), st.sets(names), st.sets(names))
def test_no_isr_the_metadata_may_hold_can_elect_before_the_lease_ends(heard, isr, joining, leaving):
    expiry = lease_expiry(heard, "L", isr | {"L"}, joining=joining, leaving=leaving, leader_timeout=T)
    certain = (isr - leaving) | set()
    optional = sorted((joining - isr) | (leaving & isr))
    for size in range(len(optional) + 1):
        for extra in itertools.combinations(optional, size):
            followers = certain | set(extra)
            if not followers:
                continue
            # The earliest moment each could report, then the moment enough of them have.
            reports = sorted(-math.inf if heard.get(f) is None else heard[f] + T for f in followers)
            elected = reports[witness_quorum(followers | {"L"}, "L") - 1]
            assert expiry <= elected, (followers, heard)


def tracker(**kwargs) -> IsrTracker:
    settings = dict(leader_log_end=0, hw=-1, min_isr=1, max_lag_time=30.0, leader_timeout=T, now=100.0)
    return IsrTracker("L", 3, ("L", "F", "G"), ("L", "F", "G"), **(settings | kwargs))


def test_the_tracker_takes_only_readings_this_leadership_could_have_sent():
    t = tracker()
    assert t.lease_expiry() == -math.inf
    t.record_fetch("F", 0, 3, now=105.0, leader_time=99.0)  # before this leadership began
    t.record_fetch("F", 0, 3, now=105.0, leader_time=106.0)  # from the future
    t.record_fetch("F", 0, 2, now=105.0, leader_time=104.0)  # another epoch's follower
    t.record_fetch("G", 0, 3, now=105.0, leader_time=float("nan"))
    assert t.progress("F").heard_at is None and t.progress("G").heard_at is None
    t.record_fetch("F", 0, 3, now=106.0, leader_time=104.0)
    t.record_fetch("G", 0, 3, now=106.0, leader_time=103.0)
    assert t.lease_expiry() == 104.0 + LEASE
    t.record_fetch("F", 0, 3, now=107.0, leader_time=101.0)  # a request held up somewhere: no step back
    assert t.progress("F").heard_at == 104.0


def test_the_tracker_counts_a_shrink_it_proposed_until_the_metadata_settles_it():
    t = tracker()
    t.record_fetch("F", 0, 3, now=106.0, leader_time=101.0)
    t.record_fetch("G", 0, 3, now=106.0, leader_time=105.0)
    assert t.lease_expiry() == 105.0 + LEASE
    t.shrink_proposed("G", partition_epoch=4)
    assert t.lease_expiry() == 101.0 + LEASE
    t.set_isr({"L", "F", "G"}, now=107.0, partition_epoch=4)  # not yet: the same partition epoch
    assert t.lease_expiry() == 101.0 + LEASE
    t.set_isr({"L", "F", "G"}, now=107.0, partition_epoch=5)  # a newer one without it: it never commits
    assert t.lease_expiry() == 105.0 + LEASE
    t.shrink_proposed("G", partition_epoch=5)
    t.shrink_refused("G")
    assert t.lease_expiry() == 105.0 + LEASE


def test_holds_lease_answers_as_the_expiry_does_whatever_came_in_between():
    t = tracker()
    steps = [
        lambda: t.record_fetch("F", 0, 3, now=101.0, leader_time=100.5),
        lambda: t.record_fetch("G", 0, 3, now=102.0, leader_time=101.5),
        lambda: t.shrink_proposed("G", 0),
        lambda: t.record_fetch("F", 0, 3, now=110.0, leader_time=109.0),
        lambda: t.set_isr({"L", "F"}, now=111.0, partition_epoch=1),
        lambda: t.expand_proposals(111.0, 1),
        lambda: t.set_isr({"L"}, now=112.0, partition_epoch=2),
    ]
    for step in steps:
        step()
        for now in (100.0, 105.0, 109.5, 110.0, 115.0, 118.0, 125.0):
            assert t.holds_lease(now) == (now < t.lease_expiry()), (step, now)
