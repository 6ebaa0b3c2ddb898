"""Deduplication by message id: the window alone, then the Leader machine writing with ids.

Tokens are strings; ``Log`` plays the log by answering each Append with ``appended``.
"""

from hypothesis import given
from hypothesis import strategies as st
from test_replication_leader_writes import TIMEOUT, Log, acked, failed

from bascule.partition.log.epochs import EpochHistory
from bascule.partition.replication.concurrency import NO_EXPECTATION, IncorrectOffset
from bascule.partition.replication.dedup import DedupLimits, DedupWindow
from bascule.partition.replication.leader import Append, Leader, StartSync
from bascule.wire.entry import Record

LIMITS = DedupLimits(max_age=120.0, max_messages=1000)


def test_the_window_forgets_ids_beyond_its_count_of_offsets():
    window = DedupWindow(DedupLimits(max_age=120.0, max_messages=2))
    window.remember(b"x", 0, 1.0)
    window.remember(b"y", 1, 1.0)
    window.expire(log_end=2, now=1.0)
    assert window.offset_of(b"x") == 0
    window.remember(b"z", 2, 1.0)
    window.expire(log_end=3, now=1.0)
    assert window.offset_of(b"x") is None and window.offset_of(b"y") == 1 and window.offset_of(b"z") == 2


def test_the_window_s_memory_stays_within_twice_its_count():
    window = DedupWindow(DedupLimits(max_age=120.0, max_messages=100))
    for first in range(0, 10_000, 10):
        window.remember_run(first, [b"%d" % offset for offset in range(first, first + 10)], 1.0)
        window.expire(first + 10, 1.0)
        assert len(window._offsets) <= 2 * 100 + 10 and len(window._runs) <= 11
    assert window.offset_of(b"9899") is None and window.offset_of(b"9900") == 9900
    assert window.holds_any([b"1", b"9999"]) and not window.holds_any([b"1", b"2", None])


_IDS = st.lists(st.none() | st.sampled_from([b"a", b"b", b"c", b"d"]), max_size=6)


@given(st.lists(_IDS, max_size=5), _IDS)
def test_runs_remembered_and_checked_at_once_are_ids_one_at_a_time(runs, keys):
    """remember_run and holds_any (C loops over the run) against remember and offset_of per id."""
    together, alone = DedupWindow(DedupLimits(120.0, 6)), DedupWindow(DedupLimits(120.0, 6))
    first = 0
    for run in runs:
        together.remember_run(first, run, 1.0)
        for offset, key in enumerate(run, first):
            if key is not None:
                alone.remember(key, offset, 1.0)
        first += len(run)
        together.expire(first, 1.0)
        alone.expire(first, 1.0)
    for key in (b"a", b"b", b"c", b"d"):
        assert together.offset_of(key) == alone.offset_of(key)
    given = [key for key in keys if key is not None]
    expected = len(set(given)) < len(given) or any(alone.offset_of(key) is not None for key in given)
    assert together.holds_any(keys) == expected


def test_the_window_forgets_ids_older_than_its_age():
    window = DedupWindow(DedupLimits(max_age=10.0, max_messages=1000), [(b"x", 0, 1.0), (b"y", 1, 5.0)])
    window.expire(log_end=2, now=11.5)
    assert window.offset_of(b"x") is None and window.offset_of(b"y") == 1


def test_an_id_written_again_after_it_left_the_window_means_its_newest_message():
    window = DedupWindow(DedupLimits(max_age=10.0, max_messages=1000), [(b"x", 0, 1.0)])
    window.expire(log_end=1, now=20.0)
    window.remember(b"x", 5, 20.0)
    window.expire(log_end=6, now=20.0)  # the old entry of x leaves; the new one stays
    assert window.offset_of(b"x") == 5


def test_either_bound_at_zero_turns_deduplication_off():
    assert LIMITS.enabled
    assert not DedupLimits(0.0, 1000).enabled and not DedupLimits(120.0, 0).enabled


def leading(*, sync_always=False, occ=False, window=None, isr=("me",), epoch=1, machine=None) -> Leader[str]:
    machine = machine or Leader("s/0", sync_always=sync_always, concurrency_control=occ)
    machine.lead("me", epoch, 0, ("me", "f"), isr, history=EpochHistory(), log_end_offset=0, hw=-1, min_isr=1,
                 max_lag_time=TIMEOUT, leader_timeout=TIMEOUT, now=0.0,
                 dedup=DedupWindow(LIMITS) if window is None else window)
    return machine


def write(machine, log, token, ids, now=1.0, values=None, expected=None):
    values = values or [f"{token}{index}".encode() for index in range(len(ids))]
    machine.submit([Record(value) for value in values], token, expected, ids)
    return log.flush(machine, now)


def test_a_duplicate_is_not_written_again_and_learns_the_first_copy_s_offset():
    machine, log = leading(), Log()
    assert acked(write(machine, log, "a", [b"x"])) == [(0, "a")]
    actions = write(machine, log, "retry", [b"x"])
    assert not any(isinstance(action, Append) for action in actions)
    assert acked(actions) == [([0], "retry")] and len(log.records) == 1


def test_a_burst_keeps_its_new_records_and_names_each_one_s_offset():
    machine, log = leading(), Log()
    write(machine, log, "a", [b"x", b"y"])
    actions = write(machine, log, "b", [b"z", b"y", None, b"w"])
    assert [record.value for record in log.records] == [b"a0", b"a1", b"b0", b"b2", b"b3"]
    assert acked(actions) == [([2, 1, 3, 4], "b")]


def test_duplicates_within_one_flush_are_written_once():
    machine, log = leading(), Log()
    machine.submit([Record(b"first")], "first", None, [b"x"])
    machine.submit([Record(b"plain")], "plain", None)  # no ids: the groups keep their places
    machine.submit([Record(b"again"), Record(b"new")], "again", None, [b"x", b"y"])
    actions = log.flush(machine, 1.0)
    assert [record.value for record in log.records] == [b"first", b"plain", b"new"]
    assert acked(actions) == [(0, "first"), (1, "plain"), ([0, 2], "again")]
    assert acked(write(machine, log, "later", [b"y"])) == [([2], "later")]  # remembered once appended


def test_records_without_ids_are_never_deduplicated():
    machine, log = leading(), Log()
    machine.submit([Record(b"same")], "a", None)
    machine.submit([Record(b"same")], "b", None)
    assert acked(log.flush(machine, 1.0)) == [(0, "a"), (1, "b")]


def test_without_a_window_ids_are_ignored():
    machine = Leader("s/0", sync_always=False, concurrency_control=False)
    machine.lead("me", 1, 0, ("me",), ("me",), history=EpochHistory(), log_end_offset=0, hw=-1, min_isr=1,
                 max_lag_time=TIMEOUT, leader_timeout=TIMEOUT, now=0.0)
    log = Log()
    write(machine, log, "a", [b"x"])
    assert acked(write(machine, log, "b", [b"x"])) == [(1, "b")] and len(log.records) == 2


def test_a_failed_append_remembers_nothing():
    machine, log = leading(), Log()
    machine.submit([Record(b"lost")], "lost", None, [b"x"])
    [append] = machine.flush(1.0)
    assert failed(machine.append_failed(OSError("ENOSPC"))) == [("lost", OSError)]
    assert acked(write(machine, log, "retry", [b"x"])) == [(0, "retry")] and len(log.records) == 1
    assert isinstance(append, Append)


def test_under_sync_always_a_duplicate_waits_for_a_sync_covering_its_first_copy():
    machine, log = leading(sync_always=True), Log()
    [sync] = write(machine, log, "a", [b"x"])
    assert isinstance(sync, StartSync)
    assert write(machine, log, "retry", [b"x"]) == []  # behind the sync in flight
    actions = machine.synced(sync, 2.0)
    assert acked(actions) == [(0, "a")]
    [second] = [action for action in actions if isinstance(action, StartSync)]
    assert second.writes == [([0], "retry")] and acked(machine.synced(second, 3.0)) == [([0], "retry")]


def test_a_duplicate_waits_behind_acks_held_for_the_lease():
    machine, log = leading(isr=("me", "f")), Log()
    assert acked(write(machine, log, "a", [b"x"])) == []  # no follower has echoed this leader's clock
    assert acked(write(machine, log, "retry", [b"x"])) == [] and machine.acks_held == 2
    _, actions = machine.fetched("f", 0, 1, 3.0, leader_time=2.5)
    assert acked(actions) == [(0, "a"), ([0], "retry")]


def test_under_concurrency_control_a_retry_is_acked_not_refused():
    machine, log = leading(occ=True), Log()
    assert acked(write(machine, log, "a", [b"x"], expected=[0])) == [(0, "a")]
    # The retry expects the offset its first attempt got, where the log no longer ends.
    assert acked(write(machine, log, "retry", [b"x"], expected=[0])) == [([0], "retry")]
    assert failed(write(machine, log, "other", [b"y"], expected=[0])) == [("other", IncorrectOffset)]


def test_a_duplicate_of_a_refused_record_is_refused_alike():
    machine, log = leading(occ=True), Log()
    machine.submit([Record(b"a")], "refused", [5], [b"x"])
    machine.submit([Record(b"b")], "copy", [NO_EXPECTATION], [b"x"])
    actions = log.flush(machine, 1.0)
    assert failed(actions) == [("refused", IncorrectOffset), ("copy", IncorrectOffset)] and log.records == []


def test_a_new_leadership_knows_the_ids_its_window_was_rebuilt_with():
    machine, log = leading(), Log()
    write(machine, log, "a", [b"x"])
    machine.step_down()
    rebuilt = DedupWindow(LIMITS, [(b"x", 0, 0.5)])
    machine.lead("me", 2, 0, ("me",), ("me",), history=EpochHistory(), log_end_offset=1, hw=0, min_isr=1,
                 max_lag_time=TIMEOUT, leader_timeout=TIMEOUT, now=1.0, dedup=rebuilt)
    assert acked(write(machine, log, "retry", [b"x"])) == [([0], "retry")] and len(log.records) == 1


def test_ids_leave_the_window_as_the_log_grows_past_its_count():
    machine, log = leading(window=DedupWindow(DedupLimits(120.0, 2))), Log()
    write(machine, log, "a", [b"x"])
    write(machine, log, "b", [b"y", b"z"])
    assert acked(write(machine, log, "retry", [b"x"])) == [(3, "retry")]  # x left: written again


def test_ids_of_a_flush_without_copies_land_where_their_records_do_when_some_are_refused():
    machine, log = leading(occ=True), Log()
    machine.submit([Record(b"a")], "a", [0], [b"x"])
    machine.submit([Record(b"b")], "b", [5], [b"y"])  # refused: the log will not be at 5
    machine.submit([Record(b"c")], "c", [1], [b"z"])
    actions = log.flush(machine, 1.0)
    assert acked(actions) == [(0, "a"), (1, "c")] and failed(actions) == [("b", IncorrectOffset)]
    assert acked(write(machine, log, "retry z", [b"z"], expected=[NO_EXPECTATION])) == [([1], "retry z")]
    assert acked(write(machine, log, "retry y", [b"y"], expected=[NO_EXPECTATION])) == [(2, "retry y")]


def test_ids_of_an_append_the_log_could_not_encode_all_of_land_where_the_rest_does():
    machine = leading()
    machine.submit([Record(b"a")], "a", None, [b"x"])
    machine.submit([Record(b"bad", headers={"h" * 70_000: b"v"})], "bad", None, [b"y"])
    machine.submit([Record(b"c")], "c", None, [b"z"])
    [append] = machine.flush(1.0)
    refusals, retry = machine.unencodable(append.records)
    assert failed(refusals) == [("bad", ValueError)] and [r.value for r in retry.records] == [b"a", b"c"]
    assert acked(machine.appended(0, 2, 1.0)) == [(0, "a"), (1, "c")]
    log = Log()
    log.records = list(retry.records)
    assert acked(write(machine, log, "retry z", [b"z"])) == [([1], "retry z")]
    assert acked(write(machine, log, "retry y", [b"y"])) == [(2, "retry y")]


def test_an_id_that_left_the_window_while_no_ids_were_written_is_written_again():
    machine, log = leading(window=DedupWindow(DedupLimits(max_age=10.0, max_messages=3))), Log()
    write(machine, log, "a", [b"x"], now=1.0)
    for token in "bcd":
        machine.submit([Record(token.encode())], token, None)  # no ids: the window is not touched
        log.flush(machine, 1.0)
    assert acked(write(machine, log, "again", [b"x"], now=1.0)) == [(4, "again")]  # beyond its count
    assert acked(write(machine, log, "late", [b"x"], now=30.0)) == [(5, "late")]  # beyond its age
