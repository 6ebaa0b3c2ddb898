"""bascule as a PySpark data source (``pyspark.sql.datasource``): batch and streaming reads, batch and
streaming writes. See docs/spark.md.

These are the classes Spark calls, and no more: the rules they follow are in `planning`,
`partitioning`, `schema` and `arrow`; the calls to the brokers in `lookups`, `reading` and `writing`.

Spark pickles the data source, its readers and writers and the input partitions to its Python
workers: they hold options and offsets only. Connections are opened inside each call (`read`,
`write`, `partitions`, `latestOffset`, ...) on a fresh event loop, and closed before it returns.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from bascule.spark import lookups, reading, writing
from bascule.spark.arrow import SinkColumns, row_chunks
from bascule.spark.connections import run_with_client
from bascule.spark.errors import BasculeSparkError
from bascule.spark.ids import (
    BATCH_ID_PROPERTY,
    QUERY_ID_PROPERTY,
    RowIds,
    batch_write_prefix,
    new_write_id,
    streaming_prefix,
)
from bascule.spark.options import (
    ReadOptions,
    WriteOptions,
    includes_headers,
    parse_read_options,
    parse_write_options,
)
from bascule.spark.planning import (
    Bounds,
    OffsetRange,
    Offsets,
    next_end,
    offsets_from_json,
    offsets_to_json,
    plan_ranges,
    split_ranges,
    waits_for_more,
)
from bascule.spark.schema import arrow_schema, read_schema, sink_columns, source_schema

try:  # Spark 4.1+
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase

    _STREAM_WRITER_TAKES_ARROW = True
except ImportError:  # Spark 4.0: rows
    _StreamWriterBase = DataSourceStreamWriter  # type: ignore[misc,assignment]
    _STREAM_WRITER_TAKES_ARROW = False

try:  # Spark 4.2+
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadMaxRows,
        ReadMinRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # Spark 4.0/4.1
    ReadAllAvailable = ReadMaxRows = ReadMinRows = None  # type: ignore[assignment,misc]
    SupportsTriggerAvailableNow = object  # type: ignore[assignment,misc]

log = logging.getLogger("bascule.spark")


class BasculeDataSource(DataSource):
    """``spark.dataSource.register(BasculeDataSource)``, then ``format("bascule")``."""

    @classmethod
    def name(cls) -> str:
        return "bascule"

    def schema(self) -> StructType:
        return source_schema(includes_headers(self.options))

    def reader(self, schema: StructType) -> DataSourceReader:
        options = parse_read_options(self.options, streaming=False)
        return BasculeBatchReader(options, read_schema(schema, options.include_headers))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = parse_read_options(self.options, streaming=True)
        return BasculeStreamReader(options, read_schema(schema, options.include_headers))

    def writer(self, schema: StructType, overwrite: bool) -> BasculeWriter:
        _refuse_overwrite(overwrite)
        options = parse_write_options(self.options)
        return BasculeWriter(options, sink_columns(schema, options.stream))

    def streamWriter(self, schema: StructType, overwrite: bool) -> BasculeStreamWriter:
        _refuse_overwrite(overwrite)
        options = parse_write_options(self.options)
        return BasculeStreamWriter(options, sink_columns(schema, options.stream))


def _refuse_overwrite(overwrite: bool) -> None:
    if overwrite:
        raise BasculeSparkError("streams are append-only: write with mode('append'), not 'overwrite'")


# ---- reading -------------------------------------------------------------------------------------


class BasculeInputPartition(InputPartition):
    """One Spark task: messages start .. end-1 of one partition of one stream."""

    def __init__(self, range: OffsetRange) -> None:
        super().__init__(None)
        self.range = range

    def __repr__(self) -> str:
        r = self.range
        return f"BasculeInputPartition({r.stream}/{r.partition} {r.start}..{r.end - 1})"


class _Reader:
    options: ReadOptions
    schema: StructType

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, BasculeInputPartition):
            return iter(())  # Spark's stand-in InputPartition(None) when there is nothing to read
        return reading.read(self.options, partition.range, arrow_schema(self.schema))

    def _inputs(self, ranges: Sequence[OffsetRange]) -> list[InputPartition]:
        o = self.options
        return [BasculeInputPartition(r) for r in split_ranges(ranges, o.min_partitions, o.max_records_per_partition)]


class BasculeBatchReader(_Reader, DataSourceReader):
    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options, self.schema = options, schema

    def partitions(self) -> Sequence[InputPartition]:
        o = self.options
        ranges = run_with_client(
            o.brokers, o.request_timeout, lambda client: lookups.batch_ranges(client, o), "planning the read", o.tls,
        )
        return self._inputs(ranges)


class BasculeStreamReader(_Reader, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets in the checkpoint: {"stream": {"partition": next offset}}."""

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options, self.schema = options, schema
        # State of the driver-side process Spark keeps for this query (never pickled after use).
        self._target: Offsets | None = None  # Trigger.AvailableNow: stop here
        self._last_end: Offsets | None = None  # Spark 4.0/4.1 give latestOffset no start
        self._latest: Offsets | None = None  # for reportLatestOffset
        self._last_batch_ms: float | None = None  # minOffsetsPerTrigger: when the last batch was let through

    # -- offsets --
    def initialOffset(self) -> dict:
        o = self.options
        offsets = run_with_client(
            o.brokers, o.request_timeout, lambda client: lookups.initial_offsets(client, o),
            "finding the starting offsets", o.tls,
        )
        self._last_end = offsets
        return offsets_to_json(offsets)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._bounds(None).latest

    def getDefaultReadLimit(self) -> Any:
        # Spark hands this limit back to latestOffset; a Python source cannot give a composite one,
        # so with both limits it is the minimum, and the maximum comes from the options.
        o = self.options
        if ReadMinRows is not None and o.min_messages_per_trigger:
            return ReadMinRows(o.min_messages_per_trigger)
        if ReadMaxRows is not None and o.max_messages_per_trigger:
            return ReadMaxRows(o.max_messages_per_trigger)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        begin = offsets_from_json(start) if start is not None else self._last_end
        bounds = self._bounds(begin)
        self._latest = bounds.latest
        if begin is not None and self._waits_for_more(begin, bounds, limit):
            return offsets_to_json(begin)
        end, rewinds = next_end(
            begin, bounds, max_rows=self._max_rows(limit), target=self._target,
            fail_on_data_loss=self.options.fail_on_data_loss,
        )
        for rewind in rewinds:
            log.warning("%s/%s went back from %d to %d; reading it from its start", *rewind)
        self._last_end = end
        return offsets_to_json(end)

    def reportLatestOffset(self) -> dict | None:
        return offsets_to_json(self._latest) if self._latest is not None else None

    def _waits_for_more(self, begin: Offsets, bounds: Bounds, limit: Any) -> bool:
        """minOffsetsPerTrigger, as Kafka's source: never under Trigger.AvailableNow (the run must
        reach its target) nor when Spark asks for everything available."""
        o = self.options
        if not o.min_messages_per_trigger or self._target is not None or not self._applies_options(limit):
            return False
        now = time.monotonic() * 1000
        since = None if self._last_batch_ms is None else now - self._last_batch_ms
        if waits_for_more(
            begin, bounds.latest, o.min_messages_per_trigger, since_last_batch_ms=since,
            max_delay_ms=o.max_trigger_delay_ms,
        ):
            return True
        self._last_batch_ms = now
        return False

    @staticmethod
    def _applies_options(limit: Any) -> bool:
        """Whether the trigger options apply: Spark 4.0/4.1 give no limit, and a minimum (our
        default limit when minOffsetsPerTrigger is set) leaves the maximum to the options."""
        return limit is None or (ReadMinRows is not None and isinstance(limit, ReadMinRows))

    def _max_rows(self, limit: Any) -> int | None:
        if self._applies_options(limit):
            return self.options.max_messages_per_trigger
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            return limit.max_rows
        return None

    def _bounds(self, begin: Offsets | None) -> Bounds:
        o = self.options
        return run_with_client(
            o.brokers, o.request_timeout, lambda client: lookups.bounds(client, o, begin),
            "finding the latest offsets", o.tls,
        )

    # -- batches --
    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin, finish = offsets_from_json(start), offsets_from_json(end)
        o = self.options
        compacted = run_with_client(
            o.brokers, o.request_timeout, lambda client: lookups.compacted(client, list(finish)),
            "finding the compacted streams", o.tls,
        )
        return self._inputs(plan_ranges(begin, finish, compacted))

    def commit(self, end: dict) -> None:
        pass  # the offsets live in Spark's checkpoint; nothing is held on the brokers

    def stop(self) -> None:
        pass


# ---- writing -------------------------------------------------------------------------------------


@dataclass
class BasculeCommitMessage(WriterCommitMessage):
    """What one task published: per (stream, partition), the count and the offsets of the first and
    last acknowledged message (-1 with ackPolicy none)."""

    published: dict[tuple[str, int], tuple[int, int, int]] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return sum(n for n, _, _ in self.published.values())


def summarize(messages: Sequence[WriterCommitMessage | None]) -> dict[str, Any]:
    """Totals over the tasks' commit messages: {"messages": N, "tasks": T, "partitions": {"s/p": N}}."""
    per_partition: dict[str, int] = {}
    tasks = 0
    for message in messages:
        if isinstance(message, BasculeCommitMessage):
            tasks += 1
            for (stream, partition), (count, _, _) in message.published.items():
                name = f"{stream}/{partition}"
                per_partition[name] = per_partition.get(name, 0) + count
    return {"messages": sum(per_partition.values()), "tasks": tasks, "partitions": dict(sorted(per_partition.items()))}


class _Writer:
    options: WriteOptions
    columns: SinkColumns

    def _write_batches(self, batches: Iterator[Any]) -> BasculeCommitMessage:
        row_ids = RowIds(self._id_prefix(_running_task())) if self.options.message_ids else None
        published = writing.publish(self.options, self.columns, batches, row_ids)
        return BasculeCommitMessage({k: (r.count, r.first_offset, r.last_offset) for k, r in published.items()})

    def _id_prefix(self, task: TaskContext) -> str:
        """What the message ids of this task's rows start with (`ids`)."""
        raise NotImplementedError


def _running_task() -> TaskContext:
    task = TaskContext.get()
    if task is None:
        raise BasculeSparkError("the bascule sink's writers write in Spark's tasks only")
    return task


class BasculeWriter(_Writer, DataSourceArrowWriter):
    """Batch sink: `df.write.format("bascule").mode("append")`."""

    def __init__(self, options: WriteOptions, columns: SinkColumns) -> None:
        self.options, self.columns = options, columns
        self.write_id = new_write_id()  # on the driver, once per write: every task attempt has it

    def _id_prefix(self, task: TaskContext) -> str:
        return batch_write_prefix(self.write_id, task.partitionId())

    def write(self, iterator: Iterator[Any]) -> BasculeCommitMessage:
        return self._write_batches(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        log.info("bascule sink committed: %s", summarize(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning(
            "bascule sink aborted; messages already acknowledged stay in their streams: %s", summarize(messages)
        )


class BasculeStreamWriter(_Writer, _StreamWriterBase):
    """Streaming sink: `df.writeStream.format("bascule")`."""

    def __init__(self, options: WriteOptions, columns: SinkColumns) -> None:
        self.options, self.columns = options, columns

    def _id_prefix(self, task: TaskContext) -> str:
        # write() is not told its micro-batch: Spark sets it, and the query's id, on the batch's tasks.
        query_id, batch_id = task.getLocalProperty(QUERY_ID_PROPERTY), task.getLocalProperty(BATCH_ID_PROPERTY)
        if query_id is None or batch_id is None:
            raise BasculeSparkError(
                f"this Spark sets no {QUERY_ID_PROPERTY} and {BATCH_ID_PROPERTY} on a micro-batch's tasks, which "
                "the sink's message ids are made of: write with the option messageIds 'false' (at least once)"
            )
        return streaming_prefix(query_id, batch_id, task.partitionId())

    def write(self, iterator: Iterator[Any]) -> BasculeCommitMessage:
        if _STREAM_WRITER_TAKES_ARROW:
            return self._write_batches(iterator)
        return self._write_batches(row_chunks(iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.info("bascule sink committed batch %d: %s", batchId, summarize(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning(
            "bascule sink aborted batch %d; messages already acknowledged stay in their streams: %s",
            batchId, summarize(messages),
        )
