"""The Spark sink writes exactly once (issue 31): rows written again by a retried task or by a
micro-batch run again after a crash carry the same message ids, go to the same partitions, and are
stored once by the partitions' leaders. A real bascule node, the real PySpark (test_spark's session,
whose tasks are tried twice), faults injected where Spark meets them.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

pytest.importorskip("pyspark", reason="PySpark is not installed (pip install -e '.[spark]')")
pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install -e '.[spark]')")

from test_spark import broker, cluster, create, publish_client, reader, run, spark, spark_test  # noqa: E402, F401  (fixtures)

from bascule.client import Client, partition_by_key  # noqa: E402
from bascule.wire.dedup import MESSAGE_ID_HEADER  # noqa: E402

ROWS_PER_TASK = 400
FAIL_AT = 300  # each task's first attempt fails at this row of its input...
STORED_BEFORE_FAILING = 100  # ...once at least this many of its rows are in the stream
# Spark's Python workers pass rows on through 64 KiB buffers: rows of 2 KB reach the sink before the
# failure, in record batches of 50 (spark.sql.execution.arrow.maxRecordsPerBatch, 10,000 by default).
VALUE_BYTES = 2000
SINK_BATCH_ROWS = "50"


def written(spark, broker: str, stream: str) -> list[tuple[bytes, bytes]]:  # noqa: F811
    """(value, message id) of every message in `stream`."""
    table = reader(spark, broker, stream=stream).select("value", "headers").toArrow().to_pydict()
    return [(value, dict(headers)[MESSAGE_ID_HEADER]) for value, headers in zip(table["value"], table["headers"])]


@spark_test
def test_tasks_that_fail_after_writing_and_are_retried_leave_each_row_once(spark, broker, tmp_path):  # noqa: F811
    from pyspark.sql import functions as F

    run(create(broker, "once-batch", "once.batch", partitions=3))

    def stored_rows(task: int) -> int:
        """How many of task `task`'s rows the stream holds (run in the task's Python worker)."""

        async def count() -> int:
            async with Client(broker) as client:
                values = [
                    m.value for p in range(3)
                    async for m in client.subscribe("once-batch", p, start="earliest", stop_latest=True)
                ]
            return sum(int(v.lstrip(b"-")) // ROWS_PER_TASK == task for v in values)

        return asyncio.run(count())

    def pass_or_fail(value):  # no type hints: PySpark would look in them for a pandas UDF's
        """A Python UDF upstream of the sink: a task's first attempt fails at its row FAIL_AT, once
        the sink has stored some of the rows before it."""
        from pyspark import TaskContext

        task, row = TaskContext.get(), int(value.lstrip("-"))
        if task.attemptNumber() == 0 and row % ROWS_PER_TASK == FAIL_AT:
            deadline = time.monotonic() + 60
            while (stored := stored_rows(task.partitionId())) < STORED_BEFORE_FAILING and time.monotonic() < deadline:
                time.sleep(0.2)
            (tmp_path / f"task-{task.partitionId()}").write_text(str(stored))
            raise RuntimeError(f"injected: a first attempt fails at row {row}, {stored} of its rows stored")
        return value

    padded = F.lpad(F.col("id").cast("string"), VALUE_BYTES, "-")
    rows = spark.range(0, 2 * ROWS_PER_TASK, 1, numPartitions=2).select(
        F.udf(pass_or_fail, "string", useArrow=False)(padded).alias("value")
    )
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", SINK_BATCH_ROWS)
    try:
        rows.write.format("bascule").mode("append").option("brokers", broker).option("stream", "once-batch").save()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")

    stored_by_first_attempts = {task: int((tmp_path / f"task-{task}").read_text()) for task in range(2)}
    assert min(stored_by_first_attempts.values()) >= STORED_BEFORE_FAILING, stored_by_first_attempts
    messages = written(spark, broker, "once-batch")
    counts = Counter(int(value.lstrip(b"-")) for value, _ in messages)
    assert [n for n, times in counts.items() if times > 1] == [], "rows stored more than once"
    assert sorted(counts) == list(range(2 * ROWS_PER_TASK))
    # <write id>/<Spark partition id>/<row index>: one write id, each row's place in its task.
    write_ids = {message_id.split(b"/")[0] for _, message_id in messages}
    assert len(write_ids) == 1
    (write_id,) = write_ids
    for value, message_id in messages:
        n = int(value.lstrip(b"-"))
        assert message_id == b"%s/%d/%d" % (write_id, n // ROWS_PER_TASK, n % ROWS_PER_TASK)


@spark_test
def test_a_micro_batch_run_again_after_a_crash_before_its_commit_is_stored_once(spark, broker, tmp_path):  # noqa: F811
    run(create(broker, "once-in", "once.in", partitions=2))
    run(create(broker, "once-out", "once.out", partitions=3))
    for p in range(2):
        run(publish_client(broker, "once-in", p, [b"%d-%d" % (p, i) for i in range(300)]))
    checkpoint = tmp_path / "checkpoint"

    def run_query():
        source = (
            spark.readStream.format("bascule").option("brokers", broker).option("stream", "once-in")
            .option("startingOffsets", "earliest").option("maxMessagesPerTrigger", "400").load()
        )
        query = (
            source.select("value").writeStream.format("bascule").option("brokers", broker)
            .option("stream", "once-out").option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True).start()
        )
        query.awaitTermination(120)
        assert not query.isActive and query.exception() is None
        return query, [(p["batchId"], p["numInputRows"]) for p in query.recentProgress if p["numInputRows"]]

    first, batches = run_query()
    assert batches == [(0, 400), (1, 200)]
    assert len(written(spark, broker, "once-out")) == 600
    # The driver died after the sink wrote micro-batch 1 and before Spark recorded its commit.
    for name in ("1", ".1.crc"):
        (checkpoint / "commits" / name).unlink(missing_ok=True)

    again, batches = run_query()
    assert batches == [(1, 200)], "Spark did not run micro-batch 1 again"
    messages = written(spark, broker, "once-out")
    counts = Counter(value for value, _ in messages)
    assert [v for v, times in counts.items() if times > 1] == [], "rows stored more than once"
    assert set(counts) == {b"%d-%d" % (p, i) for p in range(2) for i in range(300)}
    # <query id>/<batch id>/<Spark partition id>/<row index>, the query's id the same after the restart.
    assert again.id == first.id
    parts = [message_id.decode().split("/") for _, message_id in messages]
    assert {query_id for query_id, *_ in parts} == {first.id}
    assert Counter(batch for _, batch, _, _ in parts) == {"0": 400, "1": 200}
    assert len({tuple(p) for p in parts}) == 600


@spark_test
def test_rows_with_their_own_message_ids_keep_them(spark, broker):  # noqa: F811
    run(create(broker, "own-ids", "own.ids", partitions=3))
    rows = [(f"v{i}", {MESSAGE_ID_HEADER: f"order-{i % 4}".encode()}) for i in range(8)]
    df = spark.createDataFrame(rows, "value string, headers map<string, binary>").coalesce(1)
    df.write.format("bascule").mode("append").option("brokers", broker).option("stream", "own-ids").save()

    stored = reader(spark, broker, stream="own-ids").toArrow().to_pydict()
    ids = {
        dict(h)[MESSAGE_ID_HEADER]: (v, p) for v, p, h in zip(stored["value"], stored["partition"], stored["headers"])
    }
    assert len(stored["value"]) == 4, "a message id repeated in one write was stored again"
    for i in range(4):  # the first row with each id, where the id's hash puts it
        message_id = f"order-{i}".encode()
        assert ids[message_id] == (f"v{i}".encode(), partition_by_key("own-ids", message_id, b"", 3))
