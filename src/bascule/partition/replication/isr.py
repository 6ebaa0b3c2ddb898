"""The leader's view of its followers: their progress, the ISR proposals, the HW and ALL-acks.

One :class:`IsrTracker` lives for one leadership (one leader epoch) of one partition. It is fed
values (fetches, appends, the ISR the metadata committed, the time) and answers with decisions;
it never sends anything itself.

Offsets: a follower's fetch names its *log end offset* (next offset it wants, = its newest offset
+ 1 on Liftbridge's wire); the HW is the offset of the last committed message (see ``hw``).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .hw import clamp_high_watermark, leader_high_watermark
from .lease import lease_expiry


@dataclass(slots=True)
class FollowerProgress:
    """What the leader knows about one follower during this leadership."""

    replica_id: str
    log_end_offset: int | None = None  # from its last accepted fetch; None: not fetched yet
    last_fetch_time: float | None = None
    leader_log_end_at_last_fetch: int | None = None
    last_caught_up_time: float | None = None
    caught_up_at_last_fetch: bool = False
    waiting: bool = False  # its last fetch got nothing new and it has not been notified since
    heard_at: float | None = None  # the newest leader clock reading it echoed (see ``lease``)


class IsrTracker:
    """Follower progress, HW, and ISR shrink/expand proposals for one leader epoch.

    Caught up: a fetch is "caught up" when it asks for the leader's LEO at that moment, or, under
    a steady write load, for at least the leader's LEO as of that follower's previous fetch (it
    has everything that existed one fetch ago; the time of that previous fetch then counts as its
    last caught-up time). ISR members start with the construction time as their last caught-up
    time, so a new leader gives every follower ``max_lag_time`` to show up.
    """

    def __init__(
        self,
        leader_id: str,
        leader_epoch: int,
        replicas: Iterable[str],
        isr: Iterable[str],
        *,
        leader_log_end: int,
        hw: int,
        min_isr: int,
        max_lag_time: float,
        leader_timeout: float,
        now: float,
        epoch_start: int | None = None,
        unclean: Iterable[str] = (),
    ) -> None:
        self.leader_id = leader_id
        self.leader_epoch = leader_epoch
        self.replicas = frozenset(replicas) | {leader_id}
        self.min_isr = min_isr
        self.max_lag_time = max_lag_time
        self.leader_timeout = leader_timeout  # the followers' (replica.max.leader.timeout)
        self.leader_log_end = leader_log_end
        self.epoch_start = leader_log_end if epoch_start is None else epoch_start
        self.hw = clamp_high_watermark(hw, leader_log_end)
        self._followers = {
            rid: FollowerProgress(rid) for rid in self.replicas if rid != leader_id
        }
        self.started_at = now
        self.isr: frozenset[str] = frozenset()
        self.unclean: frozenset[str] = frozenset()  # ISR members that must show they caught up (metadata's)
        # Expansions and shrinks proposed and not settled, with the partition epoch they were proposed at.
        self._expanding: dict[str, int] = {}
        self._shrinking: dict[str, int] = {}
        # The lease's expiry as last computed: a lower bound until the ISR or a change in flight
        # moves (newer echoes only move the expiry later).
        self._lease: float | None = None
        self.set_isr(isr, now, unclean=unclean)

    # -- inputs -----------------------------------------------------------------------------

    def set_isr(
        self, isr: Iterable[str], now: float, partition_epoch: int | None = None, unclean: Iterable[str] = (),
    ) -> None:
        """Adopt the ISR the metadata committed (the leader is always part of it) at
        ``partition_epoch``, and its ``unclean`` members. Settles pending expansions: accepted
        when the ISR contains them as clean members, refused when it does not at a newer partition
        epoch than they were proposed at (ISR changes are conditional on the partition epoch, so
        such a proposal can never commit)."""
        new_isr = frozenset(isr) | {self.leader_id}
        for rid in new_isr - self.isr:
            progress = self._followers.get(rid)
            if progress is not None and progress.last_caught_up_time is None:
                progress.last_caught_up_time = now  # a grace period for a member we never saw
        self.isr = new_isr
        self.unclean = frozenset(unclean) & new_isr
        self._lease = None
        for rid, proposed_at in list(self._expanding.items()):
            settled = rid in new_isr and rid not in self.unclean
            if settled or (partition_epoch is not None and partition_epoch > proposed_at):
                del self._expanding[rid]
        for rid, proposed_at in list(self._shrinking.items()):
            if rid not in new_isr or (partition_epoch is not None and partition_epoch > proposed_at):
                del self._shrinking[rid]
        self._recompute_hw()

    def shrink_proposed(self, replica_id: str, partition_epoch: int) -> None:
        """The shell asked the metadata to remove ``replica_id`` at ``partition_epoch``: until
        :meth:`set_isr` or :meth:`shrink_refused` settles it, the ISR may already be without it."""
        self._shrinking[replica_id] = partition_epoch
        self._lease = None

    def shrink_refused(self, replica_id: str) -> None:
        self._shrinking.pop(replica_id, None)
        self._lease = None

    def expand_refused(self, replica_id: str) -> None:
        """The metadata refused the expansion of ``replica_id`` (an unknown outcome is not a
        refusal: the expansion stays pending until :meth:`set_isr` settles it)."""
        self._expanding.pop(replica_id, None)
        self._lease = None
        self._recompute_hw()

    def leader_appended(self, log_end_offset: int) -> list[str]:
        """The leader's log now ends at ``log_end_offset`` (under a sync-always policy: is durable
        up to it). Returns the followers to notify: those waiting after an empty response."""
        if log_end_offset < self.leader_log_end:
            raise ValueError("a leader's log end offset never moves backwards")
        self.leader_log_end = log_end_offset
        self._recompute_hw()
        return self.take_waiting()

    def take_waiting(self) -> list[str]:
        """The followers idle after an empty response, which are to be notified now (new data,
        or a new HW they would otherwise learn only at their next idle timeout); they stop
        counting as waiting."""
        notify = sorted(p.replica_id for p in self._followers.values() if p.waiting)
        for rid in notify:
            self._followers[rid].waiting = False
        return notify

    def asks_again(self, replica_id: str, log_end_offset: int) -> bool:
        """Whether a fetch from ``log_end_offset`` asks for what this follower's previous fetch was
        sent: it made no progress although there was data (its answer was lost, or damaged)."""
        progress = self._followers.get(replica_id)
        return (
            progress is not None
            and progress.log_end_offset == log_end_offset
            and progress.leader_log_end_at_last_fetch is not None
            and progress.leader_log_end_at_last_fetch > log_end_offset
        )

    def record_fetch(
        self, replica_id: str, log_end_offset: int, leader_epoch: int, now: float, leader_time: float = 0.0
    ) -> bool:
        """A replication request from ``replica_id`` asking for ``log_end_offset`` onwards, echoing
        ``leader_time``, the clock reading of the newest response it took (0: none).

        False (the request must get no data) when the replica is not one of the partition's,
        when it follows another leader epoch, or when it asks beyond this leader's LEO (it has
        not truncated against this leader). Otherwise it is recorded, and the HW recomputed if the
        follower's position moved (every other input of the HW recomputes it as it changes: a fetch
        at the same position again, an idle follower's, leaves it where it is).
        """
        progress = self._followers.get(replica_id)
        if progress is None or leader_epoch != self.leader_epoch:
            return False
        # Only a reading this leadership could have sent counts: one from before it began, or
        # from the future, proves nothing (a request held up in a socket echoes an old one, which
        # only shortens the lease).
        if self.started_at <= leader_time <= now and (progress.heard_at is None or leader_time > progress.heard_at):
            progress.heard_at = leader_time
        if log_end_offset < 0 or log_end_offset > self.leader_log_end:
            return False
        previous_leader_end = progress.leader_log_end_at_last_fetch
        previous_time = progress.last_fetch_time
        if log_end_offset >= self.leader_log_end:
            progress.last_caught_up_time = now
            progress.caught_up_at_last_fetch = True
        elif previous_leader_end is not None and log_end_offset >= previous_leader_end:
            assert previous_time is not None
            if progress.last_caught_up_time is None or previous_time > progress.last_caught_up_time:
                progress.last_caught_up_time = previous_time
            progress.caught_up_at_last_fetch = True
        else:
            progress.caught_up_at_last_fetch = False
        moved = log_end_offset != progress.log_end_offset
        progress.log_end_offset = log_end_offset
        progress.last_fetch_time = now
        progress.leader_log_end_at_last_fetch = self.leader_log_end
        progress.waiting = log_end_offset >= self.leader_log_end
        if moved:
            self._recompute_hw()
        return True

    # -- questions --------------------------------------------------------------------------

    @property
    def can_commit(self) -> bool:
        """Whether the HW may move at all: the ISR has at least min ISR members."""
        return len(self.isr) >= self.min_isr

    def progress(self, replica_id: str) -> FollowerProgress:
        return self._followers[replica_id]

    def is_caught_up(self, replica_id: str) -> bool:
        """Its last fetch asked for (at least) the leader's current LEO."""
        progress = self._followers.get(replica_id)
        return (
            progress is not None
            and progress.log_end_offset is not None
            and progress.log_end_offset >= self.leader_log_end
        )

    def last_caught_up(self, replica_id: str) -> float | None:
        progress = self._followers.get(replica_id)
        return None if progress is None else progress.last_caught_up_time

    def shrink_proposals(self, now: float) -> list[str]:
        """ISR followers not caught up for more than ``max_lag_time``, and at once those whose
        log ends at or below the HW: they lack committed messages (they lost data in a crash,
        or an expansion was committed after it stopped being pending). Sorted; repeated on every
        call until the metadata commits a new ISR, so the shell rate-limits its requests."""
        lagging = []
        for rid in self.isr - {self.leader_id}:
            progress = self._followers.get(rid)
            caught_up = None if progress is None else progress.last_caught_up_time
            if caught_up is None or now - caught_up > self.max_lag_time:
                lagging.append(rid)
            elif progress is not None and progress.log_end_offset is not None and progress.log_end_offset <= self.hw:
                lagging.append(rid)
        return sorted(lagging)

    def expand_proposals(self, now: float, partition_epoch: int = 0) -> list[str]:
        """Replicas to add to the ISR: outside it (or in it but unclean, to be declared clean),
        their last fetch (no older than ``max_lag_time``) was caught up and already holds every
        committed message and everything before this leader's epoch.

        Each replica is returned once and is from then on *pending*: it counts for the HW as if
        it were in the ISR (Kafka's "maximal ISR") until :meth:`set_isr` includes it or
        :meth:`expand_refused` drops it. Otherwise the HW could pass its log end while the
        request is in flight, and the metadata would then add a member lacking committed
        messages. Pending members do not count towards ``min_isr``. ``partition_epoch`` is the
        one the proposal is conditional on.
        """
        ready = []
        for rid in ((self.replicas - self.isr) | self.unclean).difference(self._expanding, {self.leader_id}):
            p = self._followers[rid]
            if (
                p.caught_up_at_last_fetch
                and p.log_end_offset is not None
                and p.last_fetch_time is not None
                and now - p.last_fetch_time <= self.max_lag_time
                and p.log_end_offset > self.hw
                and p.log_end_offset >= self.epoch_start
            ):
                ready.append(rid)
        for rid in ready:
            self._expanding[rid] = partition_epoch
            self._lease = None
        return sorted(ready)

    @property
    def pending_expansions(self) -> frozenset[str]:
        return frozenset(self._expanding)

    def lease_expiry(self) -> float:
        """When another leader could first be elected (see ``lease``), with the pending ISR
        changes counted both ways."""
        heard = {rid: progress.heard_at for rid, progress in self._followers.items()}
        return lease_expiry(
            heard, self.leader_id, self.isr, joining=self._expanding, leaving=self._shrinking,
            leader_timeout=self.leader_timeout,
        )

    def holds_lease(self, now: float) -> bool:
        """``now < lease_expiry()``, computed again only once an earlier answer no longer shows
        it: a write's check costs next to nothing."""
        if self._lease is None or now >= self._lease:
            self._lease = self.lease_expiry()
        return now < self._lease

    # -- internals --------------------------------------------------------------------------

    def _recompute_hw(self) -> None:
        if not self.can_commit:
            return
        log_ends: list[int | None] = [self.leader_log_end]
        for rid in self.isr.union(self._expanding) - {self.leader_id}:
            progress = self._followers.get(rid)
            log_ends.append(None if progress is None else progress.log_end_offset)
        self.hw = leader_high_watermark(self.hw, log_ends, 1)


class PendingAcks:
    """ALL-acks waiting for their offset to be committed: an ack for offset X may fire once
    HW >= X. Tokens are whatever the shell needs to send the ack."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Any]] = []
        self._order = itertools.count()

    def add(self, offset: int, token: Any) -> None:
        heapq.heappush(self._heap, (offset, next(self._order), token))

    def release(self, hw: int) -> list[tuple[int, Any]]:
        """The (offset, token) pairs now committed, in offset order, removed from the queue."""
        ready = []
        while self._heap and self._heap[0][0] <= hw:
            offset, _, token = heapq.heappop(self._heap)
            ready.append((offset, token))
        return ready

    def fail_all(self) -> list[tuple[int, Any]]:
        """Everything still pending, e.g. on losing leadership: these acks must report failure
        (or never fire); their messages may or may not survive."""
        pending = sorted(self._heap)
        self._heap.clear()
        return [(offset, token) for offset, _, token in pending]

    def __len__(self) -> int:
        return len(self._heap)

