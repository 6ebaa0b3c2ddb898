"""A follower's replication state machine (sans I/O).

One :class:`Follower` lives for one leader epoch of one partition: build a new one after a
restart and whenever the metadata names a new leader or leader epoch. It keeps its own model of
the replica's log (log end offset, epoch history, HW); every change it makes to that model is also
emitted as an action, which the shell must apply to the real log *in order* before feeding the
next event:

``TRUNCATING``
    :meth:`start` asks the leader for the end of the follower's latest epoch
    (:class:`SendEpochQuery`). Each answer (``epoch``, exclusive ``end_offset``) follows KIP-101/279:

    - the follower has ``epoch``: truncate to ``min(end_offset, its own end of that epoch)``
      and start fetching;
    - it lacks ``epoch``: truncate to the end of its own largest epoch below it and ask again
      for its (new) latest epoch; the asked epoch strictly decreases, so this terminates;
    - the leader knows no epoch <= the asked one (``end_offset < 0``), or the follower has no
      epoch <= the answered one: nothing of the follower's log can be proven to match the leader
      (every entry the leader holds is from a later epoch), so the follower truncates to its log
      start. This cannot remove a committed entry the leader still holds: the leader, elected
      from the ISR, holds that entry with its epoch, so it would have known an epoch <= asked.

    The follower's own HW is never used as a truncation point (Kafka's old rule, which loses
    acknowledged messages: scenario S1). A truncation below the HW (only possible after data loss
    on the leader side) lowers the HW and is flagged in :class:`Truncate`.

``FETCHING``
    :class:`SendFetch` asks for the follower's log end offset. A response is dropped when its
    leader epoch is not the expected one, when its first offset is below the follower's log end
    offset (stale), or when its offsets do not rise or its entries carry epochs that
    cannot follow the log (going backwards, or above the leader epoch). A valid response is
    appended (:class:`Append`, with the epochs it starts) and the HW becomes
    ``max(hw, min(leader hw, last offset))``. A response of the current epoch that starts past
    the follower's log end, at or below the leader's HW + 1, skips offsets the leader no longer
    has: compaction removed them (its log keeps gaps), or retention (its log starts there). The
    entries are appended after the gap, as Liftbridge's followers do; an epoch they begin starts
    where the gap does (it may have begun anywhere in it: the earlier start is the safe answer to
    epoch queries). A follower with an empty log (a new or wiped replica) restarts it at the
    response's first offset instead (:class:`RestartLog`), before the append. Above the leader's
    HW, neither can remove anything: such a gap is dropped.

``IDLE``
    After an empty valid response (caught up) the follower waits for a notification or
    ``max_idle_wait`` (:class:`WaitForData`, ``caught_up``); after a dropped response,
    ``retry_backoff``. A caught-up follower may be parked in a fetch session instead, whose
    answered rounds count as the leader's contact (:meth:`Follower.on_parked_contact`).
    Replication requests go to a subject that a zombie leader may still answer, so the shell
    should hand the follower every reply it gets for a request until its timeout: a valid reply
    is taken even while IDLE.

Failed requests: an epoch query or fetch that fails (no reply, no responder, "not the leader of
this epoch", a reply that cannot be read) is asked again after :class:`Pause`, which doubles with
each failure in a row (:func:`retry_pause`): the first retries stay short, for a leader elected a
moment ago, and the followers of a dead node do not flood the cluster. Any answer of the leader
resets it; so does a new leader or epoch (a new machine). A pause never runs past the time a silent
leader is due to be reported (unless it is a first pause): the failure of the request it holds back
reports it on time.

Leader timeout: when nothing valid came from the leader for more than ``leader_timeout``, the
follower emits :class:`ReportLeader` (to the metadata leader), then again at most once per
``leader_timeout``. ``max_idle_wait`` must be shorter than ``leader_timeout`` so that an idle
but healthy leader is never reported. Every fetch echoes the leader's clock reading from the
newest response that reset this timer: the leader learns that this follower cannot report it
before that reading plus the leader timeout (its lease, ``lease``).

Offsets: log end offset = the next offset (the wire's "newest offset" + 1); HW = last committed
offset, -1 for none.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from bascule.partition.log.epochs import EpochHistory

from .hw import clamp_high_watermark, follower_high_watermark

# The pause after a first failed request, doubled after each further one up to the cap: a quarter of
# the leader timeout, at most MAX_RETRY_PAUSE, so that a leader that answers again (or a new one) is
# asked well within a leader timeout.
FIRST_RETRY_PAUSE = 0.05
MAX_RETRY_PAUSE = 1.0


def retry_pause(failures: int, leader_timeout: float) -> float:
    """The pause before asking again after ``failures`` (>= 1) failed requests in a row."""
    cap = min(MAX_RETRY_PAUSE, leader_timeout / 4)
    # 2 ** 30 first pauses are past any cap; a bounded exponent keeps a long outage's count finite.
    return min(cap, FIRST_RETRY_PAUSE * 2.0 ** min(failures - 1, 30))


class FollowerState(enum.Enum):
    TRUNCATING = "truncating"
    FETCHING = "fetching"
    IDLE = "idle"


@dataclass(frozen=True, slots=True)
class FollowerConfig:
    leader_timeout: float = 15.0  # replica.max.leader.timeout
    max_idle_wait: float = 10.0  # replica.max.idle.wait
    retry_backoff: float = 0.5  # after a dropped response

    def __post_init__(self) -> None:
        if not 0 < self.max_idle_wait < self.leader_timeout:
            raise ValueError("max_idle_wait must be positive and shorter than leader_timeout")
        if self.retry_backoff < 0:
            raise ValueError("retry_backoff must be >= 0")


# -- actions --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SendEpochQuery:
    """Send LeaderEpochOffsetRequest(leaderEpoch=epoch) to the leader."""

    epoch: int


@dataclass(frozen=True, slots=True)
class Truncate:
    """Cut the log and the epoch history at ``end_offset`` (keep offsets < end_offset; history:
    ``truncate_from_end(end_offset)``). Emitted even when no entry goes, as it may drop an empty
    epoch this replica recorded as a leader."""

    end_offset: int
    below_high_watermark: bool = False


@dataclass(frozen=True, slots=True)
class RestartLog:
    """The leader's log starts after this replica's log end: empty the log (and its epoch history)
    and restart it at ``start_offset``, with the HW just below it."""

    start_offset: int


@dataclass(frozen=True, slots=True)
class SendFetch:
    """Send a replication request for ``offset`` onwards (wire ``offset`` field: offset - 1),
    echoing ``leader_time``, the leader's clock reading in the newest response taken (0: none)."""

    offset: int
    leader_epoch: int
    leader_time: float = 0.0


@dataclass(frozen=True, slots=True)
class Append:
    """Append the response's entries as received: ``count`` entries from ``first_offset``;
    ``epoch_starts`` lists the (epoch, start offset) pairs they add to the epoch history."""

    first_offset: int
    count: int
    epoch_starts: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class SetHighWatermark:
    hw: int


@dataclass(frozen=True, slots=True)
class WaitForData:
    """Wait for a partition notification (call :meth:`Follower.on_notify`) or until ``until``
    (call :meth:`Follower.tick`). ``caught_up``: after an empty reply, not a back-off: the shell
    may park the partition in a fetch session instead (see :meth:`Follower.on_parked_contact`)."""

    until: float
    caught_up: bool = False


@dataclass(frozen=True, slots=True)
class Pause:
    """Wait until ``until`` before the next action (a failed request asked again); a notification
    does not end it."""

    until: float


@dataclass(frozen=True, slots=True)
class ReportLeader:
    """Tell the metadata leader that ``leader_id`` (in ``leader_epoch``) looks dead."""

    leader_id: str
    leader_epoch: int


Action = (
    SendEpochQuery | Truncate | RestartLog | SendFetch | Append | SetHighWatermark | WaitForData | Pause
    | ReportLeader
)


class Follower:
    def __init__(
        self,
        replica_id: str,
        leader_id: str,
        leader_epoch: int,
        history: EpochHistory,
        log_end_offset: int,
        hw: int,
        now: float,
        *,
        log_start_offset: int = 0,
        config: FollowerConfig = FollowerConfig(),
    ) -> None:
        if log_end_offset < log_start_offset:
            raise ValueError("log end offset below log start offset")
        self.replica_id = replica_id
        self.leader_id = leader_id
        self.leader_epoch = leader_epoch
        self.history = EpochHistory(history.entries)  # own model; the shell mirrors the actions
        self.log_end_offset = log_end_offset
        self.log_start_offset = log_start_offset
        self.hw = clamp_high_watermark(hw, log_end_offset)
        self.config = config
        self.state = FollowerState.TRUNCATING
        self._asked_epoch: int | None = None
        self._idle_until: float | None = None
        self._last_contact = now
        self._last_report: float | None = None
        self._failures = 0  # failed requests since the leader last answered: how long the next pause is
        # The leader's clock reading in the newest response that counted as contact: echoed in
        # every fetch, it tells the leader how long this follower cannot report it (its lease).
        self._leader_time = 0.0

    # -- events -----------------------------------------------------------------------------

    def start(self) -> list[Action]:
        """First actions: the epoch query, or straight to fetching when there is no epoch to
        check (an empty history; any entry without an epoch is cut, as nothing vouches for it)."""
        if self.state is not FollowerState.TRUNCATING or self._asked_epoch is not None:
            return []
        if self.history.latest_epoch < 0:
            return self._finish_truncation(self.log_start_offset)
        self._asked_epoch = self.history.latest_epoch
        return [SendEpochQuery(self._asked_epoch)]

    def on_epoch_answer(self, epoch: int, end_offset: int, now: float) -> list[Action]:
        """The leader's answer: its largest epoch <= the asked one and that epoch's exclusive end
        offset. ``end_offset < 0`` (or ``epoch < 0``) means it knows no such epoch."""
        asked = self._asked_epoch
        if self.state is not FollowerState.TRUNCATING or asked is None:
            return []
        self._heard(now)
        if end_offset < 0 or epoch < 0:
            return self._finish_truncation(self.log_start_offset)
        if epoch > asked:  # not an answer to this question: ask again
            return [SendEpochQuery(asked)]
        own_epoch, own_end = self.history.end_offset_for(epoch, self.log_end_offset)
        if own_epoch == epoch:
            return self._finish_truncation(min(end_offset, own_end))
        if own_epoch < 0:
            return self._finish_truncation(self.log_start_offset)
        # The leader's epoch is unknown here: cut what this replica wrote after its own largest
        # smaller epoch, then ask about that one.
        actions = self._truncate(min(own_end, self.log_end_offset))
        if self.history.latest_epoch < 0:
            return actions + self._finish_truncation(self.log_end_offset)
        self._asked_epoch = self.history.latest_epoch
        actions.append(SendEpochQuery(self._asked_epoch))
        return actions

    def on_epoch_query_failed(self, now: float) -> list[Action]:
        """The epoch query timed out or failed: ask again after a pause (and maybe report the leader)."""
        if self.state is not FollowerState.TRUNCATING or self._asked_epoch is None:
            return []
        return self._after_failure(now, SendEpochQuery(self._asked_epoch))

    def on_replicate(
        self,
        leader_epoch: int,
        leader_hw: int,
        entries: Sequence[tuple[int, int]],
        now: float,
        leader_time: float = 0.0,
    ) -> list[Action]:
        """A replication response: the leader's epoch and HW, and (offset, epoch) of each entry
        it carries, in order; ``leader_time``, the leader's clock reading in it (0: none).

        Judged on its content, not on its timing: a valid response is taken while FETCHING or
        IDLE (a second reply to the same request, e.g. the real leader's after a zombie's), an
        invalid one is dropped, and only while FETCHING does a drop lead to a new request.
        """
        if self.state is FollowerState.TRUNCATING:
            return []
        fetching = self.state is FollowerState.FETCHING
        if leader_epoch != self.leader_epoch:
            return self._back_off(now) if fetching else []
        if not entries:
            self._heard(now, leader_time)
            actions = self._update_hw(leader_hw)
            self.state = FollowerState.IDLE
            self._idle_until = now + self.config.max_idle_wait
            return actions + [WaitForData(self._idle_until, caught_up=True)]
        first_offset = entries[0][0]
        # Past this log's end: the leader has nothing at this log's end (compaction or retention
        # removed it; neither passes the leader's HW, so a gap above it is no such answer).
        gap = first_offset > self.log_end_offset and leader_hw >= first_offset - 1
        if first_offset < self.log_end_offset or (first_offset > self.log_end_offset and not gap):
            # stale (a reply to an earlier request) or a gap; the leader did answer, though
            self._heard(now, leader_time)
            return [self._fetch()] if fetching else []
        restart = gap and self.log_end_offset == self.log_start_offset
        actions = [self._restart_log(first_offset)] if restart else []
        epoch_starts = self._epoch_starts(entries)
        if epoch_starts is None:
            return actions + (self._back_off(now) if fetching else [])
        self._heard(now, leader_time)
        for epoch, start in epoch_starts:
            self.history.assign(epoch, start)
        self.log_end_offset = entries[-1][0] + 1
        actions.append(Append(first_offset, len(entries), tuple(epoch_starts)))
        actions += self._update_hw(leader_hw)
        actions.append(self._fetch())
        return actions

    def on_fetch_failed(self, now: float) -> list[Action]:
        """The replication request timed out or failed: fetch again after a pause (and maybe report)."""
        if self.state is not FollowerState.FETCHING:
            return []
        return self._after_failure(now, self._fetch())

    def on_parked_contact(self, heard_at: float, leader_time: float) -> None:
        """While parked (IDLE), a fetch session's round carrying this partition was answered at
        ``heard_at`` with nothing for it: the leader lives, as an empty reply would have said."""
        if self.state is not FollowerState.IDLE:
            return
        self._last_contact = max(self._last_contact, heard_at)
        self._leader_time = max(self._leader_time, leader_time)

    def on_notify(self, now: float) -> list[Action]:
        """The leader announced new data: stop waiting."""
        if self.state is not FollowerState.IDLE:
            return []
        return [self._fetch()]

    def tick(self, now: float) -> list[Action]:
        """Time passed: end an idle wait that expired; report a silent leader."""
        actions = self._check_leader(now)
        if self.state is FollowerState.IDLE and self._idle_until is not None and now >= self._idle_until:
            actions.append(self._fetch())
        return actions

    def next_deadline(self) -> float:
        """When :meth:`tick` has something to do at the latest."""
        deadline = self._report_due()
        if self.state is FollowerState.IDLE and self._idle_until is not None:
            deadline = min(deadline, self._idle_until)
        return deadline

    # -- internals --------------------------------------------------------------------------

    def _finish_truncation(self, end_offset: int) -> list[Action]:
        end_offset = max(self.log_start_offset, min(end_offset, self.log_end_offset))
        actions = self._truncate(end_offset)
        self._asked_epoch = None
        actions.append(self._fetch())
        return actions

    def _truncate(self, end_offset: int) -> list[Action]:
        self.history.truncate_from_end(end_offset)
        self.log_end_offset = end_offset
        new_hw = clamp_high_watermark(self.hw, end_offset)
        below = new_hw < self.hw
        actions: list[Action] = [Truncate(end_offset, below)]
        if below:
            self.hw = new_hw
            actions.append(SetHighWatermark(new_hw))
        return actions

    def _heard(self, now: float, leader_time: float = 0.0) -> None:
        self._last_contact = now
        self._leader_time = max(self._leader_time, leader_time)
        self._failures = 0

    def _after_failure(self, now: float, request: SendEpochQuery | SendFetch) -> list[Action]:
        """Report a silent leader, then ask again after a pause that grows with each failure in a
        row, and ends by the next report's due time (the request's failure then reports on time)."""
        self._failures += 1
        actions = self._check_leader(now)
        timeout = self.config.leader_timeout
        # Never cut below a first pause: a failure at the due instant itself (not yet past it) would
        # otherwise be asked again at once, and on virtual time at that same instant, forever.
        due = max(self._report_due(), now + retry_pause(1, timeout))
        return actions + [Pause(min(now + retry_pause(self._failures, timeout), due)), request]

    def _fetch(self) -> SendFetch:
        self.state = FollowerState.FETCHING
        self._idle_until = None
        return SendFetch(self.log_end_offset, self.leader_epoch, self._leader_time)

    def _back_off(self, now: float) -> list[Action]:
        self.state = FollowerState.IDLE
        self._idle_until = now + self.config.retry_backoff
        return [WaitForData(self._idle_until)]

    def _update_hw(self, leader_hw: int) -> list[Action]:
        new_hw = follower_high_watermark(self.hw, leader_hw, self.log_end_offset)
        if new_hw == self.hw:
            return []
        self.hw = new_hw
        return [SetHighWatermark(new_hw)]

    def _restart_log(self, start_offset: int) -> RestartLog:
        self.history.truncate_from_end(0)
        self.log_start_offset = self.log_end_offset = start_offset
        self.hw = start_offset - 1
        return RestartLog(start_offset)

    def _epoch_starts(self, entries: Sequence[tuple[int, int]]) -> list[tuple[int, int]] | None:
        """New (epoch, start) pairs of a batch, or None when it cannot follow this log. An epoch
        that begins after a gap starts where the gap does."""
        starts: list[tuple[int, int]] = []
        latest = self.history.latest_epoch
        expected = self.log_end_offset
        for offset, epoch in entries:
            if offset < expected or epoch < 0 or epoch > self.leader_epoch or epoch < latest:
                return None
            if epoch > latest:
                starts.append((epoch, expected))
                latest = epoch
            expected = offset + 1
        return starts

    def _report_due(self) -> float:
        """When a silent leader is reported (again) at the earliest."""
        due = self._last_contact + self.config.leader_timeout
        if self._last_report is not None:
            due = max(due, self._last_report + self.config.leader_timeout)
        return due

    def _check_leader(self, now: float) -> list[Action]:
        timeout = self.config.leader_timeout
        if now - self._last_contact <= timeout:
            return []
        if self._last_report is not None and now - self._last_report < timeout:
            return []
        self._last_report = now
        return [ReportLeader(self.leader_id, self.leader_epoch)]
