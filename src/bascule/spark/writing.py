"""Publishing the rows of one Spark task: PublishAsync in pipelined batches, in row order per
partition and partitions in parallel; a batch is sent again after a leader change, and the acks are
counted. With message ids (`ids`), every row carries one that another attempt at it repeats, so that
the partitions' leaders store it once."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from bascule.client import Ack, BasculeError, Client
from bascule.spark.arrow import OutgoingMessages, SinkColumns, outgoing
from bascule.spark.connections import connect, run
from bascule.spark.errors import BasculeSparkError
from bascule.spark.ids import RowIds
from bascule.spark.options import WriteOptions
from bascule.spark.partitioning import Partitioner
from bascule.spark.retry import PUBLISH_RETRY, retried
from bascule.wire.dedup import message_id


@dataclass
class PublishedRange:
    """What a task published to one partition: how many messages, and the offsets of the first and
    last acknowledged one (-1 with ackPolicy none)."""

    count: int = 0
    first_offset: int = -1
    last_offset: int = -1

    def add(self, count: int, acks: Sequence[Ack]) -> None:
        if acks:
            if self.first_offset < 0:
                self.first_offset = acks[0].offset
            self.last_offset = acks[-1].offset
        self.count += count


Published = dict[tuple[str, int], PublishedRange]  # by (stream, partition)


def publish(options: WriteOptions, columns: SinkColumns, batches: Iterable[Any], row_ids: RowIds | None) -> Published:
    """Every row of `batches` (see `arrow.outgoing`) published, on a fresh event loop and client,
    with the ids `row_ids` numbers them with (None: the sink gives no ids)."""

    async def connected() -> Published:
        client = await connect(options.brokers, options.request_timeout, options.tls)
        try:
            publisher = Publisher(client, options.ack_policy, options.write_batch_size, options.partitioner, row_ids)
            for messages in outgoing(batches, columns, options.stream):
                await publisher.publish(messages)
            return publisher.published
        finally:
            await client.close()

    return run(connected)


class Publisher:
    """Publishes messages, in order per partition, through PublishAsync in pipelined batches."""

    def __init__(
        self, client: Client, ack_policy: str, batch_size: int, partitioner: str, row_ids: RowIds | None = None
    ) -> None:
        self.client = client
        self.ack_policy = ack_policy
        self.batch_size = batch_size
        self.row_ids = row_ids
        # A start of its own per task (see Partitioner): the same on every attempt when rows have ids.
        first = row_ids.round_robin_start if row_ids is not None else random.randrange(1 << 16)
        self.partitioner = Partitioner(partitioner, first=first)
        self.partition_counts: dict[str, int] = {}
        self.published: Published = {}

    async def partition_count(self, stream: str) -> int:
        if stream not in self.partition_counts:
            metadata = await self.client.fetch_metadata(stream)
            info = metadata.streams.get(stream)
            if info is None or not info.exists:
                raise BasculeSparkError(f"cannot write to stream {stream!r}: it does not exist")
            self.partition_counts[stream] = len(info.partitions)
        return self.partition_counts[stream]

    async def publish(self, messages: OutgoingMessages) -> None:
        counts = {stream: await self.partition_count(stream) for stream in dict.fromkeys(messages.streams)}
        own_ids = [None if headers is None else message_id(headers) for headers in messages.headers]
        groups = self.partitioner.group(messages.streams, messages.partitions, messages.keys, own_ids, counts)
        if self.row_ids is not None:
            messages = self.row_ids.numbered(messages)
        await asyncio.gather(
            *(self._publish_partition(s, p, rows, messages) for (s, p), rows in groups.items())
        )

    async def _publish_partition(
        self, stream: str, partition: int, rows: list[int], messages: OutgoingMessages
    ) -> None:
        """The `rows` (indexes into `messages`) of one partition, a batch at a time: a batch's acks are
        all awaited before the next is sent, so that the partition gets them in row order."""
        done = self.published.setdefault((stream, partition), PublishedRange())
        for begin in range(0, len(rows), self.batch_size):
            chunk = rows[begin : begin + self.batch_size]
            send = partial(self._send, stream, partition, chunk, messages)
            try:
                acks = await retried(PUBLISH_RETRY, send, f"publishing to {stream}/{partition}")
            except BasculeError as exc:
                raise BasculeSparkError(
                    f"publishing to stream {stream!r} partition {partition} failed: {exc} (this task had "
                    f"{done.count} messages acknowledged there before the failing batch of {len(chunk)})"
                ) from exc
            done.add(len(chunk), acks)

    async def _send(self, stream: str, partition: int, chunk: list[int], messages: OutgoingMessages) -> list[Ack]:
        return await self.client.publish_many(
            stream,
            [messages.values[i] for i in chunk],
            keys=[messages.keys[i] for i in chunk],
            headers=[messages.headers[i] for i in chunk],
            partition=partition,
            ack_policy=self.ack_policy,
        )
