"""A partition leader's rules, sans I/O: for one leadership (one leader epoch), and for the
writes of a replica across its leaderships.

:class:`Leadership` holds what a leader decides: the start of its epoch in the epoch history,
follower progress and the HW (its :class:`IsrTracker`), the ALL-acks waiting for the HW
(:class:`PendingAcks`), fencing by a newer epoch, and the ISR changes it asks the metadata leader
for. :class:`Leader` is the machine a replica's shell (``partition.replica``) applies: writes in,
appends, syncs, acks and failures out, over the leaderships it holds. It spans them because a
write outlives its leadership: a sync begun in one may complete in the next, and must ack
nothing then. The shell feeds it appends, fetches, metadata and outcomes, and carries its
actions out.

ISR change requests are conditional on the leader epoch *and* the partition epoch they were
decided at: the metadata refuses one if either moved, so a stale proposer cannot undo a change
made since (say, re-add a replica that a later shrink removed). An expansion whose outcome is
unknown (the metadata leader did not answer) is not a refusal: the replica keeps counting for the
HW and the request is made again, until the metadata's ISR settles it.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from bascule.partition.log.epochs import EpochHistory
from bascule.wire.entry import Record, record_error

from .concurrency import NO_EXPECTATION, IncorrectOffset, admitted
from .dedup import DedupWindow
from .isr import IsrTracker, PendingAcks

log = logging.getLogger(__name__)


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


# ---- the leader's write path, across its leaderships ------------------------------------------
# Its actions are not frozen: a frozen dataclass's __init__ costs several times a plain one's, and
# a write makes a few of them.

T = TypeVar("T")  # a write's outcome token: what the shell calls with its placement, or its error
# Where a write's records are: the first one's offset when they were stored together, else each
# one's (under deduplication, some were duplicates of messages written before).
Placement = int | list[int]


class NotLeader(Exception):
    pass


class PartitionClosed(Exception):
    pass


class ReplicaFailed(PartitionClosed):
    """The replica's log failed (``PartitionReplica.failed`` says why, also its ``__cause__``): it
    takes no more writes, leads no more, and acknowledged nothing its log could not vouch for."""


@dataclass(slots=True)
class Append:
    """Append ``records`` in ``leader_epoch``, all at once; then ``appended`` with the first
    offset, or one of the failures."""

    records: list[Record]
    leader_epoch: int


@dataclass(slots=True)
class StartSync(Generic[T]):
    """Begin an fsync (group commit) covering the log up to ``durable_end``; hand this back to
    ``synced`` or ``sync_failed``. ``writes`` are acked when it completes in ``leadership``."""

    leadership: Leadership | None
    writes: list[tuple[Placement, T]]
    durable_end: int


@dataclass(slots=True)
class Acknowledge(Generic[T]):
    """Tell each token its (placement, no error), in order."""

    writes: Sequence[tuple[Placement, T]]


@dataclass(slots=True)
class Fail(Generic[T]):
    """Tell each token (no offset, ``error``), in order."""

    tokens: list[T]
    error: BaseException


@dataclass(slots=True)
class Notify:
    """Wake these followers: there is something to fetch (entries, or a new HW)."""

    followers: list[str]


@dataclass(slots=True)
class PublishHighWatermark:
    """Publish ``hw``, then tell ``committed``."""

    hw: int


@dataclass(slots=True)
class StepDown:
    """A follower follows ``epoch``, newer than this leader's: it no longer leads."""

    epoch: int


@dataclass(slots=True)
class Failed:
    """The log failed for good (``cause``): record it, then ``fail`` with the error writes get."""

    cause: BaseException


Action = Append | StartSync | Acknowledge | Fail | Notify | PublishHighWatermark | StepDown | Failed


@dataclass(slots=True)
class _Expecting(Generic[T]):
    """One submit under concurrency control: where its records start among the pending ones,
    the offsets they expect (None: any) and its token."""

    start: int
    expected: Sequence[int] | None
    token: T | None


class Leader(Generic[T]):
    """A replica's leader role, sans I/O: the writes it takes, from submit to ack or failure, over
    the leaderships it holds (a sync begun in one may complete in the next). Its rules:

    - writes submitted in a turn are appended as one (``flush``), under concurrency control only
      the groups whose expected offsets hold (``concurrency.admitted``), never a group holding a
      record the log cannot encode;
    - under ``sync_always``, group commit: one fsync at a time, covering everything written
      before it began; a failed fsync is never retried: every write not yet acked fails;
    - a write is acked only in the leadership that wrote it, and only while that leadership holds
      its lease (``Leadership.holds_lease``); acks held for the lease go out in order once it
      holds again, and fail if the leadership ends first;
    - a request of a newer epoch fences this leader, before its metadata says so.

    ``name`` ("stream/partition") is for the errors' messages.
    """

    def __init__(self, name: str, *, sync_always: bool, concurrency_control: bool) -> None:
        self.name = name
        self.sync_always = sync_always
        self.concurrency_control = concurrency_control
        self.leadership: Leadership | None = None
        self.fenced_epoch = -1  # a newer leader epoch seen in a follower's request
        self._log_end = 0  # the log's end, as this leader's appends left it
        self._hw = -1  # the HW last published
        self._pending: list[Record] = []
        self._pending_tokens: list[tuple[int, T]] = []  # (index of a group's first record, token)
        self._pending_expected: list[_Expecting[T]] = []  # under concurrency control, one per submit
        self._appending: list[tuple[int, T]] = []  # the groups of the Append being carried out
        self._awaiting_sync: list[tuple[Placement, T]] = []  # written, not yet fsynced
        self._awaiting_lease: list[tuple[Placement, T]] = []  # written, in order, the lease lapsed
        # Deduplication (None: off): the window of ids written, and for the submits since the last
        # flush, each record's id (None: no id) and each group's start, kept only once an id came.
        self._window: DedupWindow | None = None
        self._pending_ids: list[bytes | None] = []
        self._pending_starts: list[int] = []
        self._placed: list[tuple[Placement, T]] | None = None  # a deduplicated Append's writes
        self._remembering: list[tuple[bytes, int]] = []  # its new ids and their offsets
        # An Append without copies: its records' ids in its order, or, once some of its records may
        # have been refused, by record (with its records).
        self._new_id_run: list[bytes | None] | None = None
        self._appending_records: list[Record] = []
        self._new_ids: dict[int, bytes] = {}
        self.duplicates = 0  # records not written again: their ids were written before
        self._sync_due = False  # records written since the last fsync began (with tokens or not)
        self._syncing = False
        self._failed = False
        self._closed = False

    @property
    def acks_held(self) -> int:
        return len(self._awaiting_lease)

    # ---- roles --------------------------------------------------------------------------------

    def lead(
        self, leader_id: str, leader_epoch: int, partition_epoch: int, replicas: Iterable[str], isr: Iterable[str],
        *, history: EpochHistory, log_end_offset: int, hw: int, min_isr: int, max_lag_time: float,
        leader_timeout: float, now: float, unclean: Iterable[str] = (), dedup: DedupWindow | None = None,
    ) -> list[Action]:
        """Begin leading ``leader_epoch`` (after ``step_down`` from any earlier one). ``dedup``: the
        deduplication window, holding the ids of the log's tail (None: no deduplication)."""
        self._log_end, self._hw = log_end_offset, hw
        self._window = dedup
        self.leadership = Leadership(
            leader_id, leader_epoch, partition_epoch, replicas, isr, history=history,
            log_end_offset=log_end_offset, hw=hw, min_isr=min_isr, max_lag_time=max_lag_time,
            leader_timeout=leader_timeout, now=now, unclean=unclean,
        )
        return self._published(self.leadership)

    def metadata_changed(
        self, isr: Iterable[str], partition_epoch: int, min_isr: int, now: float, unclean: Iterable[str] = (),
    ) -> list[Action]:
        """The metadata's view of the epoch this leader leads (see ``Leadership.metadata_changed``)."""
        leadership = self.leadership
        if leadership is None:
            return []
        leadership.metadata_changed(isr, partition_epoch, min_isr, now, unclean)
        return self._published(leadership) + self._released(leadership, now)

    def fence(self, requested_epoch: int) -> list[Action]:
        """A follower asked with ``requested_epoch``: a newer one ends this leadership now."""
        if self.leadership is None or not self.leadership.fenced_by(requested_epoch):
            return []
        self.fenced_epoch = requested_epoch
        return [StepDown(requested_epoch), *self.step_down()]

    def step_down(self) -> list[Action]:
        """Stop leading: writes not yet acked fail."""
        if self.leadership is None:
            return []
        actions = self._fail_pending(NotLeader(f"{self.name} lost leadership"))
        self.leadership = None
        return actions

    def close(self) -> list[Action]:
        self._closed = True
        actions = self._fail_pending(PartitionClosed(f"{self.name} closed"))
        self.leadership = None
        return actions

    def fail(self, error: BaseException) -> list[Action]:
        """The log failed for good: every write and ack waiting fails with ``error``, and this
        leader stops. Nothing written since the last good fsync may ever be acked: a later fsync
        that succeeds does not prove the pages the failed one could not write reach the disk."""
        self._failed = True
        actions = self._fail_pending(error)
        self.leadership = None
        return actions

    # ---- writes -------------------------------------------------------------------------------

    def submit(
        self, records: list[Record], token: T | None, expected: Sequence[int] | None,
        ids: Sequence[bytes | None] | None = None,
    ) -> None:
        """Queue ``records`` as one group for the next ``flush``; ``token`` learns their placement
        once all are written. ``expected``: under concurrency control, each record's expected offset
        (NO_EXPECTATION: any); the group is appended all or none. ``ids``: each record's message id
        (``wire.dedup.window_key`` of it; None: none), for deduplication when it is on: a record
        whose id the window holds, or an earlier record of the flush has, is not appended again, and
        its placement is that message's offset."""
        if self._window is not None:
            self._pend_ids(records, ids)
        if self.concurrency_control:
            if expected is not None and len(expected) != len(records):
                raise ValueError(f"{len(expected)} expected offsets for {len(records)} records")
            self._pending_expected.append(_Expecting(len(self._pending), expected, token))
        if token is not None:
            self._pending_tokens.append((len(self._pending), token))
        self._pending += records

    def flush(self, now: float) -> list[Action]:
        """What the writes submitted since the last flush come to: an Append, and the refusals."""
        records, self._pending = self._pending, []
        tokens, self._pending_tokens = self._pending_tokens, []
        expecting, self._pending_expected = self._pending_expected, []
        leadership = self.leadership
        starts, self._pending_starts = self._pending_starts, []
        if self._pending_ids:
            ids, self._pending_ids = self._pending_ids, []
            if records and leadership is not None:
                assert self._window is not None
                self._window.expire(self._log_end, now)  # ids may have aged out since the last Append with ids
                if self._window.holds_any(ids):
                    return self._deduplicated(leadership, records, ids, starts, dict(tokens), expecting, now)
                # The usual case, no copies: the usual path, whose records' ids join the window
                # where they land (their records' places, unless some are refused on the way).
                self._new_id_run = ids
                if expecting:
                    self._index_new_ids(records)
        if not records or leadership is None:
            return []
        actions: list[Action] = []
        if expecting:
            records, tokens = self._admitted(records, expecting, actions)
            if not records:
                return actions
        self._appending = tokens
        self._appending_records = records
        actions.append(Append(records, leadership.leader_epoch))
        return actions

    def unencodable(self, records: list[Record]) -> tuple[list[Action], Append | None]:
        """The log could not encode a record of the Append (``records``: as it was given them, in
        the Append's order): the refusals of the groups holding one, and the Append of the others
        (whose outcome goes to ``appended`` or a failure as the first's would have)."""
        if self._placed is not None:  # never: a deduplicating flush refuses such groups first
            return self.append_failed(ValueError(next(filter(None, map(record_error, records)), "unencodable"))), None
        if self._new_id_run is not None:
            self._index_new_ids(records)
        kept, self._appending, refusals = _without_unencodable_groups(records, self._appending)
        self._appending_records = kept
        leadership = self.leadership
        if not kept or leadership is None:
            return refusals, None
        return refusals, Append(kept, leadership.leader_epoch)

    def append_failed(self, error: BaseException) -> list[Action]:
        """The Append failed and the log is as it was (a full disk, say): its writes fail."""
        tokens = [token for _, token in self._taken_appending()]
        return [Fail(tokens, error)]

    def log_failed(self, cause: BaseException) -> list[Action]:
        """The Append failed and left the log failed: its writes fail first, with all others."""
        self._awaiting_sync[:0] = self._taken_appending()
        return [Failed(cause)]

    def appended(self, first_offset: int, log_end: int, now: float) -> list[Action]:
        """The Append is in the log, from ``first_offset``; the log ends at ``log_end``."""
        written: list[tuple[Placement, T]]
        if self._placed is not None:
            written = self._remembered(first_offset, log_end, now)
        else:
            tokens, self._appending = self._appending, []
            written = [(first_offset + index, token) for index, token in tokens]
            if self._new_id_run is not None or self._new_ids:
                self._remember_new_ids(first_offset, log_end, now)
            self._appending_records = []
        self._log_end = log_end
        leadership = self.leadership
        if self.sync_always:
            self._awaiting_sync += written
            self._sync_due = True
            return self._start_sync()
        assert leadership is not None
        return self._written(leadership, written, log_end, now)

    def synced(self, sync: StartSync[T], now: float) -> list[Action]:
        self._syncing = False
        if self._closed or sync.leadership is None:
            actions = self._fail_sync(sync, PartitionClosed(f"{self.name} closed"))
        else:
            actions = self._written(sync.leadership, sync.writes, sync.durable_end, now)
        return actions + self._start_sync()

    def sync_failed(self, sync: StartSync[T], error: BaseException) -> list[Action]:
        """Never retried: this sync's writes, and every write after them, fail (see ``fail``)."""
        self._syncing = False
        if self._closed:
            return self._fail_sync(sync, error) + self._start_sync()
        self._awaiting_sync[:0] = sync.writes
        return [Failed(error)]

    def sync_cancelled(self, sync: StartSync[T]) -> list[Action]:
        """The sync's outcome is unknown (the loop is shutting down): its writes fail."""
        self._syncing = False
        return self._fail_sync(sync, PartitionClosed(f"{self.name} closed")) + self._start_sync()

    # ---- followers and the metadata -----------------------------------------------------------

    def fetched(
        self, replica_id: str, log_end_offset: int, leader_epoch: int, now: float, leader_time: float,
    ) -> tuple[bool, list[Action]]:
        """A follower's fetch (see ``IsrTracker.record_fetch``): whether it gets data, and what
        its echo of this leader's clock and its progress release."""
        leadership = self.leadership
        if leadership is None:
            return False, []
        recorded = leadership.tracker.record_fetch(replica_id, log_end_offset, leader_epoch, now, leader_time)
        actions = self._released(leadership, now)
        if recorded:
            actions += self._published(leadership)
        return recorded, actions

    def isr_request_done(self, request: IsrRequest, outcome: IsrOutcome, now: float) -> list[Action]:
        leadership = self.leadership
        if leadership is None or leadership.leader_epoch != request.leader_epoch:
            return []
        leadership.isr_request_done(request, outcome)
        return self._published(leadership) + self._released(leadership, now)

    def committed(self, hw: int) -> list[Action]:
        """``hw`` is published: the commits waiting for it. Asked for only then, so that those
        that writers asked for as their writes were acked (in the actions before) are among them."""
        leadership = self.leadership
        released = [] if leadership is None else leadership.acks.release(hw)
        return [Acknowledge(released)] if released else []

    # ---- internals ----------------------------------------------------------------------------

    def _pend_ids(self, records: list[Record], ids: Sequence[bytes | None] | None) -> None:
        if ids is not None and len(ids) != len(records):
            raise ValueError(f"{len(ids)} message ids for {len(records)} records")
        self._pending_starts.append(len(self._pending))
        if ids is not None and not self._pending_ids:
            self._pending_ids = [None] * len(self._pending)  # the groups before had no ids
        if ids is not None:
            self._pending_ids += ids
        elif self._pending_ids:
            self._pending_ids += [None] * len(records)

    def _deduplicated(
        self, leadership: Leadership, records: list[Record], ids: list[bytes | None], starts: list[int],
        tokens: dict[int, T], expecting: list[_Expecting[T]], now: float,
    ) -> list[Action]:
        """``flush`` when some records have ids: each group keeps only the records whose ids are
        new (neither in the window nor earlier in this flush); those are checked (encodable,
        expected offsets) and appended; a group's placement names each of its records' offsets,
        and a group that holds a duplicate of a refused record is refused alike."""
        groups, firsts_of_ids = _deduplicated_groups(self._window, records, ids, starts, tokens, expecting)
        self.duplicates += sum(len(group.places) - len(group.new) for group in groups)
        refusals = self._refusals(groups)
        appending: list[Record] = []
        firsts: dict[int, int] = {}
        for number, group in enumerate(groups):
            if group.new and number not in refusals:
                firsts[number] = self._log_end + len(appending)
                appending += group.new
        actions: list[Action] = []
        placed: list[tuple[Placement, T]] = []
        for number, group in enumerate(groups):
            if group.token is None:
                continue
            error = refusals.get(number)
            placement: Placement = firsts.get(number, 0)  # stored together, as without ids
            if len(group.new) < len(group.places):
                placement, unplaced = _offsets(group.places, firsts, refusals)
                error = error or unplaced
            if error is not None:
                actions.append(Fail([group.token], error))
            else:
                placed.append((placement, group.token))
        if appending:
            self._placed = placed
            self._remembering = [(key, firsts[owner] + index) for key, (owner, index) in firsts_of_ids.items()
                                 if owner in firsts]
            actions.append(Append(appending, leadership.leader_epoch))
        elif placed:
            actions += self._written_again(leadership, placed, now)
        return actions

    def _refusals(self, groups: list[_Group[T]]) -> dict[int, BaseException]:
        """The groups (by number) refused: holding a record the log cannot encode, or, under
        concurrency control, whose new records would not get the offsets they expect."""
        refusals: dict[int, BaseException] = {}
        for number, group in enumerate(groups):
            problem = next(filter(None, map(record_error, group.new)), None)
            if problem is not None:
                refusals[number] = ValueError(problem)
        if not self.concurrency_control:
            return refusals
        candidates = [number for number, group in enumerate(groups) if group.new and number not in refusals]
        expectations = [groups[number].expected or [NO_EXPECTATION] * len(groups[number].new) for number in candidates]
        for number, verdict, expected in zip(candidates, admitted(self._log_end, expectations), expectations):
            if not verdict:
                refusals[number] = IncorrectOffset(f"{self.name}: expected offsets {expected}, the log ends"
                                                   f" at {self._log_end} before this write")
        return refusals

    def _remembered(self, first_offset: int, log_end: int, now: float) -> list[tuple[Placement, T]]:
        """A deduplicating flush's Append is in the log: its new ids join the window."""
        if first_offset != self._log_end:
            raise AssertionError(f"{self.name}: an Append placed at {self._log_end} went to {first_offset}")
        placed, self._placed = self._placed or [], None
        remembering, self._remembering = self._remembering, []
        window = self._window
        if window is not None:
            for key, offset in remembering:
                window.remember(key, offset, now)
            window.expire(log_end, now)
        return placed

    def _written_again(self, leadership: Leadership, placed: list[tuple[Placement, T]], now: float) -> list[Action]:
        """Writes whose records were all written before: acked as a write at the log's end would
        be, after every write before them (their first copies among those)."""
        if self.sync_always:
            self._awaiting_sync += placed
            self._sync_due = True
            return self._start_sync()
        return self._written(leadership, placed, self._log_end, now)

    def _index_new_ids(self, records: list[Record]) -> None:
        """Key the ids of the Append's records by record: some may be refused before it is written."""
        run, self._new_id_run = self._new_id_run or [], None
        self._new_ids = {id(record): key for record, key in zip(records, run) if key is not None}
        self._appending_records = records

    def _remember_new_ids(self, first_offset: int, log_end: int, now: float) -> None:
        run, self._new_id_run = self._new_id_run, None
        new_ids, self._new_ids = self._new_ids, {}
        window = self._window
        if window is None:
            return
        if run is not None:
            window.remember_run(first_offset, run, now)
        else:
            for index, record in enumerate(self._appending_records):
                key = new_ids.get(id(record))
                if key is not None:
                    window.remember(key, first_offset + index, now)
        window.expire(log_end, now)

    def _taken_appending(self) -> list[tuple[Placement, T]]:
        """The writes of the Append being carried out, taken (for their tokens)."""
        self._new_ids, self._new_id_run = {}, None
        if self._placed is not None:
            taken, self._placed, self._remembering = self._placed, None, []
            return taken
        appending, self._appending = self._appending, []
        return list(appending)

    def _admitted(
        self, records: list[Record], expecting: list[_Expecting[T]], actions: list[Action]
    ) -> tuple[list[Record], list[tuple[int, T]]]:
        """The submitted groups whose expected offsets hold, in order, and their tokens; each
        refused group's refusal goes to ``actions``. Groups the log cannot encode are refused
        first: dropped after the check, they would move the offsets of those after them."""
        ends = [group.start for group in expecting[1:]] + [len(records)]
        candidates = []
        for group, end in zip(expecting, ends):
            run = records[group.start:end]
            problem = next(filter(None, map(record_error, run)), None)
            if problem is None:
                candidates.append((run, group))
            elif group.token is not None:
                actions.append(Fail([group.token], ValueError(problem)))
        verdicts = admitted(self._log_end, [group.expected or [NO_EXPECTATION] * len(run) for run, group in candidates])
        kept: list[Record] = []
        kept_tokens: list[tuple[int, T]] = []
        for (run, group), verdict in zip(candidates, verdicts):
            if verdict:
                if group.token is not None:
                    kept_tokens.append((len(kept), group.token))
                kept += run
            elif group.token is not None:
                actions.append(Fail([group.token], IncorrectOffset(
                    f"{self.name}: expected offsets {list(group.expected or [])},"
                    f" the log ends at {self._log_end + len(kept)}")))
        return kept, kept_tokens

    def _written(
        self, leadership: Leadership, written: list[tuple[Placement, T]], durable_end: int, now: float
    ) -> list[Action]:
        """Records written in ``leadership`` are in the log (on disk, under ``always``) up to
        ``durable_end``: tell their writers, let followers fetch them, and commit what the ISR
        already has. If that leadership ended meanwhile (even if a new one began), nothing is
        acked: the new leadership's followers may truncate these records."""
        if self.leadership is not leadership:
            error = NotLeader(f"{self.name} lost leadership before the write was durable")
            return [Fail([token for _, token in written], error)]
        actions: list[Action] = []
        if self._awaiting_lease or not leadership.holds_lease(now):
            # Another leader may have been elected meanwhile (this one was paused or cut off):
            # an ack now could name an offset the new one gives another message. The followers
            # notified below renew the lease with their next fetches, or fence this leader.
            self._awaiting_lease += written
        else:
            actions.append(Acknowledge(written))
        waiting = leadership.tracker.leader_appended(durable_end)
        if waiting:
            actions.append(Notify(waiting))
        return actions + self._published(leadership)

    def _released(self, leadership: Leadership, now: float) -> list[Action]:
        """The writes held for a lapsed lease, once it holds again."""
        if self._awaiting_lease and leadership.holds_lease(now):
            written, self._awaiting_lease = self._awaiting_lease, []
            return [Acknowledge(written)]
        return []

    def _published(self, leadership: Leadership) -> list[Action]:
        hw = leadership.tracker.hw
        if hw <= self._hw:
            return []
        self._hw = hw
        actions: list[Action] = [PublishHighWatermark(hw)]
        # Idle followers learn a new HW only by fetching: wake them, so readers of ISR replicas
        # see what is committed without waiting for an idle timeout.
        waiting = leadership.tracker.take_waiting()
        if waiting:
            actions.append(Notify(waiting))
        return actions

    def _start_sync(self) -> list[Action]:
        if self._syncing or not self._sync_due or self._failed:
            return []
        self._syncing, self._sync_due = True, False
        writes, self._awaiting_sync = self._awaiting_sync, []
        return [StartSync(self.leadership, writes, self._log_end)]

    def _fail_sync(self, sync: StartSync[T], error: BaseException) -> list[Action]:
        return [Fail([token for _, token in sync.writes], error)]

    def _fail_pending(self, error: BaseException) -> list[Action]:
        tokens = [] if self.leadership is None else [token for _, token in self.leadership.acks.fail_all()]
        tokens += [token for _, token in self._awaiting_lease + self._pending_tokens + self._awaiting_sync]
        self._pending, self._pending_tokens, self._awaiting_sync, self._awaiting_lease = [], [], [], []
        self._pending_expected, self._pending_ids, self._pending_starts = [], [], []
        self._window, self._new_ids, self._new_id_run = None, {}, None  # the next leadership rebuilds it
        return [Fail(tokens, error)] if tokens else []


@dataclass(slots=True)
class _Group(Generic[T]):
    """One submit of a deduplicating flush: its token, its records whose ids are new (and their
    expected offsets), and where each of its records is: a written message's offset, or
    (group number, index among that group's new records) for one appended by this flush."""

    token: T | None
    new: list[Record]
    expected: list[int] | None
    places: list[int | tuple[int, int]]


def _deduplicated_groups(
    window: DedupWindow | None, records: list[Record], ids: list[bytes | None], starts: list[int],
    tokens: dict[int, T], expecting: list[_Expecting[T]],
) -> tuple[list[_Group[T]], dict[bytes, tuple[int, int]]]:
    """The groups of a flush, and where the first record of each id new in it is."""
    expected_at = {group.start: group.expected for group in expecting}
    seen: dict[bytes, tuple[int, int]] = {}  # an id new in this flush: where its record is
    groups: list[_Group[T]] = []
    for number, (start, end) in enumerate(zip(starts, [*starts[1:], len(records)])):
        expected = expected_at.get(start)
        group: _Group[T] = _Group(tokens.get(start), [], None if expected is None else [], [])
        for index in range(start, end):
            key = ids[index]
            if key is not None:
                written = window.offset_of(key) if window is not None else None
                place: int | tuple[int, int] | None = written if written is not None else seen.get(key)
                if place is not None:
                    group.places.append(place)
                    continue
                seen[key] = (number, len(group.new))
            group.places.append((number, len(group.new)))
            group.new.append(records[index])
            if expected is not None and group.expected is not None:
                group.expected.append(expected[index - start])
        groups.append(group)
    return groups, seen


def _offsets(
    places: list[int | tuple[int, int]], firsts: dict[int, int], refusals: dict[int, BaseException],
) -> tuple[list[int], BaseException | None]:
    """A group's records' offsets, or the refusal of a group holding the first copy of one."""
    offsets = []
    for place in places:
        if isinstance(place, int):
            offsets.append(place)
        elif place[0] in refusals:
            return [], refusals[place[0]]
        else:
            offsets.append(firsts[place[0]] + place[1])
    return offsets, None


def _without_unencodable_groups(
    records: list[Record], tokens: list[tuple[int, T]]
) -> tuple[list[Record], list[tuple[int, T]], list[Action]]:
    """``records`` and ``tokens`` less the groups that hold a record the log cannot encode, and
    the refusals of the groups that have a token."""
    starts = [start for start, _ in tokens]
    groups = zip([0, *starts], [*starts, len(records)], [None, *(token for _, token in tokens)])
    kept: list[Record] = []
    kept_tokens: list[tuple[int, T]] = []
    refusals: list[Action] = []
    for start, end, token in groups:
        group = records[start:end]
        problem = next((p for p in map(record_error, group) if p), None)
        if problem is not None:
            log.warning("refusing a group of %d records: %s", len(group), problem)
            if token is not None:
                refusals.append(Fail([token], ValueError(problem)))
            continue
        if token is not None:
            kept_tokens.append((len(kept), token))
        kept += group
    return kept, kept_tokens, refusals
