"""bascule.spark.retry: the retry policy of the Spark source and sink, and the loop that follows it
(no Spark session, no brokers: the calls here are stand-ins that fail as told)."""

import asyncio
import logging

import grpc
import pytest

pytest.importorskip("pyspark", reason="PySpark is not installed (pip install -e '.[spark]')")

from bascule.client import BasculeError  # noqa: E402
from bascule.spark.retry import PUBLISH_RETRY, READ_RETRY, RetryPolicy, retried  # noqa: E402

UNAVAILABLE, UNKNOWN, NOT_FOUND = grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN, grpc.StatusCode.NOT_FOUND
POLICY = RetryPolicy(frozenset({UNAVAILABLE}), attempts=3, first_delay=0.5)


def test_the_policy_retries_only_its_codes_and_only_while_attempts_are_left():
    assert POLICY.retries(UNAVAILABLE, 1) and POLICY.retries(UNAVAILABLE, 2)
    assert not POLICY.retries(UNAVAILABLE, 3)  # the third attempt was the last
    assert not POLICY.retries(UNKNOWN, 1)
    assert not RetryPolicy(frozenset({UNAVAILABLE}), attempts=1).retries(UNAVAILABLE, 1)


def test_pauses_double_after_each_failure():
    assert [POLICY.delay(n) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]
    assert [READ_RETRY.delay(n) for n in (1, 2, 3, 4)] == pytest.approx([0.2, 0.4, 0.8, 1.6])


def test_reads_retry_leader_changes_and_timeouts_and_publishes_not_a_refused_message():
    for code in (UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.DEADLINE_EXCEEDED, UNKNOWN):
        assert READ_RETRY.retries(code, 4) and not READ_RETRY.retries(code, 5)
    assert not READ_RETRY.retries(NOT_FOUND, 1)
    assert PUBLISH_RETRY.retries(UNAVAILABLE, 2) and not PUBLISH_RETRY.retries(UNAVAILABLE, 3)
    assert not PUBLISH_RETRY.retries(UNKNOWN, 1)  # a message the broker refused is final


class Flaky:
    """A call that fails with `codes`, in turn, then returns "done"."""

    def __init__(self, *codes: grpc.StatusCode) -> None:
        self.codes, self.calls = list(codes), 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.codes:
            raise BasculeError(self.codes.pop(0), "no leader")
        return "done"


@pytest.fixture
def pauses(monkeypatch) -> list[float]:
    """The pauses `retried` takes, recorded instead of slept."""
    taken: list[float] = []

    async def sleep(seconds: float) -> None:
        taken.append(seconds)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    return taken


def test_the_loop_tries_again_after_each_retried_failure(pauses, caplog):
    call = Flaky(UNAVAILABLE, UNAVAILABLE)
    with caplog.at_level(logging.INFO, logger="bascule.spark"):
        assert asyncio.run(retried(POLICY, call, "fetching")) == "done"
    assert (call.calls, pauses) == (3, [0.5, 1.0])
    assert "fetching: UNAVAILABLE: no leader; trying again in 0.5 s" in caplog.text


def test_the_loop_raises_the_last_failure_when_attempts_run_out(pauses):
    call = Flaky(UNAVAILABLE, UNAVAILABLE, UNAVAILABLE, UNAVAILABLE)
    with pytest.raises(BasculeError, match="UNAVAILABLE"):
        asyncio.run(retried(POLICY, call, "fetching"))
    assert (call.calls, pauses) == (3, [0.5, 1.0])


def test_the_loop_raises_a_failure_the_policy_does_not_retry_at_once(pauses):
    call = Flaky(UNAVAILABLE, NOT_FOUND)
    with pytest.raises(BasculeError, match="NOT_FOUND"):
        asyncio.run(retried(POLICY, call, "fetching"))
    assert (call.calls, pauses) == (2, [0.5])


def test_other_exceptions_pass_through_untouched(pauses):
    async def broken() -> None:
        raise ValueError("a bug, not a broker")

    with pytest.raises(ValueError, match="a bug"):
        asyncio.run(retried(POLICY, broken, "fetching"))
    assert pauses == []
