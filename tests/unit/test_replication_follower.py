import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bascule.partition.log.epochs import EpochHistory
from bascule.partition.replication.follower import (
    Append,
    Follower,
    FollowerConfig,
    FollowerState,
    Pause,
    ReportLeader,
    RestartLog,
    SendEpochQuery,
    SendFetch,
    SetHighWatermark,
    Truncate,
    WaitForData,
    retry_pause,
)
from bascule.partition.replication.leader import start_leader_epoch

CONFIG = FollowerConfig(leader_timeout=15.0, max_idle_wait=10.0, retry_backoff=0.5)


def follower(entries=((1, 0),), leo=5, hw=-1, epoch=3, now=0.0, **kwargs) -> Follower:
    return Follower("F", "L", epoch, EpochHistory(entries), leo, hw, now, config=CONFIG, **kwargs)


def fetching(leo=5, hw=-1, entries=((1, 0),), epoch=3) -> Follower:
    f = follower(entries, leo=leo, hw=hw, epoch=epoch)
    f.start()
    f.on_epoch_answer(entries[-1][0], leo, 0.0)
    assert f.state is FollowerState.FETCHING
    return f


# -- truncation ------------------------------------------------------------------------------


def test_starts_by_asking_for_its_latest_epoch():
    f = follower([(1, 0), (2, 3)])
    assert f.state is FollowerState.TRUNCATING
    assert f.start() == [SendEpochQuery(2)]
    assert f.start() == []  # once


def test_empty_history_goes_straight_to_fetching():
    f = follower([], leo=0)
    assert f.start() == [Truncate(0), SendFetch(0, 3)]
    assert f.state is FollowerState.FETCHING


def test_entries_without_any_epoch_are_not_trusted():
    f = follower([], leo=4, log_start_offset=1)
    assert f.start() == [Truncate(1), SendFetch(1, 3)]


def test_never_truncates_to_its_own_hw():
    """S1: the follower's HW (-1) lags; the leader's epoch end (2) says keep both entries."""
    f = follower([(1, 0)], leo=2, hw=-1)
    f.start()
    assert f.on_epoch_answer(1, 2, 1.0) == [Truncate(2), SendFetch(2, 3)]
    assert f.log_end_offset == 2


def test_has_the_epoch_truncates_to_the_smaller_end():
    f = follower([(1, 0), (2, 4)], leo=9)
    f.start()
    assert f.on_epoch_answer(2, 6, 1.0) == [Truncate(6), SendFetch(6, 3)]
    assert f.history.entries == [(1, 0), (2, 4)]


def test_has_an_older_epoch_uses_its_own_end_of_it():
    # asked 3, the leader answers (2, 8); this replica's epoch 2 ends at 5 (its epoch 3 starts)
    f = follower([(1, 0), (2, 3), (3, 5)], leo=8)
    assert f.start() == [SendEpochQuery(3)]
    assert f.on_epoch_answer(2, 8, 1.0) == [Truncate(5), SendFetch(5, 3)]
    assert f.history.entries == [(1, 0), (2, 3)]


def test_lacking_the_epoch_truncates_and_asks_again():
    f = follower([(1, 0), (3, 1)], leo=2)
    f.start()
    # the leader's largest epoch <= 3 is 2, ending at 2: unknown here
    assert f.on_epoch_answer(2, 2, 1.0) == [Truncate(1), SendEpochQuery(1)]
    assert f.state is FollowerState.TRUNCATING
    assert f.on_epoch_answer(1, 1, 1.0) == [Truncate(1), SendFetch(1, 3)]


def test_unknown_epoch_truncates_to_the_log_start():
    f = follower([(1, 2)], leo=6, log_start_offset=2)
    f.start()
    assert f.on_epoch_answer(-1, -1, 1.0) == [Truncate(2), SendFetch(2, 3)]
    assert f.history.entries == []


def test_no_common_epoch_truncates_to_the_log_start():
    f = follower([(2, 0), (3, 4)], leo=6)
    f.start()
    assert f.on_epoch_answer(1, 3, 1.0) == [Truncate(0), SendFetch(0, 3)]


def test_answer_for_a_newer_epoch_than_asked_is_asked_again():
    f = follower([(1, 0)], leo=3)
    f.start()
    assert f.on_epoch_answer(2, 3, 1.0) == [SendEpochQuery(1)]


def test_answer_beyond_its_log_keeps_its_log():
    f = follower([(1, 0)], leo=3)
    f.start()
    assert f.on_epoch_answer(1, 10, 1.0) == [Truncate(3), SendFetch(3, 3)]


def test_truncation_below_the_hw_lowers_it_and_says_so():
    f = follower([(1, 0), (2, 1)], leo=2, hw=1)
    f.start()
    assert f.on_epoch_answer(1, 1, 1.0) == [Truncate(1, True), SetHighWatermark(0), SendFetch(1, 3)]
    assert f.hw == 0


def test_hw_beyond_the_log_is_clamped_at_start():
    assert follower([(1, 0)], leo=3, hw=7).hw == 2


def test_answers_outside_truncation_are_ignored():
    f = fetching()
    assert f.on_epoch_answer(1, 0, 1.0) == []
    f = follower()
    assert f.on_epoch_answer(1, 0, 1.0) == []  # nothing asked yet


def _ground_truth_lcp(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@st.composite
def diverged_replicas(draw):
    """Logs and epoch histories of three replicas after a random run of leaderships: each epoch's
    leader records it and appends; some replicas then sync to it (cut at the true common prefix,
    copy a prefix of the rest). Any replica may lead (even unclean): truncation must be exact."""
    ids = "XYZ"
    logs = {r: [] for r in ids}
    histories = {r: EpochHistory() for r in ids}
    epoch = 0
    for _ in range(draw(st.integers(1, 7))):
        epoch += draw(st.integers(1, 2))
        leader = draw(st.sampled_from(ids))
        start_leader_epoch(histories[leader], epoch, len(logs[leader]))
        for _ in range(draw(st.integers(1, 2))):
            for _ in range(draw(st.integers(0, 3))):
                logs[leader].append((epoch, f"{leader}{epoch}@{len(logs[leader])}"))
            for other in ids:
                if other == leader or not draw(st.booleans()):
                    continue
                log, history, source = logs[other], histories[other], logs[leader]
                cut = _ground_truth_lcp(log, source)
                del log[cut:]
                history.truncate_from_end(cut)
                for offset in range(cut, draw(st.integers(cut, len(source)))):
                    entry_epoch = source[offset][0]
                    if entry_epoch > history.latest_epoch:
                        history.assign(entry_epoch, offset)
                    log.append(source[offset])
    leader = draw(st.sampled_from(ids))
    member = draw(st.sampled_from([r for r in ids if r != leader]))
    epoch += 1
    start_leader_epoch(histories[leader], epoch, len(logs[leader]))
    return logs[leader], histories[leader], logs[member], histories[member], epoch


@settings(max_examples=400, deadline=None)
@given(diverged_replicas())
def test_truncation_stops_exactly_at_the_divergence(case):
    """Never removes an entry the leader also holds at that offset (below the leader's epoch
    boundary), and keeps no entry the leader does not hold."""
    leader_log, leader_history, log, history, epoch = case
    f = Follower("F", "L", epoch, history, len(log), -1, 0.0, config=CONFIG)
    actions = f.start()
    rounds = 0
    while not isinstance(actions[-1], SendFetch):
        query = actions[-1]
        assert isinstance(query, SendEpochQuery)
        rounds += 1
        assert rounds <= len(history) + 1
        answer = leader_history.end_offset_for(query.epoch, len(leader_log))
        actions = f.on_epoch_answer(*answer, 1.0)
    assert f.log_end_offset == _ground_truth_lcp(log, leader_log)
    kept = log[: f.log_end_offset]
    assert all(f.history.epoch_at(i) == entry[0] for i, entry in enumerate(kept))
    assert all(start < f.log_end_offset for _, start in f.history.entries)


# -- fetching --------------------------------------------------------------------------------


def test_valid_data_is_appended_and_the_next_fetch_follows():
    f = fetching(leo=5, entries=((1, 0),))
    actions = f.on_replicate(3, 6, [(5, 1), (6, 3), (7, 3)], 2.0)
    assert actions == [Append(5, 3, ((3, 6),)), SetHighWatermark(6), SendFetch(8, 3)]
    assert f.history.entries == [(1, 0), (3, 6)] and f.log_end_offset == 8


def test_follower_hw_is_min_of_leader_hw_and_own_last_offset():
    f = fetching(leo=5)
    assert f.on_replicate(3, 100, [(5, 1)], 1.0) == [Append(5, 1, ()), SetHighWatermark(5), SendFetch(6, 3)]
    assert f.on_replicate(3, 2, [(6, 1)], 1.0) == [Append(6, 1, ()), SendFetch(7, 3)]
    assert f.hw == 5  # a lagging leader HW does not pull it back


def test_response_of_another_leader_epoch_is_dropped():
    f = fetching(leo=5)
    actions = f.on_replicate(2, 9, [(5, 1)], 1.0)
    assert actions == [WaitForData(1.5)]
    assert f.log_end_offset == 5 and f.hw == -1 and f.state is FollowerState.IDLE
    assert f.on_replicate(4, 9, [], 1.1) == []  # backing off: dropped silently
    f.on_notify(1.2)
    assert f.on_replicate(4, 9, [], 1.3) == [WaitForData(1.8)]  # a newer epoch: also dropped


def test_the_real_leaders_reply_after_a_zombies_is_taken():
    f = fetching(leo=5)
    assert f.on_replicate(2, 0, [], 1.0) == [WaitForData(1.5)]  # the zombie answered first
    assert f.on_replicate(3, 5, [(5, 1)], 1.1) == [Append(5, 1, ()), SetHighWatermark(5), SendFetch(6, 3)]
    assert f.state is FollowerState.FETCHING


def test_invalid_replies_while_idle_are_ignored():
    f = fetching(leo=5)
    f.on_replicate(3, 4, [], 1.0)
    assert f.on_replicate(3, 4, [(3, 1)], 2.0) == []  # stale
    assert f.on_replicate(3, 4, [(5, 1), (5, 1)], 2.0) == []  # malformed
    assert f.state is FollowerState.IDLE and f.log_end_offset == 5


def test_stale_or_gapped_data_is_dropped_and_refetched():
    f = fetching(leo=5)
    assert f.on_replicate(3, 9, [(3, 1), (4, 1)], 1.0) == [SendFetch(5, 3)]
    assert f.on_replicate(3, 5, [(7, 1)], 1.0) == [SendFetch(5, 3)]  # a gap above the leader's HW
    assert f.log_end_offset == 5 and f.hw == -1


def test_past_a_gap_at_or_below_the_leaders_hw_the_entries_are_appended_after_it():
    """The leader no longer has offsets 5..99 (compaction removed them, or retention): the follower
    appends what follows the gap, as Liftbridge's do, and keeps what it has. An epoch the entries
    begin starts where the gap does, the earliest it can have begun."""
    f = fetching(leo=5, hw=4, entries=((1, 0),))
    actions = f.on_replicate(3, 120, [(100, 2), (101, 3)], 1.0)
    assert actions == [Append(100, 2, ((2, 5), (3, 101))), SetHighWatermark(101), SendFetch(102, 3)]
    assert f.history.entries == [(1, 0), (2, 5), (3, 101)]
    assert f.log_start_offset == 0 and f.log_end_offset == 102 and f.hw == 101


def test_gaps_inside_a_batch_are_the_leaders_and_stored_as_they_are():
    f = fetching(leo=5, hw=4, entries=((1, 0),))
    actions = f.on_replicate(3, 20, [(5, 1), (9, 1), (12, 3)], 1.0)
    assert actions == [Append(5, 3, ((3, 10),)), SetHighWatermark(12), SendFetch(13, 3)]
    assert f.log_end_offset == 13


def test_an_empty_log_below_the_leaders_log_start_restarts_there():
    """This replica has nothing (new, or its disk was wiped) and the leader's log starts past its
    end: the follower restarts its log there, never idling below it forever."""
    f = follower((), leo=0)
    assert f.start() == [Truncate(0, False), SendFetch(0, 3)]
    actions = f.on_replicate(3, 120, [(100, 2), (101, 3)], 1.0)
    assert actions == [RestartLog(100), Append(100, 2, ((2, 100), (3, 101))), SetHighWatermark(101), SendFetch(102, 3)]
    assert f.history.entries == [(2, 100), (3, 101)]
    assert f.log_start_offset == 100 and f.log_end_offset == 102 and f.hw == 101


@pytest.mark.parametrize(
    "entries",
    [
        [(5, 1), (5, 1)],  # offsets not rising
        [(6, 1), (5, 1)],  # offsets going back
        [(5, 4)],  # an epoch above the leader's
        [(5, 2), (6, 1)],  # epochs going backwards
    ],
)
def test_malformed_batches_are_dropped(entries):
    f = fetching(leo=5, entries=((1, 0),))
    assert f.on_replicate(3, 9, entries, 1.0) == [WaitForData(1.5)]
    assert f.log_end_offset == 5


def test_batch_older_than_its_latest_epoch_is_dropped():
    f = fetching(leo=5, entries=((1, 0), (2, 3)))
    assert f.on_replicate(3, 9, [(5, 1)], 1.0) == [WaitForData(1.5)]


def test_caught_up_waits_for_a_notification_or_the_idle_wait():
    f = fetching(leo=5)
    assert f.on_replicate(3, 4, [], 2.0) == [SetHighWatermark(4), WaitForData(12.0, caught_up=True)]
    assert f.state is FollowerState.IDLE
    assert f.tick(11.9) == []
    assert f.tick(12.0) == [SendFetch(5, 3)]
    f.on_replicate(3, 4, [], 13.0)
    assert f.on_notify(14.0) == [SendFetch(5, 3)]
    assert f.on_notify(14.0) == []  # not waiting


def test_a_back_off_is_no_caught_up_wait():
    f = fetching(leo=5)
    [wait] = f.on_replicate(4, 9, [], 1.0)  # another epoch: dropped
    assert wait == WaitForData(1.5) and not wait.caught_up


def test_parked_contact_counts_as_the_leader_s_answer():
    f = fetching(leo=5)
    f.on_replicate(3, 4, [], 1.0)  # caught up at 1.0: parked
    f.on_parked_contact(14.0, 7.5)  # a round answered at 14.0
    assert f.tick(15.5) == [SendFetch(5, 3, 7.5)]  # the idle wait is over; the leader is not silent
    assert f.on_fetch_failed(28.9) == [Pause(28.9 + 0.05), SendFetch(5, 3, 7.5)]
    # 15 s after 14.0
    assert f.on_fetch_failed(29.1) == [ReportLeader("L", 3), Pause(29.1 + 0.1), SendFetch(5, 3, 7.5)]


def test_parked_contact_never_moves_contact_back_nor_counts_outside_idle():
    f = fetching(leo=5)
    f.on_replicate(3, 4, [], 10.0)
    f.on_parked_contact(9.0, 2.0)  # an older round: contact stays at 10.0, the echo takes the reading
    assert f.next_deadline() == 20.0
    assert f.on_notify(10.5) == [SendFetch(5, 3, 2.0)]
    f.on_parked_contact(30.0, 9.0)  # fetching now: not parked, nothing counts
    assert f.on_fetch_failed(25.1) == [ReportLeader("L", 3), Pause(25.1 + 0.05), SendFetch(5, 3, 2.0)]


def test_next_deadline():
    f = fetching(leo=5)
    assert f.next_deadline() == 15.0
    f.on_replicate(3, 4, [], 2.0)
    assert f.next_deadline() == 12.0


# -- leader timeout --------------------------------------------------------------------------


def test_silent_leader_is_reported_once_per_timeout():
    f = fetching(leo=5)
    f.on_replicate(3, 4, [(5, 1)], 1.0)  # last contact at 1.0
    assert f.on_fetch_failed(10.0) == [Pause(10.0 + 0.05), SendFetch(6, 3)]
    assert f.on_fetch_failed(16.5) == [ReportLeader("L", 3), Pause(16.5 + 0.1), SendFetch(6, 3)]
    assert f.on_fetch_failed(20.0) == [Pause(20.0 + 0.2), SendFetch(6, 3)]
    assert f.tick(31.0) == []
    assert f.tick(31.5) == [ReportLeader("L", 3)]
    assert f.next_deadline() == 46.5


def test_unanswered_epoch_query_is_reported():
    f = follower(now=0.0)
    f.start()
    assert f.on_epoch_query_failed(3.0) == [Pause(3.0 + 0.05), SendEpochQuery(1)]
    assert f.on_epoch_query_failed(15.5) == [ReportLeader("L", 3), Pause(15.5 + 0.1), SendEpochQuery(1)]
    assert fetching().on_epoch_query_failed(20.0) == []


def test_answers_count_as_contact():
    f = follower(now=0.0)
    f.start()
    f.on_epoch_answer(1, 5, 14.0)
    assert f.on_fetch_failed(20.0) == [Pause(20.0 + 0.05), SendFetch(5, 3)]
    assert f.on_fetch_failed(29.5) == [ReportLeader("L", 3), Pause(29.5 + 0.1), SendFetch(5, 3)]


# -- failed requests --------------------------------------------------------------------------


def test_the_retry_pause_doubles_from_50_ms_up_to_a_quarter_of_the_leader_timeout_and_1_s():
    assert [retry_pause(n, 15.0) for n in range(1, 8)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert [retry_pause(n, 2.0) for n in range(1, 6)] == [0.05, 0.1, 0.2, 0.4, 0.5]
    assert retry_pause(1, 0.1) == 0.025  # a tiny leader timeout caps even the first
    assert retry_pause(10**6, 15.0) == 1.0  # a long outage's count


def test_failed_requests_pause_longer_each_time_until_the_leader_answers():
    f = follower(now=0.0)
    f.start()
    assert f.on_epoch_query_failed(1.0) == [Pause(1.0 + 0.05), SendEpochQuery(1)]
    assert f.on_epoch_query_failed(2.0) == [Pause(2.0 + 0.1), SendEpochQuery(1)]
    f.on_epoch_answer(1, 5, 3.0)  # an answer: the next failure pauses as the first did
    assert f.on_fetch_failed(4.0) == [Pause(4.0 + 0.05), SendFetch(5, 3)]
    pauses = [f.on_fetch_failed(t)[0].until - t for t in (5.0, 6.0, 7.0, 8.0, 9.0, 10.0)]
    assert pauses == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    f.on_replicate(3, 4, [(5, 1)], 11.0)
    assert f.on_fetch_failed(12.0) == [Pause(12.0 + 0.05), SendFetch(6, 3)]


def test_a_not_the_leader_yet_reply_is_asked_again_promptly_after_a_new_leader():
    """Each "not the leader of this epoch (yet)" reply is a failed request: a machine of a new
    leader or epoch starts again from the short pauses, whatever its predecessor had come to."""
    f = fetching(leo=5)
    for t in range(1, 10):
        f.on_fetch_failed(float(t))
    after_election = fetching(leo=5, epoch=4)
    assert after_election.on_fetch_failed(1.0) == [Pause(1.0 + 0.05), SendFetch(5, 4)]
    assert after_election.on_fetch_failed(1.1) == [Pause(1.1 + 0.1), SendFetch(5, 4)]


def test_a_pause_ends_when_the_silent_leader_is_due_to_be_reported():
    f = fetching(leo=5)  # last contact at 0.0: reported after 15.0
    for _ in range(10):
        actions = f.on_fetch_failed(14.7)
    assert actions == [Pause(15.0), SendFetch(5, 3)]  # not 15.7
    # A failure at that very instant is not past it: no report yet, and a first pause, not none.
    assert f.on_fetch_failed(15.0) == [Pause(15.0 + 0.05), SendFetch(5, 3)]
    assert f.on_fetch_failed(15.05) == [ReportLeader("L", 3), Pause(15.05 + 1.0), SendFetch(5, 3)]
    for _ in range(10):
        actions = f.on_fetch_failed(29.5)
    assert actions == [Pause(15.05 + 15.0), SendFetch(5, 3)]  # the next report's due time


def test_responses_of_another_epoch_are_not_contact():
    f = fetching(leo=5)  # last contact at 0.0
    reports = []
    for t in range(1, 17):
        assert f.on_replicate(2, 0, [], float(t)) == [WaitForData(t + 0.5)]  # a zombie's
        actions = f.tick(t + 0.5)
        assert SendFetch(5, 3) in actions
        reports += [t + 0.5 for a in actions if isinstance(a, ReportLeader)]
    assert reports == [15.5]


def test_events_outside_their_state_are_ignored():
    f = follower()
    assert f.on_replicate(3, 0, [], 1.0) == []
    assert f.on_fetch_failed(1.0) == []
    assert f.on_notify(1.0) == []


def test_config_validation():
    with pytest.raises(ValueError):
        FollowerConfig(leader_timeout=5.0, max_idle_wait=10.0)
    with pytest.raises(ValueError):
        FollowerConfig(retry_backoff=-1)
    with pytest.raises(ValueError):
        Follower("F", "L", 1, EpochHistory(), 0, -1, 0.0, log_start_offset=3)


def test_the_follower_copies_the_history_it_is_given():
    history = EpochHistory([(1, 0), (2, 3)])
    f = Follower("F", "L", 3, history, 5, -1, 0.0)
    f.start()
    f.on_epoch_answer(1, 3, 0.0)
    assert history.entries == [(1, 0), (2, 3)] and f.history.entries == [(1, 0)]


# -- the leader's lease ------------------------------------------------------------------------


def test_fetches_echo_the_newest_leader_reading_of_a_reply_that_counted_as_contact():
    f = fetching(leo=5)
    assert f.on_replicate(3, 4, [(5, 1)], 1.0, leader_time=70.0)[-1] == SendFetch(6, 3, 70.0)
    f.on_replicate(3, 4, [(3, 1)], 1.1, leader_time=71.0)  # a stale reply still is the leader's answer
    assert f.on_notify(1.2) == [] and f.state is FollowerState.FETCHING
    assert f.on_fetch_failed(1.3)[-1] == SendFetch(6, 3, 71.0)
    f.on_replicate(3, 4, [], 1.4, leader_time=69.0)  # an older reply, late: no step back
    assert f.on_notify(1.5) == [SendFetch(6, 3, 71.0)]


def test_replies_that_are_no_contact_are_not_echoed():
    f = fetching(leo=5)
    f.on_replicate(3, 4, [], 1.0, leader_time=70.0)
    f.on_notify(1.1)
    f.on_replicate(2, 4, [], 1.2, leader_time=500.0)  # another leader epoch: another clock
    f.on_notify(1.7)
    f.on_replicate(3, 4, [(5, 1), (5, 1)], 1.8, leader_time=80.0)  # malformed
    assert f.tick(2.5) == [SendFetch(5, 3, 70.0)]  # after its back-off
