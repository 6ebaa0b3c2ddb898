"""bascule.spark.progress: Kafka's offsets-behind-latest metrics from a query's progress (no Spark)."""

import json

import pytest

pytest.importorskip("pyspark", reason="PySpark is not installed (pip install -e '.[spark]')")

from bascule.spark import offsets_behind_latest  # noqa: E402


def test_offsets_behind_latest_per_partition_as_kafkas_metrics():
    source = {
        "endOffset": json.dumps({"a": {"0": 10, "1": 20}, "b": {"0": 5}}),
        "latestOffset": json.dumps({"a": {"0": 10, "1": 27}, "b": {"0": 9}}),
    }
    assert offsets_behind_latest(source) == {
        "minOffsetsBehindLatest": "0", "maxOffsetsBehindLatest": "7", "avgOffsetsBehindLatest": "3.6666666666666665",
    }


def test_a_partition_the_batch_has_not_reached_counts_from_offset_zero_and_dicts_are_taken_as_is():
    source = {"endOffset": {"a": {"0": 4}}, "latestOffset": {"a": {"0": 4, "1": 6}}}
    assert offsets_behind_latest(source)["maxOffsetsBehindLatest"] == "6"


@pytest.mark.parametrize("end, latest", [(None, None), ("null", "null"), ("{}", "{}"), ('{"a": {"0": 1}}', None)])
def test_no_offsets_no_metrics(end, latest):
    assert offsets_behind_latest({"endOffset": end, "latestOffset": latest}) == {}
