"""A partition replica on this node: its log, its role, and the waits built on them.

This is the I/O shell around the commit log. Messages arrive in bursts (one NATS
callback each); they are gathered and appended once per event-loop turn, so one
write, and under the ``always`` sync policy one fsync, covers the whole burst.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Callable

from bascule.partition.log import CommitLog
from bascule.wire.entry import Entry, Record

log = logging.getLogger(__name__)


class NotLeader(Exception):
    pass


class PartitionClosed(Exception):
    pass


@dataclass(frozen=True)
class SyncPolicy:
    """When message data reaches the disk: never (page cache only), on an interval, or before acks."""

    always: bool = False
    interval: float = 0.0  # seconds, 0 = no periodic sync

    @classmethod
    def parse(cls, value: str | float) -> "SyncPolicy":
        if value == "always":
            return cls(always=True)
        if value in ("never", "", 0, None):
            return cls()
        return cls(interval=float(value))


@dataclass
class Appended:
    """Where a burst landed, resolved once written (and synced if the policy says so)."""

    first: int
    last: int
    reception_ns: int


class PartitionReplica:
    def __init__(
        self,
        stream: str,
        partition: int,
        commit_log: CommitLog,
        sync_policy: SyncPolicy,
        on_committed: Callable[["PartitionReplica"], None] = lambda _: None,
    ) -> None:
        self.stream = stream
        self.partition = partition
        self.log = commit_log
        self.sync_policy = sync_policy
        self.leader_epoch = -1
        self.is_leader = False
        self.isr_size = 1
        self.min_isr = 1
        self._on_committed = on_committed
        self._pending: list[tuple[Record, asyncio.Future[Appended] | None]] = []
        self._flush_scheduled = False
        self._commit_waiters: list[tuple[int, asyncio.Future[int]]] = []
        self._data_changed = asyncio.Event()
        self._closed = False
        self.paused = False
        self.readonly = False

    @property
    def high_watermark(self) -> int:
        return self.log.high_watermark

    def become_leader(self, leader_epoch: int, isr_size: int, min_isr: int) -> None:
        if leader_epoch != self.leader_epoch:
            self.log.epochs.assign(leader_epoch, self.log.next_offset)
        self.leader_epoch = leader_epoch
        self.is_leader = True
        self.update_isr(isr_size, min_isr)

    def update_isr(self, isr_size: int, min_isr: int) -> None:
        self.isr_size, self.min_isr = isr_size, min_isr
        self._advance_high_watermark(self.log.newest_offset)

    def set_flags(self, paused: bool, readonly: bool) -> None:
        if (paused, readonly) != (self.paused, self.readonly):
            self.paused, self.readonly = paused, readonly
            self._wake_readers()

    def submit(self, record: Record, want_offset: bool) -> asyncio.Future[Appended] | None:
        """Queue a record for this turn's append; the future resolves once it is written."""
        if self._closed:
            raise PartitionClosed(f"{self.stream}/{self.partition} is closed")
        if not self.is_leader:
            raise NotLeader(f"not the leader of {self.stream}/{self.partition}")
        future = asyncio.get_running_loop().create_future() if want_offset else None
        self._pending.append((record, future))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        return future

    def _flush(self) -> None:
        self._flush_scheduled = False
        pending, self._pending = self._pending, []
        if not pending or self._closed:
            return
        try:
            first, last = self.log.append([record for record, _ in pending], self.leader_epoch)
            if self.sync_policy.always:
                self.log.sync()
        except Exception as exc:
            log.exception("append to %s/%s failed", self.stream, self.partition)
            for _, future in pending:
                if future is not None and not future.done():
                    future.set_exception(exc)
            return
        for offset, (record, future) in enumerate(pending, start=first):
            if future is not None and not future.done():
                future.set_result(Appended(offset, offset, record.timestamp))
        self._advance_high_watermark(last)

    def _advance_high_watermark(self, leader_end: int) -> None:
        # Alone in the ISR, the leader's own write commits; followers' progress arrives with replication.
        if not self.is_leader or self.isr_size > 1 or self.isr_size < self.min_isr:
            return
        if leader_end > self.log.high_watermark:
            self.log.high_watermark = leader_end
            self._committed()

    def set_high_watermark(self, hw: int) -> None:
        if hw > self.log.high_watermark:
            self.log.high_watermark = hw
            self._committed()

    def _committed(self) -> None:
        hw = self.log.high_watermark
        still_waiting = []
        for offset, future in self._commit_waiters:
            if offset <= hw:
                if not future.done():
                    future.set_result(hw)
            else:
                still_waiting.append((offset, future))
        self._commit_waiters = still_waiting
        self._wake_readers()
        self._on_committed(self)

    def _wake_readers(self) -> None:
        self._data_changed.set()
        self._data_changed = asyncio.Event()

    async def wait_committed(self, offset: int) -> int:
        """Wait until ``offset`` is committed; returns the HW then."""
        if offset <= self.log.high_watermark:
            return self.log.high_watermark
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._commit_waiters.append((offset, future))
        return await future

    async def wait_for_data(self, timeout: float | None = None) -> None:
        """Wait until the HW moves, the partition changes role, or it closes."""
        event = self._data_changed
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    def read_committed(self, offset: int, max_entries: int) -> list[Entry]:
        hw = self.log.high_watermark
        if offset > hw:
            return []
        entries = self.log.read(offset, max_entries=max_entries)
        return [e for e in entries if e.offset <= hw]

    def sync(self) -> None:
        self.log.sync()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.is_leader = False
        error = PartitionClosed(f"{self.stream}/{self.partition} closed")
        for _, future in self._commit_waiters:
            if not future.done():
                future.set_exception(error)
        for _, future in self._pending:
            if future is not None and not future.done():
                future.set_exception(error)
        self._commit_waiters, self._pending = [], []
        self._wake_readers()
        self.log.checkpoint_high_watermark()
        self.log.close()

    @property
    def closed(self) -> bool:
        return self._closed
