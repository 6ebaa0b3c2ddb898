"""bascule.spark.ids: the message ids the sink gives its rows (no Spark session, no brokers)."""

import pytest

pytest.importorskip("pyspark", reason="PySpark is not installed (pip install -e '.[spark]')")

from bascule.spark.arrow import OutgoingMessages  # noqa: E402
from bascule.spark.ids import RowIds, batch_write_prefix, new_write_id, streaming_prefix  # noqa: E402
from bascule.wire.dedup import MAX_KEPT_ID_BYTES, MESSAGE_ID_HEADER  # noqa: E402


def rows(headers: list) -> OutgoingMessages:
    n = len(headers)
    return OutgoingMessages(["s"] * n, [None] * n, [None] * n, [b"v"] * n, headers)


def ids(messages: OutgoingMessages) -> list:
    return [h.get(MESSAGE_ID_HEADER) for h in messages.headers]


def test_the_prefixes_of_a_batch_write_and_of_a_micro_batch():
    write_id = new_write_id()
    assert len(write_id) == 32 and write_id != new_write_id()
    assert batch_write_prefix(write_id, 3) == f"{write_id}/3"
    query = "d12c8f36-1e34-49c9-8143-4d39be48b3ba"  # a query's id as Spark gives it
    assert streaming_prefix(query, "8", 1) == f"{query}/8/1"
    # Kept as they are by the leaders' windows for any task of up to 10 million rows, and hashed beyond.
    assert len(f"{query}/{10**6}/{10**4}/{10**7}") <= MAX_KEPT_ID_BYTES


def test_rows_are_numbered_across_batches_keeping_their_headers():
    numbering = RowIds("w/0")
    first = numbering.numbered(rows([None, {"a": b"1"}]))
    second = numbering.numbered(rows([None]))
    assert ids(first) + ids(second) == [b"w/0/0", b"w/0/1", b"w/0/2"]
    assert first.headers[1] == {"a": b"1", MESSAGE_ID_HEADER: b"w/0/1"}


def test_a_row_with_its_own_id_keeps_it_even_empty_and_still_counts():
    numbering = RowIds("w/0")
    mine = {MESSAGE_ID_HEADER: b"order-17", "a": b"1"}
    numbered = numbering.numbered(rows([mine, {MESSAGE_ID_HEADER: b""}, None]))
    assert ids(numbered) == [b"order-17", b"", b"w/0/2"]
    assert numbered.headers[0] == mine


def test_every_attempt_of_a_task_numbers_alike_and_starts_its_round_robin_alike():
    attempts = [RowIds("w/1"), RowIds("w/1")]
    assert ids(attempts[0].numbered(rows([None] * 3))) == ids(attempts[1].numbered(rows([None] * 3)))
    assert attempts[0].round_robin_start == attempts[1].round_robin_start
    assert len({RowIds(f"w/{task}").round_robin_start % 3 for task in range(10)}) == 3  # tasks start apart
