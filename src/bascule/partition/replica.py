"""A partition replica on this node: its log, its role, and the waits built on them.

This is the shell around the commit log and the pure replication rules. As leader, it applies
the actions of the pure ``Leader`` machine, which decides what is appended, synced, acked and
failed: messages arrive in bursts (one NATS callback each); they are gathered and appended once
per event-loop turn, so one write, and under the ``always`` sync policy one fsync, covers the
whole burst. What the replica still does itself: the I/O (appends, syncs in a thread,
checkpoints, reads), sealing an encrypted stream's values, the clock, calling the outcomes,
waking readers and followers, and the counters. As follower, the log changes only through the
actions of the pure ``Follower`` machine, applied by the follower loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial

from bascule.partition.encryption import EncryptionUnavailable, Values, opening, sealed_records
from bascule.partition.log import LogFailed, PartitionLog
from bascule.partition.replication.dedup import DedupLimits, DedupWindow
from bascule.partition.replication.isr import IsrTracker
from bascule.partition.replication.leader import (
    Acknowledge,
    Action,
    Append,
    Fail,
    Failed,
    IsrOutcome,
    IsrRequest,
    Leader,
    Leadership,
    Notify,
    NotLeader,
    PartitionClosed,
    Placement,
    PublishHighWatermark,
    ReplicaFailed,
    StartSync,
    StepDown,
)
from bascule.partition.replication.session import has_news
from bascule.wire.dedup import MESSAGE_ID_HEADER, stored_message_ids, window_key, window_keys
from bascule.wire.entry import CorruptEntry, Entry, EntryWalk, Record, WalkedEntry, stored_prefix


@dataclass
class EventTimes:
    """Liftbridge's partition event timestamps: the first and latest time (ns since the epoch, 0:
    never) something happened to this replica since it opened, as FetchPartitionMetadata shows."""

    first: int = 0
    latest: int = 0

    def happened(self) -> None:
        self.latest = time.time_ns()
        self.first = self.first or self.latest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SyncPolicy:
    """When message data reaches the disk: never (page cache only), on an interval, or before acks."""

    always: bool = False
    interval: float = 0.0  # seconds, 0 = no periodic sync

    @classmethod
    def parse(cls, value: str | float) -> SyncPolicy:
        if value == "always":
            return cls(always=True)
        if value in ("never", "", 0, None):
            return cls()
        return cls(interval=float(value))


# Told the outcome of a write or of a commit: (offset, None) on success, (None, error) otherwise.
# Callbacks instead of futures, because capture asks for one per acked message.
Outcome = Callable[[int | None, BaseException | None], None]
# Told the outcome of a submit: (its records' placement, None), or (None, error).
WriteOutcome = Callable[[Placement | None, BaseException | None], None]
NO_DEDUP = DedupLimits(0, 0)
# How many bytes of entries at a time a new leader reads to rebuild its deduplication window.
_RECENT_IDS_CHUNK_BYTES = 1 << 20
_ID_HEADER_NAME = MESSAGE_ID_HEADER.encode()


def placed_offsets(placement: Placement, count: int) -> Sequence[int]:
    """The offsets of a submit's ``count`` records, from its placement."""
    return range(placement, placement + count) if isinstance(placement, int) else placement


class PartitionReplica:
    def __init__(
        self,
        stream: str,
        partition: int,
        commit_log: PartitionLog,
        sync_policy: SyncPolicy,
        clock: Callable[[], float],
        notify_followers: Callable[[PartitionReplica, list[str]], None] = lambda *_: None,
        concurrency_control: bool = False,
        values: Values | None = None,
        dedup: DedupLimits = NO_DEDUP,
    ) -> None:
        self.stream = stream
        self.partition = partition
        self.log = commit_log
        self.sync_policy = sync_policy
        self.clock = clock
        self.leader_epoch = -1
        self.leader = ""
        self.paused = False
        self.readonly = False
        self.last_activity = clock()  # last append or leadership change, for auto-pause
        self.readers = 0  # open subscriptions, for auto-pause's "not while subscribed"
        self.received, self.pause_changes, self.readonly_changes = EventTimes(), EventTimes(), EventTimes()
        # For the metrics endpoint: plain integers, as they count on the message paths. The log counts
        # what is appended; what subscribers and followers get is counted where it is sent.
        self.messages_to_subscribers = self.bytes_to_subscribers = 0
        self.messages_to_followers = self.bytes_to_followers = 0
        self.isr_shrinks = self.isr_expansions = 0  # members the ISR lost or gained while this replica led
        self._flags_known = False  # the first flags are the state it opened in, not a change
        self._notify_followers = notify_followers
        # Liftbridge's optimistic concurrency control: appends check the offsets publishers expect.
        self.concurrency_control = concurrency_control
        self.dedup = dedup  # the deduplication window's bounds, rebuilt from the log's tail as it leads
        self._leader: Leader[WriteOutcome] = Leader(
            f"{stream}/{partition}", sync_always=sync_policy.always, concurrency_control=concurrency_control
        )
        # An encrypted stream's: values are sealed as this replica appends them as leader, and
        # opened for its readers; followers store and serve the leader's sealed bytes as they are.
        self.values = values
        self._flush_scheduled = False
        self._checkpointing = False  # a checkpoint of new epochs is being written
        self._data_changed = asyncio.Event()
        self._closed = False
        self._files_closed = False
        self._failure: BaseException | None = None  # a sync that failed other than by LogFailed
        self._failure_reported = False
        self.writes_failing = False  # the last append as leader failed on the disk (a full disk, say)
        # Looked up once: asyncio.get_running_loop() costs about half a microsecond, per message here.
        self._loop = asyncio.get_running_loop()

    @property
    def leadership(self) -> Leadership | None:
        """Set while this replica leads."""
        return self._leader.leadership

    @property
    def fenced_epoch(self) -> int:
        """A newer leader epoch seen in a follower's request, -1 before any."""
        return self._leader.fenced_epoch

    @property
    def is_leader(self) -> bool:
        return self.leadership is not None

    @property
    def duplicates(self) -> int:
        """Messages this replica did not store again as leader: copies within the deduplication window."""
        return self._leader.duplicates

    @property
    def acks_held(self) -> int:
        """Writes stored as leader whose acks wait for the lease (see ``Leadership.holds_lease``)."""
        return self._leader.acks_held

    @property
    def high_watermark(self) -> int:
        return self.log.high_watermark

    @property
    def oldest_offset(self) -> int:
        return self.log.oldest_offset

    @property
    def newest_offset(self) -> int:
        return self.log.newest_offset

    def offset_for_timestamp(self, timestamp_ns: int) -> int:
        """The first offset whose timestamp is at or after ``timestamp_ns``; the log's end if none is."""
        return self.log.offset_for_timestamp(timestamp_ns)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def failed(self) -> BaseException | None:
        """Why this replica takes no more writes, None while it is sound: its log's LogFailed (an
        fsync failed, or a failed write could not be undone), or whatever else a sync raised.
        A failed replica has failed every write not yet acknowledged and stopped leading; what
        to do with it (close it, leave the ISR) is the node's decision."""
        return self._failure or self.log.failure

    def _failed_error(self) -> ReplicaFailed:
        cause = self.failed
        error = ReplicaFailed(f"{self.stream}/{self.partition} failed and takes no more writes: {cause}")
        error.__cause__ = cause
        return error

    def _fail(self, error: BaseException) -> None:
        """Stop for good after a failed sync or a failed log: fail every write and ack waiting,
        and stop leading (followers then get nothing and report this leader). Nothing written
        since the last good fsync may ever be acknowledged: a later fsync that succeeds does not
        prove the pages the failed one could not write ever reach the disk."""
        if self.failed is None:
            self._failure = error  # a LogFailed is the log's failure already
        if not self._failure_reported:
            self._failure_reported = True
            log.error("%s/%s failed, it takes no more writes and stops leading: %s",
                      self.stream, self.partition, error)
        self._apply(self._leader.fail(self._failed_error()))
        self._wake_readers()

    # ---- roles -------------------------------------------------------------------------------

    @property
    def tracker(self) -> IsrTracker | None:
        return None if self.leadership is None else self.leadership.tracker

    def become_leader(
        self, leader_id: str, leader_epoch: int, partition_epoch: int, replicas: Iterable[str],
        isr: Iterable[str], min_isr: int, max_lag_time: float, leader_timeout: float, unclean: Iterable[str] = (),
    ) -> None:
        """Lead ``leader_epoch``; the same epoch again only takes the metadata's new ISR (and its
        ``unclean`` members) and min ISR. ``leader_timeout``: the followers' (how long one waits
        before reporting this leader)."""
        if self.failed is not None:
            raise self._failed_error()
        if leader_epoch <= self.fenced_epoch:
            return  # this node's metadata is behind: a follower already follows a newer leader
        now = self.clock()
        if self.leadership is not None and self.leader_epoch == leader_epoch:
            tracker = self.leadership.tracker
            isr_before = tracker.isr
            self._apply(self._leader.metadata_changed(isr, partition_epoch, min_isr, now, unclean))
            self.isr_shrinks += len(isr_before - tracker.isr)
            self.isr_expansions += len(tracker.isr - isr_before)
            return
        if self.leadership is not None:
            self.become_follower("", self.leader_epoch)
        self.last_activity = now
        self.leader, self.leader_epoch = leader_id, leader_epoch
        self._apply(self._leader.lead(
            leader_id, leader_epoch, partition_epoch, replicas, isr, history=self.log.epochs,
            log_end_offset=self.log.next_offset, hw=self.log.high_watermark,
            min_isr=min_isr, max_lag_time=max_lag_time, leader_timeout=leader_timeout, now=now, unclean=unclean,
            dedup=DedupWindow(self.dedup, recent_ids(self.log, self.dedup, now)) if self.dedup.enabled else None,
        ))
        self._wake_readers()
        self._checkpoint_new_epochs()

    def fence(self, requested_epoch: int) -> None:
        """A follower asked with ``requested_epoch``: stop writing now if the leadership says so,
        before this node's metadata catches up, so no write is acknowledged in a dead epoch."""
        actions = self._leader.fence(requested_epoch)
        if actions:
            self._apply(actions)
            self.leader = ""
            self._wake_readers()

    def serves_epoch(self, leader_epoch: int) -> bool:
        """Whether this replica answers a follower's request (a fetch, a fetch session's item, an
        epoch query) made in ``leader_epoch``: it fences first (a newer epoch ends its leadership
        at once), and only the leader of exactly that epoch answers, so that a deposed leader, or a
        follower of another epoch, gets nothing from it."""
        leadership = self.leadership
        if leadership is not None and leadership.leader_epoch == leader_epoch:
            return True  # only a newer epoch fences
        self.fence(leader_epoch)
        return False

    def become_follower(self, leader_id: str, leader_epoch: int) -> None:
        self._apply(self._leader.step_down())
        self.leader, self.leader_epoch = leader_id, leader_epoch
        self._wake_readers()

    def set_flags(self, paused: bool, readonly: bool) -> None:
        if self._flags_known:
            if paused != self.paused:
                self.pause_changes.happened()
            if readonly != self.readonly:
                self.readonly_changes.happened()
        self._flags_known = True
        if (paused, readonly) != (self.paused, self.readonly):
            self.paused, self.readonly = paused, readonly
            self._wake_readers()

    # ---- leader: appends, fetches, acks -------------------------------------------------------

    def submit(
        self, records: list[Record], on_written: WriteOutcome | None = None, linger: float = 0.0,
        expected: Sequence[int] | None = None, ids: Sequence[bytes | None] | None = None,
    ) -> None:
        """Queue records for this turn's append (or, with ``linger``, for an append that many
        records arriving one per turn share); ``on_written`` learns their placement (see
        ``placed_offsets``) once all are written (and synced, under the ``always`` policy).
        ``ids``: each record's message id (``wire.dedup.message_id``, None: none): under
        deduplication, a record whose id was written within the window is not written again, and
        its placement is the first copy's offset. A burst of captured
        messages is one group with one outcome: a callback per message costs more than its append.
        ``expected``: the offset each record's publisher expects it to get (NO_EXPECTATION: any),
        checked under concurrency control, where these records are appended all or none
        (``on_written`` gets IncorrectOffset when they are not) and ignored otherwise."""
        if self._closed:
            raise PartitionClosed(f"{self.stream}/{self.partition} is closed")
        if self.failed is not None:
            raise self._failed_error()
        leader = self._leader
        if leader.leadership is None:
            raise NotLeader(f"not the leader of {self.stream}/{self.partition}")
        leader.submit(records, on_written, expected, ids and window_keys(ids))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            if linger:
                self._loop.call_later(linger, self._flush)
            else:
                self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        self._apply(self._leader.flush(self.clock()))

    def _apply(self, actions: list[Action]) -> None:
        """Carry out the Leader machine's actions, in order (those of every write first)."""
        for action in actions:
            if isinstance(action, Acknowledge):
                for offset, on_written in action.writes:
                    on_written(offset, None)
            elif isinstance(action, PublishHighWatermark):
                self.log.high_watermark = action.hw
                self._apply(self._leader.committed(action.hw))
                self._wake_readers()
            elif isinstance(action, Append):
                self._append(action)
            elif isinstance(action, StartSync):
                self._start_sync(action)
            elif isinstance(action, Notify):
                self._notify_followers(self, action.followers)
            elif isinstance(action, Fail):
                for on_written in action.tokens:
                    on_written(None, action.error)
            elif isinstance(action, StepDown):
                log.warning("%s/%s: a follower follows leader epoch %d, this leader has %d: stepping down",
                            self.stream, self.partition, action.epoch, self.leader_epoch)
            elif isinstance(action, Failed):
                self._fail(action.cause)

    def _append(self, append: Append) -> None:
        records = append.records
        if self.values is not None:
            try:
                records = sealed_records(self.values, records)
            except EncryptionUnavailable as exc:  # nothing is stored unsealed: these writes fail
                log.warning("%s/%s: refusing %d messages: %s", self.stream, self.partition, len(records), exc)
                self._apply(self._leader.append_failed(exc))
                return
        try:
            try:
                first, _ = self.log.append(records, append.leader_epoch)
            except ValueError:
                # A record the log cannot encode fails its own group, not the others of this
                # append (the log is as it was).
                refusals, retry = self._leader.unencodable(records)
                self._apply(refusals)
                if retry is None:
                    return
                first, _ = self.log.append(retry.records, retry.leader_epoch)
        except LogFailed as exc:
            self._apply(self._leader.log_failed(exc))
            return
        except Exception as exc:
            # The log is as it was (a full disk, say): these writes failed, later ones may not.
            log.exception("append to %s/%s failed", self.stream, self.partition)
            self.writes_failing = isinstance(exc, OSError)
            self._apply(self._leader.append_failed(exc))
            return
        self.writes_failing = False
        self.last_activity = self.clock()
        self.received.happened()
        self._apply(self._leader.appended(first, self.log.next_offset, self.last_activity))

    def _start_sync(self, sync: StartSync) -> None:
        """Group commit: one fsync, in a thread, covers everything written before it started."""
        try:
            job = self._loop.run_in_executor(None, self.log.begin_sync())
        except Exception as exc:  # the log failed already (LogFailed): the same path as a failed fsync
            job = self._loop.create_future()
            job.set_exception(exc)
        job.add_done_callback(partial(self._synced, sync))

    def _synced(self, sync: StartSync, job: asyncio.Future) -> None:
        if job.cancelled():
            self._apply(self._leader.sync_cancelled(sync))
        elif (error := job.exception()) is not None:
            self._apply(self._leader.sync_failed(sync, error))
        else:
            self._apply(self._leader.synced(sync, self.clock()))

    def serve_fetch(
        self, replica_id: str, log_end_offset: int, leader_epoch: int, max_bytes: int, leader_time: float = 0.0
    ) -> bytes:
        """Entries for a follower that has everything below ``log_end_offset``; b"" when caught up
        or when the request is not one this leadership serves (wrong epoch, unknown replica).
        ``leader_time``: this leader's clock reading the follower echoes (see ``lease``)."""
        leadership = self.leadership
        if leadership is None:
            return b""
        tracker = leadership.tracker
        asked_again = tracker.asks_again(replica_id, log_end_offset)
        fetched_before = _fetched_from(tracker, replica_id)
        recorded, actions = self._leader.fetched(replica_id, log_end_offset, leader_epoch, self.clock(), leader_time)
        if recorded and fetched_before is not None and log_end_offset > fetched_before:
            self.messages_to_followers += log_end_offset - fetched_before
        self._apply(actions)
        if not recorded:
            return b""
        # Only what is durable here (under ``always``) goes to followers: a follower never gets
        # ahead of what this leader counts as its own log end.
        # A follower below this log's start (retention, or its disk was wiped) gets the entries
        # from the start: the gap tells it to restart its log there.
        start = max(log_end_offset, self.log.oldest_offset)
        available = tracker.leader_log_end - start
        if available <= 0:
            return b""
        # Followers check every entry's CRC as they receive it: no need to check here too, unless
        # a follower asks again for what it was sent, which is what it does when the entry there
        # was damaged. The checked read then raises CorruptEntry and the log records the damage.
        return self.log.read_raw(start, max_bytes, check_crc=asked_again, max_entries=available)

    def serve_parked(
        self, replica_id: str, log_end_offset: int, follower_hw: int, leader_epoch: int, leader_time: float
    ) -> bool:
        """A parked follower's fetch, one item of a fetch session's round: recorded as
        ``serve_fetch`` records it (the ISR's view, the lease), nothing read. True when the
        follower must fetch on its own now: news (``has_news``), or a fetch this leadership
        does not take (another epoch, an unknown replica), which its own fetch will find out."""
        leadership = self.leadership
        if leadership is None:
            return True
        recorded, actions = self._leader.fetched(replica_id, log_end_offset, leader_epoch, self.clock(), leader_time)
        self._apply(actions)
        return not recorded or has_news(
            log_end_offset, follower_hw, leadership.tracker.leader_log_end, self.high_watermark,
            self.log.oldest_offset,
        )

    def epoch_end(self, epoch: int) -> tuple[int, int]:
        """The (epoch, exclusive end offset) answer to a follower's leader-epoch query."""
        return self.log.epochs.end_offset_for(epoch, self.log.next_offset)

    def idle_for(self) -> float:
        """Seconds since the last append (or since leadership began)."""
        return self.clock() - self.last_activity

    def isr_requests(self) -> list[IsrRequest]:
        """The ISR changes this leader asks for now (see ``Leadership.isr_requests``)."""
        return [] if self.leadership is None else self.leadership.isr_requests(self.clock())

    def isr_request_done(self, request: IsrRequest, outcome: IsrOutcome) -> None:
        self._apply(self._leader.isr_request_done(request, outcome, self.clock()))

    def position(self) -> tuple[int, int]:
        """(epoch of the last entry or -1, log end offset): what elections compare. A log with
        damage holds only what precedes it: it must not win an election over a whole one."""
        end = self.log.next_offset
        if self.log.damaged_from is not None:
            end = min(end, self.log.damaged_from)
        return (self.log.epochs.epoch_at(end - 1) if end else -1), end

    def when_committed(self, offset: int, on_committed: Outcome) -> None:
        """Call ``on_committed(offset, None)`` once ``offset`` is committed, or (None, error) if
        leadership is lost first."""
        if offset <= self.log.high_watermark:
            on_committed(offset, None)
        elif self.failed is not None:
            on_committed(None, self._failed_error())
        elif self.leadership is None:
            on_committed(None, NotLeader(f"not the leader of {self.stream}/{self.partition}"))
        else:
            self.leadership.acks.add(offset, on_committed)

    # ---- follower: applying the Follower machine's actions -------------------------------------

    def append_replicated(self, data: bytes, walked: list[WalkedEntry]) -> None:
        """Raises LogFailed once the log failed (the follower loop then stops)."""
        self.log.append_raw(data, walked)
        self._checkpoint_new_epochs()

    def truncate(self, end_offset: int) -> None:
        self.log.truncate(end_offset)
        self._wake_readers()

    def cut_damage(self) -> int | None:
        """As a follower: truncate the log at its first damaged entry, if it still holds one,
        so that the damaged entry and everything after it are fetched again from the leader.
        Returns the offset cut at, None if there was nothing to cut."""
        damaged = self.log.damaged_from
        if damaged is None or damaged >= self.log.next_offset:
            return None
        log.warning("%s/%s: cutting the log at its damaged entry %d to fetch it again from the leader",
                    self.stream, self.partition, damaged)
        self.truncate(damaged)
        return damaged

    def restart_log(self, start_offset: int) -> None:
        self.log.restart_at(start_offset)
        self._wake_readers()

    def set_high_watermark(self, hw: int) -> None:
        """A follower's HW, as its Follower machine computed it (it may go down after a truncation)."""
        if hw != self.log.high_watermark:
            self.log.high_watermark = hw
            self._wake_readers()

    # ---- readers -----------------------------------------------------------------------------

    def _wake_readers(self) -> None:
        self._data_changed.set()
        self._data_changed = asyncio.Event()

    async def wait_for_data(self, timeout: float | None = None) -> None:
        """Wait until the HW moves, the partition changes role or flags, or it closes."""
        event = self._data_changed
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            pass

    def read_committed(self, offset: int, max_entries: int) -> list[Entry]:
        """Committed entries from ``offset``, their values opened (an encrypted stream's)."""
        hw = self.log.high_watermark
        if offset > hw:
            return []
        entries = self.log.read(offset, max_entries=min(max_entries, hw - offset + 1))
        if self.values is not None:
            for entry in entries:
                entry.value = self.values.open(entry.value)
        return entries

    def read_committed_through(
        self, offset: int, max_bytes: int, last: int | None = None, walk: EntryWalk = stored_prefix
    ) -> tuple[bytes, int]:
        """What ``walk`` makes of the committed entries from ``offset`` up to ``last`` (checked as
        it walks them; their stored bytes by default), and how many they are; (b"", 0) when none.
        An encrypted stream's entries reach ``walk`` with their values opened: EncryptionUnavailable
        on a node without the key, DecryptionFailed at a value that does not open."""
        until = self.log.high_watermark if last is None else min(last, self.log.high_watermark)
        if offset > until:
            return b"", 0
        if self.values is not None:
            walk = opening(self.values, walk)
        return self.log.read_through(offset, max_bytes, until - offset + 1, walk)

    async def sync(self) -> None:
        """fsync the log in a thread (the ``interval`` sync policy); a failure fails the replica
        and raises ReplicaFailed."""
        if self.failed is not None:
            raise self._failed_error()
        try:
            await self._loop.run_in_executor(None, self.log.begin_sync())
        except LogFailed as exc:
            self._fail(exc)
            raise self._failed_error() from exc

    async def checkpoint(self) -> None:
        """Write the HW and epoch checkpoints in a thread, those that changed since the last ones."""
        write = self.log.begin_checkpoint()
        if write is not None:
            await self._loop.run_in_executor(None, write)

    def _checkpoint_new_epochs(self) -> None:
        """Checkpoint a changed epoch history soon, in a thread, rather than at the next periodic
        checkpoint: the shorter the checkpoint lags, the less of the log the next open reads."""
        if self._checkpointing or not self.log.epochs_changed:
            return
        write = self.log.begin_checkpoint()
        if write is None:
            return
        self._checkpointing = True
        self._loop.run_in_executor(None, write).add_done_callback(self._checkpointed)

    def _checkpointed(self, job: asyncio.Future) -> None:
        self._checkpointing = False
        if not job.cancelled() and job.exception() is not None:
            log.warning("%s/%s: checkpoint failed: %s", self.stream, self.partition, job.exception())

    def stop(self) -> None:
        """Stop serving: writes not yet acked fail, readers wake, leadership ends. On the event
        loop; the log's files stay open until ``close``."""
        if self._closed:
            return
        self._closed = True
        self._apply(self._leader.close())
        self._wake_readers()

    def close(self) -> None:
        """``stop``, then checkpoint the HW, sync and close the log's files. Blocking: once
        stopped on the loop, a replica may be closed in another thread."""
        self.stop()
        if self._files_closed:
            return
        self._files_closed = True
        try:
            self.log.checkpoint()
        finally:
            try:
                self.log.close()
            except LogFailed:
                pass  # logged as it failed; closing a replica must close its files all the same


def _fetched_from(tracker: IsrTracker, replica_id: str) -> int | None:
    """Where the follower's previous fetch of this leadership started; None before its first, or for
    a replica that is no follower. How far its next one starts past it is what it got."""
    if replica_id == tracker.leader_id or replica_id not in tracker.replicas:
        return None
    return tracker.progress(replica_id).log_end_offset


def settle(future: asyncio.Future, result: object, error: BaseException | None) -> None:
    """An outcome callback's (result, error) as the future's result or exception."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def recent_ids(commit_log: PartitionLog, limits: DedupLimits, now: float) -> list[tuple[bytes, int, float]]:
    """(window key, offset, time) of each message with an id a deduplication window over ``commit_log``
    holds, oldest first: among its newest ``max_messages`` offsets and within ``max_age`` of its
    newest entry, taken as written ``now`` (a window rebuilt after a pause keeps ids a little longer,
    never shorter). Only that tail is read, and only its entries holding an id looked into: a log
    without ids costs a read (8 ms for 100,000 entries)."""
    end = commit_log.next_offset
    start = max(commit_log.oldest_offset, end - limits.max_messages)
    remembered: list[tuple[bytes, int, float]] = []
    try:
        newest = commit_log.read(end - 1, 1) if start < end else []
        if not newest:
            return []
        newest_ns = newest[0].timestamp
        start = max(start, commit_log.offset_for_timestamp(newest_ns - int(limits.max_age * 1e9)))
        while start < end:
            data, advanced = commit_log.read_through(start, _RECENT_IDS_CHUNK_BYTES, end - start)
            if not advanced:
                break
            if _ID_HEADER_NAME in data:  # else no entry here has an id: nothing to look at
                for offset, timestamp, key in stored_message_ids(data):
                    remembered.append((window_key(key), offset, now - (newest_ns - timestamp) / 1e9))
            start += advanced
    except CorruptEntry as exc:
        # The log's damage is its readers' and the cleaner's to report; the window knows the ids
        # before it, and a retry of a message past it may be stored again.
        log.warning("deduplication window of %s: stopped at damage: %s", commit_log.directory, exc)
    return remembered
