"""The message ids the sink gives the rows it writes (issue 31), as pure rules.

An id is what lets a partition's leader store a message once (``wire.dedup``), so a row must get the
same id, and go to the same partition, on every attempt that writes it: a retried task, a micro-batch
run again after a restart. The id says where the row is in what Spark wrote, and nothing else:

- a batch write: ``<write id>/<Spark partition id>/<row index>``, the write id made once on the
  driver when Spark asks for the writer (`new_write_id`), which Spark then pickles to every attempt
  of every task;
- a streaming write: ``<query id>/<batch id>/<Spark partition id>/<row index>``: the query's id,
  which its checkpoint keeps across restarts, and the micro-batch's, both from the task's local
  properties (`QUERY_ID_PROPERTY`, `BATCH_ID_PROPERTY`).

The row index counts the task's input rows from 0, whatever record batches they arrive in. So a row's
id is the same only when the task's input is: the same rows in the same order (docs/spark.md).
"""

from __future__ import annotations

import dataclasses
import uuid
import zlib

from bascule.spark.arrow import OutgoingMessages
from bascule.wire.dedup import MESSAGE_ID_HEADER

# Set by Spark on the tasks of a streaming query's micro-batch (StreamExecution.QUERY_ID_KEY,
# MicroBatchExecution.BATCH_ID_KEY); the query id is its `id`, not the `runId` of one run.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


def new_write_id() -> str:
    return uuid.uuid4().hex


def batch_write_prefix(write_id: str, spark_partition: int) -> str:
    return f"{write_id}/{spark_partition}"


def streaming_prefix(query_id: str, batch_id: str, spark_partition: int) -> str:
    return f"{query_id}/{batch_id}/{spark_partition}"


class RowIds:
    """Numbers one task's rows: row i gets the id ``<prefix>/<i>``."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.next_row = 0

    @property
    def round_robin_start(self) -> int:
        """Where the task's round robin starts: fixed by its prefix, so that every attempt sends each
        row where the first sent it, and different for each task (see `partitioning.Partitioner`)."""
        return zlib.crc32(self.prefix.encode())

    def numbered(self, messages: OutgoingMessages) -> OutgoingMessages:
        """The next rows of the task with their ids. A row whose headers carry a ``Nats-Msg-Id``
        keeps it, as bascule's client does (even an empty one, which the leader takes for no id);
        it still has its index, so that the others' ids do not depend on it."""
        first = self.next_row
        self.next_row += len(messages.values)
        headers = [
            row if row is not None and MESSAGE_ID_HEADER in row
            else {**(row or {}), MESSAGE_ID_HEADER: f"{self.prefix}/{first + i}".encode()}
            for i, row in enumerate(messages.headers)
        ]
        return dataclasses.replace(messages, headers=headers)
