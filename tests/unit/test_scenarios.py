"""Replication scenarios (../shared/reference/replication-scenarios.md) on bascule's own rules.

A small deterministic in-memory cluster. The rules are the ones production runs: the metadata is
a real ``MetadataState`` changed only through its commands, elections are decided by
``metadata.election`` (witness reports, the returning-leader rule, Oxia's choice), leaders are
``Leader`` machines (group commit, the lease-gated ack, the writing-leadership check, HW, acks,
ISR requests conditional on both epochs), followers are ``Follower`` machines; which role a
replica takes is ``replica_role``. This harness only carries out their actions and moves their
messages (with the leader's clock readings the lease needs), holds logs as lists of (epoch,
payload), and injects faults. No threads, no sleeps: time is a number the tests move. An
ack-ALL publish is acked once its write is acked (under the lease) and committed.

After every scenario the invariants of the document are checked:
- no lost committed write: every ALL-acked entry is in every ISR member's log at its offset;
- no divergence: any two replicas agree up to the smaller of their HWs;
- no inconsistent offsets: an offset once seen below some replica's HW never changes;
- contiguous offsets, HW <= last offset, epoch history consistent with the entries, and HWs
  that never move backwards.
"""

from __future__ import annotations

import itertools
import random
from collections import deque
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bascule.metadata.election import (
    Candidate,
    Elect,
    Elections,
    PartitionView,
    Position,
    Role,
    choose_leader,
    replica_role,
)
from bascule.metadata.state import MetadataState
from bascule.partition.log.epochs import EpochHistory
from bascule.partition.replication.follower import (
    Append,
    Follower,
    FollowerConfig,
    ReportLeader,
    SendEpochQuery,
    SendFetch,
    SetHighWatermark,
    Truncate,
    WaitForData,
)
from bascule.partition.replication.isr import IsrTracker
from bascule.partition.replication.leader import (
    Acknowledge,
    Fail,
    IsrOutcome,
    IsrRequest,
    Leader,
    Leadership,
    Notify,
    PublishHighWatermark,
    StartSync,
)
from bascule.partition.replication.leader import Append as LeaderAppend
from bascule.wire.commands import command_from_map
from bascule.wire.entry import Record

STREAM = "stream"
PARTITION = (STREAM, 0)
CONFIG = FollowerConfig(leader_timeout=15.0, max_idle_wait=10.0, retry_backoff=0.5)
MAX_LAG_TIME = 15.0

Entry = tuple[int, str]  # (leader epoch, payload)
Token = tuple[bool, str]  # (whether it is the commit's rather than the write's, payload)


class InvariantViolation(AssertionError):
    pass


@dataclass
class Replica:
    rid: str
    log: list[Entry] = field(default_factory=list)
    history: EpochHistory = field(default_factory=EpochHistory)
    hw: int = -1
    status: str = "up"  # up | down (crashed) | paused (SIGSTOP: state kept, unreachable)
    synced: int = 0  # durable prefix length (sync policy "never")
    incarnation: int = 0  # bumps at every restart, as a node process's does
    sync_always: bool = True
    # volatile (lost in a crash)
    leader: Leader[Token] = field(init=False)
    follower: Follower | None = None
    pending: deque = field(default_factory=deque)
    inflight: list[Entry] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.start_process()

    def start_process(self) -> None:
        self.leader = Leader(f"{STREAM}/0", sync_always=self.sync_always, concurrency_control=False)

    @property
    def lead(self) -> Leadership | None:
        return self.leader.leadership

    @property
    def leo(self) -> int:
        return len(self.log)

    @property
    def tracker(self) -> IsrTracker | None:
        return None if self.lead is None else self.lead.tracker

    def position(self) -> Position:
        return Position(self.history.epoch_at(self.leo - 1) if self.log else -1, self.leo)


class Cluster:
    def __init__(self, ids, *, min_isr: int = 1, sync_always: bool = True, batch: int = 100) -> None:
        self.replicas = {rid: Replica(rid, sync_always=sync_always) for rid in ids}
        self.ids = list(ids)
        self.min_isr = min_isr
        self.sync_always = sync_always
        self.batch = batch
        self.now = 0.0
        self.meta = MetadataState()
        self.elections = Elections()
        for rid in ids:
            self._register(rid)
        # observations
        self.acked: dict[int, Entry] = {}
        self.failed_acks: list[tuple[int, str]] = []
        self.offsets: dict[str, int] = {}  # where each payload was written
        self.seen: dict[int, Entry] = {}
        self.hw_seen: dict[str, int] = {rid: -1 for rid in ids}
        self.truncations: list[tuple[str, int, bool]] = []  # (replica, end offset, below HW)
        self.entries_truncated = 0
        self.rejected: list[tuple[str, str, str, str]] = []
        self.allow_hw_regress = False
        self._payloads = itertools.count()

    # -- metadata: the real state machine -------------------------------------------------

    def _register(self, rid: str) -> None:
        r = self.replicas[rid]
        self._apply("register_broker", id=rid, host="h", port=1, raft="r", incarnation=f"{rid}-{r.incarnation}")

    def _apply(self, op: str, **fields):
        self.meta, result = self.meta.apply(command_from_map({"op": op, **fields}))
        return result

    @property
    def _partition(self):
        return self.meta.partition(*PARTITION)

    @property
    def leader(self) -> str:
        return self._partition.leader

    @property
    def epoch(self) -> int:
        return self._partition.leader_epoch

    @property
    def isr(self) -> frozenset[str]:
        return frozenset(self._partition.isr)

    def _view(self) -> PartitionView:
        p = self._partition
        return PartitionView(p.leader, p.leader_epoch, p.epoch, frozenset(p.isr), frozenset(p.replicas))

    def start(self, leader: str) -> None:
        replicas = [leader] + [rid for rid in self.ids if rid != leader]
        self._apply("create_stream", name=STREAM, subject="s", group="", created=1, settings={}, replicas=[replicas])
        # Epochs count from 1 in these scenarios, as in the narratives they come from.
        view = self._view()
        self._commit(Elect(leader, tuple(sorted(view.isr)), view.leader_epoch, view.epoch))

    def _live(self, rid: str) -> bool:
        return self.replicas[rid].status == "up"

    def _commit(self, decision: Elect | None) -> bool:
        if decision is None:
            return False
        result = self._apply(
            "change_leader", name=STREAM, partition=0, leader=decision.leader,
            leader_epoch=decision.leader_epoch, epoch=decision.epoch, isr=list(decision.isr),
        )
        if result is not None:
            return False
        self.elections.elected(PARTITION, self.epoch, self.now)
        self._learn_all()
        return True

    def force_election(self, failed: str | None, leader: str, keep_isr: bool = False) -> None:
        """A metadata leader's decision other than Oxia's pick (Liftbridge picks any live ISR
        member); ``keep_isr`` models a second election before the first one's ISR change."""
        assert leader in self.isr and self._live(leader), "only live ISR members may lead"
        view = self._view()
        isr = view.isr if keep_isr or failed is None else (view.isr - {failed}) | {leader}
        assert self._commit(Elect(leader, tuple(sorted(isr)), view.leader_epoch, view.epoch))

    def _learn_all(self) -> None:
        for r in self.replicas.values():
            if self._live(r.rid):
                self._learn(r)

    def _learn(self, r: Replica) -> None:
        """Replica ``r`` learns the current metadata (what a node's reconcile does)."""
        p = self._partition
        role = replica_role(p.leader, p.leader_incarnation, r.rid, f"{r.rid}-{r.incarnation}")
        if r.lead is not None and (role is not Role.LEAD or r.lead.leader_epoch != p.leader_epoch):
            self._carry_out(r, r.leader.step_down())
        if role is Role.LEAD:
            r.follower = None
            r.pending.clear()
            if r.lead is None:
                actions = r.leader.lead(
                    r.rid, p.leader_epoch, p.epoch, p.replicas, p.isr, history=r.history, log_end_offset=r.leo,
                    hw=r.hw, min_isr=self.min_isr, max_lag_time=MAX_LAG_TIME, leader_timeout=CONFIG.leader_timeout,
                    now=self.now,
                )
            else:
                actions = r.leader.metadata_changed(p.isr, p.epoch, self.min_isr, self.now)
            self._carry_out(r, actions)  # a leader that is the whole ISR commits at once
            return
        if role is Role.HAND_BACK:
            r.follower = None
            r.pending.clear()
            self._hand_back(r)
            return
        f = r.follower
        if f is None or f.leader_id != p.leader or f.leader_epoch != p.leader_epoch:
            r.follower = Follower(r.rid, p.leader, p.leader_epoch, r.history, r.leo, r.hw, self.now, config=CONFIG)
            r.pending = deque(r.follower.start())

    def _hand_back(self, r: Replica) -> None:
        """A restarted leader asks the metadata leader for an election; the positions of the
        live ISR members are gathered for it."""
        view = self._view()
        positions = {rid: self.replicas[rid].position() for rid in view.isr if self._live(rid)}
        self._commit(self.elections.leader_returned(PARTITION, view, r.rid, view.leader_epoch, positions, self.now))

    def _report(self, reporter: str, action: ReportLeader) -> bool:
        """A follower's "leader looks dead" report; True when it led to an election."""
        decision = self.elections.leader_reported(
            PARTITION, self._view(), action.leader_id, action.leader_epoch, reporter,
            self.replicas[reporter].position(), self.now,
        )
        return self._commit(decision)

    def request_isr_change(self, r: Replica, request: IsrRequest) -> bool:
        result = self._apply(
            "change_isr", name=STREAM, partition=0, replica=request.replica_id, add=request.add,
            leader=r.rid, leader_epoch=request.leader_epoch, epoch=request.partition_epoch,
        )
        if result is not None:
            kind = "expand" if request.add else "shrink"
            self.rejected.append((r.rid, kind, request.replica_id, result[1].removeprefix("ISR change refused: ")))
        outcome = IsrOutcome.REFUSED if result else IsrOutcome.ACCEPTED
        self._carry_out(r, r.leader.isr_request_done(request, outcome, self.now))
        if result is None:
            self._learn_all()
        return result is None

    def _isr_maintenance(self, r: Replica) -> None:
        if r.lead is None or r.status != "up":
            return
        for request in r.lead.isr_requests(self.now):
            self.request_isr_change(r, request)

    # -- leader side ----------------------------------------------------------------------

    def publish(self, to: str | None = None) -> int | None:
        """An ack-ALL publish to ``to`` (default: the metadata leader); the offset, or None when
        nobody took it."""
        target = to if to is not None else self.leader
        if target is None:
            return None
        r = self.replicas[target]
        if r.status != "up" or r.lead is None:
            return None
        payload = f"{target}-e{r.lead.leader_epoch}-m{next(self._payloads)}"
        r.leader.submit([Record(payload.encode())], (False, payload), None)
        self._carry_out(r, r.leader.flush())
        return self.offsets[payload]

    def fsync(self, rid: str) -> None:
        self.replicas[rid].synced = self.replicas[rid].leo

    def _carry_out(self, r: Replica, actions) -> None:
        """What a leader replica does with its Leader machine's actions: the log is a list, an
        fsync is instant, and a write's ack asks for its commit, as an ack-ALL publish does."""
        for action in actions:
            if isinstance(action, LeaderAppend):
                first = r.leo
                for record in action.records:
                    self.offsets[record.value.decode()] = r.leo
                    r.log.append((action.leader_epoch, record.value.decode()))
                self._carry_out(r, r.leader.appended(first, r.leo, self.now))
            elif isinstance(action, StartSync):
                r.synced = action.durable_end
                self._carry_out(r, r.leader.synced(action, self.now))
            elif isinstance(action, Acknowledge):
                for offset, (commit, payload) in action.writes:
                    assert r.log[offset][1] == payload
                    if commit:
                        self.acked[offset] = r.log[offset]
                    elif offset <= r.hw:
                        self.acked[offset] = r.log[offset]
                    else:
                        r.lead.acks.add(offset, (True, payload))
            elif isinstance(action, PublishHighWatermark):
                r.hw = action.hw
                self._carry_out(r, r.leader.committed(action.hw))
            elif isinstance(action, Notify):
                for rid in action.followers:
                    f = self.replicas[rid]
                    if f.status == "up" and f.follower is not None and f.follower.leader_id == r.rid:
                        self._feed(f, f.follower.on_notify(self.now))
            elif isinstance(action, Fail):
                self.failed_acks += [(self.offsets[payload], payload) for _, payload in action.tokens]
            else:
                raise AssertionError(f"no fault here leads to {action}")

    def _serving(self, leader_id: str) -> Replica | None:
        r = self.replicas[leader_id]
        return r if r.status == "up" and r.lead is not None else None

    # -- follower side --------------------------------------------------------------------

    def _feed(self, r: Replica, actions) -> None:
        for action in actions:
            if isinstance(action, ReportLeader):
                self._report(r.rid, action)
                if r.follower is None or r.pending is None:
                    return
            else:
                r.pending.append(action)

    def pump(self, rid: str, max_fetches: int | None = None, lose_last_response: bool = False) -> None:
        """Run ``rid``'s follower until it waits, its leader is unreachable, or it has sent
        ``max_fetches`` fetches (the last one's response lost if ``lose_last_response``)."""
        r = self.replicas[rid]
        fetches = 0
        for _ in range(10_000):
            f = r.follower
            if r.status != "up" or f is None or not r.pending:
                return
            action = r.pending.popleft()
            if isinstance(action, SendEpochQuery):
                leader = self._serving(f.leader_id)
                if leader is None:
                    self._feed(r, f.on_epoch_query_failed(self.now))
                    return
                epoch, end = leader.history.end_offset_for(action.epoch, leader.leo)
                self._feed(r, f.on_epoch_answer(epoch, end, self.now))
            elif isinstance(action, Truncate):
                self.truncations.append((rid, action.end_offset, action.below_high_watermark))
                self.entries_truncated += max(0, r.leo - action.end_offset)
                del r.log[action.end_offset:]
                r.history.truncate_from_end(action.end_offset)
                r.synced = min(r.synced, r.leo)
            elif isinstance(action, SendFetch):
                if max_fetches is not None and fetches >= max_fetches:
                    r.pending.appendleft(action)
                    return
                leader = self._serving(f.leader_id)
                if leader is None:
                    self._feed(r, f.on_fetch_failed(self.now))
                    return
                fetches += 1
                ok, actions = leader.leader.fetched(
                    rid, action.offset, action.leader_epoch, self.now, action.leader_time)
                self._carry_out(leader, actions)
                self._isr_maintenance(leader)
                data = leader.log[action.offset:action.offset + self.batch] if ok else []
                if lose_last_response and fetches == max_fetches:
                    self._feed(r, f.on_fetch_failed(self.now))
                    return
                r.inflight = list(data)
                entries = [(action.offset + i, epoch) for i, (epoch, _) in enumerate(data)]
                self._feed(r, f.on_replicate(leader.tracker.leader_epoch, leader.tracker.hw, entries, self.now,
                                             leader_time=self.now))
            elif isinstance(action, Append):
                assert action.first_offset == r.leo and action.count == len(r.inflight)
                r.log.extend(r.inflight)
                for epoch, start in action.epoch_starts:
                    r.history.assign(epoch, start)
                if self.sync_always:
                    r.synced = r.leo
            elif isinstance(action, SetHighWatermark):
                r.hw = action.hw
            elif isinstance(action, WaitForData):
                return
        raise AssertionError("follower did not settle")

    def settle(self, rounds: int = 50) -> None:
        """Pump every follower until nothing changes; idle followers are woken (as their idle
        wait would) so that HWs propagate."""
        for _ in range(rounds):
            before = self._snapshot()
            for r in self.replicas.values():
                self.pump(r.rid)
            for r in self.replicas.values():
                if r.status == "up" and r.follower is not None and not r.pending:
                    self._feed(r, r.follower.on_notify(self.now))
                self.pump(r.rid)
            for r in self.replicas.values():
                self._isr_maintenance(r)
            if self._snapshot() == before:
                return

    def _snapshot(self):
        return (
            tuple((r.rid, r.leo, r.hw, r.status) for r in self.replicas.values()),
            self.leader, self.epoch, self.isr,
        )

    # -- faults and time ------------------------------------------------------------------

    def crash(self, rid: str, lose_unsynced: bool = False) -> None:
        r = self.replicas[rid]
        self._carry_out(r, r.leader.close())  # the process's writers see their acks fail
        r.status = "down"
        r.start_process()
        r.follower = None
        r.pending = deque()
        if lose_unsynced:
            del r.log[r.synced:]
            r.history.truncate_from_end(r.leo)
            r.hw = min(r.hw, r.leo - 1)
            self.allow_hw_regress = True

    def restart(self, rid: str) -> None:
        """A new process: a new incarnation, registered as a node registers at start."""
        r = self.replicas[rid]
        assert r.status == "down"
        r.status = "up"
        r.hw = min(r.hw, r.leo - 1)  # the HW checkpoint is clamped to the recovered log
        r.incarnation += 1
        self._register(rid)
        self._learn(r)

    def pause(self, rid: str) -> None:
        self.replicas[rid].status = "paused"

    def resume(self, rid: str, learn: bool = True) -> None:
        """SIGCONT: the same process, which learns the metadata (or, not ``learn``, not yet)."""
        r = self.replicas[rid]
        assert r.status == "paused"
        r.status = "up"
        if learn:
            self._learn(r)

    def advance(self, seconds: float, step: float = 1.0) -> None:
        """Move time in steps; at each, tick every follower, run ISR maintenance, pump."""
        end = self.now + seconds
        while self.now < end:
            self.now = min(end, self.now + step)
            for r in self.replicas.values():
                if r.status == "up" and r.follower is not None:
                    self._feed(r, r.follower.tick(self.now))
            for r in self.replicas.values():
                self._isr_maintenance(r)
            for r in self.replicas.values():
                self.pump(r.rid)

    # -- invariants -----------------------------------------------------------------------

    def violations(self) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []
        for rid in sorted(self.isr):
            log = self.replicas[rid].log
            for offset, entry in sorted(self.acked.items()):
                if offset >= len(log) or log[offset] != entry:
                    found.append(("acked-loss", f"{rid} lacks acked {entry} at {offset}"))
        replicas = list(self.replicas.values())
        for a, b in itertools.combinations(replicas, 2):
            upto = min(a.hw, b.hw) + 1
            if a.log[:upto] != b.log[:upto]:
                found.append(("divergence", f"{a.rid} and {b.rid} differ below HW {upto - 1}"))
        for r in replicas:
            for offset in range(r.hw + 1):
                if offset < r.leo:
                    first = self.seen.setdefault(offset, r.log[offset])
                    if first != r.log[offset]:
                        found.append(("inconsistent-offset", f"{r.rid} offset {offset}: {first} then {r.log[offset]}"))
            if r.hw > r.leo - 1:
                found.append(("structure", f"{r.rid} HW {r.hw} beyond its last offset {r.leo - 1}"))
            if r.hw < self.hw_seen[r.rid] and not self.allow_hw_regress:
                found.append(("hw-regress", f"{r.rid} HW went from {self.hw_seen[r.rid]} to {r.hw}"))
            self.hw_seen[r.rid] = r.hw
            epochs = [epoch for epoch, _ in r.log]
            if epochs != sorted(epochs):
                found.append(("structure", f"{r.rid} entry epochs go backwards"))
            if any(r.history.epoch_at(i) != epoch for i, epoch in enumerate(epochs)):
                found.append(("structure", f"{r.rid} epoch history {r.history} disagrees with its log"))
            if r.tracker is not None and r.tracker.hw != r.hw:
                found.append(("structure", f"{r.rid} leader HW not applied"))
            f = r.follower
            if f is not None and r.status == "up":
                if (f.log_end_offset, f.history, f.hw) != (r.leo, r.history, r.hw):
                    found.append(("structure", f"{r.rid} follower model out of step with its log"))
        return found

    def check_structure(self) -> None:
        found = [message for kind, message in self.violations() if kind == "structure"]
        if found:
            raise InvariantViolation("; ".join(found))

    def check(self) -> None:
        found = self.violations()
        if found:
            raise InvariantViolation("; ".join(message for _, message in found))


def kinds(cluster: Cluster) -> set[str]:
    return {kind for kind, _ in cluster.violations()}


def started(ids=("A", "B"), leader="A", **kwargs) -> Cluster:
    c = Cluster(ids, **kwargs)
    c.start(leader)
    c.settle()
    c.check()
    return c


# -- S1: truncation to a stale HW followed by a fast election ------------------------------


def _s1_setup() -> Cluster:
    c = started(("A", "B"), min_isr=1)
    c.publish()
    c.publish()
    c.pump("B", max_fetches=1)  # B gets m1, m2 with the old HW -1
    c.pump("B", max_fetches=1, lose_last_response=True)  # A learns B has both: HW 1, acks fire
    assert sorted(c.acked) == [0, 1]
    assert c.replicas["B"].hw == -1  # the HW reaches the follower one fetch later
    c.check()
    return c


def test_s1_restart_keeps_acked_m2_and_survives_fast_election():
    c = _s1_setup()
    c.crash("B")
    c.restart("B")
    c.pump("B", max_fetches=0)  # the epoch query and the truncation, no fetch yet
    assert c.replicas["B"].leo == 2  # the leader's epoch end (2) said keep both
    assert ("B", 2, False) in c.truncations
    c.crash("A")
    c.advance(20)  # B's leader timeout: one witness of a 1+1 ISR is enough
    assert c.leader == "B" and c.epoch == 2
    c.settle()
    c.check()
    assert c.publish() == 2


def test_s1_control_truncating_to_the_hw_would_lose_m2():
    """Kafka's pre-KIP-101 rule, applied by hand: the checker sees the loss."""
    c = _s1_setup()
    c.crash("B")
    b = c.replicas["B"]
    del b.log[b.hw + 1:]
    b.history.truncate_from_end(b.leo)
    c.restart("B")
    c.crash("A")  # before B fetches m2 again
    c.advance(20)
    assert c.leader == "B"
    assert "acked-loss" in kinds(c)


# -- S2: divergence after several hard failures --------------------------------------------


def test_s2_uncommitted_m2_is_truncated_when_a_returns():
    c = started(("A", "B"), min_isr=1)
    c.publish()
    c.settle()
    assert sorted(c.acked) == [0]
    c.publish()  # m2 on A only
    c.crash("A")
    c.crash("B")
    c.restart("B")
    c.advance(20)
    assert c.leader == "B" and c.epoch == 2
    assert c.publish() == 1  # m3 where A holds m2
    c.restart("A")
    c.settle()
    assert ("A", 1, False) in c.truncations  # A's epoch 1 ended where B's epoch 2 began
    assert c.replicas["A"].log == c.replicas["B"].log
    assert c.isr == {"A", "B"}
    c.check()


def test_s2_committed_m2_lost_unsynced_on_b_still_no_divergence():
    """KIP-101's original form: m2 was committed, then lost from B's page cache in the crash.
    The acked loss is the sync policy's (see last replica standing); the protocol still keeps
    the replicas from diverging: A cuts m2 below its own HW."""
    c = started(("A", "B"), min_isr=1, sync_always=False)
    for r in c.replicas.values():
        r.synced = r.leo
    c.publish()
    c.settle()
    c.fsync("A"), c.fsync("B")
    c.publish()
    c.settle()
    c.fsync("A")  # B never synced m2
    assert sorted(c.acked) == [0, 1] and c.replicas["A"].hw == 1
    c.crash("A")
    c.crash("B", lose_unsynced=True)
    c.restart("B")
    c.advance(20)
    assert c.leader == "B"
    assert c.publish() == 1  # m3
    c.restart("A")
    c.pump("A", max_fetches=0)
    assert ("A", 1, True) in c.truncations  # below A's HW, flagged ...
    assert c.replicas["A"].hw == 0  # ... and the HW follows the cut
    c.check_structure()
    c.settle()
    assert c.replicas["A"].log == c.replicas["B"].log
    assert "divergence" not in kinds(c)
    assert kinds(c) <= {"acked-loss", "inconsistent-offset"}


def test_s2_with_sync_always_nothing_is_lost():
    c = started(("A", "B"), min_isr=1)
    c.publish()
    c.publish()
    c.settle()
    c.crash("A")
    c.crash("B")
    c.restart("B")
    c.advance(20)
    assert c.publish() == 2
    c.restart("A")
    c.settle()
    c.check()


# -- KIP-279: back-to-back elections ---------------------------------------------------------


def test_kip279_follower_lacking_the_answered_epoch_truncates_in_two_rounds():
    c = started(("A", "B", "C", "D"), min_isr=1)
    c.publish()  # m0, epoch 1, everywhere
    c.settle()
    c.crash("A")
    c.force_election(failed="A", leader="B")  # epoch 2
    c.settle()
    c.publish()  # x1 (epoch 2) ...
    c.pump("C")  # ... reaches C only
    c.pause("C")
    c.crash("B")
    c.force_election(failed="B", leader="D")  # epoch 3: D never saw x1
    c.publish()  # g1 (epoch 3) on D only
    c.crash("D")
    c.resume("C")
    c.force_election(failed="D", leader="C")  # epoch 4: C still in the ISR, holds x1
    assert c.replicas["C"].history.entries == [(1, 0), (2, 1), (4, 2)]
    # D asks for epoch 3; C answers (2, 2); D lacks epoch 2: cut to the end of its epoch 1 (1)
    # and ask again; C answers (1, 1): done. One lookup would have kept g1 next to C's x1.
    d = c.replicas["D"]
    assert d.history.entries == [(1, 0), (3, 1)]
    assert c.replicas["C"].history.end_offset_for(3, c.replicas["C"].leo) == (2, 2)
    mark = len(c.truncations)
    c.restart("D")
    c.restart("B")
    c.settle()
    assert [t for t in c.truncations[mark:] if t[0] == "D"] == [("D", 1, False), ("D", 1, False)]
    assert d.log == c.replicas["C"].log == c.replicas["B"].log
    c.check()


def test_kip279_common_epoch_ends_earlier_on_the_follower():
    """The follower has the answered epoch but its own part of it ends before the leader's:
    truncating to min(leader's end, own log end) would keep its later epoch's entries."""
    c = started(("A", "B", "C"), min_isr=1, batch=2)
    for _ in range(3):
        c.publish()  # m0..m2, epoch 1
    c.settle()
    c.crash("A")
    c.advance(20)
    assert c.leader == "B" and c.epoch == 2
    for _ in range(5):
        c.publish()  # b3..b7, epoch 2
    c.pump("C", max_fetches=1)  # C gets b3, b4
    c.pause("B")
    c.force_election(failed="B", leader="C", keep_isr=True)  # epoch 3
    for _ in range(3):
        c.publish()  # c5..c7, epoch 3
    c.crash("C")
    c.resume("B")
    c.force_election(failed="C", leader="B")  # epoch 4, B holds b5..b7 of epoch 2
    leader = c.replicas["B"]
    assert leader.history.entries == [(1, 0), (2, 3), (4, 8)]
    assert c.replicas["C"].history.entries == [(1, 0), (2, 3), (3, 5)]
    assert leader.history.end_offset_for(3, leader.leo) == (2, 8)  # C's own epoch 2 ends at 5
    mark = len(c.truncations)
    c.restart("C")
    c.restart("A")
    c.settle()
    assert ("C", 5, False) in c.truncations[mark:]
    assert c.replicas["C"].log == leader.log == c.replicas["A"].log
    c.check()


def test_kip279_leader_answers_an_older_epoch_the_follower_has():
    c = started(("A", "B", "C"), min_isr=1)
    c.publish()
    c.settle()
    c.crash("A")
    c.advance(20)  # B and C report: B (ties broken by id)
    assert c.leader == "B" and c.epoch == 2
    c.publish(), c.publish()  # b1, b2 on B only
    c.crash("B")
    c.advance(20)  # C is the only ISR follower left: one witness
    assert c.leader == "C" and c.epoch == 3
    c.publish()  # c1
    c.restart("B")  # asks for epoch 2; C answers (1, 1)
    c.restart("A")
    c.settle()
    assert ("B", 1, False) in c.truncations
    assert c.replicas["B"].log == c.replicas["C"].log == c.replicas["A"].log
    c.check()


def test_kip279_new_leader_records_its_epoch_before_appending_and_empty_epochs_are_cut():
    c = started(("A", "B"), min_isr=1)
    c.publish()  # m0 both
    c.settle()
    c.publish()  # a1 on A only
    c.pause("A")
    c.force_election(failed="A", leader="B", keep_isr=True)  # epoch 2
    assert c.replicas["B"].history.entries == [(1, 0), (2, 1)]  # before any append
    assert c.replicas["B"].history.end_offset_for(1, 1) == (1, 1)
    c.crash("B")  # B never wrote in epoch 2
    c.resume("A")
    c.force_election(failed="B", leader="A")  # epoch 3, A still holds a1
    assert c.replicas["A"].history.entries == [(1, 0), (3, 2)]
    c.publish()  # a2 (epoch 3)
    c.restart("B")
    c.settle()
    # B asked for epoch 2, got (1, 2): cut at its own end of epoch 1 (1), dropping its empty
    # epoch 2, so that a1 (epoch 1) may follow.
    assert ("B", 1, False) in c.truncations
    assert c.replicas["B"].history.entries == [(1, 0), (3, 2)]
    assert c.replicas["B"].log == c.replicas["A"].log
    c.check()


def test_kip279_no_common_epoch_truncates_to_the_log_start():
    c = started(("A", "B"), min_isr=1)
    c.pause("B")
    c.publish()  # a0 on A only (uncommitted: B is in the ISR and has not fetched it)
    c.resume("B")
    c.pause("A")
    c.advance(20)  # B reports A
    assert c.leader == "B" and c.replicas["B"].history.entries == [(2, 0)]
    c.publish()  # b0
    c.resume("A")
    c.settle()
    assert ("A", 0, False) in c.truncations  # (-1, -1): nothing of A's is known to B
    assert c.replicas["A"].log == c.replicas["B"].log
    c.check()


# -- Oxia's election rule ---------------------------------------------------------------------


def test_oxia_rule_picks_the_most_advanced_isr_member():
    c = started(("A", "B", "C"), min_isr=1, batch=1)
    for _ in range(5):
        c.publish()
    for _ in range(5):
        c.pump("B", max_fetches=1)
    for _ in range(3):
        c.pump("C", max_fetches=1)
    assert (c.replicas["B"].leo, c.replicas["C"].leo) == (5, 3)
    mark = len(c.truncations)
    c.crash("A")
    c.advance(20)
    assert c.leader == "B"
    c.settle()
    assert ("C", 3, False) in c.truncations[mark:]  # C keeps its 3, nothing is thrown away
    assert c.replicas["C"].log == c.replicas["B"].log and c.replicas["B"].leo == 5
    c.check()


def test_oxia_rule_last_epoch_beats_length():
    candidates = [Candidate("X", 200, 2501), Candidate("Y", 198, 3000)]
    assert choose_leader(candidates, {"X", "Y"}) == "X"
    assert choose_leader(candidates, {"Y"}) == "Y"
    assert choose_leader(candidates, set()) is None


def test_no_unclean_election():
    c = started(("A", "B"), min_isr=1)
    c.crash("B")
    c.advance(20)  # A shrinks the ISR to itself
    assert c.isr == {"A"}
    c.publish()
    assert 0 in c.acked
    c.crash("A")
    c.restart("B")
    c.advance(30)
    # B is not in the ISR: it may not lead, and a leader with no ISR follower has no witness.
    assert c.leader == "A" and c.epoch == 1 and c.publish() is None
    assert c.elections.leader_returned(PARTITION, c._view(), "A", 1, {"B": c.replicas["B"].position()}, c.now) is None
    c.restart("A")
    assert c.leader == "A" and c.epoch == 2
    c.settle()
    c.check()


# -- Minority ISR ---------------------------------------------------------------------------


def test_minority_isr_never_acks_on_a_single_copy():
    c = started(("A", "B", "C"), min_isr=2)
    c.publish()
    c.settle()
    assert 0 in c.acked
    c.crash("B")
    c.crash("C")
    c.advance(20)
    assert c.isr == {"A"}
    offset = c.publish()
    c.advance(60)
    assert offset not in c.acked and c.replicas["A"].hw == 0
    c.restart("B")
    c.settle()
    assert c.isr == {"A", "B"}
    assert offset in c.acked  # waited, then committed on two copies
    c.check()


# -- Zombie leader ----------------------------------------------------------------------------


def test_zombie_leader_is_fenced_and_truncated():
    c = started(("A", "B", "C"), min_isr=1)
    c.publish()
    c.settle()
    c.pause("A")
    c.advance(20)  # B and C both report A: 2 of 2 witnesses
    assert c.leader == "B" and c.epoch == 2 and c.isr == {"B", "C"}
    c.publish()
    c.settle()
    # A resumes without having learned the new metadata: it still believes it leads epoch 1.
    c.resume("A", learn=False)
    zombie = c.replicas["A"]
    assert zombie.tracker is not None and zombie.tracker.leader_epoch == 1
    z = c.publish(to="A")
    assert z == 1 and zombie.log[1] != c.replicas["B"].log[1]
    assert zombie.leader.acks_held == 1  # stored, not acked: no follower renewed its lease
    c.now += 20
    c._isr_maintenance(zombie)  # its shrink proposals carry epoch 1: refused
    assert {(kind, reason) for _, kind, _, reason in c.rejected} == {("shrink", "stale leader")}
    assert c.isr == {"B", "C"} and c.acked[z] != zombie.log[z]
    # the zombie answers a request of C's (same subject): dropped, and the real leader's reply
    # to the same request is still taken
    c_replica, b_replica = c.replicas["C"], c.replicas["B"]
    follower = c_replica.follower
    b_replica_time = c.now - 20  # the clock reading of B's last answer, which C echoes
    fetch = follower.on_notify(c.now)
    assert fetch == [SendFetch(c_replica.leo, 2, leader_time=b_replica_time)]
    assert zombie.tracker.record_fetch("C", c_replica.leo, 2, c.now) is False  # wrong epoch
    assert follower.on_replicate(zombie.tracker.leader_epoch, zombie.hw, [], c.now) == [WaitForData(c.now + 0.5)]
    assert follower.on_replicate(2, b_replica.hw, [], c.now)[-1] == WaitForData(c.now + 10.0)
    # a late report about epoch 1 is stale
    assert not c._report("C", ReportLeader("A", 1))
    assert c.leader == "B"
    # A learns: its pending ack fails, it becomes a follower and cuts its epoch-1 write
    c._learn(zombie)
    assert (z, zombie.log[z][1]) in c.failed_acks
    c.replicas["C"].follower = None
    c._learn(c.replicas["C"])
    c.settle()
    assert ("A", 1, False) in c.truncations
    assert zombie.log == c.replicas["B"].log
    assert c.isr == {"A", "B", "C"}
    c.check()


def test_zombie_shrink_to_itself_is_what_would_let_it_ack_alone():
    """Why the epoch check matters: with minISR 1 the zombie's shrink, if accepted, would commit
    its write on one copy that the real leader does not have."""
    c = started(("A", "B"), min_isr=1)
    c.pause("A")
    c.advance(20)
    assert c.leader == "B"
    c.resume("A", learn=False)
    z = c.publish(to="A")
    c.now += 20
    c._isr_maintenance(c.replicas["A"])
    assert z not in c.acked and c.replicas["A"].tracker.hw == -1
    assert ("A", "shrink", "B", "stale leader") in c.rejected and c.isr == {"B"}


def test_one_witness_of_two_is_not_enough():
    c = started(("A", "B", "C"), min_isr=1)
    c.publish()
    c.settle()
    c.pause("A")
    c.pause("C")
    c.advance(20)  # only B reports
    assert c.leader == "A" and c.elections.reports.witnesses(PARTITION) == {"B"}
    c.resume("C")
    c.advance(20)  # C's report makes two of two
    assert c.leader == "B" and c.epoch == 2
    c.settle()
    c.check()


def test_late_isr_change_from_a_previous_epoch_of_the_same_leader_is_refused():
    """A leader that restarted was elected again with a new epoch; a shrink it sent in its
    previous epoch arrives late."""
    c = started(("A", "B", "C"), min_isr=1)
    late = IsrRequest("B", False, leader_epoch=1, partition_epoch=c._partition.epoch)
    c.publish()  # on A only: A has the greatest (epoch, log end) and wins again
    c.crash("A")
    c.restart("A")
    assert c.leader == "A" and c.epoch == 2
    assert not c.request_isr_change(c.replicas["A"], late)
    assert c.rejected[-1][-1] == "stale leader epoch" and c.isr == {"A", "B", "C"}


def test_late_isr_change_decided_on_an_older_isr_cannot_undo_a_shrink():
    """Same leader, same leader epoch: an expansion decided before a shrink must not re-add the
    replica the shrink removed (ISR changes are conditional on the partition epoch)."""
    c = started(("A", "B", "C"), min_isr=1)
    c.settle()
    stale = IsrRequest("C", True, leader_epoch=1, partition_epoch=c._partition.epoch)
    assert c.request_isr_change(c.replicas["A"], IsrRequest("C", False, 1, c._partition.epoch))
    assert c.isr == {"A", "B"}
    c.request_isr_change(c.replicas["A"], IsrRequest("C", False, 1, c._partition.epoch))
    assert not c.request_isr_change(c.replicas["A"], stale)
    assert c.rejected[-1][-1] == "stale partition epoch" and c.isr == {"A", "B"}


def test_a_leader_power_cut_and_quick_restart_hands_over_and_loses_nothing_acked():
    """The defect of a returning leader: A loses its unsynced tail in a power cut and comes back
    before anyone reported it. Resuming its old epoch, followers holding more would keep those
    entries and append A's new ones after them. A hands its epoch back: the follower with the
    most leads, A truncates and catches up."""
    c = started(("A", "B", "C"), min_isr=2, sync_always=False)
    for _ in range(3):
        c.publish()
    c.settle()
    c.fsync("A")
    for _ in range(4):
        c.publish()
    c.settle()
    assert sorted(c.acked) == list(range(7)) and c.replicas["A"].synced == 3
    c.crash("A", lose_unsynced=True)
    c.restart("A")  # at once: no follower has reported it
    assert c.leader in {"B", "C"} and c.epoch == 2 and "A" not in c.isr
    for _ in range(2):
        c.publish()
    c.settle()
    c.advance(5)
    c.settle()
    assert c.replicas["A"].log == c.replicas[c.leader].log and c.isr == {"A", "B", "C"}
    c.check()


# -- Last replica standing (KIP-966) ---------------------------------------------------------


@pytest.mark.parametrize("sync_always", [True, False])
def test_last_replica_standing(sync_always):
    """The pure layer commits what the shell reports as the ISR's log ends; it cannot know what
    is durable. Under sync "always" the shell reports (and acks) only fsynced offsets, so even
    the only ISR member crashing loses nothing acknowledged; under "never" it can."""
    c = started(("A", "B"), min_isr=1, sync_always=sync_always)
    c.crash("B")
    c.advance(20)
    assert c.isr == {"A"}
    c.publish()
    if not sync_always:
        c.fsync("A")
    c.publish(), c.publish()
    assert sorted(c.acked) == [0, 1, 2]
    c.crash("A", lose_unsynced=not sync_always)
    c.restart("A")
    assert c.leader == "A" and c.epoch == 2  # re-elected with a new epoch
    c.restart("B")
    c.settle()
    if sync_always:
        c.check()
    else:
        assert kinds(c) == {"acked-loss"}
        assert c.replicas["A"].leo == 1


# -- Follower restart with a divergent tail -------------------------------------------------


def test_follower_restart_with_divergent_tail():
    c = started(("A", "B", "C"), min_isr=2)
    for _ in range(3):
        c.publish()
    c.settle()
    assert sorted(c.acked) == [0, 1, 2]
    c.publish(), c.publish()  # a3, a4: never replicated, never acked
    c.crash("A")
    c.advance(20)
    assert c.leader == "B"
    for _ in range(3):
        c.publish()
    c.settle()
    assert sorted(c.acked) == [0, 1, 2, 3, 4, 5]
    c.restart("A")
    c.settle()
    assert ("A", 3, False) in c.truncations
    assert c.replicas["A"].log == c.replicas["B"].log
    assert c.isr == {"A", "B", "C"}
    c.check()


# -- Random fault sequences -----------------------------------------------------------------

IDS = ("A", "B", "C")
# (name, weight): sampled with repetition so that writes and leader changes dominate
OPERATIONS = [
    ("publish", 6), ("publish_to", 2), ("pump", 4), ("pump1", 4), ("settle", 1),
    ("crash", 2), ("restart", 2), ("pause", 1), ("resume", 1), ("resume_stale", 1),
    ("advance", 2), ("elect", 3),
]
operation = st.tuples(
    st.sampled_from([name for name, weight in OPERATIONS for _ in range(weight)]),
    st.sampled_from(IDS),
    st.sampled_from([1, 2, 3]),
)


def run_operation(c: Cluster, op: str, rid: str, n: int) -> None:
    r = c.replicas[rid]
    if op == "publish":
        for _ in range(n):
            c.publish()
    elif op == "publish_to":  # a client still talking to a replica that may be a zombie
        c.publish(to=rid)
    elif op == "pump":
        c.pump(rid)
    elif op == "pump1":
        c.pump(rid, max_fetches=1)
    elif op == "settle":
        c.settle()
    elif op == "crash" and r.status != "down":
        c.crash(rid)
    elif op == "restart" and r.status == "down":
        c.restart(rid)
    elif op == "pause" and r.status == "up":
        c.pause(rid)
    elif op == "resume" and r.status == "paused":
        c.resume(rid)
    elif op == "resume_stale" and r.status == "paused":
        c.resume(rid, learn=False)  # learns at the next metadata change
    elif op == "advance":
        c.advance([1.0, 6.0, 20.0][n - 1])
    elif op == "elect" and rid in c.isr and c._live(rid) and rid != c.leader:
        c.force_election(failed=c.leader, leader=rid)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    min_isr=st.integers(1, 2),
    batch=st.integers(1, 3),
    ops=st.lists(operation, min_size=5, max_size=60),
)
def test_random_faults_keep_the_invariants(min_isr, batch, ops):
    c = Cluster(IDS, min_isr=min_isr, batch=batch)
    c.start("A")
    for op, rid, n in ops:
        run_operation(c, op, rid, n)
        c.check()
    heal_and_converge(c)


def heal_and_converge(c: Cluster) -> None:
    """Bring every replica back: the cluster converges and nothing acknowledged is missing."""
    for r in c.replicas.values():
        if r.status == "down":
            c.restart(r.rid)
        elif r.status == "paused":
            c.resume(r.rid)
    for r in c.replicas.values():
        c._learn(r)  # a replica resumed with stale metadata catches up with it
    c.advance(20)
    c.settle()
    c.check()
    leader_log = c.replicas[c.leader].log
    for r in c.replicas.values():
        assert r.log == leader_log
    assert c.isr == set(IDS)


def test_long_random_fault_walks_keep_the_invariants():
    """Longer walks than hypothesis explores, from fixed seeds (deterministic)."""
    names = [name for name, weight in OPERATIONS for _ in range(weight)]
    for seed in range(150):
        rng = random.Random(seed)
        c = Cluster(IDS, min_isr=rng.choice([1, 2]), batch=rng.choice([1, 2, 3]))
        c.start("A")
        for step in range(150):
            op, rid, n = rng.choice(names), rng.choice(IDS), rng.choice([1, 2, 3])
            run_operation(c, op, rid, n)
            try:
                c.check()
            except InvariantViolation as exc:
                raise AssertionError(f"seed {seed}, step {step} ({op} {rid} {n}): {exc}") from None
        heal_and_converge(c)


def test_control_a_leader_resuming_its_old_epoch_after_a_power_cut_diverges(monkeypatch):
    """Without the returning-leader rule (a restarted leader resumes its epoch), the scenario
    above loses acknowledged messages."""
    monkeypatch.setattr(
        f"{__name__}.replica_role",
        lambda leader, _incarnation, rid, _own: Role.LEAD if leader == rid else Role.FOLLOW,
    )
    c = started(("A", "B", "C"), min_isr=2, sync_always=False)
    for _ in range(3):
        c.publish()
    c.settle()
    c.fsync("A")
    for _ in range(4):
        c.publish()
    c.settle()
    c.crash("A", lose_unsynced=True)
    c.restart("A")
    assert c.leader == "A" and c.epoch == 1
    for _ in range(2):
        c.publish()
    c.settle()
    assert "acked-loss" in kinds(c)
