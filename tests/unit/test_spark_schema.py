"""bascule.spark.schema: the columns a read gives and the columns a write takes (Spark's types only,
no Spark session)."""

import pytest

pytest.importorskip("pyspark", reason="PySpark is not installed (pip install -e '.[spark]')")

from pyspark.sql.types import (  # noqa: E402
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
)

from bascule.spark import SCHEMA, SCHEMA_DDL  # noqa: E402
from bascule.spark.arrow import SinkColumns  # noqa: E402
from bascule.spark.errors import BasculeSparkError  # noqa: E402
from bascule.spark.schema import read_schema, sink_columns, source_schema  # noqa: E402


def schema(**columns) -> StructType:
    return StructType([StructField(name, dtype) for name, dtype in columns.items()])


KAFKA_HEADERS = ArrayType(schema(key=StringType(), value=BinaryType()))


def test_the_ddl_says_what_the_schema_is():
    ddl = [column.split(" ") for column in SCHEMA_DDL.split(", ")]
    assert [(name, {"long": "bigint"}.get(t, t)) for name, t in ddl] == [
        (f.name, f.dataType.simpleString()) for f in SCHEMA.fields
    ]


def test_a_read_schema_is_bascules_or_a_subset_of_it():
    assert read_schema(SCHEMA) == SCHEMA
    subset = schema(value=BinaryType(), offset=LongType())
    assert read_schema(subset) == subset
    with pytest.raises(BasculeSparkError, match=r"column offset int is not in bascule's schema \(stream string"):
        read_schema(schema(offset=IntegerType()))
    with pytest.raises(BasculeSparkError, match="column payload binary is not in bascule's schema"):
        read_schema(schema(payload=BinaryType()))


def test_sink_columns_of_every_kind():
    full = schema(VALUE=StringType(), key=BinaryType(), headers=MapType(StringType(), StringType()),
                  partition=ShortType(), stream=StringType(), offset=LongType())
    assert sink_columns(full, None) == SinkColumns("string", "binary", "map", True, True)
    assert sink_columns(schema(value=BinaryType(), headers=KAFKA_HEADERS), "s") == SinkColumns(
        "binary", None, "array", False, False
    )
    # A DataFrame read from bascule, written as is: its other columns are ignored.
    assert sink_columns(SCHEMA, "out").headers == "map"


@pytest.mark.parametrize(
    "columns, message",
    [
        (schema(partition=IntegerType()), "needs a 'value' column .* it has partition"),
        (schema(), "needs a 'value' column .* it has no columns"),
        (schema(value=LongType()), "column 'value' must be binary or string, not bigint"),
        (schema(value=BinaryType(), key=IntegerType()), "column 'key' must be binary or string, not int"),
        (schema(value=BinaryType(), headers=StringType()), "'headers' must be map<string,binary>, .* not string"),
        (schema(value=BinaryType(), headers=MapType(IntegerType(), BinaryType())), "not map<int,binary>"),
        (schema(value=BinaryType(), headers=ArrayType(schema(name=StringType(), value=BinaryType()))),
         "not array<struct<name"),
        (schema(value=BinaryType(), partition=StringType()), "column 'partition' must be an integer, not string"),
        (schema(value=BinaryType(), stream=BinaryType()), "column 'stream' must be a string, not binary"),
    ],
)
def test_sink_column_errors(columns, message):
    with pytest.raises(BasculeSparkError, match=message):
        sink_columns(columns, "s")


def test_a_write_needs_a_stream_option_or_column():
    with pytest.raises(BasculeSparkError, match="say where to write: the option 'stream', or a 'stream' column"):
        sink_columns(schema(value=BinaryType()), None)
    assert sink_columns(schema(value=BinaryType(), stream=StringType()), None).stream


def test_include_headers_false_leaves_the_headers_column_out():
    assert source_schema(True) == SCHEMA
    assert source_schema(False).fieldNames() == [n for n in SCHEMA.fieldNames() if n != "headers"]
    assert read_schema(source_schema(False), include_headers=False) == source_schema(False)
    with pytest.raises(BasculeSparkError, match="the schema names the column 'headers', but includeHeaders is false"):
        read_schema(SCHEMA, include_headers=False)
