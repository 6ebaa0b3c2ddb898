"""bascule as a PySpark data source (``pyspark.sql.datasource``): batch and streaming reads, batch and
streaming writes. See docs/spark.md.

Spark pickles the data source, its readers and writers and the input partitions to its Python
workers: they hold options and offsets only. Connections are opened inside each call (`read`,
`write`, `partitions`, `latestOffset`, ...) on a fresh event loop, and closed before it returns.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from bascule.spark import io
from bascule.spark.options import (
    BasculeSparkError,
    ReadOptions,
    WriteOptions,
    parse_read_options,
    parse_write_options,
)
from bascule.spark.planning import (
    OffsetRange,
    Offsets,
    cap,
    offsets_from_json,
    offsets_to_json,
    plan_ranges,
    rate_limit,
    split_ranges,
)

try:  # Spark 4.1+
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase

    _STREAM_WRITER_TAKES_ARROW = True
except ImportError:  # Spark 4.0: rows
    _StreamWriterBase = DataSourceStreamWriter  # type: ignore[misc]
    _STREAM_WRITER_TAKES_ARROW = False

try:  # Spark 4.2+
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow
except ImportError:  # Spark 4.0/4.1
    ReadAllAvailable = ReadMaxRows = None  # type: ignore[assignment,misc]
    SupportsTriggerAvailableNow = object  # type: ignore[assignment,misc]

log = logging.getLogger("bascule.spark")

SCHEMA = StructType(
    [
        StructField("stream", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("timestamp", TimestampType()),
        StructField("subject", StringType()),
        StructField("headers", MapType(StringType(), BinaryType())),
    ]
)
SCHEMA_DDL = (
    "stream string, partition int, offset long, key binary, value binary, timestamp timestamp, "
    "subject string, headers map<string,binary>"
)


class BasculeDataSource(DataSource):
    """``spark.dataSource.register(BasculeDataSource)``, then ``format("bascule")``."""

    @classmethod
    def name(cls) -> str:
        return "bascule"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return BasculeBatchReader(parse_read_options(self.options, streaming=False), _read_schema(schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return BasculeStreamReader(parse_read_options(self.options, streaming=True), _read_schema(schema))

    def writer(self, schema: StructType, overwrite: bool) -> BasculeWriter:
        _refuse_overwrite(overwrite)
        options = parse_write_options(self.options)
        return BasculeWriter(options, _Rows.check(schema, options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> BasculeStreamWriter:
        _refuse_overwrite(overwrite)
        options = parse_write_options(self.options)
        return BasculeStreamWriter(options, _Rows.check(schema, options))


def _read_schema(schema: StructType) -> StructType:
    """The schema to produce: bascule's, or a user-given subset of its columns (same types)."""
    ours = {f.name: f for f in SCHEMA.fields}
    for f in schema.fields:
        if f.name not in ours or f.dataType != ours[f.name].dataType:
            raise BasculeSparkError(
                f"column {f.name} {f.dataType.simpleString()} is not in bascule's schema ({SCHEMA_DDL})"
            )
    return schema


def _refuse_overwrite(overwrite: bool) -> None:
    if overwrite:
        raise BasculeSparkError("streams are append-only: write with mode('append'), not 'overwrite'")


def _arrow_schema(schema: StructType) -> Any:
    try:  # the conversion Spark itself checks record batches against
        from pyspark.sql.pandas.types import to_arrow_schema

        return to_arrow_schema(schema, timezone="UTC")
    except ImportError:  # pragma: no cover - older layouts
        import pyarrow as pa

        types = {
            "stream": pa.string(), "partition": pa.int32(), "offset": pa.int64(), "key": pa.binary(),
            "value": pa.binary(), "timestamp": pa.timestamp("us", tz="UTC"), "subject": pa.string(),
            "headers": pa.map_(pa.string(), pa.binary()),
        }
        return pa.schema([pa.field(f.name, types[f.name]) for f in schema.fields])


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
        arrow_schema = _arrow_schema(self.schema)
        options, r = self.options, partition.range
        return io.iterate(lambda: io.read_range(options, r, arrow_schema))

    def _inputs(self, ranges: Sequence[OffsetRange]) -> list[InputPartition]:
        o = self.options
        return [BasculeInputPartition(r) for r in split_ranges(ranges, o.min_partitions, o.max_records_per_partition)]


class BasculeBatchReader(_Reader, DataSourceReader):
    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options, self.schema = options, schema

    def partitions(self) -> Sequence[InputPartition]:
        o = self.options

        async def plan(client) -> list[OffsetRange]:
            parts = await io.discover(client, o.selection)
            if parts.missing:
                raise BasculeSparkError(_missing_message(parts.missing, o))
            if not parts.infos and o.selection.pattern is not None:
                log.warning("streamPattern %r matches no stream", o.selection.pattern)
            start, from_earliest = await io.resolve(
                client, o.starting, parts, default="earliest", option="starting offsets",
                timestamp_strategy=o.timestamp_strategy,
            )
            end, _ = await io.resolve(client, o.ending, parts, default="latest", option="ending offsets", ending=True)
            ranges = []
            for stream in sorted(end):
                for partition in sorted(end[stream]):
                    b, e = start[stream][partition], end[stream][partition]
                    if b > e:
                        raise BasculeSparkError(
                            f"the starting offset {b} of {stream}/{partition} is after its ending offset {e}"
                        )
                    ranges.append(OffsetRange(stream, partition, b, e, (stream, partition) not in from_earliest))
            return ranges

        ranges = io.run(lambda: io.with_client(o.brokers, o.request_timeout, plan, "planning the read"))
        return self._inputs(ranges)


class BasculeStreamReader(_Reader, DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    """Offsets in the checkpoint: {"stream": {"partition": next offset}}."""

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options, self.schema = options, schema
        # State of the driver-side process Spark keeps for this query (never pickled after use).
        self._target: Offsets | None = None  # Trigger.AvailableNow: stop here
        self._last_end: Offsets | None = None  # Spark 4.0/4.1 give latestOffset no start
        self._latest: Offsets | None = None  # for reportLatestOffset
        self._newest: Offsets = {}  # next offset after each partition's newest (uncommitted too)

    # -- offsets --
    def initialOffset(self) -> dict:
        o = self.options

        async def initial(client) -> Offsets:
            parts = await io.discover(client, o.selection)
            if parts.missing:
                raise BasculeSparkError(_missing_message(parts.missing, o))
            offsets, _ = await io.resolve(
                client, o.starting, parts, default="earliest" if o.starting.kind == "earliest" else "latest",
                option="starting offsets", timestamp_strategy=o.timestamp_strategy,
            )
            return offsets

        offsets = io.run(lambda: io.with_client(o.brokers, o.request_timeout, initial, "finding the starting offsets"))
        self._last_end = offsets
        return offsets_to_json(offsets)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._fetch_latest(None)[0]

    def getDefaultReadLimit(self) -> Any:
        if ReadMaxRows is not None and self.options.max_messages_per_trigger:
            return ReadMaxRows(self.options.max_messages_per_trigger)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        begin = offsets_from_json(start) if start is not None else self._last_end
        latest, earliest_of_new = self._fetch_latest(begin)
        self._latest = latest
        end = latest
        if begin is not None:
            end = self._check_progress(begin, end)
            max_rows = self._max_rows(limit)
            if max_rows is not None:
                from_ = {s: dict(parts) for s, parts in begin.items()}
                for (s, p), offset in earliest_of_new.items():
                    from_.setdefault(s, {}).setdefault(p, offset)
                end = rate_limit(from_, end, max_rows)
            if self._target is not None:
                end = cap(end, self._target, begin)
            # A stream that is gone (failOnDataLoss false) drops out of the offsets.
        elif self._target is not None:
            end = cap(end, self._target, {})
        self._last_end = end
        return offsets_to_json(end)

    def reportLatestOffset(self) -> dict | None:
        return offsets_to_json(self._latest) if self._latest is not None else None

    def _max_rows(self, limit: Any) -> int | None:
        if limit is None:  # Spark 4.0/4.1: no read limits in the API; apply the option ourselves
            return self.options.max_messages_per_trigger
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            return limit.max_rows
        return None

    def _fetch_latest(self, begin: Offsets | None) -> tuple[Offsets, dict[tuple[str, int], int]]:
        """Every selected partition's next offset after its HW; for partitions `begin` lacks, when a
        read limit needs it, their earliest offset too."""
        o = self.options

        async def latest(client):
            parts = await io.discover(client, o.selection)
            for stream in parts.missing:
                if begin is not None and stream in begin and o.fail_on_data_loss:
                    raise BasculeSparkError(
                        f"data loss: stream {stream!r} was deleted while the query still reads it "
                        f"(last offsets {offsets_to_json({stream: begin[stream]})[stream]}). Set failOnDataLoss "
                        "to false to go on without it."
                    )
                if begin is None or stream not in begin:
                    log.warning("stream %r does not exist (yet); reading it once it does", stream)
            earliest_of_new: dict[tuple[str, int], int] = {}
            if begin is not None and self._needs_earliest():
                for s, infos in parts.infos.items():
                    for p, info in infos.items():
                        if p not in begin.get(s, {}):
                            earliest_of_new[s, p] = await io.earliest_offset(client, s, p, info)
            self._newest = {s: {p: i.newest_offset + 1 for p, i in infos.items()} for s, infos in parts.infos.items()}
            return parts.latest(), earliest_of_new

        return io.run(lambda: io.with_client(o.brokers, o.request_timeout, latest, "finding the latest offsets"))

    def _needs_earliest(self) -> bool:
        return self.options.max_messages_per_trigger is not None

    def _check_progress(self, begin: Offsets, end: Offsets) -> Offsets:
        """A partition whose end is below the checkpointed start: a lagging HW on a new leader
        (its log still reaches the start: wait), or a log that lost messages (data loss)."""
        checked: Offsets = {}
        for s, parts in begin.items():
            vanished = sorted(set(parts) - set(end.get(s, parts)))
            if vanished and self.options.fail_on_data_loss:
                raise BasculeSparkError(
                    f"data loss: partitions {vanished} of stream {s!r} no longer exist (the stream was deleted and "
                    "created again with fewer partitions). Set failOnDataLoss to false to go on without them."
                )
        for s, parts in end.items():
            for p, e in parts.items():
                b = begin.get(s, {}).get(p)
                if b is not None and e < b:
                    newest = self._newest.get(s, {}).get(p, e)
                    if newest >= b:
                        e = b
                    elif self.options.fail_on_data_loss:
                        raise BasculeSparkError(
                            f"data loss: stream {s!r} partition {p} now ends at offset {newest - 1}, but the query "
                            f"already read up to offset {b - 1} (the stream was deleted and created again, or "
                            "its log was truncated). Set failOnDataLoss to false to read it again from its start."
                        )
                    else:
                        log.warning("%s/%s went back from %d to %d; reading it from its start", s, p, b, e)
                checked.setdefault(s, {})[p] = e
        return checked

    # -- batches --
    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return self._inputs(plan_ranges(offsets_from_json(start), offsets_from_json(end)))

    def commit(self, end: dict) -> None:
        pass  # the offsets live in Spark's checkpoint; nothing is held on the brokers

    def stop(self) -> None:
        pass


def _missing_message(missing: Sequence[str], o: ReadOptions) -> str:
    names = ", ".join(repr(m) for m in missing)
    return f"stream {names} does not exist (brokers {','.join(o.brokers)})" if len(missing) == 1 else (
        f"streams {names} do not exist (brokers {','.join(o.brokers)})"
    )


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


@dataclass(frozen=True)
class _Rows:
    """How to turn the columns of the written DataFrame into messages."""

    value: str  # "binary" or "string"
    key: str | None
    headers: str | None  # "map" or "array" (Kafka's array<struct<key, value>>)
    header_values: str | None
    partition: bool
    stream: bool

    @staticmethod
    def check(schema: StructType, options: WriteOptions) -> _Rows:
        fields = {f.name.lower(): f.dataType for f in schema.fields}

        def kind(name: str, required: bool = False) -> str | None:
            dtype = fields.get(name)
            if dtype is None:
                if required:
                    raise BasculeSparkError(
                        f"the DataFrame to write needs a '{name}' column (binary or string); it has "
                        f"{', '.join(schema.fieldNames()) or 'no columns'}"
                    )
                return None
            if isinstance(dtype, BinaryType):
                return "binary"
            if isinstance(dtype, StringType):
                return "string"
            raise BasculeSparkError(f"column '{name}' must be binary or string, not {dtype.simpleString()}")

        value = kind("value", required=True)
        key = kind("key")
        headers = header_values = None
        dtype = fields.get("headers")
        if dtype is not None:
            shape = _header_shape(dtype)
            if shape is None:
                raise BasculeSparkError(
                    "column 'headers' must be map<string,binary>, map<string,string> or "
                    f"array<struct<key:string,value:binary>>, not {dtype.simpleString()}"
                )
            headers, header_values = shape
        partition = "partition" in fields
        if partition and not isinstance(fields["partition"], (IntegerType, LongType, ShortType)):
            raise BasculeSparkError(f"column 'partition' must be an integer, not {fields['partition'].simpleString()}")
        stream = "stream" in fields
        if stream and not isinstance(fields["stream"], StringType):
            raise BasculeSparkError(f"column 'stream' must be a string, not {fields['stream'].simpleString()}")
        if options.stream is None and not stream:
            raise BasculeSparkError("say where to write: the option 'stream', or a 'stream' column")
        return _Rows(value, key, headers, header_values, partition, stream)

    def columns(self, names: list[str], column: Any) -> tuple[list, list, list, list, list]:
        """(streams, partitions, keys, values, headers) from a column accessor: column(name) -> list."""
        lower = {n.lower(): n for n in names}

        def get(name: str) -> list:
            return column(lower[name])

        values = get("value")
        n = len(values)
        if self.value == "string":
            values = [None if v is None else v.encode() for v in values]
        if any(v is None for v in values):
            raise BasculeSparkError("a row to write has a null 'value'")
        keys = get("key") if self.key else [None] * n
        if self.key == "string":
            keys = [None if k is None else k.encode() for k in keys]
        if self.headers:
            headers = [_headers(h, self.headers, self.header_values) for h in get("headers")]
        else:
            headers = [None] * n
        partitions = [None if p is None else int(p) for p in get("partition")] if self.partition else [None] * n
        streams = get("stream") if self.stream else [None] * n
        return streams, partitions, keys, values, headers


def _header_shape(dtype: DataType) -> tuple[str, str] | None:
    if isinstance(dtype, MapType) and isinstance(dtype.keyType, StringType):
        if isinstance(dtype.valueType, (BinaryType, StringType)):
            return "map", "binary" if isinstance(dtype.valueType, BinaryType) else "string"
    if isinstance(dtype, ArrayType) and isinstance(dtype.elementType, StructType):
        names = {f.name: f.dataType for f in dtype.elementType.fields}
        if set(names) == {"key", "value"} and isinstance(names["key"], StringType):
            if isinstance(names["value"], (BinaryType, StringType)):
                return "array", "binary" if isinstance(names["value"], BinaryType) else "string"
    return None


def _headers(value: Any, shape: str | None, values: str | None) -> dict[str, bytes] | None:
    if value is None:
        return None
    if shape == "map":
        pairs = value.items() if isinstance(value, dict) else value
    else:
        pairs = [(h["key"], h["value"]) for h in value]
    out = {}
    for name, v in pairs:
        if name is None:
            continue
        out[name] = b"" if v is None else (v.encode() if isinstance(v, str) else bytes(v))
    return out


class _Writer:
    options: WriteOptions
    rows: _Rows

    def _write_batches(self, batches: Iterator[Any]) -> BasculeCommitMessage:
        """Publish every row of `batches` (Arrow record batches or lists of Rows)."""
        o, rows = self.options, self.rows

        async def write(client) -> BasculeCommitMessage:
            publisher = io.Publisher(client, o.ack_policy, o.write_batch_size, o.partitioner)
            for batch in batches:
                if hasattr(batch, "schema") and hasattr(batch, "column"):  # pyarrow.RecordBatch
                    if batch.num_rows == 0:
                        continue
                    streams, partitions, keys, values, headers = rows.columns(
                        batch.schema.names, lambda name: batch.column(name).to_pylist()
                    )
                else:  # a list of pyspark Rows
                    if not batch:
                        continue
                    names = list(batch[0].__fields__)
                    streams, partitions, keys, values, headers = rows.columns(
                        names, lambda name: [r[name] for r in batch]
                    )
                if o.stream is not None:
                    streams = [o.stream] * len(values)
                elif any(s is None for s in streams):
                    raise BasculeSparkError("a row to write has a null 'stream' and no 'stream' option is set")
                await publisher.publish_rows(streams, partitions, keys, values, headers)
            return BasculeCommitMessage(
                {k: (r.count, r.first_offset, r.last_offset) for k, r in publisher.published.items()}
            )

        async def connected() -> BasculeCommitMessage:
            client = await io.connect(o.brokers, o.request_timeout)
            try:
                return await write(client)
            finally:
                await client.close()

        return io.run(connected)


def _row_chunks(rows: Iterator[Any], size: int = 10_000) -> Iterator[list]:
    chunk: list = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class BasculeWriter(_Writer, DataSourceArrowWriter):
    """Batch sink: `df.write.format("bascule").mode("append")`; at least once."""

    def __init__(self, options: WriteOptions, rows: _Rows) -> None:
        self.options, self.rows = options, rows

    def write(self, iterator: Iterator[Any]) -> BasculeCommitMessage:
        return self._write_batches(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        log.info("bascule sink committed: %s", summarize(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning(
            "bascule sink aborted; messages already acknowledged stay in their streams: %s", summarize(messages)
        )


class BasculeStreamWriter(_Writer, _StreamWriterBase):  # type: ignore[misc,valid-type]
    """Streaming sink: `df.writeStream.format("bascule")`; at least once (a retried micro-batch
    publishes its rows again)."""

    def __init__(self, options: WriteOptions, rows: _Rows) -> None:
        self.options, self.rows = options, rows

    def write(self, iterator: Iterator[Any]) -> BasculeCommitMessage:
        if _STREAM_WRITER_TAKES_ARROW:
            return self._write_batches(iterator)
        return self._write_batches(_row_chunks(iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.info("bascule sink committed batch %d: %s", batchId, summarize(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning(
            "bascule sink aborted batch %d; messages already acknowledged stay in their streams: %s",
            batchId, summarize(messages),
        )
