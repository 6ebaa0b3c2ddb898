"""The metrics, /healthz and /readyz endpoint of an in-process node, over real sockets."""

import asyncio
import json
import os
import platform
import random
import resource
import sys
import time
from importlib.metadata import version
from pathlib import Path

import grpc
import nats
import pytest
from cluster_checks import FAST, create_stream, leader_index, new_leader, publish_all_acked, restart, wait_for
from conftest import running_node
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from bascule.client import BasculeError, Client
from bascule.natsio.sealed import SealedNats
from bascule.testing.local import LocalCluster
from bascule.testing.ports import free_port
from bascule.wire import envelope
from bascule.wire.pb import api_pb2, api_pb2_grpc
from bascule.wire.seal import Sealer, derive_key

pytestmark = pytest.mark.anyio

METRICS_ON = {"metrics.listen": "127.0.0.1:0"}


async def exchange(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``request`` raw and read until the server closes: (status, header fields, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        response = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, body = response.partition(b"\r\n\r\n")
    status_line, *fields = head.decode("ascii").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (field.partition(":") for field in fields)}
    return int(status_line.split(" ")[1]), headers, body


async def get(port: int, path: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    return await exchange(port, f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n".encode())


async def scrape(port: int) -> dict[tuple[str, frozenset], float]:
    """Every sample the endpoint exposes, by (sample name, labels)."""
    status, headers, body = await get(port, "/metrics")
    assert status == 200 and headers["content-type"] == CONTENT_TYPE_LATEST
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }


async def eventually(check, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result or time.monotonic() > deadline:
            return result
        await asyncio.sleep(0.05)


async def bascule_command(*args: str) -> tuple[int, str, str]:
    """The `bascule` command, run as a user runs it: (exit status, stdout, stderr)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bascule.cli", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def grpc_requests(samples: dict[tuple[str, frozenset], float]) -> dict[tuple[str, str, str], float]:
    """bascule_grpc_requests_total by (method, code, outcome)."""
    return {
        (labels["method"], labels["code"], labels["outcome"]): value
        for (name, labelset), value in samples.items() if name == "bascule_grpc_requests_total"
        for labels in [dict(labelset)]
    }


def partition_labels(stream: str, partition: int = 0, **more: str) -> frozenset:
    return frozenset({"stream": stream, "partition": str(partition), **more}.items())


def labelled(**labels: str) -> frozenset:
    return frozenset(labels.items())


async def test_health_readiness_and_routes(tmp_path):
    servers = []
    async with running_node(tmp_path, metrics_servers=servers, **METRICS_ON) as (node, address):
        port = servers[0].port
        status, _, body = await get(port, "/healthz")
        assert (status, body) == (200, b"ok\n")

        async def ready():
            return (await get(port, "/readyz"))[0] == 200

        assert await eventually(ready)
        assert (await get(port, "/readyz"))[2] == b"ready\n"
        assert node.why_not_ready() is None
        assert (await get(port, "/readyz?verbose=1"))[0] == 200  # a query is no part of the path
        assert (await get(port, "/nowhere"))[0] == 404
        assert (await get(port, "/"))[0] == 404
        status, headers, _ = await get(port, "/metrics", method="POST")
        assert (status, headers["allow"]) == (405, "GET, HEAD")
        status, headers, body = await get(port, "/healthz", method="HEAD")
        assert (status, headers["content-length"], body) == (200, "3", b"")
        assert headers["connection"] == "close"


async def test_partition_series_follow_publishes(tmp_path):
    servers = []
    async with running_node(tmp_path, metrics_servers=servers, **METRICS_ON) as (node, address):
        port = servers[0].port
        async with Client(address) as client:
            await client.wait_ready()
            await client.create_stream("orders", "orders.in", partitions=2)
            before = await scrape(port)
            assert before[("bascule_partition_log_end_offset", partition_labels("orders"))] == 0
            assert before[("bascule_partition_high_watermark", partition_labels("orders"))] == -1
            for i in range(5):
                await client.publish("orders", f"m{i}".encode(), ack_policy="all")
            await client.publish("orders", b"other", partition=1, ack_policy="all")
            after = await scrape(port)
        for name, value in [("log_end_offset", 5), ("high_watermark", 4), ("isr_size", 1), ("replicas", 1),
                            ("leader", 1), ("under_replicated", 0), ("acks_held", 0)]:
            assert after[(f"bascule_partition_{name}", partition_labels("orders"))] == value, name
        assert after[("bascule_partition_log_end_offset", partition_labels("orders", 1))] == 1
        assert after[("bascule_partitions_under_replicated", frozenset())] == 0
        assert after[("bascule_partitions_offline", frozenset())] == 0
        assert after[("bascule_raft_leader", frozenset())] == 1
        assert after[("bascule_raft_term", frozenset())] >= 1
        assert after[("bascule_raft_commit_index", frozenset())] >= 1
        voter = frozenset({"voter": node.raft.address}.items())
        assert after[("bascule_raft_voter_connected", voter)] == 1
        assert after[("bascule_raft_voter_match_index", voter)] == after[("bascule_raft_commit_index", frozenset())]
        assert after[("bascule_nats_connected", frozenset())] == 1
        assert after[("bascule_nats_reconnects_total", frozenset())] == 0
        dropped = [labels for name, labels in after if name == "bascule_internal_messages_dropped_total"]
        reasons = {dict(labels)["reason"] for labels in dropped}
        assert reasons == {"malformed", "bad_tag", "untimely", "behind_window", "replayed"}


async def test_dropped_internal_messages_are_counted(tmp_path):
    servers = []
    async with running_node(tmp_path, metrics_servers=servers, **METRICS_ON) as (node, address):
        port = servers[0].port
        bad_tag = ("bascule_internal_messages_dropped_total", frozenset({"reason": "bad_tag"}.items()))
        assert (await scrape(port))[bad_tag] == 0
        nc = await nats.connect(node._embedded.url)
        stranger = SealedNats(nc, Sealer(derive_key("not the cluster's secret")))
        await stranger.publish(node.subjects.admin_status, b"")
        await nc.flush()
        await nc.close()

        async def counted():
            return (await scrape(port))[bad_tag] == 1

        assert await eventually(counted)


GARBAGE = [
    (bytes(random.Random(7).randrange(256) for _ in range(512)) + b"\r\n\r\n", 400),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(200) + b"\r\n\r\n", 400),  # a TLS hello
    (b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * 16 * 1024 + b"\r\n\r\n", 431),
    (b"GET /metrics\r\n\r\n", 400),
    (b"GET  /metrics HTTP/1.1\r\n\r\n", 400),
    (b"GET metrics HTTP/1.1\r\n\r\n", 400),
    (b"GET /metrics HTTP/2.0\r\n\r\n", 400),
    (b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n", 400),
    (b"GET /metrics HTTP/1.1\r\nBad Name: x\r\n\r\n", 400),
    (b"GET /metrics HTTP/1.1\r\nX: a\x00b\r\n\r\n", 400),
    (b"GET /metr", 400),  # then the client stops sending
]


async def test_garbage_gets_400_or_431_and_the_endpoint_keeps_answering(tmp_path):
    servers = []
    async with running_node(tmp_path, metrics_servers=servers, **METRICS_ON) as (node, address):
        port = servers[0].port
        for garbage, status in GARBAGE:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(garbage)
            writer.write_eof()
            response = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            assert response.startswith(f"HTTP/1.1 {status} ".encode()), (garbage[:40], response[:60])
            assert b"\r\nConnection: close\r\n" in response
            assert (await get(port, "/healthz"))[0] == 200
        assert ("bascule_raft_leader", frozenset()) in await scrape(port)


async def test_a_client_that_sends_nothing_is_let_go_and_others_are_served(tmp_path):
    servers = []
    async with running_node(tmp_path, metrics_servers=servers, **METRICS_ON) as (node, address):
        port = servers[0].port
        silent = [await asyncio.open_connection("127.0.0.1", port) for _ in range(8)]
        assert (await get(port, "/healthz"))[0] == 200
        for _, writer in silent:
            writer.write_eof()
        for reader, writer in silent:
            assert await asyncio.wait_for(reader.read(), 10) == b""  # closed without an answer
            writer.close()


async def test_no_endpoint_unless_configured(tmp_path):
    servers = []
    async with running_node(tmp_path, metrics_servers=servers) as (node, address):
        assert node.config.metrics.port is None
        assert servers == []


async def test_traffic_moves_the_counters_of_partitions_grpc_calls_fsyncs_and_capture(tmp_path):
    servers = []
    settings = {**METRICS_ON, "streams.sync": "always"}  # an fsync before each ack
    async with running_node(tmp_path, metrics_servers=servers, **settings) as (node, address):
        port = servers[0].port
        orders = partition_labels("orders")
        async with Client(address) as client:
            await client.create_stream("orders", "orders.in")
            before = await scrape(port)
            assert before[("bascule_partition_messages_in_total", orders)] == 0
            for i in range(5):
                await client.publish("orders", f"m{i}".encode(), ack_policy="all")
            read = [message async for message in client.subscribe("orders", start="earliest", stop_offset=4)]
            assert len(read) == 5
            with pytest.raises(BasculeError) as missing:
                await client.delete_stream("nowhere")
            assert missing.value.code.name == "NOT_FOUND"
            after = await scrape(port)

        assert after[("bascule_partition_messages_in_total", orders)] == 5
        stored = after[("bascule_partition_bytes_in_total", orders)]
        assert stored > 5 * 32  # each entry's header and body
        # SubscribeBatches, bascule's client's read, sends entries as stored.
        assert after[("bascule_partition_messages_out_total", partition_labels("orders", reader="subscriber"))] == 5
        assert after[("bascule_partition_bytes_out_total", partition_labels("orders", reader="subscriber"))] == stored
        assert after[("bascule_partition_messages_out_total", partition_labels("orders", reader="follower"))] == 0
        assert after[("bascule_partition_leader_elections_total", orders)] == 0
        assert after[("bascule_partition_isr_shrinks_total", orders)] == 0

        publish = "/proto.API/Publish"
        assert after[("bascule_grpc_requests_total", labelled(method=publish, code="OK", outcome="ok"))] == 5
        assert after[("bascule_grpc_request_duration_seconds_count", labelled(method=publish))] == 5
        assert after[("bascule_grpc_request_duration_seconds_bucket", labelled(method=publish, le="+Inf"))] == 5
        missing_stream = labelled(method="/proto.API/DeleteStream", code="NOT_FOUND", outcome="error")
        assert after[("bascule_grpc_requests_total", missing_stream)] == 1
        batches = labelled(method="/bascule.data.Data/SubscribeBatches", code="RESOURCE_EXHAUSTED", outcome="end")
        assert after[("bascule_grpc_requests_total", batches)] == 1

        fsyncs = ("bascule_log_fsync_seconds_count", frozenset())
        fsync_time = ("bascule_log_fsync_seconds_sum", frozenset())
        assert after[fsyncs] >= before[fsyncs] + 5
        assert after[("bascule_log_fsync_seconds_bucket", labelled(le="+Inf"))] == after[fsyncs]
        assert after[fsync_time] > before[fsync_time]
        dropped = {dict(labels)["reason"]: value for (name, labels), value in after.items()
                   if name == "bascule_capture_messages_dropped_total"}
        assert dropped == {"not_leader": 0, "closed": 0, "failed": 0, "invalid": 0, "write_error": 0}


async def test_captured_messages_the_log_refuses_are_counted_and_garbage_is_stored(tmp_path):
    servers = []
    async with running_node(tmp_path, metrics_servers=servers, **METRICS_ON) as (node, address):
        port = servers[0].port
        async with Client(address) as client:
            await client.create_stream("plain", "plain.in")
        rng = random.Random(5)
        garbage = [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))) for _ in range(30)]
        garbage += [envelope.MAGIC + payload for payload in garbage[:10]]  # envelopes in looks only
        # A header name longer than an entry can hold (64 KiB): refused by the log, never acked.
        refused = envelope.encode_message(
            api_pb2.Message(value=b"v", headers={"n" * 70_000: b"v"}), envelope.MsgType.PUBLISH
        )
        nc = await nats.connect(node._embedded.url)
        try:
            for payload in garbage:
                await nc.publish("plain.in", payload)
            await nc.flush()

            async def stored():
                return (await scrape(port))[("bascule_partition_messages_in_total", partition_labels("plain"))] == 40

            assert await eventually(stored)
            await nc.publish("plain.in", refused)
            await nc.flush()
        finally:
            await nc.close()
        invalid = ("bascule_capture_messages_dropped_total", labelled(reason="invalid"))

        async def counted():
            return (await scrape(port))[invalid] == 1

        assert await eventually(counted)
        assert (await scrape(port))[("bascule_partition_messages_in_total", partition_labels("plain"))] == 40


@pytest.mark.cluster
async def test_replication_isr_changes_and_elections_move_the_series_of_a_cluster():
    ports = [free_port() for _ in range(3)]
    node_config = [{"metrics.listen": f"127.0.0.1:{port}"} for port in ports]
    with LocalCluster(3, config=FAST, node_config=node_config) as cluster:

        async def series(index: int, name: str, **labels: str) -> float:
            return (await scrape(ports[index]))[(name, partition_labels("replicated", **labels))]

        await create_stream(cluster, "replicated")
        leader = await leader_index(cluster, "replicated")
        followers = [i for i in range(3) if i != leader]
        await publish_all_acked(cluster, "replicated", [f"r{i}".encode() for i in range(10)])

        async def replicated():
            counts = [await series(i, "bascule_partition_messages_in_total") for i in range(3)]
            sizes = {await series(i, "bascule_partition_bytes_in_total") for i in range(3)}
            sent = await series(leader, "bascule_partition_messages_out_total", reader="follower")
            return counts == [10, 10, 10] and len(sizes) == 1 and sent == 20

        await wait_for(replicated, 15, "every replica's in-counters at 10, the leader's out at 20", cluster)
        stored = await series(leader, "bascule_partition_bytes_in_total")
        assert await series(leader, "bascule_partition_bytes_out_total", reader="follower") >= 2 * stored
        assert await series(followers[0], "bascule_partition_messages_out_total", reader="follower") == 0

        cluster.kill(followers[0])  # out of the ISR after the max lag time (2 s)

        async def shrunk():
            return await series(leader, "bascule_partition_isr_shrinks_total") == 1

        await wait_for(shrunk, 15, "the leader to count an ISR shrink", cluster)
        assert await series(leader, "bascule_partition_under_replicated") == 1
        await restart(cluster, followers[0])

        async def expanded():
            return await series(leader, "bascule_partition_isr_expands_total") == 1

        await wait_for(expanded, 20, "the leader to count an ISR expansion", cluster)
        assert await series(leader, "bascule_partition_leader_elections_total") == 0

        old = cluster.server_ids[leader]
        cluster.kill(leader)
        successor = await new_leader(cluster, "replicated", followers, old)

        async def elected():
            return await series(successor, "bascule_partition_leader_elections_total") >= 1

        await wait_for(elected, 15, "the new leader to count an election", cluster)
        assert await series(successor, "bascule_partition_leader") == 1


async def test_reads_that_end_where_asked_count_as_ends_and_failed_calls_as_errors(tmp_path):
    servers = []
    async with running_node(tmp_path, metrics_servers=servers, **METRICS_ON) as (node, address):
        port = servers[0].port
        async with Client(address) as client:
            await client.create_stream("orders", "orders.in")
            await client.create_stream("empty", "empty.in")
            for i in range(3):
                await client.publish("orders", f"m{i}".encode(), ack_policy="all")
        # The README's reads: newest first back to the oldest (Liftbridge's Subscribe, ended UNKNOWN "EOF"),
        # and up to the newest (bascule's batches, ended RESOURCE_EXHAUSTED), of a stream and of an empty one.
        assert await bascule_command("subscribe", "-s", "orders", "--start", "latest", "--reverse", "-a", address) == (
            0, "2 m2\n1 m1\n0 m0\n", "",
        )
        assert await bascule_command("subscribe", "-s", "orders", "--stop-latest", "-a", address) == (
            0, "0 m0\n1 m1\n2 m2\n", "",
        )
        assert (await bascule_command("subscribe", "-s", "empty", "--stop-latest", "-a", address))[:2] == (0, "")
        # A Liftbridge client's read up to the newest: Subscribe, ended RESOURCE_EXHAUSTED "Stop offset reached".
        async with grpc.aio.insecure_channel(address) as channel:
            call = api_pb2_grpc.APIStub(channel).Subscribe(api_pb2.SubscribeRequest(
                stream="orders", startPosition=api_pb2.StartPosition.EARLIEST,
                stopPosition=api_pb2.StopPosition.STOP_LATEST,
            ))
            with pytest.raises(grpc.aio.AioRpcError) as stopped:
                assert len([message async for message in call]) == 4  # the handshake, then three
            assert (stopped.value.code(), stopped.value.details()) == (
                grpc.StatusCode.RESOURCE_EXHAUSTED, "Stop offset reached",
            )
        code, _, err = await bascule_command("delete", "-s", "nowhere", "-a", address)
        assert (code, err) == (1, "bascule delete: not found: stream does not exist\n")
        requests = grpc_requests(await scrape(port))

    subscribe, batches = "/proto.API/Subscribe", "/bascule.data.Data/SubscribeBatches"
    assert requests[(subscribe, "UNKNOWN", "end")] == 1
    assert requests[(subscribe, "RESOURCE_EXHAUSTED", "end")] == 1
    assert requests[(batches, "RESOURCE_EXHAUSTED", "end")] == 2
    assert {key: count for key, count in requests.items() if key[2] == "error"} == {
        ("/proto.API/DeleteStream", "NOT_FOUND", "error"): 1,
    }
    assert all(code == "OK" for _, code, outcome in requests if outcome == "ok")


def process_facts(pid: int) -> tuple[int, int, int]:
    """A process's open files, its soft limit of them and its resident memory in bytes, as Linux tells them."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    resident_kib = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    return len(os.listdir(f"/proc/{pid}/fd")), resource.prlimit(pid, resource.RLIMIT_NOFILE)[0], resident_kib * 1024


@pytest.mark.cluster
async def test_process_and_build_series_describe_the_node_process():
    port = free_port()
    started = time.time()
    with LocalCluster(1, node_config=[{"metrics.listen": f"127.0.0.1:{port}"}]) as cluster:
        pid = cluster.node(0).pid
        samples = await scrape(port)
        open_fds, soft_limit, resident = process_facts(pid)

    def sample(name: str) -> float:
        return samples[(name, frozenset())]

    assert started - 60 < sample("process_start_time_seconds") <= time.time()
    assert sample("process_max_fds") == soft_limit  # the node raised it to its hard limit
    assert abs(sample("process_open_fds") - open_fds) < 20
    assert 0.5 < sample("process_resident_memory_bytes") / resident < 2
    assert sample("process_virtual_memory_bytes") > sample("process_resident_memory_bytes")
    assert sample("process_cpu_seconds_total") > 0
    build = labelled(version=version("bascule"), python=platform.python_version())
    assert samples[("bascule_build_info", build)] == 1


async def test_partition_size_and_oldest_offset_follow_retention_as_stream_info_shows_them(tmp_path):
    servers = []
    async with running_node(tmp_path, metrics_servers=servers, **METRICS_ON) as (node, address):
        port = servers[0].port
        kept = partition_labels("kept")
        async with Client(address) as client:
            await client.create_stream(
                "kept", "kept.in", segment_max_bytes=1024, retention_max_messages=20, cleaner_interval=0.2,
            )
            before = await scrape(port)
            assert before[("bascule_partition_oldest_offset", kept)] == 0
            assert before[("bascule_partition_size_bytes", kept)] == 0
            await client.publish_many("kept", [b"x" * 100 for _ in range(200)], ack_policy="all")

        async def retained():
            samples = await scrape(port)
            return samples[("bascule_partition_oldest_offset", kept)] > 0 and samples

        samples = await eventually(retained)
        assert samples, "retention removed no segment"
        oldest = samples[("bascule_partition_oldest_offset", kept)]
        size = samples[("bascule_partition_size_bytes", kept)]
        assert 0 < oldest < 200 and 0 < size < samples[("bascule_partition_bytes_in_total", kept)]
        code, out, err = await bascule_command("stream-info", "kept", "--json", "-a", address)
        assert code == 0, err
        [shown] = json.loads(out)["partitions"]
        assert (shown["oldestOffset"], shown["sizeBytes"]) == (oldest, size)
