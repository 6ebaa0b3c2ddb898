"""The Leader machine alone, without a disk or a loop: what it appends, syncs, acks and fails.

Tokens are strings; a test plays the log by answering each Append with ``appended``.
"""

from bascule.partition.log.epochs import EpochHistory
from bascule.partition.replication.concurrency import NO_EXPECTATION, IncorrectOffset
from bascule.partition.replication.leader import (
    Acknowledge,
    Append,
    Fail,
    Failed,
    Leader,
    Notify,
    NotLeader,
    PartitionClosed,
    PublishHighWatermark,
    ReplicaFailed,
    StartSync,
    StepDown,
)
from bascule.wire.entry import Record

TIMEOUT = 10.0
LEASE = 0.9 * TIMEOUT  # how long a follower's echo keeps the lease


def leading(isr=("me", "f"), *, sync_always=False, occ=False, epoch=1, now=0.0, machine=None) -> Leader[str]:
    machine = machine or Leader("s/0", sync_always=sync_always, concurrency_control=occ)
    machine.lead("me", epoch, 0, ("me", "f"), isr, history=EpochHistory(), log_end_offset=0, hw=-1,
                 min_isr=1, max_lag_time=TIMEOUT, leader_timeout=TIMEOUT, now=now)
    return machine


class Log:
    """The log's side: appends what the machine asks for and reports where it went."""

    def __init__(self) -> None:
        self.records: list[Record] = []

    def write(self, machine: Leader[str], token: str, now: float, expected=None) -> list:
        machine.submit([Record(token.encode())], token, expected)
        return self.flush(machine, now)

    def flush(self, machine: Leader[str], now: float) -> list:
        actions = machine.flush(now)
        appends = [action for action in actions if isinstance(action, Append)]
        rest = [action for action in actions if not isinstance(action, Append)]
        for append in appends:
            first = len(self.records)
            self.records += append.records
            rest += machine.appended(first, len(self.records), now)
        return rest


def acked(actions) -> list[tuple[int, str]]:
    return [write for action in actions if isinstance(action, Acknowledge) for write in action.writes]


def failed(actions) -> list[tuple[str, type]]:
    return [(token, type(action.error)) for action in actions if isinstance(action, Fail) for token in action.tokens]


def test_a_lone_leader_acks_at_once():
    machine, log = leading(isr=("me",)), Log()
    assert acked(log.write(machine, "a", 1.0)) == [(0, "a")]


def test_acks_wait_for_the_lease_and_go_out_in_order_when_a_fetch_renews_it():
    machine, log = leading(), Log()
    assert acked(log.write(machine, "a", 1.0)) == []  # no follower has echoed this leader's clock
    assert acked(log.write(machine, "b", 2.0)) == [] and machine.acks_held == 2
    recorded, actions = machine.fetched("f", 0, 1, 3.0, leader_time=2.5)
    assert recorded and acked(actions) == [(0, "a"), (1, "b")] and machine.acks_held == 0
    assert acked(log.write(machine, "c", 2.5 + LEASE - 0.1)) == [(2, "c")]


def test_once_the_lease_lapses_later_writes_wait_behind_the_held_ones():
    machine, log = leading(), Log()
    machine.fetched("f", 0, 1, 1.0, leader_time=1.0)
    assert acked(log.write(machine, "a", 1.0 + LEASE)) == []  # lapsed
    _, actions = machine.fetched("f", 0, 1, 20.0, leader_time=19.0)
    assert acked(actions) == [(0, "a")]


def test_a_fence_fails_the_held_acks_and_the_commits_waiting():
    machine, log = leading(), Log()
    log.write(machine, "a", 1.0)
    machine.leadership.acks.add(0, "a-committed")
    actions = machine.fence(2)
    assert actions[0] == StepDown(2) and machine.leadership is None and machine.fenced_epoch == 2
    assert failed(actions) == [("a-committed", NotLeader), ("a", NotLeader)]
    assert machine.fence(3) == []  # no longer leading: nothing to fence


def test_a_request_of_the_same_or_an_older_epoch_fences_nothing():
    machine = leading(epoch=2)
    assert machine.fence(2) == [] and machine.fence(1) == [] and machine.leadership is not None


def test_group_commit_syncs_once_at_a_time_and_acks_after_the_sync():
    machine, log = leading(isr=("me",), sync_always=True), Log()
    [first] = log.write(machine, "a", 1.0)
    assert isinstance(first, StartSync) and first.writes == [(0, "a")] and first.durable_end == 1
    assert log.write(machine, "b", 1.0) == []  # waits for the sync in flight
    actions = machine.synced(first, 2.0)
    assert acked(actions) == [(0, "a")]
    [second] = [action for action in actions if isinstance(action, StartSync)]
    assert second.writes == [(1, "b")] and second.durable_end == 2
    assert acked(machine.synced(second, 3.0)) == [(1, "b")]


def test_a_sync_completing_after_its_leadership_ended_acks_nothing():
    machine, log = leading(isr=("me",), sync_always=True), Log()
    [sync] = log.write(machine, "a", 1.0)
    assert machine.step_down() == []  # the write is the sync's now
    leading(isr=("me",), sync_always=True, epoch=2, now=2.0, machine=machine)
    actions = machine.synced(sync, 3.0)
    assert acked(actions) == [] and failed(actions) == [("a", NotLeader)]


def test_a_failed_fsync_fails_everything_pending_and_is_never_retried():
    machine, log = leading(isr=("me",), sync_always=True), Log()
    [sync] = log.write(machine, "a", 1.0)
    log.write(machine, "b", 1.0)
    machine.submit([Record(b"c")], "c", None)
    error = OSError("EIO")
    assert machine.sync_failed(sync, error) == [Failed(error)]  # no sync for "b": never retried
    actions = machine.fail(ReplicaFailed("failed"))
    # The writes still pending, then the synced batch first among those awaiting a sync.
    assert failed(actions) == [("c", ReplicaFailed), ("a", ReplicaFailed), ("b", ReplicaFailed)]
    assert machine.leadership is None and machine.flush(0.0) == []


def test_a_failed_append_fails_its_writes_only():
    machine, log = leading(isr=("me",)), Log()
    machine.submit([Record(b"a")], "a", None)
    assert isinstance(*machine.flush(0.0), Append)
    error = OSError("ENOSPC")
    assert machine.append_failed(error) == [Fail(["a"], error)]
    assert acked(log.write(machine, "b", 1.0)) == [(0, "b")]


def test_an_unencodable_group_fails_alone():
    machine = leading(isr=("me",))
    machine.submit([Record(b"a")], "a", None)
    machine.submit([Record(b"bad", headers={"n" * 70_000: b""})], "bad", None)  # a header name too long
    machine.submit([Record(b"c")], "c", None)
    [append] = machine.flush(0.0)
    refusals, retry = machine.unencodable(append.records)
    assert failed(refusals) == [("bad", ValueError)]
    assert retry is not None and [r.value for r in retry.records] == [b"a", b"c"]
    assert acked(machine.appended(5, 7, 1.0)) == [(5, "a"), (6, "c")]


def test_under_concurrency_control_groups_are_admitted_whole_in_order():
    machine = leading(isr=("me",), occ=True)
    machine.submit([Record(b"a"), Record(b"b")], "ab", [0, 1])
    machine.submit([Record(b"x")], "x", [1])  # "ab" takes offset 1
    machine.submit([Record(b"c")], "c", [2])
    machine.submit([Record(b"any")], "any", [NO_EXPECTATION])
    actions = machine.flush(0.0)
    assert failed(actions) == [("x", IncorrectOffset)]
    [append] = [action for action in actions if isinstance(action, Append)]
    assert [r.value for r in append.records] == [b"a", b"b", b"c", b"any"]
    assert acked(machine.appended(0, 4, 1.0)) == [(0, "ab"), (2, "c"), (3, "any")]


def test_concurrency_control_checks_against_the_log_end_the_appends_left():
    machine, log = leading(isr=("me",), occ=True), Log()
    log.write(machine, "a", 1.0, expected=[0])
    assert failed(log.write(machine, "b", 1.0, expected=[0])) == [("b", IncorrectOffset)]
    assert acked(log.write(machine, "c", 1.0, expected=[1])) == [(1, "c")]


def test_a_follower_fetching_what_was_written_commits_it_and_idle_followers_are_woken():
    machine, log = leading(), Log()
    machine.fetched("f", 0, 1, 1.0, leader_time=1.0)  # caught up: it waits for data
    actions = log.write(machine, "a", 1.0)
    assert Notify(["f"]) in actions
    machine.leadership.acks.add(0, "a-committed")
    _, actions = machine.fetched("f", 1, 1, 2.0, leader_time=1.0)
    assert PublishHighWatermark(0) in actions and acked(actions) == []
    assert acked(machine.committed(0)) == [(0, "a-committed")]


def test_a_commit_asked_for_as_its_write_is_acked_is_released_by_the_hw_that_write_moves():
    machine = leading(isr=("me",))
    machine.submit([Record(b"a")], "a", None)
    machine.flush(0.0)
    actions = machine.appended(0, 1, 1.0)
    assert acked(actions[:1]) == [(0, "a")] and PublishHighWatermark(0) in actions
    machine.leadership.acks.add(0, "a-committed")  # what an ack-ALL writer does on the write's ack
    assert acked(machine.committed(0)) == [(0, "a-committed")]


def test_closing_fails_everything_and_a_later_sync_acks_nothing():
    machine, log = leading(isr=("me",), sync_always=True), Log()
    [sync] = log.write(machine, "a", 1.0)
    machine.submit([Record(b"b")], "b", None)
    assert failed(machine.close()) == [("b", PartitionClosed)]
    actions = machine.synced(sync, 2.0)
    assert acked(actions) == [] and failed(actions) == [("a", PartitionClosed)]


def test_a_log_failed_by_an_append_fails_that_append_first_among_those_awaiting_a_sync():
    machine, log = leading(isr=("me",), sync_always=True), Log()
    log.write(machine, "a", 1.0)  # its sync in flight
    log.write(machine, "b", 1.0)
    machine.submit([Record(b"c")], "c", None)
    machine.flush(0.0)
    cause = OSError("EIO")
    assert machine.log_failed(cause) == [Failed(cause)]
    assert failed(machine.fail(ReplicaFailed("failed"))) == [("c", ReplicaFailed), ("b", ReplicaFailed)]
