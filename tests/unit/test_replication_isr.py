from hypothesis import given, settings
from hypothesis import strategies as st

from bascule.partition.replication.isr import IsrTracker, PendingAcks


def tracker(isr=("L", "F", "G"), replicas=("L", "F", "G"), leo=10, hw=4, min_isr=1, now=0.0, **kw):
    return IsrTracker(
        "L", 7, replicas, isr, leader_log_end=leo, hw=hw, min_isr=min_isr,
        max_lag_time=15.0, leader_timeout=15.0, now=now, **kw,
    )


# -- HW --------------------------------------------------------------------------------------


def test_sole_isr_leader_commits_on_append():
    t = tracker(isr=("L",), leo=0, hw=-1)
    assert t.hw == -1
    t.leader_appended(3)
    assert t.hw == 2


def test_new_leader_waits_for_every_isr_follower_to_fetch():
    t = tracker(leo=10, hw=4)
    t.leader_appended(12)
    assert t.hw == 4
    assert t.record_fetch("F", 10, 7, 1.0)
    assert t.hw == 4  # G unknown yet
    assert t.record_fetch("G", 8, 7, 1.0)
    assert t.hw == 7
    assert t.record_fetch("G", 12, 7, 2.0) and t.hw == 9
    assert t.record_fetch("F", 12, 7, 2.0) and t.hw == 11


def test_hw_waits_for_min_isr():
    t = tracker(isr=("L", "F"), leo=10, hw=4, min_isr=3)
    t.record_fetch("F", 10, 7, 1.0)
    assert t.hw == 4 and not t.can_commit
    t.record_fetch("G", 10, 7, 1.0)
    t.set_isr({"L", "F", "G"}, 1.0)
    assert t.can_commit and t.hw == 9


def test_hw_beyond_the_leader_log_is_clamped():
    assert tracker(isr=("L",), leo=3, hw=8).hw == 2


def test_fetches_that_must_get_no_data():
    t = tracker()
    assert not t.record_fetch("X", 5, 7, 1.0)  # not a replica
    assert not t.record_fetch("F", 5, 6, 1.0)  # follows another leader epoch
    assert not t.record_fetch("F", 11, 7, 1.0)  # beyond this leader's log: not truncated
    assert not t.record_fetch("F", -1, 7, 1.0)
    assert t.progress("F").log_end_offset is None


def test_isr_always_contains_the_leader():
    t = tracker(isr=("F",))
    assert t.isr == {"L", "F"}
    t.set_isr(set(), 0.0)
    assert t.isr == {"L"}


# -- caught up, shrink, expand ---------------------------------------------------------------


def test_caught_up_means_fetching_the_leader_log_end():
    t = tracker()
    t.record_fetch("F", 10, 7, 3.0)
    assert t.is_caught_up("F") and t.last_caught_up("F") == 3.0
    t.leader_appended(11)
    assert not t.is_caught_up("F")
    assert not t.is_caught_up("G") and not t.is_caught_up("nobody")


def test_under_steady_load_caught_up_up_to_the_previous_fetch():
    t = tracker(leo=10)
    t.record_fetch("F", 8, 7, 1.0)
    assert t.last_caught_up("F") == 0.0  # the grace of a new leadership
    t.leader_appended(12)
    t.record_fetch("F", 10, 7, 2.0)  # has all that existed at its previous fetch
    assert t.last_caught_up("F") == 1.0 and not t.is_caught_up("F")
    t.leader_appended(20)
    t.record_fetch("F", 11, 7, 3.0)  # fell behind what existed at 2.0
    assert t.last_caught_up("F") == 1.0


def test_shrink_after_max_lag_time_without_catching_up():
    t = tracker(now=100.0)
    assert t.shrink_proposals(115.0) == []
    assert t.shrink_proposals(115.5) == ["F", "G"]
    t.record_fetch("F", 10, 7, 110.0)
    assert t.shrink_proposals(115.5) == ["G"]
    t.record_fetch("G", 3, 7, 116.0)  # fetching, but far behind
    assert t.shrink_proposals(125.5) == ["F", "G"]


def test_expand_a_caught_up_follower_outside_the_isr():
    t = tracker(isr=("L", "F"), leo=10, hw=4)
    assert t.expand_proposals(1.0) == []
    t.record_fetch("G", 6, 7, 1.0)
    assert t.expand_proposals(1.0) == []
    t.record_fetch("G", 10, 7, 2.0)
    assert t.expand_proposals(17.5) == []  # its last fetch is too old
    assert t.expand_proposals(2.0) == ["G"]
    t.set_isr({"L", "F", "G"}, 2.0)
    assert t.expand_proposals(2.0) == []


def test_expand_needs_every_committed_message():
    """Caught up with what existed one fetch ago, but the HW moved past its log end since."""
    t = tracker(isr=("L", "F"), leo=10, hw=4)
    t.record_fetch("G", 8, 7, 1.0)
    t.record_fetch("F", 10, 7, 1.0)
    t.leader_appended(14)
    t.record_fetch("F", 14, 7, 2.0)
    assert t.hw == 13
    t.record_fetch("G", 10, 7, 2.0)
    assert t.progress("G").caught_up_at_last_fetch
    assert t.expand_proposals(2.0) == []


def test_expand_needs_everything_before_the_leader_epoch():
    t = tracker(isr=("L",), leo=10, hw=2, epoch_start=10)
    t.record_fetch("G", 8, 7, 1.0)
    t.record_fetch("G", 8, 7, 2.0)  # >= the leader's end at its previous fetch? no: 8 < 10
    assert t.expand_proposals(2.0) == []
    t.record_fetch("G", 10, 7, 3.0)
    assert t.expand_proposals(3.0) == ["G"]


def test_pending_expansion_holds_the_hw_back():
    """G is proposed at its log end 10; the leader and F move on before the metadata answers."""
    t = tracker(isr=("L", "F"), leo=10, hw=4)
    t.record_fetch("F", 10, 7, 1.0)
    t.record_fetch("G", 10, 7, 1.0)
    assert t.expand_proposals(1.0) == ["G"]
    assert t.expand_proposals(1.0) == []  # proposed once
    t.leader_appended(14)
    t.record_fetch("F", 14, 7, 2.0)
    assert t.hw == 9  # not 13: G, about to join, holds up to 9
    t.set_isr({"L", "F", "G"}, 3.0)
    assert t.pending_expansions == frozenset() and t.hw == 9
    t.record_fetch("G", 14, 7, 3.0)
    assert t.hw == 13


def test_refused_expansion_releases_the_hw():
    t = tracker(isr=("L", "F"), leo=10, hw=4)
    t.record_fetch("F", 10, 7, 1.0)
    t.record_fetch("G", 10, 7, 1.0)
    t.expand_proposals(1.0)
    t.leader_appended(14)
    t.record_fetch("F", 14, 7, 2.0)
    assert t.hw == 9
    t.expand_refused("G")
    assert t.hw == 13
    assert t.expand_proposals(2.0) == []  # G is behind now
    t.record_fetch("G", 14, 7, 3.0)
    assert t.expand_proposals(3.0) == ["G"]


def test_unsettled_expansion_holds_the_hw_until_a_newer_partition_epoch_settles_it():
    """An expansion whose outcome is unknown is not a refusal: only an ISR committed at a newer
    partition epoch than the proposal's (which can then never commit) settles it as refused."""
    t = tracker(isr=("L", "F"), leo=10, hw=4)
    t.record_fetch("F", 10, 7, 1.0)
    t.record_fetch("G", 10, 7, 1.0)
    assert t.expand_proposals(1.0, partition_epoch=3) == ["G"]
    t.leader_appended(14)
    t.record_fetch("F", 14, 7, 2.0)
    assert t.hw == 9
    t.shrink_proposals(100.0)
    t.set_isr({"L", "F"}, 100.0, partition_epoch=3)  # the same epoch: the proposal may still commit
    assert t.pending_expansions == {"G"} and t.hw == 9
    t.set_isr({"L", "F"}, 101.0, partition_epoch=4)
    assert t.pending_expansions == frozenset() and t.hw == 13


def test_late_expansion_lacking_committed_messages_is_shrunk_at_once():
    t = tracker(isr=("L", "F"), leo=10, hw=4)
    t.record_fetch("F", 10, 7, 1.0)
    t.record_fetch("G", 10, 7, 1.0)
    t.expand_proposals(1.0)
    t.leader_appended(14)
    t.expand_refused("G")
    t.record_fetch("F", 14, 7, 20.0)
    assert t.hw == 13
    t.set_isr({"L", "F", "G"}, 21.0)  # G joins all the same (say, an operator's change)
    assert t.shrink_proposals(21.0) == ["G"]


def test_follower_that_lost_committed_messages_is_shrunk_at_once():
    t = tracker(isr=("L", "F"), leo=10, hw=4)
    t.record_fetch("F", 10, 7, 1.0)
    assert t.hw == 9
    t.record_fetch("F", 6, 7, 2.0)  # restarted after losing unsynced entries
    assert t.shrink_proposals(2.0) == ["F"] and t.hw == 9


def test_pending_members_do_not_count_towards_min_isr():
    t = tracker(isr=("L",), leo=10, hw=4, min_isr=2)
    t.record_fetch("G", 10, 7, 1.0)
    assert t.expand_proposals(1.0) == ["G"]
    assert t.hw == 4


def test_members_added_by_the_metadata_get_a_grace_period():
    t = tracker(isr=("L",), now=0.0)
    t.set_isr({"L", "F"}, 50.0)
    assert t.shrink_proposals(60.0) == []
    assert t.shrink_proposals(65.5) == ["F"]


def test_waiting_followers_are_notified_once():
    t = tracker(leo=10)
    t.record_fetch("F", 10, 7, 1.0)  # got nothing: waits
    t.record_fetch("G", 7, 7, 1.0)  # got data: not waiting
    assert t.leader_appended(11) == ["F"]
    assert t.leader_appended(12) == []
    t.record_fetch("F", 12, 7, 2.0)
    t.record_fetch("G", 12, 7, 2.0)
    assert t.leader_appended(13) == ["F", "G"]


# -- acks ------------------------------------------------------------------------------------


def test_acks_fire_once_their_offset_is_committed():
    acks = PendingAcks()
    for offset, token in [(3, "c"), (1, "a"), (2, "b"), (2, "b2")]:
        acks.add(offset, token)
    assert acks.release(0) == []
    assert acks.release(2) == [(1, "a"), (2, "b"), (2, "b2")]
    assert len(acks) == 1
    assert acks.fail_all() == [(3, "c")]
    assert len(acks) == 0 and acks.release(10) == []


def test_minority_isr_never_releases_acks():
    t = tracker(isr=("L",), leo=0, hw=-1, min_isr=2)
    acks = PendingAcks()
    t.leader_appended(1)
    acks.add(0, "m0")
    assert acks.release(t.hw) == []
    t.record_fetch("F", 1, 7, 1.0)
    t.set_isr({"L", "F"}, 1.0)
    assert acks.release(t.hw) == [(0, "m0")]


# -- properties ------------------------------------------------------------------------------

event = st.one_of(
    st.tuples(st.just("append"), st.integers(0, 3)),
    st.tuples(st.just("fetch"), st.sampled_from("FG"), st.integers(0, 4)),
    st.tuples(st.just("time"), st.sampled_from([1.0, 8.0, 20.0])),
    st.tuples(st.just("shrink")),
    st.tuples(st.just("expand")),
    st.tuples(st.just("settle"), st.booleans()),
)


@settings(max_examples=300, deadline=None)
@given(min_isr=st.integers(1, 3), isr=st.sets(st.sampled_from("FG")), events=st.lists(event, max_size=60))
def test_hw_never_decreases_and_never_passes_an_isr_member(min_isr, isr, events):
    """Followers fetch forward (their log ends never go back, nor beyond the leader's); ISR
    changes are the tracker's own proposals: shrinks committed at once, expansions committed
    or refused later, while the HW keeps moving (an answer later than max_lag_time counts as
    lost: see test_late_expansion_lacking_committed_messages_is_shrunk_at_once)."""
    now = 0.0
    t = IsrTracker("L", 1, "LFG", {"L", *isr}, leader_log_end=0, hw=-1, min_isr=min_isr, max_lag_time=15.0,
                   leader_timeout=15.0, now=now)
    log_end = {"L": 0, "F": 0, "G": 0}
    last_hw = t.hw
    pending: list[str] = []
    for e in events:
        isr_before = t.isr
        if e[0] == "append":
            log_end["L"] += e[1]
            t.leader_appended(log_end["L"])
        elif e[0] == "fetch":
            rid = e[1]
            log_end[rid] = min(log_end["L"], log_end[rid] + e[2])
            assert t.record_fetch(rid, log_end[rid], 1, now)
        elif e[0] == "time":
            now += e[1]
        elif e[0] == "shrink":
            for rid in t.shrink_proposals(now):
                t.set_isr(t.isr - {rid}, now)
        elif e[0] == "expand":
            pending.extend(t.expand_proposals(now))
        elif pending:  # the metadata commits (or refuses) the oldest pending expansion
            rid = pending.pop(0)
            if e[1] and rid in t.pending_expansions:  # answered within max_lag_time
                assert log_end[rid] > t.hw  # it holds every committed message
                t.set_isr(t.isr | {rid}, now)
            else:
                t.expand_refused(rid)
        assert t.hw >= last_hw
        # Every event left the HW where its inputs put it: record_fetch recomputes it only when a
        # follower's position moved, which holds only if every other input recomputes it as it changes.
        settled = t.hw
        t._recompute_hw()
        assert t.hw == settled
        if t.hw > last_hw:
            assert len(isr_before) >= min_isr or len(t.isr) >= min_isr
        for rid in t.isr | t.pending_expansions:
            if rid == "L" or t.progress(rid).log_end_offset is not None:
                assert t.hw <= log_end[rid] - 1
        last_hw = t.hw


def test_take_waiting_returns_idle_followers_once():
    tracker = IsrTracker("a", 1, ["a", "b", "c"], ["a", "b", "c"], leader_log_end=5, hw=4, min_isr=1,
                         max_lag_time=10, leader_timeout=10, now=0)
    tracker.record_fetch("b", 5, 1, now=1)  # caught up: an empty response, then it idles
    assert tracker.take_waiting() == ["b"]
    assert tracker.take_waiting() == []


def test_a_follower_asking_again_for_what_it_was_sent_is_seen():
    """A follower whose answer was lost or damaged asks for the same offset again: the leader then
    reads with CRC checks (it skips them otherwise)."""
    t = tracker(leo=10, hw=4)
    assert not t.asks_again("F", 5)  # never fetched
    assert t.record_fetch("F", 5, 7, 1.0)
    assert t.asks_again("F", 5)  # there was data from 5 and it is back for it
    assert not t.asks_again("F", 8)  # it made progress
    assert t.record_fetch("F", 10, 7, 2.0)
    assert not t.asks_again("F", 10)  # caught up, nothing was sent
    assert not t.asks_again("X", 5)


# -- unclean members ----------------------------------------------------------------------------


def test_an_unclean_member_is_declared_clean_once_it_holds_every_committed_message():
    t = tracker(isr=("L", "F", "G"), leo=10, hw=4, unclean=("F",))
    assert t.expand_proposals(1.0) == []
    assert t.record_fetch("F", 4, 7, 1.0)  # at or below the HW: lacks committed messages
    assert t.expand_proposals(1.0) == []
    assert t.record_fetch("F", 10, 7, 2.0)
    assert t.expand_proposals(2.0, partition_epoch=3) == ["F"]
    assert t.expand_proposals(2.0) == []  # pending: asked once
    t.set_isr({"L", "F", "G"}, 2.5, partition_epoch=3, unclean={"F"})
    assert t.pending_expansions == {"F"}  # the metadata has not cleared it yet
    t.set_isr({"L", "F", "G"}, 3.0, partition_epoch=4)
    assert t.pending_expansions == frozenset() and t.unclean == frozenset()


def test_the_unclean_set_is_kept_within_the_isr():
    t = tracker(isr=("L", "F"), unclean=("F", "G"))
    assert t.unclean == {"F"}
