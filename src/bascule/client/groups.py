"""A member of a consumer group, as go-liftbridge's Consumer.

The member joins the group for the streams it reads and fetches its assignments from the group's
coordinator every ``fetch_interval`` (by default 0.7 of the group's consumer timeout, as go-liftbridge:
the fetch is also the member's heartbeat). At each new epoch, or new assignments, it commits its
positions, then reads each assigned partition again at the new epoch: from the offset after the
last message it delivered, else after the group's cursor (``__group:<group>``), else from the
``auto_offset`` position. It commits its positions to that cursor every ``checkpoint_interval``.
A coordinator that does not answer is reported, and the member follows the group to its next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

import grpc

from bascule.client.model import Assignments, BasculeError, Message
from bascule.client.routing import NoRoute
from bascule.wire.pb import api_pb2

if TYPE_CHECKING:
    from bascule.client.core import Client

AUTO_OFFSETS = {
    "new": api_pb2.StartPosition.NEW_ONLY,
    "earliest": api_pb2.StartPosition.EARLIEST,
    "latest": api_pb2.StartPosition.LATEST,
    "none": None,  # no cursor yet is an error
}
QUEUE_SIZE = 1024  # messages read ahead of the consumer, all partitions together
_RETRY_DELAY = 0.2
_NOT_MEMBER = "consumer is not a member of the consumer group"  # Liftbridge's words
# A refused fetch the member recovers from: a dropped member, a coordinator gone, a stale epoch.
_FOLLOWED = frozenset({grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION})

Position = tuple[str, int]  # stream, partition


class Consumer:
    def __init__(
        self,
        client: Client,
        group_id: str,
        *,
        consumer_id: str | None = None,
        auto_offset: str = "new",
        checkpoint_interval: float = 5.0,
        fetch_interval: float | None = None,
    ) -> None:
        if auto_offset not in AUTO_OFFSETS:
            raise ValueError(f"auto_offset is one of {sorted(AUTO_OFFSETS)}, not {auto_offset!r}")
        self.client = client
        self.group_id = group_id
        self.consumer_id = consumer_id or uuid.uuid4().hex
        self.auto_offset = auto_offset
        self.checkpoint_interval = checkpoint_interval
        self.fetch_interval = fetch_interval
        self.coordinator = ""
        self.epoch = 0
        self.assignments: dict[str, list[int]] = {}
        self.positions: dict[Position, int] = {}  # the last offset delivered of each partition read
        self._committed: dict[Position, int] = {}
        self._streams: list[str] = []
        self._reading: tuple[int, dict[str, list[int]]] | None = None  # epoch and assignments read at
        self._generation = 0  # bumped at each rebalance: what older readers queued is dropped
        self._readers: dict[Position, asyncio.Task] = {}
        self._queue: asyncio.Queue[tuple[int, Message | BaseException]] = asyncio.Queue(QUEUE_SIZE)
        self._wake = asyncio.Event()

    @property
    def cursor_id(self) -> str:
        return f"__group:{self.group_id}"

    async def __aenter__(self) -> Consumer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def messages(self, streams: Sequence[str]) -> AsyncIterator[Message]:
        """Join the group for ``streams`` and yield the messages of the partitions it assigns this
        consumer, for as long as the caller reads."""
        self._streams = list(streams)
        await self._join()
        loops = [asyncio.create_task(self._assignment_loop())]
        if self.checkpoint_interval > 0:
            loops.append(asyncio.create_task(self._checkpoint_loop()))
        try:
            while True:
                generation, item = await self._queue.get()
                if isinstance(item, BaseException):
                    raise item
                if generation != self._generation:
                    continue  # read before the last rebalance, and read again after it
                self.positions[item.stream, item.partition] = item.offset
                yield item
        finally:
            await _cancel([*loops, *self._readers.values()])
            self._readers.clear()

    async def checkpoint(self) -> None:
        """Commit the last offset delivered of each assigned partition to the group's cursor."""
        assigned = {(stream, p) for stream, partitions in self.assignments.items() for p in partitions}
        for position, offset in list(self.positions.items()):
            if position in assigned and self._committed.get(position) != offset:
                await self.client.set_cursor(*position, self.cursor_id, offset)
                self._committed[position] = offset

    async def close(self) -> None:
        """Commit the positions and leave the group (its partitions go to the other members)."""
        if not self.coordinator:
            return
        with contextlib.suppress(BasculeError):
            await self.checkpoint()
        with contextlib.suppress(BasculeError):
            await self.client.leave_consumer_group(self.group_id, self.consumer_id)
        self.coordinator = ""

    async def _join(self) -> None:
        joined = await self.client.join_consumer_group(self.group_id, self.consumer_id, self._streams)
        self.coordinator, self.epoch = joined.coordinator, joined.epoch
        if self.fetch_interval is None:
            self.fetch_interval = 0.7 * joined.consumer_timeout

    async def _assignment_loop(self) -> None:
        try:
            while True:
                assigned = await self._fetch_assignments()
                if self._reading != (assigned.epoch, assigned.partitions):
                    await self._rebalance(assigned)
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.fetch_interval)
        except BasculeError as exc:
            await self._queue.put((self._generation, exc))

    async def _fetch_assignments(self) -> Assignments:
        """This consumer's assignments, following the group through epochs, coordinator moves and
        (once dropped as silent) a new join, for up to the client's resubscribe wait."""
        deadline = time.monotonic() + max(self.client.resubscribe_wait, self.client.timeout)
        while True:
            try:
                return await self.client._assignments(self.group_id, self.consumer_id, self.epoch, self.coordinator)
            except grpc.aio.AioRpcError as exc:
                code, details = exc.code(), exc.details() or ""
            except BasculeError as exc:
                code, details = exc.code, exc.message
            except NoRoute as exc:
                code, details = exc.code, exc.details
            if time.monotonic() > deadline:
                raise BasculeError(code, details)
            await self._follow_group(code, details)
            await asyncio.sleep(_RETRY_DELAY)

    async def _follow_group(self, code: grpc.StatusCode, details: str) -> None:
        """After a refused fetch: join again if the group dropped this member, report a coordinator
        that does not answer, and learn the group's coordinator and epoch."""
        if code not in _FOLLOWED:
            raise BasculeError(code, details)
        with contextlib.suppress(BasculeError):
            if code == grpc.StatusCode.NOT_FOUND or details == _NOT_MEMBER:
                await self._join()
                return
            if code == grpc.StatusCode.UNAVAILABLE:
                await self.client.report_consumer_group_coordinator(
                    self.group_id, self.consumer_id, self.coordinator, self.epoch
                )
            group = await self.client.fetch_group_metadata(self.group_id)
            if group.exists:
                self.coordinator, self.epoch = group.coordinator, group.epoch

    async def _rebalance(self, assigned: Assignments) -> None:
        with contextlib.suppress(BasculeError):
            await self.checkpoint()  # the partitions that move on start where this consumer stopped
        await _cancel(list(self._readers.values()))
        self._readers.clear()
        self._generation += 1
        self.epoch, self.assignments = assigned.epoch, assigned.partitions
        self._reading = (assigned.epoch, assigned.partitions)
        for stream, partitions in assigned.partitions.items():
            for partition in partitions:
                request = await self._subscribe_request(stream, partition)
                self._readers[stream, partition] = asyncio.create_task(self._read(self._generation, request))

    async def _subscribe_request(self, stream: str, partition: int) -> api_pb2.SubscribeRequest:
        request = api_pb2.SubscribeRequest(
            stream=stream, partition=partition,
            consumer=api_pb2.Consumer(groupId=self.group_id, groupEpoch=self.epoch, consumerId=self.consumer_id),
        )
        # Another member may have read further while this one did not hold the partition.
        last = max(
            self.positions.get((stream, partition), -1),
            await self.client.fetch_cursor(stream, partition, self.cursor_id),
        )
        if last >= 0:
            request.startPosition, request.startOffset = api_pb2.StartPosition.OFFSET, last + 1
            return request
        start = AUTO_OFFSETS[self.auto_offset]
        if start is None:
            raise BasculeError(grpc.StatusCode.NOT_FOUND,
                               f"no previous consumer group offset found for partition {partition} of stream {stream}")
        request.startPosition = start
        return request

    async def _read(self, generation: int, request: api_pb2.SubscribeRequest) -> None:
        try:
            async for message in self.client._subscription(request):
                await self._queue.put((generation, message))
        except BasculeError as exc:
            if exc.code != grpc.StatusCode.FAILED_PRECONDITION:  # not a fencing: the stream is gone or unreachable
                await self._queue.put((generation, exc))
                return
        # Displaced or fenced by a newer epoch: the assignments say what to read now.
        self._reading = None
        self._wake.set()

    async def _checkpoint_loop(self) -> None:
        while True:
            await asyncio.sleep(self.checkpoint_interval)
            with contextlib.suppress(BasculeError):
                await self.checkpoint()


async def _cancel(tasks: list[asyncio.Task]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
