"""Read and write bascule streams from PySpark 4.x (Python Data Source API).

    from bascule.spark import BasculeDataSource
    spark.dataSource.register(BasculeDataSource)
    df = spark.read.format("bascule").option("brokers", "127.0.0.1:9292").option("stream", "orders").load()

See docs/spark.md for every option.
"""

from bascule.spark.errors import BasculeSparkError
from bascule.spark.progress import offsets_behind_latest
from bascule.spark.schema import SCHEMA, SCHEMA_DDL
from bascule.spark.source import BasculeDataSource

__all__ = ["SCHEMA", "SCHEMA_DDL", "BasculeDataSource", "BasculeSparkError", "offsets_behind_latest"]
