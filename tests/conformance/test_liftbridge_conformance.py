"""bascule against the real Liftbridge (v1.9.0), driven the same way: go-liftbridge's functional check
(``lbtool check``, some 160 cases) on one node and on three, and gRPC calls of our own that lbtool does
not make. Any difference that docs/liftbridge.md does not list, with its reason, under "Conformance:
accepted differences" fails the test; so does a listed deliberate difference that no longer occurs.

The deployments (Liftbridge on one node, bascule on one and on three) run side by side and lbtool drives
them at once: most of its time is waiting (stop positions, consumer group rebalances, timeouts), so
this takes about as long as one run. Skipped where the Liftbridge binaries are absent.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from liftbridge_anchor import (
    Comparison,
    accepted_differences,
    compare,
    liftbridge_node,
    missing_binaries,
    run_lbtool,
    stale_rows,
)

from bascule.testing.local import LocalCluster
from bascule.wire.pb import api_pb2, api_pb2_grpc

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.conformance,
    pytest.mark.timeout(400),
    pytest.mark.skipif(missing_binaries() is not None, reason=f"Liftbridge conformance: {missing_binaries()}"),
]

# The same settings for both servers: cursors (and so consumer groups' checkpoints) need the cursor stream.
SHARED_CONFIG = {"cursors.stream.partitions": 1}


@pytest.fixture(scope="module")
def deployments(tmp_path_factory) -> Iterator[dict[str, list[str]]]:
    """gRPC addresses of Liftbridge on one node and of bascule on one node and on three."""
    with contextlib.ExitStack() as stack:
        base: Path = tmp_path_factory.mktemp("liftbridge")
        yield {
            "liftbridge": [stack.enter_context(liftbridge_node(base, SHARED_CONFIG))],
            "bascule 1": stack.enter_context(LocalCluster(1, embedded_nats=True, config=SHARED_CONFIG)).brokers,
            "bascule 3": stack.enter_context(LocalCluster(3, config=SHARED_CONFIG)).brokers,
        }


@pytest.fixture(scope="module")
def lbtool_cases(deployments) -> dict[str, dict[str, str]]:
    """Each deployment's lbtool answers, all three driven at once. lbtool's cases on three nodes are
    those on one, with replication factor 3, so bascule's answers on three nodes are held to
    Liftbridge's on one (see docs/liftbridge.md for why not to Liftbridge's on three)."""
    nodes = {"liftbridge": 1, "bascule 1": 1, "bascule 3": 3}
    with ThreadPoolExecutor(len(deployments)) as pool:
        runs = {name: pool.submit(run_lbtool, addresses, nodes[name]) for name, addresses in deployments.items()}
        return {name: run.result() for name, run in runs.items()}


@pytest.fixture(scope="module")
def comparisons() -> dict[str, Comparison]:
    return {}  # filled by the tests below, read by the staleness check


@pytest.mark.parametrize("nodes", [1, 3])
def test_lbtool_check_agrees_but_for_documented_differences(nodes, lbtool_cases, comparisons):
    comparison = compare(nodes, lbtool_cases["liftbridge"], lbtool_cases[f"bascule {nodes}"], accepted_differences())
    comparisons[f"lbtool check, {nodes} node(s)"] = comparison
    print(comparison.report())
    assert not comparison.unexpected, comparison.report()


def test_own_calls_agree_but_for_documented_differences(deployments, comparisons):
    liftbridge, bascule = (own_calls(deployments[name][0]) for name in ("liftbridge", "bascule 1"))
    comparison = compare(1, liftbridge, bascule, accepted_differences())
    comparisons["own calls"] = comparison
    print(comparison.report())
    assert not comparison.unexpected, comparison.report()


def test_every_documented_difference_still_occurs(comparisons):
    if len(comparisons) < 3:
        pytest.skip("needs every comparison above")
    stale = stale_rows(accepted_differences(), list(comparisons.values()))
    assert not stale, "documented differences that no longer occur:\n" + "\n".join(
        f"  {sorted(row.nodes)} {row.cases} {sorted(row.fields)}" for row in stale)


# ---- our own calls ----------------------------------------------------------------------------------


def _status(call: Callable[[], object]) -> str:
    try:
        answer = call()
    except grpc.RpcError as exc:
        return f'err="{exc.details()}" [grpc {exc.code().name}]'
    return f"err=nil answer={str(answer).strip() or '{}'!r}"


def own_calls(address: str) -> dict[str, str]:
    """Calls lbtool does not make, each case's result in lbtool's style (``err="..." [grpc CODE]``)."""
    with grpc.insecure_channel(address) as channel:
        api = api_pb2_grpc.APIStub(channel)

        def create(name: str, subject: str, **options) -> str:
            return _status(lambda: api.CreateStream(
                api_pb2.CreateStreamRequest(name=name, subject=subject, **options), timeout=10))

        def set_cursor(stream: str, cursor_id: str, partition: int = 0, offset: int = 1) -> str:
            return _status(lambda: api.SetCursor(api_pb2.SetCursorRequest(
                stream=stream, cursorId=cursor_id, partition=partition, offset=offset), timeout=10))

        def fetch_cursor(stream: str, cursor_id: str, partition: int = 0) -> str:
            return _status(lambda: api.FetchCursor(api_pb2.FetchCursorRequest(
                stream=stream, cursorId=cursor_id, partition=partition), timeout=10))

        cases = {
            "grpc.create.subject_empty_token": create("badsubj", "a..b"),
            "grpc.create.subject_wildcard": create("wild", "wild.*"),
            "grpc.create.reserved_name": create("__cursors", "reserved"),
            "grpc.create.rf_minus2": create("rfneg", "rfneg", replicationFactor=-2),
            "grpc.create.rf_max": create("rfmax", "rfmax", replicationFactor=-1),
            "grpc.delete.reserved": _status(lambda: api.DeleteStream(
                api_pb2.DeleteStreamRequest(name="__cursors"), timeout=10)),
            "grpc.cursor.set_no_cursor_id": set_cursor("rfmax", ""),
            "grpc.cursor.set_no_stream_name": set_cursor("", "c1"),
            "grpc.cursor.fetch_no_cursor_id": fetch_cursor("rfmax", ""),
            "grpc.cursor.fetch_no_stream_name": fetch_cursor("", "c1"),
            "grpc.cursor.set_missing_stream": set_cursor("missing", "c1", offset=5),
            "grpc.cursor.fetch_missing_stream": fetch_cursor("missing", "c1"),
            "grpc.cursor.fetch_missing_stream_unset": fetch_cursor("missing", "c2"),
            "grpc.cursor.set_missing_partition": set_cursor("rfmax", "c1", partition=9, offset=3),
            "grpc.cursor.fetch_missing_partition": fetch_cursor("rfmax", "c1", partition=9),
            "grpc.publish.oversize": _status(lambda: api.Publish(
                api_pb2.PublishRequest(stream="rfmax", value=bytes(2 << 20), ackPolicy=api_pb2.AckPolicy.LEADER),
                timeout=10).ack.offset),
            "grpc.publish_async.oversize": _publish_async_error(api, bytes(2 << 20)),
        }
    return cases


def _publish_async_error(api: api_pb2_grpc.APIStub, value: bytes) -> str:
    request = api_pb2.PublishRequest(stream="rfmax", value=value, correlationId="big",
                                     ackPolicy=api_pb2.AckPolicy.LEADER)
    try:
        for response in api.PublishAsync(iter([request]), timeout=10):
            error = response.asyncError
            return (f'code={api_pb2.PublishAsyncError.Code.Name(error.code)} message="{error.message}" '
                    f"cid={response.correlationId} offset={response.ack.offset}")
    except grpc.RpcError as exc:
        return f'err="{exc.details()}" [grpc {exc.code().name}]'
    return "no response"
