import pytest
from hypothesis import given
from hypothesis import strategies as st

from bascule.metadata.election import (
    Candidate,
    Elect,
    Elections,
    IsrChangeKind,
    LeaderFailureReports,
    PartitionView,
    Position,
    ReportVerdict,
    choose_leader,
    isr_after_leader_change,
    validate_isr_change,
)
from bascule.partition.log.epochs import EpochHistory
from bascule.partition.replication.leader import start_leader_epoch
from bascule.wire.witnesses import witness_quorum

# -- leader choice ---------------------------------------------------------------------------


def test_last_epoch_beats_log_length():
    a = Candidate("a", 200, 2501)
    b = Candidate("b", 198, 3000)
    assert choose_leader([b, a], {"a", "b"}) == "a"


def test_longer_log_wins_within_an_epoch():
    assert choose_leader([Candidate("a", 5, 10), Candidate("b", 5, 12)], {"a", "b"}) == "b"


def test_ties_go_to_fewest_leaderships_then_smallest_id():
    c = [Candidate("c", 5, 10, 1), Candidate("b", 5, 10, 2), Candidate("d", 5, 10, 1)]
    assert choose_leader(c, {"b", "c", "d"}) == "c"
    assert choose_leader(c, {"b", "d"}) == "d"


def test_only_isr_members_not_excluded_may_lead():
    c = [Candidate("a", 9, 99), Candidate("b", 1, 1)]
    assert choose_leader(c, {"b"}) == "b"
    assert choose_leader(c, {"a", "b"}, exclude={"a"}) == "b"
    assert choose_leader(c, {"a"}, exclude={"a"}) is None  # no unclean election
    assert choose_leader([], {"a"}) is None


@given(
    st.lists(
        st.tuples(st.integers(-1, 5), st.integers(0, 20), st.integers(0, 3)), min_size=1, max_size=6
    ),
    st.sets(st.integers(0, 5)),
)
def test_choice_is_a_greatest_pair_of_the_isr(specs, isr_indexes):
    candidates = [Candidate(f"r{i}", e, leo, n) for i, (e, leo, n) in enumerate(specs)]
    isr = {f"r{i}" for i in isr_indexes}
    chosen = choose_leader(candidates, isr)
    eligible = [c for c in candidates if c.replica_id in isr]
    if not eligible:
        assert chosen is None
        return
    best = max((c.last_epoch, c.log_end_offset) for c in eligible)
    winner = next(c for c in candidates if c.replica_id == chosen)
    assert chosen in isr and (winner.last_epoch, winner.log_end_offset) == best
    assert choose_leader(list(reversed(candidates)), isr) == chosen  # order does not matter


def test_new_leader_records_its_epoch_before_appending():
    history = EpochHistory([(1, 0)])
    start_leader_epoch(history, 4, 7)
    assert history.entries == [(1, 0), (4, 7)]
    start_leader_epoch(history, 4, 7)  # idempotent
    assert history.end_offset_for(1, 7) == (1, 7)
    with pytest.raises(ValueError):
        start_leader_epoch(history, 3, 7)


def test_failed_leader_leaves_the_isr():
    assert isr_after_leader_change({"a", "b", "c"}, "a", "b") == {"b", "c"}
    assert isr_after_leader_change({"a"}, None, "b") == {"a", "b"}


# -- witnesses -------------------------------------------------------------------------------


@pytest.mark.parametrize("followers,quorum", [(0, 1), (1, 1), (2, 2), (3, 2), (4, 3)])
def test_witness_quorum(followers, quorum):
    isr = {"L"} | {f"f{i}" for i in range(followers)}
    assert witness_quorum(isr, "L") == quorum


def report(
    reports, reporter, *, leader="L", epoch=3, isr=("L", "a", "b"), reported="L", reported_epoch=3, now=0.0, p="p"
):
    return reports.report(p, reported, reported_epoch, reporter, leader=leader, epoch=epoch, isr=set(isr), now=now)


def test_one_witness_is_enough_with_one_follower():
    assert report(LeaderFailureReports(), "a", isr=("L", "a")) is ReportVerdict.LEADER_FAILED


def test_majority_of_followers_must_witness():
    reports = LeaderFailureReports()
    assert report(reports, "a") is ReportVerdict.RECORDED
    assert report(reports, "a") is ReportVerdict.RECORDED  # the same witness twice
    assert reports.witnesses("p") == {"a"}
    assert report(reports, "b") is ReportVerdict.LEADER_FAILED
    assert reports.witnesses("p") == {"a", "b"}  # kept until an election is committed
    reports.elected("p", 4, now=0.0)
    assert reports.witnesses("p") == frozenset()


def test_stale_reports_are_ignored():
    reports = LeaderFailureReports()
    assert report(reports, "a", reported_epoch=2) is ReportVerdict.STALE
    assert report(reports, "a", reported="x") is ReportVerdict.STALE
    assert report(reports, "a", leader=None) is ReportVerdict.STALE
    assert reports.witnesses("p") == frozenset()


def test_only_isr_followers_witness():
    reports = LeaderFailureReports()
    assert report(reports, "L") is ReportVerdict.NOT_A_WITNESS
    assert report(reports, "z") is ReportVerdict.NOT_A_WITNESS


def test_reports_of_an_older_epoch_do_not_count_towards_the_new_one():
    reports = LeaderFailureReports()
    report(reports, "a", epoch=3, reported_epoch=3)
    assert report(reports, "b", epoch=4, reported_epoch=4) is ReportVerdict.RECORDED
    assert reports.witnesses("p") == {"b"}


def test_witnesses_that_left_the_isr_do_not_count():
    reports = LeaderFailureReports()
    report(reports, "a", isr=("L", "a", "b", "c"))
    assert report(reports, "b", isr=("L", "b", "c")) is ReportVerdict.RECORDED


def test_a_member_that_just_left_the_isr_still_counts_towards_the_quorum_for_a_leader_timeout():
    """b shut down and left the ISR while the leader was cut off: the leader, not knowing, holds
    its lease while a and b together could not replace it; a alone may only once b's fetches no
    longer count there."""
    reports = LeaderFailureReports(leave_memory=10.0)
    reports.left_isr("p", "b", 3, now=100.0)
    assert report(reports, "a", isr=("L", "a"), now=105.0) is ReportVerdict.RECORDED
    assert report(reports, "a", isr=("L", "a"), now=110.0) is ReportVerdict.LEADER_FAILED
    reports.left_isr("q", "b", 2, now=100.0)  # under an older leader epoch: its leader is gone
    assert report(reports, "a", isr=("L", "a"), now=101.0, p="q") is ReportVerdict.LEADER_FAILED


def test_a_new_metadata_leader_counts_every_replica_towards_the_quorum_for_a_leader_timeout():
    """It cannot know which members left the ISR just before it took over."""
    reports = LeaderFailureReports(leave_memory=10.0)
    reports.metadata_term(5, now=100.0)
    assert reports.report("p", "L", 3, "a", leader="L", epoch=3, isr={"L", "a"}, replicas={"L", "a", "b"},
                          now=105.0) is ReportVerdict.RECORDED
    reports.metadata_term(5, now=106.0)  # the same term: still since 100
    assert reports.report("p", "L", 3, "a", leader="L", epoch=3, isr={"L", "a"}, replicas={"L", "a", "b"},
                          now=110.0) is ReportVerdict.LEADER_FAILED
    reports.metadata_term(7, now=111.0)  # led again after losing it: since 111
    assert reports.report("q", "L", 3, "a", leader="L", epoch=3, isr={"L", "a"}, replicas={"L", "a", "b"},
                          now=112.0) is ReportVerdict.RECORDED


def test_reports_expire():
    reports = LeaderFailureReports(report_ttl=30.0)
    report(reports, "a", now=0.0)
    assert report(reports, "b", now=31.0) is ReportVerdict.RECORDED
    assert report(reports, "a", now=40.0) is ReportVerdict.LEADER_FAILED


def test_partitions_are_separate_and_clearable():
    reports = LeaderFailureReports()
    report(reports, "a", p="p1")
    assert report(reports, "b", p="p2") is ReportVerdict.RECORDED
    reports.clear("p1")
    assert report(reports, "b", p="p1") is ReportVerdict.RECORDED


# -- ISR changes -----------------------------------------------------------------------------


def change(kind, replica, leader="L", epoch=3, **kw):
    meta = dict(leader="L", epoch=3, replicas={"L", "a", "b"}, isr={"L", "a"})
    meta.update(kw)
    return validate_isr_change(kind, replica, leader, epoch, **meta)


def test_valid_shrink_and_expand():
    d = change(IsrChangeKind.SHRINK, "a")
    assert d.accepted and d.isr == {"L"}
    d = change(IsrChangeKind.EXPAND, "b")
    assert d.accepted and d.isr == {"L", "a", "b"}


@pytest.mark.parametrize(
    "kind,replica,args,reason",
    [
        (IsrChangeKind.SHRINK, "a", dict(leader="Z"), "stale leader"),
        (IsrChangeKind.SHRINK, "a", dict(epoch=2), "stale leader epoch"),
        (IsrChangeKind.EXPAND, "b", dict(epoch=4), "stale leader epoch"),
        (IsrChangeKind.EXPAND, "z", {}, "not a replica"),
        (IsrChangeKind.SHRINK, "L", {}, "cannot remove the leader"),
        (IsrChangeKind.SHRINK, "b", {}, "not in the ISR"),
        (IsrChangeKind.EXPAND, "a", {}, "already in the ISR"),
    ],
)
def test_refused_isr_changes(kind, replica, args, reason):
    d = change(kind, replica, **args)
    assert not d.accepted and d.reason == reason and d.isr == {"L", "a"}


def test_isr_change_decided_at_an_older_partition_epoch_is_refused():
    d = change(IsrChangeKind.EXPAND, "b", request_partition_epoch=4, partition_epoch=5)
    assert not d.accepted and d.reason == "stale partition epoch"
    assert change(IsrChangeKind.EXPAND, "b", request_partition_epoch=5, partition_epoch=5).accepted


def test_isr_change_of_a_leaderless_partition_is_refused():
    assert change(IsrChangeKind.SHRINK, "a", leader=None).reason == "stale leader"


def test_reports_against_a_just_elected_leader_wait_out_its_grace():
    reports = LeaderFailureReports(election_grace=1.0)
    reports.elected("p", 3, now=10.0)
    early = reports.report("p", "b", 3, "c", leader="b", epoch=3, isr={"b", "c"}, now=10.5)
    late = reports.report("p", "b", 3, "c", leader="b", epoch=3, isr={"b", "c"}, now=11.5)
    assert (early, late) == (ReportVerdict.STALE, ReportVerdict.LEADER_FAILED)


# -- elections -------------------------------------------------------------------------------

VIEW = PartitionView(
    leader="L", leader_epoch=3, epoch=7, isr=frozenset({"L", "a", "b"}), replicas=frozenset({"L", "a", "b"})
)


def test_a_reported_leader_is_replaced_by_the_most_advanced_isr_member_as_gathered_after_the_quorum():
    elections = Elections()
    assert not elections.leader_reported("p", VIEW, "L", 3, "a", now=0.0)
    assert elections.leader_reported("p", VIEW, "L", 3, "b", now=1.0)
    positions = {"a": Position(3, 10), "b": Position(3, 12), "L": Position(3, 20)}
    assert elections.successor(VIEW, "L", 3, positions) == Elect("b", ("a", "b"), leader_epoch=3, epoch=7)


def test_no_successor_once_the_metadata_moved_on_or_while_an_unclean_member_may_have_lost_acks():
    elections = Elections()
    positions = {"a": Position(3, 10), "b": Position(3, 12)}
    assert elections.successor(VIEW, "L", 2, positions) is None  # an older epoch's failure
    assert elections.successor(VIEW, "a", 3, positions) is None  # not the leader
    # b restarted uncleanly and a is silent: b may have lost what a holds.
    unclean = PartitionView("L", 3, 7, frozenset({"L", "a", "b"}), frozenset({"L", "a", "b"}), frozenset({"b"}))
    assert elections.successor(unclean, "L", 3, {"b": Position(3, 12)}) is None


def test_a_tie_goes_to_the_isr_member_leading_fewest_partitions():
    """Issue 32: the service did not say how many partitions each member leads, so every tie of a batch of
    elections went to the smallest id, and one survivor took all of a failed node's partitions."""
    elections = Elections()
    even = {"a": Position(3, 10), "b": Position(3, 10)}
    assert elections.successor(VIEW, "L", 3, even).leader == "a"  # nothing said: the smallest id, as before
    assert elections.successor(VIEW, "L", 3, even, {"a": 5, "b": 4}).leader == "b"
    assert elections.successor(VIEW, "L", 3, {"a": Position(3, 11), "b": Position(3, 10)}, {"a": 5}).leader == "a"
    returned = elections.leader_returned("p", VIEW, "L", 3, {"L": Position(3, 10), **even}, 0.0, {"L": 9, "a": 7})
    assert returned is not None and returned.leader == "b"


def test_a_returning_leader_that_lost_its_tail_hands_over_to_the_isr_member_holding_more():
    """A power cut took the leader's unsynced tail: followers hold more. It must not resume its
    epoch (followers would append its new entries after theirs); the best ISR member leads."""
    elections = Elections(return_patience=5.0)
    positions = {"L": Position(3, 90), "a": Position(3, 100), "b": Position(3, 95)}
    decision = elections.leader_returned("p", VIEW, "L", 3, positions, now=0.0)
    assert decision == Elect("a", ("a", "b"), leader_epoch=3, epoch=7)


def test_a_returning_leader_holding_the_most_gets_a_new_epoch_and_keeps_the_isr():
    elections = Elections(return_patience=5.0)
    positions = {"L": Position(3, 100), "a": Position(3, 100), "b": Position(2, 100)}
    decision = elections.leader_returned("p", VIEW, "L", 3, positions, now=0.0)
    assert decision is not None and decision.leader in {"L", "a"}
    alone = PartitionView("L", 3, 7, frozenset({"L"}), frozenset({"L", "a", "b"}))
    assert elections.leader_returned("q", alone, "L", 3, {"L": Position(3, 5)}, now=0.0) == Elect("L", ("L",), 3, 7)


def test_a_returning_leader_waits_for_silent_isr_members_then_elects_among_those_that_answered():
    elections = Elections(return_patience=5.0)
    positions = {"L": Position(3, 90), "a": Position(3, 80)}  # b, which may hold more, is silent
    assert elections.leader_returned("p", VIEW, "L", 3, positions, now=0.0) is None
    assert elections.leader_returned("p", VIEW, "L", 3, positions, now=4.0) is None
    decision = elections.leader_returned("p", VIEW, "L", 3, positions, now=5.5)
    assert decision == Elect("L", ("L", "a", "b"), 3, 7)


def test_a_stale_return_elects_nobody():
    elections = Elections()
    positions = {"L": Position(3, 90), "a": Position(3, 100), "b": Position(3, 100)}
    assert elections.leader_returned("p", VIEW, "L", 2, positions, now=0.0) is None
    assert elections.leader_returned("p", VIEW, "a", 3, positions, now=0.0) is None


def test_an_election_clears_the_reports_of_the_old_epoch():
    elections = Elections()
    elections.leader_reported("p", VIEW, "L", 3, "a", now=0.0)
    elections.elected("p", 4, now=1.0)
    assert elections.reports.witnesses("p") == frozenset()


# -- unclean members (KIP-966) ------------------------------------------------------------------


def test_an_unclean_member_is_passed_over_for_a_clean_one_holding_less():
    candidates = [Candidate("a", 5, 100), Candidate("b", 4, 120)]
    assert choose_leader(candidates, {"a", "b"}, unclean={"a"}) == "b"


def test_an_unclean_member_extending_a_clean_ones_epoch_may_lead():
    """Both logs are prefixes of epoch 5's leader's log: the longer holds whatever the clean one holds."""
    candidates = [Candidate("a", 5, 100), Candidate("b", 5, 90)]
    assert choose_leader(candidates, {"a", "b"}, unclean={"a"}) == "a"
    assert choose_leader([Candidate("a", 5, 80), Candidate("b", 5, 90)], {"a", "b"}, unclean={"a"}) == "b"
    assert choose_leader([Candidate("a", 5, 90), Candidate("b", 5, 90)], {"a", "b"}, unclean={"a"}) == "b"


def test_with_only_unclean_candidates_the_election_waits_for_every_isr_member():
    assert choose_leader([Candidate("a", -1, 0)], {"L", "a"}, exclude={"L"}, unclean={"a"}) is None
    both = [Candidate("a", -1, 0), Candidate("L", 5, 1515)]
    assert choose_leader(both, {"L", "a"}, unclean={"a", "L"}) == "L"


def test_issue_25_a_follower_that_lost_power_is_not_elected_in_place_of_the_dead_leader():
    """ISR {L, F1}: F1 lost power (empty log, unclean) while L's process died. F1's report reaches
    the quorum (1 of 1), but nobody is elected until L returns; then L, which kept its log, leads."""
    view = PartitionView("L", 3, 7, frozenset({"L", "F1"}), frozenset({"L", "F1", "F2"}), frozenset({"F1"}))
    elections = Elections(return_patience=5.0)
    assert elections.leader_reported("p", view, "L", 3, "F1", now=0.0)  # the quorum: 1 of 1
    assert elections.successor(view, "L", 3, {"F1": Position(-1, 0)}) is None
    returned = PartitionView(view.leader, 3, 8, view.isr, view.replicas, frozenset({"F1", "L"}))
    positions = {"L": Position(3, 1515), "F1": Position(-1, 0)}
    assert elections.leader_returned("p", returned, "L", 3, positions, now=3.0) == Elect("L", ("F1", "L"), 3, 8)


def test_a_returning_unclean_leader_waits_past_its_patience_for_a_clean_member():
    view = PartitionView("L", 3, 7, frozenset({"L", "a"}), frozenset({"L", "a"}), frozenset({"L"}))
    elections = Elections(return_patience=1.0)
    assert elections.leader_returned("p", view, "L", 3, {"L": Position(3, 90)}, now=0.0) is None
    assert elections.leader_returned("p", view, "L", 3, {"L": Position(3, 90)}, now=5.0) is None
    positions = {"L": Position(3, 90), "a": Position(3, 80)}
    assert elections.leader_returned("p", view, "L", 3, positions, now=6.0) == Elect("L", ("L", "a"), 3, 7)


def test_expanding_an_unclean_isr_member_declares_it_clean():
    args = dict(leader="L", epoch=3, replicas={"L", "a"}, isr={"L", "a"})
    refused = validate_isr_change(IsrChangeKind.EXPAND, "a", "L", 3, **args)
    accepted = validate_isr_change(IsrChangeKind.EXPAND, "a", "L", 3, **args, unclean={"a"})
    assert (refused.accepted, accepted.accepted, accepted.isr) == (False, True, frozenset({"L", "a"}))
