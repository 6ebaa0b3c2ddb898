"""The `bascule` command as people and scripts run it: a subprocess against a real node, and garbage input,
each refused with a clear error and the exit status its help documents (0 done, 1 the request failed,
2 usage, 3 no server reachable)."""

import asyncio
import base64
import json
import os
import subprocess
import sys
import time
from importlib.metadata import version

import pytest
from conftest import running_node

from bascule.client import MESSAGE_ID_HEADER, Client
from bascule.testing.local import LocalCluster

pytestmark = pytest.mark.anyio

UNREACHABLE = "127.0.0.1:1"  # nothing listens on port 1


def environment(address: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "BASCULE_ADDRESS"}
    return env if address is None else {**env, "BASCULE_ADDRESS": address}


async def bascule(*args: str, env_address: str | None = None) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bascule.cli", *args, env=environment(env_address),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def bascule_json(*args: str, env_address: str | None = None):
    code, out, err = await bascule(*args, "--json", env_address=env_address)
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()] if "subscribe" in args else json.loads(out)


def keys_of(value) -> set[str]:
    """Every object key in a JSON document (maps' keys too: stream names, broker ids)."""
    if isinstance(value, list):
        return set().union(*map(keys_of, value))
    if not isinstance(value, dict):
        return set()
    return set(value).union(*map(keys_of, value.values()))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def test_stream_info_shows_each_partitions_log_and_the_streams_settings(tmp_path):
    async with running_node(tmp_path) as (node, address), Client(address) as client:
        await client.wait_ready()
        code, _, err = await bascule("create", "-a", address, "-s", "info", "--partitions", "2",
                                     "--retention-max-messages", "1000")
        assert code == 0, err
        code, _, err = await bascule("publish", "-s", "info", "-p", "0", "-m", "a", "-m", "b", "-a", address)
        assert code == 0, err
        await client.publish("info", b"c", partition=1)

        info = await bascule_json("stream-info", "info", "-a", address)
        assert (info["name"], info["subject"], info["replicationFactor"]) == ("info", "info", 1)
        assert info["settings"]["retentionMaxMessages"] == 1000 and info["settings"]["compactEnabled"] is False
        first, second = info["partitions"]
        assert (first["messages"], first["oldestOffset"], first["newestOffset"], first["highWatermark"]) == (2, 0, 1, 1)
        assert (second["messages"], second["newestOffset"]) == (1, 0)
        assert first["sizeBytes"] > second["sizeBytes"] > 0
        assert first["leader"] == node.server_id and first["isr"] == [node.server_id]

        code, out, err = await bascule("stream-info", "info", "-a", address)
        assert code == 0, err
        assert "retentionMaxMessages=1000" in out and "MESSAGES" in out and "OLDEST" in out
        code, _, err = await bascule("stream-info", "nothing", "-a", address)
        assert code == 1 and "no such stream: nothing" in err


async def test_publish_gives_each_message_an_id_of_its_own_and_keeps_a_given_one(tmp_path):
    async with running_node(tmp_path) as (node, address), Client(address) as client:
        await client.wait_ready()
        await client.create_stream("ids", "ids")
        code, _, err = await bascule("publish", "-s", "ids", "-m", "a", "-m", "b", "-a", address)
        assert code == 0, err
        code, _, err = await bascule("publish", "-s", "ids", "-m", "c", "-H", f"{MESSAGE_ID_HEADER}=order-7",
                                     "-a", address)
        assert code == 0, err
        stored = [m async for m in client.subscribe("ids", start="earliest", stop_latest=True)]
        ids = [m.headers.get(MESSAGE_ID_HEADER) for m in stored]
        assert [m.value for m in stored] == [b"a", b"b", b"c"]
        assert ids[0] != ids[1] and all(len(i or b"") == 22 for i in ids[:2]) and ids[2] == b"order-7"


@pytest.mark.cluster
async def test_stream_info_on_a_cluster_shows_every_replica_and_the_same_log_on_each():
    with LocalCluster(3, config={"clustering.raft.password": "s3cret"}) as cluster:
        async with Client(cluster.brokers[0]) as client:
            await client.create_stream("replicated", "replicated", replication_factor=3, partitions=2)
            await client.publish_many("replicated", [b"x"] * 20, ack_policy="all")
        info = await bascule_json("stream-info", "replicated", env_address=",".join(cluster.brokers[1:]))
        assert info["replicationFactor"] == 3
        first = info["partitions"][0]
        assert sorted(first["replicas"]) == sorted(first["isr"]) == sorted(cluster.server_ids)
        extent = (first["messages"], first["oldestOffset"], first["newestOffset"], first["highWatermark"])
        assert extent == (20, 0, 19, 19)
        statuses = (await bascule_json("partitions", "replicated", "-a", cluster.brokers[2]))[0]["replicaStatus"]
        assert [(r["oldestOffset"], r["sizeBytes"]) for r in statuses] == [(0, first["sizeBytes"])] * 3


async def test_json_has_camel_case_keys_and_base64_bytes_in_every_command(tmp_path):
    async with running_node(tmp_path) as (node, address), Client(address) as client:
        await client.wait_ready()
        await client.create_stream("bin", "bin")
        await client.publish("bin", b"\xff\x00value", key=b"\x01key", headers={"h": b"\xfe"})
        await client.publish("bin", b"second")

        messages = await bascule_json("-a", address, "subscribe", "-s", "bin", "-n", "1")
        assert messages[0]["value"] == b64(b"\xff\x00value") and messages[0]["key"] == b64(b"\x01key")
        assert messages[0]["headers"]["h"] == b64(b"\xfe")
        # -o alone starts at that offset
        assert [m["offset"] for m in await bascule_json("subscribe", "-s", "bin", "-o", "1", "--stop-latest",
                                                         env_address=address)] == [1]

        documents = [
            *messages,
            await bascule_json("metadata", env_address=address),
            await bascule_json("partition-metadata", "-s", "bin", env_address=address),
            await bascule_json("partitions", "bin", env_address=address),
            await bascule_json("status", env_address=address),
            await bascule_json("stream-info", "bin", env_address=address),
        ]
        keys = keys_of(documents)
        assert {"highWatermark", "newestOffset", "replicationFactor", "logEndOffset"} <= keys
        assert not [key for key in keys if "_" in key.strip("_")]  # the "__cursors" stream is data, not a key


async def test_addresses_come_before_or_after_the_command_or_from_the_environment_first_reachable_first(tmp_path):
    async with running_node(tmp_path) as (node, address), Client(address) as client:
        await client.wait_ready()
        for args, env_address in (
            (["-a", f"{UNREACHABLE},{address}", "status"], None),
            (["-a", UNREACHABLE, "status", "-a", address], None),
            (["status"], f"{UNREACHABLE},{address}"),
            (["status", "-a", address], UNREACHABLE),  # flags win over the environment
        ):
            code, out, err = await bascule(*args, "--json", env_address=env_address)
            assert code == 0, (args, err)
            assert json.loads(out)["answeredBy"] == node.server_id


def run(*args: str, env_address: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bascule.cli", *args], capture_output=True, text=True, timeout=30,
                          env=environment(env_address))


def test_an_unreachable_address_fails_in_about_a_second_with_status_3():
    started = time.monotonic()
    done = run("metadata", "-a", UNREACHABLE)
    assert done.returncode == 3
    refused = f"bascule metadata: cannot reach a bascule server at {UNREACHABLE}: connection refused"
    assert done.stderr.strip() == refused
    assert time.monotonic() - started < 5
    done = run("status", "-a", "no-such-host.invalid:9292")
    assert (done.returncode, "unknown host" in done.stderr) == (3, True)


@pytest.mark.parametrize(("args", "env_address", "error"), [
    (["status", "--bogus"], None, "unrecognized arguments: --bogus"),
    (["frobnicate"], None, "invalid choice: 'frobnicate'"),
    (["status", "-a", "localhost"], None, "'localhost' is not HOST:PORT"),
    (["status", "-a", "127.0.0.1:99999"], None, "'127.0.0.1:99999' is not HOST:PORT"),
    (["status", "-a", ","], None, "no address given"),
    (["status"], "not an address", "$BASCULE_ADDRESS: 'not an address' is not HOST:PORT"),
    (["status", "--timeout", "0"], None, "'0' is not a positive number of seconds"),
    (["subscribe", "-s", "x", "--start", "offset"], None, "--start offset needs -o/--offset OFFSET"),
    (["subscribe", "-s", "x", "--start", "timestamp"], None, "--start timestamp needs --timestamp NS"),
    (["subscribe", "-s", "x", "--start", "latest", "-o", "3"], None, "--start latest contradicts -o/--offset"),
    (["subscribe", "-s", "x", "-o", "3", "--timestamp", "5"], None, "two start positions"),
    (["subscribe", "-s", "x", "-o", "three"], None, "'three' is not an integer"),
    (["subscribe", "-s", "x", "-o", "-1"], None, "'-1' is negative"),
    (["subscribe", "-s", "x", "-p", "-2"], None, "'-2' is negative"),
    (["subscribe"], None, "the following arguments are required: -s/--stream"),
    (["create", "-s", "x", "--partitions", "0"], None, "'0' is not at least 1"),
    (["publish", "-s", "x", "-m", "v", "-H", "no-equals"], None, "'no-equals' is not NAME=VALUE"),
    (["metadata", "--tls-cert", "cert.pem"], None, "--tls-cert"),
    (["metadata", "--tls-ca", "/no/such/ca.pem"], None, "/no/such/ca.pem"),
])
def test_garbage_is_a_usage_error_with_status_2(args, env_address, error):
    done = run(*args, env_address=env_address)
    assert done.returncode == 2, done
    assert error in done.stderr and done.stdout == ""


def test_version_and_the_documented_exit_statuses():
    expected = f"bascule {version('bascule')}"
    assert run("--version").stdout.strip() == expected
    assert run("server", "--version").stdout.strip() == expected
    help_text = run("--help").stdout
    assert "exit status" in help_text and "BASCULE_ADDRESS" in help_text
    assert "exit status" in run("subscribe", "--help").stdout


async def test_wait_waits_for_a_starting_node_and_for_enough_brokers(tmp_path):
    """`bascule wait` (issue 29): the README starts servers in the background and waits with it instead of
    failing with "connection refused" or "exceeds the 1 available brokers" while they start."""
    from bascule.testing.ports import free_port

    address = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    code, out, err = await bascule("wait", "-a", address, "--for", "1")
    assert (code, out) == (3, "") and "cannot reach a bascule server" in err and time.monotonic() - started < 5
    async with running_node(tmp_path) as (node, running):
        waiting = asyncio.ensure_future(bascule("wait", env_address=running))
        code, out, err = await waiting
        assert (code, err) == (0, "") and out == f"brokers: {node.server_id} ({running})\n"
        code, out, err = await bascule("wait", "--brokers", "2", "--for", "1", env_address=running)
        assert code == 1 and out == "" and f"1 of 2 brokers after 1 s ({node.server_id})" in err
