"""Leadership rules of the metadata leader: who may lead, when a leader counts as failed, what a
returning leader gets, which ISR changes are valid.

All pure: the metadata leader feeds them what it knows (the partition's metadata, replicas'
positions, the time) and applies the outcome through Raft.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from bascule.wire.witnesses import witness_quorum

# -- (a) leader choice ----------------------------------------------------------------------


class Position(NamedTuple):
    """Where a replica's log stands: the epoch of its last entry (-1 when empty) and its log end
    offset (next offset). Replicas are compared by this pair (Oxia's rule)."""

    last_epoch: int
    log_end_offset: int


@dataclass(frozen=True, slots=True)
class Candidate:
    """A live replica that could lead: the epoch of its last entry (-1 when its log is empty),
    its log end offset (next offset), and how many partitions it already leads (tie-break)."""

    replica_id: str
    last_epoch: int
    log_end_offset: int
    leader_count: int = 0


def choose_leader(
    candidates: Iterable[Candidate], isr: Collection[str], exclude: Collection[str] = (),
    unclean: Collection[str] = (),
) -> str | None:
    """The ISR candidate with the greatest (last epoch, log end offset) pair (Oxia's rule: the
    fewest uncommitted entries are thrown away), among those known to hold every committed entry;
    ties go to clean members, then to the fewest leaderships, then to the smallest id.
    ``candidates`` must be live replicas; ``exclude`` is typically the failed leader.

    ``unclean`` ISR members restarted after an unclean shutdown (or their fsync failed) and have
    not caught up since: their logs may have lost acknowledged entries (KIP-966). One of them is
    chosen only beside a clean candidate whose last epoch it shares and whose log it extends (both
    logs are then prefixes of that epoch's leader's log, so it holds whatever the clean one holds),
    or when every ISR member is a candidate and all are unclean (the most complete log there is).
    Otherwise None: wait for a clean member or for all of them. There is no unclean election."""
    eligible = [c for c in candidates if c.replica_id in isr and c.replica_id not in exclude]
    clean = [c for c in eligible if c.replica_id not in unclean]
    if clean:
        reference = max(clean, key=_position)
        eligible = clean + [c for c in eligible if c.replica_id in unclean and c.last_epoch == reference.last_epoch]
    elif not set(isr) <= {c.replica_id for c in eligible}:
        return None
    if not eligible:
        return None
    best = min(
        eligible,
        key=lambda c: (-c.last_epoch, -c.log_end_offset, c.replica_id in unclean, c.leader_count, c.replica_id),
    )
    return best.replica_id


def _position(candidate: Candidate) -> Position:
    return Position(candidate.last_epoch, candidate.log_end_offset)


def isr_after_leader_change(isr: Collection[str], old_leader: str | None, new_leader: str) -> frozenset[str]:
    """The ISR once ``new_leader`` replaces a failed ``old_leader``: the old one leaves it (it
    rejoins as a follower through an expansion), the new one is in it."""
    return (frozenset(isr) - {old_leader}) | {new_leader}


# -- (b) leader failure reports (Liftbridge's witness rule) ----------------------------------


class ReportVerdict(enum.Enum):
    STALE = "stale"  # not about the current leader and leader epoch
    NOT_A_WITNESS = "not a witness"  # the reporter is not an ISR follower
    RECORDED = "recorded"  # counted, no quorum yet
    LEADER_FAILED = "leader failed"  # quorum reached: elect a new leader now


class LeaderFailureReports:
    """The metadata leader's record of "leader looks dead" reports, per partition.

    Reports count only when they name the current leader and leader epoch, come from an ISR
    follower, and (with ``report_ttl``) are recent. Reports of an older leader epoch are dropped
    when a newer one arrives; reaching the quorum clears the partition's reports.

    A member that left the ISR (``left_isr``) still counts towards the quorum's size, not as a
    witness, for ``leave_memory`` seconds: the leader may not know yet that it left, and its lease
    (bascule.partition.replication.lease) counts on that member's fetches. A metadata leader that
    just took over (``metadata_term``) knows of no such removal: for ``leave_memory`` seconds every
    replica counts towards the size.
    """

    def __init__(
        self, report_ttl: float | None = None, election_grace: float = 0.0, leave_memory: float = 0.0
    ) -> None:
        self.report_ttl = report_ttl
        # A leader just elected is not judged for this long: its followers may have reported it
        # before it was ready to answer.
        self.election_grace = election_grace
        self.leave_memory = leave_memory
        self._reports: dict[Hashable, tuple[str, int, dict[str, float]]] = {}  # witness -> when it reported
        self._elected: dict[Hashable, tuple[int, float]] = {}
        self._left: dict[Hashable, dict[str, tuple[int, float]]] = {}
        self._term: tuple[int, float] | None = None  # (metadata Raft term led, first seen leading it)

    def metadata_term(self, term: int, now: float) -> None:
        """This node leads the metadata in Raft ``term``, at the latest since ``now``."""
        if self._term is None or self._term[0] != term:
            self._term = (term, now)

    def left_isr(self, partition: Hashable, replica_id: str, leader_epoch: int, now: float) -> None:
        """``replica_id`` left the ISR of ``partition`` under ``leader_epoch`` at ``now``."""
        self._left.setdefault(partition, {})[replica_id] = (leader_epoch, now)

    def _quorum_members(
        self, partition: Hashable, isr: Collection[str], replicas: Collection[str], epoch: int, now: float
    ) -> set[str]:
        if self._term is not None and now - self._term[1] < self.leave_memory:
            return set(isr) | set(replicas)
        left = self._left.get(partition, {})
        for rid in [rid for rid, (_, at) in left.items() if now - at >= self.leave_memory]:
            del left[rid]
        return set(isr) | {rid for rid, (left_epoch, _) in left.items() if left_epoch == epoch}

    def elected(self, partition: Hashable, epoch: int, now: float) -> None:
        """A new leader took over ``partition`` in ``epoch`` at ``now`` (starts its grace period)."""
        self._reports.pop(partition, None)
        self._elected[partition] = (epoch, now)

    def report(
        self,
        partition: Hashable,
        reported_leader: str,
        leader_epoch: int,
        reporter: str,
        *,
        leader: str | None,
        epoch: int,
        isr: Collection[str],
        replicas: Collection[str] = (),
        now: float = 0.0,
    ) -> ReportVerdict:
        """Count ``reporter``'s report."""
        if leader is None or reported_leader != leader or leader_epoch != epoch:
            return ReportVerdict.STALE
        if reporter == leader or reporter not in isr:
            return ReportVerdict.NOT_A_WITNESS
        elected_epoch, elected_at = self._elected.get(partition, (-1, 0.0))
        if elected_epoch == epoch and now - elected_at < self.election_grace:
            return ReportVerdict.STALE
        current = self._reports.get(partition)
        if current is None or current[0] != leader or current[1] != epoch:
            current = (leader, epoch, {})
            self._reports[partition] = current
        witnesses = current[2]
        witnesses[reporter] = now
        if self.report_ttl is not None:
            for rid in [r for r, at in witnesses.items() if now - at > self.report_ttl]:
                del witnesses[rid]
        valid = sum(1 for rid in witnesses if rid in isr and rid != leader)
        if valid >= witness_quorum(self._quorum_members(partition, isr, replicas, epoch, now), leader):
            return ReportVerdict.LEADER_FAILED
        return ReportVerdict.RECORDED

    def witnesses(self, partition: Hashable) -> frozenset[str]:
        current = self._reports.get(partition)
        return frozenset() if current is None else frozenset(current[2])

    def clear(self, partition: Hashable) -> None:
        """Forget a partition's reports (its leader changed, or it was deleted)."""
        self._reports.pop(partition, None)
        self._elected.pop(partition, None)
        self._left.pop(partition, None)


# -- (c) elections: a failed leader, a returning leader ----------------------------------


@dataclass(frozen=True, slots=True)
class PartitionView:
    """What the metadata says of one partition, as the election rules need it."""

    leader: str | None
    leader_epoch: int
    epoch: int  # the partition epoch: every change is conditional on it
    isr: frozenset[str]
    replicas: frozenset[str]
    unclean: frozenset[str] = frozenset()  # ISR members that restarted uncleanly and have not caught up


@dataclass(frozen=True, slots=True)
class Elect:
    """Make ``leader`` the leader with ``isr``, in place of leader epoch ``leader_epoch`` at
    partition epoch ``epoch`` (a proposal that is refused if either moved meanwhile)."""

    leader: str
    isr: tuple[str, ...]
    leader_epoch: int
    epoch: int


class Role(enum.Enum):
    LEAD = "lead"
    FOLLOW = "follow"
    HAND_BACK = "hand back"  # named leader of an epoch an earlier run of this node was given


def replica_role(leader: str | None, leader_incarnation: str, replica_id: str, incarnation: str) -> Role:
    """What a replica does with a partition's metadata. A leader epoch belongs to the process
    incarnation it was given to: a restarted leader never resumes it (its log may have lost the
    unsynced tail since); it hands it back and asks for an election (:meth:`Elections.leader_returned`)."""
    if leader != replica_id:
        return Role.FOLLOW
    return Role.LEAD if leader_incarnation == incarnation else Role.HAND_BACK


def _elect(view: PartitionView, new_leader: str, replaced: str | None) -> Elect:
    isr = view.isr if new_leader == replaced else isr_after_leader_change(view.isr, replaced, new_leader)
    return Elect(new_leader, tuple(sorted(isr)), view.leader_epoch, view.epoch)


class Elections:
    """The metadata leader's election decisions, across partitions.

    - A leader reported silent by a quorum of its ISR followers (Liftbridge's witness rule) is
      replaced by the ISR member with the greatest position, among positions gathered once the
      quorum is there (never those reports carried: a reporter may have lost power and restarted
      since, its log shorter, before the metadata knows of its new incarnation); it leaves the ISR.
    - A leader that comes back from a restart (crash, power cut or graceful) never resumes its
      old leader epoch: it may have lost the unsynced tail of its log, and followers holding
      more would otherwise keep entries it no longer has and then append its new ones after them
      (KIP-101). Leadership goes to the ISR member with the greatest position, which may be the
      returning one itself (then with a new epoch); the others truncate through epoch queries.
      Positions of every ISR member are awaited for up to ``return_patience`` seconds (a member
      that is still starting may hold more than the returning one), then the choice is made
      among those that answered.
    - Either way, a member that restarted after an unclean shutdown is chosen only as
      :func:`choose_leader` allows: while no candidate is known to hold every committed entry, the
      partition waits for one, or for every ISR member, instead of electing a log that lost acks.
    """

    def __init__(
        self, report_ttl: float | None = None, election_grace: float = 0.0, return_patience: float = 0.0,
        leave_memory: float = 0.0,
    ):
        self.reports = LeaderFailureReports(report_ttl, election_grace, leave_memory)
        self.return_patience = return_patience
        self._returning_since: dict[Hashable, tuple[int, float]] = {}

    def leader_reported(
        self, partition: Hashable, view: PartitionView, reported_leader: str, reported_epoch: int,
        reporter: str, now: float,
    ) -> bool:
        """Count the report; whether the leader now counts as failed (then gather the ISR's
        positions and ask for its ``successor``)."""
        verdict = self.reports.report(
            partition, reported_leader, reported_epoch, reporter,
            leader=view.leader, epoch=view.leader_epoch, isr=view.isr, replicas=view.replicas, now=now,
        )
        return verdict is ReportVerdict.LEADER_FAILED and view.leader is not None

    def successor(
        self, view: PartitionView, failed_leader: str, failed_epoch: int, positions: Mapping[str, Position],
        leaderships: Mapping[str, int] | None = None,
    ) -> Elect | None:
        """Who replaces ``failed_leader`` (of ``failed_epoch``, reported failed), from the positions
        its ISR members gave since; None when the metadata moved on meanwhile, or no one may lead yet.
        ``leaderships``: how many partitions each broker leads, for ``choose_leader``'s ties."""
        if view.leader != failed_leader or view.leader_epoch != failed_epoch:
            return None
        candidates = _candidates(positions, view.isr, leaderships)
        new_leader = choose_leader(candidates, view.isr, exclude={failed_leader}, unclean=view.unclean)
        return None if new_leader is None else _elect(view, new_leader, failed_leader)

    def leader_returned(
        self, partition: Hashable, view: PartitionView, leader: str, leader_epoch: int,
        positions: Mapping[str, Position], now: float, leaderships: Mapping[str, int] | None = None,
    ) -> Elect | None:
        """``leader`` restarted while the metadata names it leader of ``leader_epoch``;
        ``positions`` holds its own and those of the ISR members that answered. None: stale, or
        wait (ask again later). ``leaderships`` as for ``successor``."""
        if view.leader != leader or view.leader_epoch != leader_epoch:
            return None
        epoch, since = self._returning_since.get(partition, (leader_epoch, now))
        if epoch != leader_epoch:
            since = now
        self._returning_since[partition] = (leader_epoch, since)
        missing = view.isr - set(positions) - {leader}
        if missing and now - since < self.return_patience:
            return None
        candidates = _candidates(positions, view.isr, leaderships)
        new_leader = choose_leader(candidates, view.isr, unclean=view.unclean)
        return None if new_leader is None else _elect(view, new_leader, leader)

    def elected(self, partition: Hashable, leader_epoch: int, now: float) -> None:
        """An election of ``partition`` was committed: ``leader_epoch`` is the new one."""
        self.reports.elected(partition, leader_epoch, now)
        self._returning_since.pop(partition, None)

    def forget(self, partition: Hashable) -> None:
        self.reports.clear(partition)
        self._returning_since.pop(partition, None)


def _candidates(
    positions: Mapping[str, Position], isr: Collection[str], leaderships: Mapping[str, int] | None,
) -> list[Candidate]:
    """The ISR members that gave a position, with their leaderships: without them, every tie of a batch
    of elections went to the smallest id, and the one survivor of a failed node's followers with the
    smallest id took all its partitions (issue 32: 3,333 of them, whose bring-up then outlasted the
    other survivor's leader timeout)."""
    counts = leaderships or {}
    return [Candidate(rid, *pos, counts.get(rid, 0)) for rid, pos in positions.items() if rid in isr]


# -- (d) ISR change validation -----------------------------------------------------------


class IsrChangeKind(enum.Enum):
    SHRINK = "shrink"
    EXPAND = "expand"


@dataclass(frozen=True, slots=True)
class IsrDecision:
    accepted: bool
    reason: str
    isr: frozenset[str]  # the ISR after the change (unchanged when refused)


def validate_isr_change(
    kind: IsrChangeKind,
    replica_id: str,
    request_leader: str,
    request_epoch: int,
    *,
    leader: str | None,
    epoch: int,
    replicas: Collection[str],
    isr: Collection[str],
    request_partition_epoch: int | None = None,
    partition_epoch: int | None = None,
    unclean: Collection[str] = (),
) -> IsrDecision:
    """Check a shrink/expand request of a partition leader against the current metadata.

    Refused when the requester is not the current leader or names another leader epoch (a zombie
    leader), when it names another partition epoch (it was decided on an ISR that has changed
    since: a stale proposer must not undo a shrink), when the replica is not one of the
    partition's, when a shrink would remove the leader, and when it changes nothing. Expanding
    an ``unclean`` ISR member changes something: it caught up, and is clean again.
    """
    current = frozenset(isr)
    if leader is None or request_leader != leader:
        return IsrDecision(False, "stale leader", current)
    if request_epoch != epoch:
        return IsrDecision(False, "stale leader epoch", current)
    if request_partition_epoch is not None and request_partition_epoch != partition_epoch:
        return IsrDecision(False, "stale partition epoch", current)
    if replica_id not in replicas:
        return IsrDecision(False, "not a replica", current)
    if kind is IsrChangeKind.SHRINK:
        if replica_id == leader:
            return IsrDecision(False, "cannot remove the leader", current)
        if replica_id not in current:
            return IsrDecision(False, "not in the ISR", current)
        return IsrDecision(True, "ok", current - {replica_id})
    if replica_id in current and replica_id not in unclean:
        return IsrDecision(False, "already in the ISR", current)
    return IsrDecision(True, "ok", current | {replica_id})
