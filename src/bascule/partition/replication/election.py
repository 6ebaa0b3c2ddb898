"""Leadership rules: who may lead, when a leader counts as failed, which ISR changes are valid.

All pure: the metadata leader feeds them what it knows and applies the outcome through Raft.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Hashable, Iterable
from dataclasses import dataclass

from bascule.partition.log.epochs import EpochHistory

# -- (a) leader choice ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Candidate:
    """A live replica that could lead: the epoch of its last entry (-1 when its log is empty),
    its log end offset (next offset), and how many partitions it already leads (tie-break)."""

    replica_id: str
    last_epoch: int
    log_end_offset: int
    leader_count: int = 0


def candidate_from(
    replica_id: str, history: EpochHistory, log_end_offset: int, leader_count: int = 0
) -> Candidate:
    """A :class:`Candidate` from a replica's epoch history and log end offset. The last epoch is
    that of its last *entry*, not an epoch it recorded as a leader and never wrote in."""
    last_epoch = history.epoch_at(log_end_offset - 1) if log_end_offset > 0 else -1
    return Candidate(replica_id, last_epoch, log_end_offset, leader_count)


def choose_leader(
    candidates: Iterable[Candidate], isr: Collection[str], exclude: Collection[str] = ()
) -> str | None:
    """The ISR candidate with the greatest (last epoch, log end offset) pair (Oxia's rule: the
    fewest uncommitted entries are thrown away); ties go to the fewest leaderships, then the
    smallest id. ``candidates`` must be live replicas; ``exclude`` is typically the failed leader.
    None when no ISR member is a candidate: there is no unclean election."""
    eligible = [c for c in candidates if c.replica_id in isr and c.replica_id not in exclude]
    if not eligible:
        return None
    best = min(
        eligible,
        key=lambda c: (-c.last_epoch, -c.log_end_offset, c.leader_count, c.replica_id),
    )
    return best.replica_id


def isr_after_leader_change(isr: Collection[str], old_leader: str | None, new_leader: str) -> frozenset[str]:
    """The ISR once ``new_leader`` replaces a failed ``old_leader``: the old one leaves it (it
    rejoins as a follower through an expansion), the new one is in it."""
    return (frozenset(isr) - {old_leader}) | {new_leader}


def start_leader_epoch(history: EpochHistory, epoch: int, log_end_offset: int) -> None:
    """What a new leader does before its first append: record ``(epoch, log end offset)`` in its
    epoch history, so that epoch queries are answered with the right boundary (KIP-279).
    Idempotent for the same epoch; a smaller epoch than the latest known is refused."""
    if history.latest_epoch == epoch:
        return
    if not history.assign(epoch, log_end_offset):
        raise ValueError(f"leader epoch {epoch} is older than the history's {history.latest_epoch}")


# -- (b) leader failure reports (Liftbridge's witness rule) ----------------------------------


class ReportVerdict(enum.Enum):
    STALE = "stale"  # not about the current leader and leader epoch
    NOT_A_WITNESS = "not a witness"  # the reporter is not an ISR follower
    RECORDED = "recorded"  # counted, no quorum yet
    LEADER_FAILED = "leader failed"  # quorum reached: elect a new leader now


def witness_quorum(isr: Collection[str], leader: str) -> int:
    """Distinct witnesses needed: a majority of the ISR without the leader (1 of 1, 2 of 2,
    2 of 3...). 0 followers gives 1, which no report can reach: such a leader's failure must be
    detected some other way (broker liveness)."""
    followers = len(frozenset(isr) - {leader})
    return followers // 2 + 1


class LeaderFailureReports:
    """The metadata leader's record of "leader looks dead" reports, per partition.

    Reports count only when they name the current leader and leader epoch, come from an ISR
    follower, and (with ``report_ttl``) are recent. Reports of an older leader epoch are dropped
    when a newer one arrives; reaching the quorum clears the partition's reports.
    """

    def __init__(self, report_ttl: float | None = None, election_grace: float = 0.0) -> None:
        self.report_ttl = report_ttl
        # A leader just elected is not judged for this long: its followers may have reported it
        # before it was ready to answer.
        self.election_grace = election_grace
        self._reports: dict[Hashable, tuple[str, int, dict[str, float]]] = {}
        self._elected: dict[Hashable, tuple[int, float]] = {}

    def elected(self, partition: Hashable, epoch: int, now: float) -> None:
        """A new leader took over ``partition`` in ``epoch`` at ``now`` (starts its grace period)."""
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
        now: float = 0.0,
    ) -> ReportVerdict:
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
        if valid >= witness_quorum(isr, leader):
            del self._reports[partition]
            return ReportVerdict.LEADER_FAILED
        return ReportVerdict.RECORDED

    def witnesses(self, partition: Hashable) -> frozenset[str]:
        current = self._reports.get(partition)
        return frozenset() if current is None else frozenset(current[2])

    def clear(self, partition: Hashable) -> None:
        """Forget a partition's reports (its leader changed some other way, or it was deleted)."""
        self._reports.pop(partition, None)


# -- (c) ISR change validation -----------------------------------------------------------


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
) -> IsrDecision:
    """Check a shrink/expand request of a partition leader against the current metadata.

    Refused when the requester is not the current leader or names another leader epoch (a zombie
    leader), when the replica is not one of the partition's, when a shrink would remove the
    leader, and when it changes nothing.
    """
    current = frozenset(isr)
    if leader is None or request_leader != leader:
        return IsrDecision(False, "stale leader", current)
    if request_epoch != epoch:
        return IsrDecision(False, "stale leader epoch", current)
    if replica_id not in replicas:
        return IsrDecision(False, "not a replica", current)
    if kind is IsrChangeKind.SHRINK:
        if replica_id == leader:
            return IsrDecision(False, "cannot remove the leader", current)
        if replica_id not in current:
            return IsrDecision(False, "not in the ISR", current)
        return IsrDecision(True, "ok", current - {replica_id})
    if replica_id in current:
        return IsrDecision(False, "already in the ISR", current)
    return IsrDecision(True, "ok", current | {replica_id})
