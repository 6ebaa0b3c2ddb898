"""Conversions of the Spark source and sink, pure: messages read -> Arrow record batches, and rows
to write (Arrow record batches, or lists of pyspark Rows) -> messages to publish."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

from bascule.spark.errors import BasculeSparkError

# ---- reading -------------------------------------------------------------------------------------


class Message(Protocol):
    """The fields of a message read (a `bascule.client.Message`) that a record batch takes: a
    protocol, so that this module needs neither the client nor gRPC."""

    offset: int
    timestamp: int  # ns since the epoch
    key: bytes | None
    value: bytes
    subject: str
    headers: dict[str, bytes]


def record_batch(messages: Sequence[Message], stream: str, partition: int, schema: pa.Schema) -> pa.RecordBatch:
    """Messages of one partition as one record batch of `schema` (bascule's columns, or a subset)."""
    return pa.RecordBatch.from_arrays(
        [_COLUMNS[f.name](messages, stream, partition, f.type) for f in schema], schema=schema
    )


def _timestamps(messages: Sequence[Message], type_: pa.DataType) -> pa.Array:
    # Spark timestamps are microseconds: bascule's nanoseconds truncated.
    return pa.array([m.timestamp for m in messages], pa.timestamp("ns", tz="UTC")).cast(type_, safe=False)


def _headers(messages: Sequence[Message], type_: pa.DataType) -> pa.Array:
    # The client shares one headers dict among messages with identical headers: convert each once.
    converted: dict[int, list] = {}
    rows = []
    for m in messages:
        pairs = converted.get(id(m.headers))
        if pairs is None:
            pairs = converted[id(m.headers)] = list(m.headers.items())
        rows.append(pairs)
    return pa.array(rows, type_)


_COLUMNS: dict[str, Callable[[Sequence[Message], str, int, pa.DataType], pa.Array]] = {
    "stream": lambda messages, stream, partition, type_: pa.array([stream] * len(messages), type_),
    "partition": lambda messages, stream, partition, type_: pa.array([partition] * len(messages), type_),
    "offset": lambda messages, stream, partition, type_: pa.array([m.offset for m in messages], type_),
    "key": lambda messages, stream, partition, type_: pa.array([m.key for m in messages], type_),
    "value": lambda messages, stream, partition, type_: pa.array([m.value for m in messages], type_),
    "timestamp": lambda messages, stream, partition, type_: _timestamps(messages, type_),
    "subject": lambda messages, stream, partition, type_: pa.array([m.subject for m in messages], type_),
    "headers": lambda messages, stream, partition, type_: _headers(messages, type_),
}


# ---- writing -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OutgoingMessages:
    """Rows to publish, column by column: each row's stream, partition (None: the partitioner's
    choice), key, value and headers."""

    streams: Sequence[str]
    partitions: Sequence[int | None]
    keys: Sequence[bytes | None]
    values: Sequence[bytes]
    headers: Sequence[dict[str, bytes] | None]


@dataclass(frozen=True)
class SinkColumns:
    """How the columns of a DataFrame written to bascule become messages (`schema.sink_columns`
    finds them)."""

    value: str  # "binary" or "string"
    key: str | None  # "binary", "string", or no key column
    headers: str | None  # "map", "array" (Kafka's array<struct<key, value>>), or no headers column
    partition: bool
    stream: bool

    def messages(self, names: list[str], column: Callable[[str], list], stream: str | None) -> OutgoingMessages:
        """The rows' messages, read through `column(name)` -> that column's values. `stream` (the
        option) overrides the 'stream' column."""
        by_lower = {n.lower(): n for n in names}

        def get(name: str) -> list:
            return column(by_lower[name])

        values = get("value")
        if self.value == "string":
            values = _encoded(values)
        if any(v is None for v in values):
            raise BasculeSparkError("a row to write has a null 'value'")
        n = len(values)
        keys = (_encoded(get("key")) if self.key == "string" else get("key")) if self.key else [None] * n
        headers = [_header_dict(h, self.headers) for h in get("headers")] if self.headers else [None] * n
        partitions = [None if p is None else int(p) for p in get("partition")] if self.partition else [None] * n
        if stream is not None:
            streams = [stream] * n
        else:
            streams = get("stream")  # sink_columns saw to it that there is one
            if any(s is None for s in streams):
                raise BasculeSparkError("a row to write has a null 'stream' and no 'stream' option is set")
        return OutgoingMessages(streams, partitions, keys, values, headers)


def _encoded(texts: list[str | None]) -> list[bytes | None]:
    return [None if t is None else t.encode() for t in texts]


def _header_dict(value: Any, shape: str | None) -> dict[str, bytes] | None:
    """One row's headers: a map (Arrow gives (name, value) pairs, a Row a dict) or Kafka's array of
    {key, value}; values as bytes, a null value as b"", a null name left out."""
    if value is None:
        return None
    if shape == "map":
        pairs = value.items() if isinstance(value, dict) else value
    else:
        pairs = [(h["key"], h["value"]) for h in value]
    return {
        name: b"" if v is None else (v.encode() if isinstance(v, str) else bytes(v))
        for name, v in pairs
        if name is not None
    }


def outgoing(batches: Iterable[Any], columns: SinkColumns, stream: str | None) -> Iterator[OutgoingMessages]:
    """The messages of each non-empty batch: a pyarrow.RecordBatch, or a list of pyspark Rows (what
    Spark 4.0 gives a stream writer, in `row_chunks`)."""
    for batch in batches:
        if hasattr(batch, "schema") and hasattr(batch, "column"):  # pyarrow.RecordBatch
            if batch.num_rows:
                yield columns.messages(batch.schema.names, _arrow_column(batch), stream)
        elif batch:
            yield columns.messages(list(batch[0].__fields__), _row_column(batch), stream)


def _arrow_column(batch: pa.RecordBatch) -> Callable[[str], list]:
    return lambda name: batch.column(name).to_pylist()


def _row_column(rows: list) -> Callable[[str], list]:
    return lambda name: [row[name] for row in rows]


def row_chunks(rows: Iterator[Any], size: int = 10_000) -> Iterator[list]:
    """Rows in lists of `size` (the last one shorter), so that they are converted a list at a time."""
    chunk: list = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
