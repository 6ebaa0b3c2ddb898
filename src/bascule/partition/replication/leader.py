"""A partition leader's rules for one leadership (one leader epoch), sans I/O.

:class:`Leadership` holds what a leader decides: the start of its epoch in the epoch history,
follower progress and the HW (its :class:`IsrTracker`), the ALL-acks waiting for the HW
(:class:`PendingAcks`), fencing by a newer epoch, and the ISR changes it asks the metadata leader
for. The shell feeds it appends, fetches, metadata and outcomes, and carries its answers out.

ISR change requests are conditional on the leader epoch *and* the partition epoch they were
decided at: the metadata refuses one if either moved, so a stale proposer cannot undo a change
made since (say, re-add a replica that a later shrink removed). An expansion whose outcome is
unknown (the metadata leader did not answer) is not a refusal: the replica keeps counting for the
HW and the request is made again, until the metadata's ISR settles it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from bascule.partition.log.epochs import EpochHistory

from .isr import IsrTracker, PendingAcks


def start_leader_epoch(history: EpochHistory, epoch: int, log_end_offset: int) -> None:
    """What a new leader does before its first append: record ``(epoch, log end offset)`` in its
    epoch history, so that epoch queries are answered with the right boundary (KIP-279).
    Idempotent for the same epoch; a smaller epoch than the latest known is refused."""
    if history.latest_epoch == epoch:
        return
    if not history.assign(epoch, log_end_offset):
        raise ValueError(f"leader epoch {epoch} is older than the history's {history.latest_epoch}")


class IsrOutcome(enum.Enum):
    ACCEPTED = "accepted"
    REFUSED = "refused"
    UNKNOWN = "unknown"  # no answer: it may still commit


@dataclass(frozen=True, slots=True)
class IsrRequest:
    """Ask the metadata leader to add (``add``) or remove ``replica_id``, conditionally on
    ``leader_epoch`` and ``partition_epoch``."""

    replica_id: str
    add: bool
    leader_epoch: int
    partition_epoch: int


class Leadership:
    def __init__(
        self,
        leader_id: str,
        leader_epoch: int,
        partition_epoch: int,
        replicas: Iterable[str],
        isr: Iterable[str],
        *,
        history: EpochHistory,
        log_end_offset: int,
        hw: int,
        min_isr: int,
        max_lag_time: float,
        leader_timeout: float,
        now: float,
        unclean: Iterable[str] = (),
    ) -> None:
        start_leader_epoch(history, leader_epoch, log_end_offset)
        self.leader_epoch = leader_epoch
        self.partition_epoch = partition_epoch
        self.tracker = IsrTracker(
            leader_id, leader_epoch, replicas, isr, leader_log_end=log_end_offset, hw=hw,
            min_isr=min_isr, max_lag_time=max_lag_time, leader_timeout=leader_timeout, now=now, unclean=unclean,
        )
        self.acks = PendingAcks()
        self._in_flight: set[tuple[str, bool]] = set()
        self._unsettled_expansions: set[str] = set()  # outcome unknown: ask again

    def holds_lease(self, now: float) -> bool:
        """Whether no other leader can have been elected yet (see ``lease``): a write may be
        acknowledged as this leader's now."""
        return self.tracker.holds_lease(now)

    def fenced_by(self, requested_epoch: int) -> bool:
        """A follower follows ``requested_epoch``: a newer epoch means another leader was elected
        (this one was paused or cut off) and this leadership must end before the metadata says so."""
        return requested_epoch > self.leader_epoch

    def metadata_changed(
        self, isr: Iterable[str], partition_epoch: int, min_isr: int, now: float, unclean: Iterable[str] = (),
    ) -> None:
        """The metadata committed ``isr`` (and its ``unclean`` members) at ``partition_epoch``
        (same leader epoch)."""
        if partition_epoch < self.partition_epoch:
            return  # an older view than one already applied
        self.partition_epoch = partition_epoch
        self.tracker.min_isr = min_isr
        self.tracker.set_isr(isr, now, partition_epoch, unclean)
        self._unsettled_expansions &= self.tracker.pending_expansions

    def isr_requests(self, now: float) -> list[IsrRequest]:
        """The ISR changes to ask for now: shrinks of lagging members, expansions of caught-up
        replicas, and again the expansions whose outcome is unknown; none already in flight."""
        tracker = self.tracker
        wanted = [(rid, False) for rid in tracker.shrink_proposals(now)]
        wanted += [(rid, True) for rid in tracker.expand_proposals(now, self.partition_epoch)]
        wanted += [(rid, True) for rid in sorted(self._unsettled_expansions)]
        requests = []
        for rid, add in dict.fromkeys(wanted):
            if (rid, add) not in self._in_flight:
                self._in_flight.add((rid, add))
                requests.append(IsrRequest(rid, add, self.leader_epoch, self.partition_epoch))
                if not add:
                    tracker.shrink_proposed(rid, self.partition_epoch)
        return requests

    def isr_request_done(self, request: IsrRequest, outcome: IsrOutcome) -> None:
        self._in_flight.discard((request.replica_id, request.add))
        if not request.add:
            if outcome is IsrOutcome.REFUSED:
                self.tracker.shrink_refused(request.replica_id)
            return
        if outcome is IsrOutcome.REFUSED:
            self._unsettled_expansions.discard(request.replica_id)
            self.tracker.expand_refused(request.replica_id)  # stop holding the HW back for it
        elif outcome is IsrOutcome.UNKNOWN and request.replica_id in self.tracker.pending_expansions:
            self._unsettled_expansions.add(request.replica_id)
