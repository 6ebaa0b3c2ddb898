"""A node's requests to the metadata leader about many partitions at once, in batches.

A node that loses a leader of many partitions finds each of them silent in its own follower loop,
and a leader that loses a follower asks to shrink each of its ISRs: one request per partition kept
the metadata leader busy one partition at a time (a failed node leading 334 of 1,000 partitions took
34 s to replace). Here each kind of request made within one short window (``BATCH_WINDOW``) goes as
one request naming every partition, as Kafka's brokers do with their controller (a request after a
quiet window goes at once, so that a lone one, a restarted node's returning partition, waits for none):

- ``report_leaders``: "the leader of each of these partitions is silent" (``report_leader``'s items);
  the metadata leader counts each report by the witness rule and elects all those whose leader
  now counts as failed in one command (``ChangeLeaders``);
- ``leaders_returned``: "this node led each of these epochs before it restarted";
- ``change_isrs``: a leader's ISR changes, in one command (``ChangeIsrs``), each with its own outcome.

A caller still waits for its own item's outcome, and one that gives up before the batch goes
(a follower withdrawing its report when the leader answers again) takes its item out of it.
Batches are cut at ``MAX_BATCH_ITEMS`` items and at the transport's max_payload. A metadata leader of
an earlier version, which does not know a batch's request, gets its items one by one instead (a
rolling upgrade).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import msgpack

from bascule.metadata.raft import MetadataError, NoMetadataLeader
from bascule.metadata.state import INVALID_ARGUMENT
from bascule.wire.commands import MAX_BATCH_ITEMS

log = logging.getLogger(__name__)

# How long a request waits for others of its kind before its batch goes: short beside the leader
# timeout (what a failover costs) and long beside an event-loop turn (the follower loops of one
# silent leader find it within a few turns of each other).
BATCH_WINDOW = 0.02
# Room left in a NATS message for the envelope, the request's op and the seal.
REQUEST_OVERHEAD = 1024

# Sends one batch (its items), returns each item's outcome in order (None: the request answers none); an
# outcome that is an exception is raised to that item's caller.
SendBatch = Callable[[list[dict[str, Any]]], Awaitable[list[Any] | None]]
# Starts a one-shot task of the node (``Tasks.spawn``); None once the node is closing.
Spawn = Callable[[Coroutine[Any, Any, None], str], "asyncio.Task[Any] | None"]


class Batcher:
    """Gathers items submitted within ``window`` seconds of the first into one ``send`` (several when
    they exceed ``max_items`` or ``max_bytes`` of msgpack); each submitter gets its own item's outcome,
    or the batch's failure. The first item after a quiet window goes at once, with those of its loop
    turn."""

    def __init__(
        self, name: str, send: SendBatch, spawn: Spawn, max_bytes: Callable[[], int], window: float = BATCH_WINDOW,
        max_items: int = MAX_BATCH_ITEMS,
    ) -> None:
        self.name = name
        self.send = send
        self.spawn = spawn
        self.window = window
        self.max_items = max_items
        self.max_bytes = max_bytes  # read when a batch is cut: the transport's limit, known once connected
        self._pending: list[tuple[dict[str, Any], int, asyncio.Future[Any]]] = []
        self._flush: asyncio.TimerHandle | None = None
        self._last_batch = -window  # when the last batch went (the loop's clock)
        self.batches_sent = 0  # for tests and logs

    async def submit(self, item: dict[str, Any]) -> Any:
        """``item``'s outcome once its batch was answered. Cancelled before the batch goes, the item
        leaves it."""
        size = len(msgpack.packb(item, use_bin_type=True))
        loop = asyncio.get_running_loop()
        outcome: asyncio.Future[Any] = loop.create_future()
        self._pending.append((item, size, outcome))
        if self._flush is None:
            # A request that follows no recent batch of its kind (a restarted node's returning
            # partition, one ISR change) goes with those made in this loop turn, not a window later:
            # what a burst brings next (a failed node's other partitions) waits for its window.
            recent = loop.time() - self._last_batch < self.window
            self._flush = loop.call_later(self.window if recent else 0.0, self._go)
        return await outcome

    def _go(self) -> None:
        self._flush = None
        self._last_batch = asyncio.get_running_loop().time()
        pending = [entry for entry in self._pending if not entry[2].done()]  # cancelled ones leave
        self._pending = []
        batch: list[tuple[dict[str, Any], asyncio.Future[Any]]] = []
        size, max_bytes = 0, self.max_bytes()
        for item, item_size, outcome in pending:
            if batch and (len(batch) >= self.max_items or size + item_size > max_bytes):
                self._start(batch)
                batch, size = [], 0
            batch.append((item, outcome))
            size += item_size
        if batch:
            self._start(batch)

    def _start(self, batch: list[tuple[dict[str, Any], asyncio.Future[Any]]]) -> None:
        self.batches_sent += 1
        if self.spawn(self._send(batch), f"{self.name} of {len(batch)}") is None:
            for _, outcome in batch:
                if not outcome.done():
                    outcome.set_exception(NoMetadataLeader("this node is closing"))

    async def _send(self, batch: list[tuple[dict[str, Any], asyncio.Future[Any]]]) -> None:
        try:
            outcomes = await self.send([item for item, _ in batch])
        except BaseException as exc:  # every submitter hears it; a cancelled send counts as unknown
            failure = exc if isinstance(exc, Exception) else NoMetadataLeader(f"{self.name} batch cancelled")
            for _, outcome in batch:
                if not outcome.done():
                    outcome.set_exception(failure)
            if not isinstance(exc, Exception):
                raise
            return
        for index, (_, outcome) in enumerate(batch):
            if outcome.done():
                continue
            found = None if outcomes is None else outcomes[index]
            if isinstance(found, BaseException):
                outcome.set_exception(
                    found if isinstance(found, Exception) else NoMetadataLeader(f"{self.name} item cancelled")
                )
            else:
                outcome.set_result(found)


Call = Callable[..., Awaitable[Any]]


class MetadataBatches:
    """This node's batched requests to the metadata leader (through ``call``, the metadata service's)."""

    def __init__(
        self, call: Call, max_payload: Callable[[], int], spawn: Spawn, window: float = BATCH_WINDOW,
    ) -> None:
        def max_bytes() -> int:
            return max(1, max_payload() - REQUEST_OVERHEAD)

        self._call = call
        self.leader_reports = Batcher(
            "report_leaders", self._sender("report_leaders", "report_leader"), spawn, max_bytes, window
        )
        self.returns = Batcher("leaders_returned", self._sender("leaders_returned", "leader_returned"), spawn,
                               max_bytes, window)
        self.isr_changes = Batcher("change_isrs", self._isr_sender, spawn, max_bytes, window)

    def _sender(self, op: str, single: str) -> SendBatch:
        async def send(items: list[dict[str, Any]]) -> list[Any] | None:
            try:
                await self._call(op, items=items)
            except MetadataError as exc:
                if not _unknown_request(exc, op):
                    raise
                return await self._one_by_one(single, items)
            return None

        return send

    async def _one_by_one(self, single: str, items: list[dict[str, Any]]) -> list[Any]:
        """Each item as its own ``single`` request, for a metadata leader that does not know the batch's;
        each item's outcome (an exception when it failed)."""
        log.info("the metadata leader does not know batched requests: sending %d %s requests", len(items), single)
        return list(await asyncio.gather(*(self._call(single, **item) for item in items), return_exceptions=True))

    async def _isr_sender(self, items: list[dict[str, Any]]) -> list[Any]:
        try:
            outcomes = await self._call("change_isrs", items=items)
        except MetadataError as exc:
            if not _unknown_request(exc, "change_isrs"):
                raise
            return await self._one_by_one("change_isr", items)
        if not isinstance(outcomes, list) or len(outcomes) != len(items):
            raise NoMetadataLeader(f"malformed change_isrs answer from the metadata leader: {outcomes!r:.200}")
        return outcomes

    async def report_leader(self, stream: str, partition: int, leader: str, leader_epoch: int, reporter: str) -> None:
        """``report_leader``, in a batch."""
        await self.leader_reports.submit({
            "stream": stream, "partition": partition, "leader": leader, "leader_epoch": leader_epoch,
            "reporter": reporter,
        })

    async def leader_returned(
        self, stream: str, partition: int, leader: str, leader_epoch: int, last_epoch: int, log_end_offset: int,
    ) -> None:
        """``leader_returned``, in a batch. Unlike it, a partition that must wait for positions is not
        an error: the caller asks again while the metadata still names the old epoch."""
        await self.returns.submit({
            "stream": stream, "partition": partition, "leader": leader, "leader_epoch": leader_epoch,
            "last_epoch": last_epoch, "log_end_offset": log_end_offset,
        })

    async def change_isr(
        self, name: str, partition: int, replica: str, add: bool, leader: str, leader_epoch: int, epoch: int,
    ) -> None:
        """``change_isr``, in a batch: raises MetadataError when refused, NoMetadataLeader when its
        outcome is unknown."""
        outcome = await self.isr_changes.submit({
            "name": name, "partition": partition, "replica": replica, "add": add, "leader": leader,
            "leader_epoch": leader_epoch, "epoch": epoch,
        })
        if outcome is None:
            return
        try:
            code, message = outcome
            code, message = str(code), str(message)
        except (TypeError, ValueError):
            raise NoMetadataLeader(f"malformed change_isrs outcome {outcome!r:.200}") from None
        raise MetadataError(code, message)


def _unknown_request(error: MetadataError, op: str) -> bool:
    """Whether ``error`` is an earlier version's refusal of request ``op``, which it does not know."""
    return error.code == INVALID_ARGUMENT and f"unknown command op {op!r}" in error.message
