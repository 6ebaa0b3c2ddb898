"""The Spark schemas of the source and sink: the columns a read gives, and what the columns of a
DataFrame to write may be. Spark's types only: no session, no JVM."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
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

from bascule.spark.arrow import SinkColumns
from bascule.spark.errors import BasculeSparkError

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


def source_schema(include_headers: bool) -> StructType:
    """The columns a read gives: bascule's, without `headers` when includeHeaders is false."""
    return SCHEMA if include_headers else StructType([f for f in SCHEMA.fields if f.name != "headers"])


def read_schema(schema: StructType, include_headers: bool = True) -> StructType:
    """The schema to produce: bascule's, or a user-given subset of its columns (same types)."""
    ours = {f.name: f for f in source_schema(include_headers).fields}
    for f in schema.fields:
        if f.name == "headers" and not include_headers:
            raise BasculeSparkError("the schema names the column 'headers', but includeHeaders is false")
        if f.name not in ours or f.dataType != ours[f.name].dataType:
            raise BasculeSparkError(
                f"column {f.name} {f.dataType.simpleString()} is not in bascule's schema ({SCHEMA_DDL})"
            )
    return schema


def arrow_schema(schema: StructType) -> pa.Schema:
    """`schema` in Arrow, by the conversion Spark itself checks the record batches it gets against."""
    return to_arrow_schema(schema, timezone="UTC")


def sink_columns(schema: StructType, stream_option: str | None) -> SinkColumns:
    """How the columns of a DataFrame to write become messages; an error names a column that cannot."""
    fields = {f.name.lower(): f.dataType for f in schema.fields}
    if "value" not in fields:
        raise BasculeSparkError(
            "the DataFrame to write needs a 'value' column (binary or string); it has "
            f"{', '.join(schema.fieldNames()) or 'no columns'}"
        )
    columns = SinkColumns(
        value=_bytes_kind("value", fields["value"]),
        key=_bytes_kind("key", fields["key"]) if "key" in fields else None,
        headers=_headers_kind(fields["headers"]) if "headers" in fields else None,
        partition=_present("partition", fields, (IntegerType, LongType, ShortType), "an integer"),
        stream=_present("stream", fields, (StringType,), "a string"),
    )
    if stream_option is None and not columns.stream:
        raise BasculeSparkError("say where to write: the option 'stream', or a 'stream' column")
    return columns


def _bytes_kind(name: str, dtype: DataType) -> str:
    if isinstance(dtype, BinaryType):
        return "binary"
    if isinstance(dtype, StringType):
        return "string"
    raise BasculeSparkError(f"column '{name}' must be binary or string, not {dtype.simpleString()}")


def _headers_kind(dtype: DataType) -> str:
    if isinstance(dtype, MapType) and _text_or_bytes(dtype.valueType) and isinstance(dtype.keyType, StringType):
        return "map"
    if isinstance(dtype, ArrayType) and isinstance(dtype.elementType, StructType):
        pair = {f.name: f.dataType for f in dtype.elementType.fields}
        if set(pair) == {"key", "value"} and isinstance(pair["key"], StringType) and _text_or_bytes(pair["value"]):
            return "array"
    raise BasculeSparkError(
        "column 'headers' must be map<string,binary>, map<string,string> or "
        f"array<struct<key:string,value:binary>>, not {dtype.simpleString()}"
    )


def _text_or_bytes(dtype: DataType) -> bool:
    return isinstance(dtype, (BinaryType, StringType))


def _present(name: str, fields: dict[str, DataType], types: tuple[type, ...], what: str) -> bool:
    """Whether the optional column `name` is there; an error when it is, but not of `types`."""
    dtype = fields.get(name)
    if dtype is not None and not isinstance(dtype, types):
        raise BasculeSparkError(f"column '{name}' must be {what}, not {dtype.simpleString()}")
    return dtype is not None
