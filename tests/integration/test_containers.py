"""bascule in containers, driven through testcontainers and podman's Docker API.

The session fixture runs compose/podman-setup.sh (engine, API service, images: about a second when all is
there, about a minute on a bare machine) and uses the environment it prints. The tests skip only when no
engine can be had: the script cannot run here (no podman, and no root with apt-get to install it) and no
Docker API answers on /run/podman/podman.sock. Set BASCULE_CONTAINERS_SETUP=0 to use an engine and images
that are already there without running the script.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import nats
import pytest
import yaml
from gufo.liftbridge.client import LiftbridgeClient
from gufo.liftbridge.types import AckPolicy, StartPosition

from bascule.client import BasculeError, Client, ClientTls

pytestmark = [pytest.mark.containers, pytest.mark.anyio, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
SETUP = ROOT / "compose" / "podman-setup.sh"
SOCKET = "/run/podman/podman.sock"


def _api_answers(path: str = SOCKET) -> bool:
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(2)
            sock.connect(path)
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: podman\r\n\r\n")
            return sock.recv(64).startswith(b"HTTP/1.")
    except OSError:
        return False


def _setup_runnable() -> str | None:
    """None when the setup script can run here, else why not."""
    if shutil.which("bash") is None:
        return "no bash to run compose/podman-setup.sh"
    if shutil.which("podman") is None and not (os.geteuid() == 0 and shutil.which("apt-get")):
        return "podman is not installed, and installing it needs root and apt-get"
    return None


def _run_setup() -> None:
    started = time.monotonic()
    done = subprocess.run(
        ["bash", str(SETUP)],
        capture_output=True,
        text=True,
        timeout=900,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHON": sys.executable},  # makes the wheels: this interpreter's Python 3.11
    )
    if done.returncode != 0:
        pytest.fail(f"compose/podman-setup.sh failed ({done.returncode}):\n{done.stderr[-4000:]}")
    for line in done.stdout.splitlines():
        if line.startswith("export ") and "=" in line:
            key, _, value = line[len("export ") :].partition("=")
            os.environ[key] = value
    print(f"podman-setup.sh took {time.monotonic() - started:.1f} s")


@pytest.fixture(scope="session")
def engine():
    """A Docker-API engine (podman) and bascule's images, or a skip saying why there is none."""
    cannot_setup = _setup_runnable()
    if os.environ.get("BASCULE_CONTAINERS_SETUP") == "0":
        cannot_setup = "BASCULE_CONTAINERS_SETUP=0"
    api = os.environ.get("DOCKER_HOST", "").removeprefix("unix://") or SOCKET
    if cannot_setup is None:
        _run_setup()
    elif not _api_answers(api):
        pytest.skip(f"no container engine: {cannot_setup}, and no Docker API answers on {api}")
    from bascule.testing.containers import remove_leftovers, use_podman

    use_podman()
    remove_leftovers()  # of sessions that died; those of sessions running now stay
    yield
    remove_leftovers(own=True)


@pytest.fixture(scope="module")
def node(engine):
    from bascule.testing.containers import BasculeContainer

    with BasculeContainer(server_id="solo") as node:
        yield node


async def _take(iterator, count: int, timeout: float = 10.0) -> list:
    async def take():
        out = []
        async for item in iterator:
            out.append(item)
            if len(out) == count:
                return out

    return await asyncio.wait_for(take(), timeout)


# ---- one node, embedded NATS --------------------------------------------------------------------------


async def test_single_node_with_gufo_liftbridge(node):
    assert node.get_broker().startswith("127.0.0.1:")
    async with LiftbridgeClient([node.get_broker()]) as lb:
        await lb.create_stream("orders", subject="orders.in", wait_for_stream=True)
        meta = await lb.get_metadata()
        assert [(b.id, f"{b.host}:{b.port}") for b in meta.brokers] == [("solo", node.get_broker())]
        # A service publishing plain NATS messages, to the node's embedded NATS through its published port.
        nc = await nats.connect(node.get_nats_url())
        await nc.publish("orders.in", b"plain")
        await nc.drain()
        await lb.publish(b"enveloped", stream="orders", key=b"k", ack_policy=AckPolicy.ALL)
        got = await _take(lb.subscribe("orders", start_position=StartPosition.EARLIEST), 2)
        assert [(m.offset, m.value) for m in got] == [(0, b"plain"), (1, b"enveloped")]
        assert got[1].key == b"k"


async def test_single_node_with_bascule_client(node):
    async with Client(node.get_broker()) as client:
        await client.create_stream("events", "events.in")
        acks = [await client.publish("events", f"e{i}".encode(), ack_policy="all") for i in range(5)]
        assert [ack.offset for ack in acks] == list(range(5))
        got = [m async for m in client.subscribe("events", start="earliest", stop_latest=True)]
        assert [m.value for m in got] == [f"e{i}".encode() for i in range(5)]


async def test_the_node_publishes_its_metrics_port(node):
    import urllib.request

    def get(path: str) -> tuple[int, str]:
        with urllib.request.urlopen(node.get_metrics_url() + path, timeout=5) as response:
            return response.status, response.read().decode()

    assert (await asyncio.to_thread(get, "/healthz"))[0] == 200
    assert (await asyncio.to_thread(get, "/readyz"))[0] == 200
    status, body = await asyncio.to_thread(get, "/metrics")
    assert status == 200 and "bascule_raft_leader 1.0" in body


async def test_a_node_serving_mutual_tls_in_a_container(engine, tmp_path):
    """Certificates copied in; readiness and the test's client reach it with the client's; a client
    without a certificate of the CA is refused."""
    from conftest import issue

    from bascule.testing.containers import BasculeContainer, ServerTls

    ca = issue(tmp_path, "ca", None)
    _, _, cert, key = issue(tmp_path, "node", ca[:2])
    _, _, client_cert, client_key = issue(tmp_path, "tester", ca[:2])
    tls = ServerTls(cert.read_bytes(), key.read_bytes(), client_ca=ca[2].read_bytes())
    client_tls = ClientTls.from_files(str(ca[2]), str(client_cert), str(client_key))
    with BasculeContainer(server_id="tls", tls=tls, client_tls=client_tls) as node:
        async with Client(node.get_broker(), tls=node.client_tls) as client:
            await client.create_stream("secure", "secure")
            assert (await client.publish("secure", b"x", ack_policy="all")).offset == 0
        async with Client(node.get_broker(), tls=ClientTls.from_files(str(ca[2])), timeout=3) as stranger:
            with pytest.raises(BasculeError):
                await stranger.fetch_metadata()


# Run in a node's container: every path under argv[1] that is not 0700 (directories) or 0600 (files).
NOT_PRIVATE = """
import os, stat, sys
for directory, _, files in os.walk(sys.argv[1]):
    for path in [directory, *(os.path.join(directory, name) for name in files)]:
        status = os.lstat(path)
        if stat.S_IMODE(status.st_mode) != (0o700 if stat.S_ISDIR(status.st_mode) else 0o600):
            print(path, oct(stat.S_IMODE(status.st_mode)))
"""


async def test_the_node_keeps_its_files_private_in_the_container(node):
    async with Client(node.get_broker()) as client:
        await client.create_stream("private", "private.in")
        await client.publish("private", b"secret", ack_policy="all")
    result = node.exec(["python3", "-c", NOT_PRIVATE, "/var/lib/bascule"])
    assert (result.exit_code, result.output.decode()) == (0, "")
    result = node.exec(["python3", "-c", "import os; print(sorted(os.listdir('/var/lib/bascule/raft')))"])
    assert "journal" in result.output.decode()  # the walk above did reach the node's files


# ---- a 3-node cluster: one node killed ----------------------------------------------------------------------

CLUSTER_CONFIG = {
    # A dead replica leaves the ISR (and a dead leader is replaced) after 3 s instead of 15 s.
    "clustering.replica.max.lag.time": "3s",
    "clustering.replica.max.leader.timeout": "3s",
}


async def _partition(broker: str, stream: str):
    async with Client(broker, timeout=3) as client:
        return (await client.fetch_metadata(stream)).streams[stream].partitions[0]


async def _until(predicate, what: str, timeout: float = 30.0, interval: float = 0.3):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = await predicate()
            if last:
                return last
        except BasculeError as exc:
            last = exc
        await asyncio.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout:.0f} s; last: {last!r}")


async def _publish_with_retries(brokers: list[str], stream: str, value: bytes, timeout: float = 30.0):
    """Publish with ack ALL through any answering broker, until acked (a leader may be moving)."""
    deadline = time.monotonic() + timeout
    while True:
        for broker in brokers:
            try:
                async with Client(broker, timeout=3) as client:
                    return await client.publish(stream, value, ack_policy="all")
            except BasculeError as exc:
                error = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"publish of {value!r} not acked within {timeout:.0f} s: {error}")
        await asyncio.sleep(0.3)


async def test_cluster_keeps_serving_acked_messages_when_a_node_is_killed(engine):
    from bascule.testing.containers import BasculeCluster

    with BasculeCluster(3, config=CLUSTER_CONFIG) as cluster:
        try:
            _check_raft_password_given_in_the_environment_only(cluster)
            await _cluster_scenario(cluster)
        except BaseException:
            print(cluster.log_tails(40))
            raise


def _check_raft_password_given_in_the_environment_only(cluster) -> None:
    """Raft between containers needs a password (the nodes refuse to start without one): the cluster
    made one, the same for every node, in their environment and not on their command line."""
    assert len(cluster.raft_password) >= 24
    for node in cluster.nodes:
        config = node.get_wrapped_container().attrs["Config"]
        assert f"BASCULE_RAFT_PASSWORD={cluster.raft_password}" in config["Env"]
        assert not any(cluster.raft_password in arg for arg in config["Cmd"])


async def _cluster_scenario(cluster) -> None:
    brokers = cluster.brokers
    async with Client(brokers[0]) as client:
        await client.create_stream("orders", "orders.in", replication_factor=3)
    first = await _until(lambda: _partition(brokers[0], "orders"), "partition with a leader and 3 replicas in ISR")
    assert len(first.replicas) == 3
    await _until(lambda: _ok_isr(brokers[0], 3), "ISR of 3")
    acked = {}
    async with Client(brokers[0]) as client:
        for i in range(10):
            ack = await client.publish("orders", f"before-{i}".encode(), ack_policy="all")
            acked[ack.offset] = f"before-{i}".encode()

    # Kill the partition's leader: the strongest case (a follower's death only shrinks the ISR).
    leader = (await _partition(brokers[0], "orders")).leader
    victim = cluster.server_ids.index(leader)
    survivors = [broker for index, broker in enumerate(brokers) if index != victim]
    cluster.kill(victim)
    killed_at = time.monotonic()
    for i in range(10):
        ack = await _publish_with_retries(survivors, "orders", f"after-{i}".encode())
        acked[ack.offset] = f"after-{i}".encode()
    failover = time.monotonic() - killed_at
    print(f"leader {leader} killed; acked again after {failover:.1f} s")

    new = await _partition(survivors[0], "orders")
    assert new.leader != leader and new.leader in cluster.server_ids
    assert leader not in new.isr
    # Every acked message is served, in offset order, by the new leader.
    async with Client(survivors[0]) as client:
        got = [m async for m in client.subscribe("orders", start="earliest", stop_latest=True)]
    assert {m.offset: m.value for m in got} == acked
    assert [m.offset for m in got] == sorted(acked)

    # The killed node comes back with its data, catches up and rejoins the ISR.
    await asyncio.to_thread(cluster.restart, victim)
    await _until(lambda: _ok_isr(survivors[0], 3), "the restarted node back in the ISR")
    # Retried: grpc shares connections (subchannels) between channels to the same address, and the one to
    # the restarted node may still be in its reconnect backoff from while the node was down (about 1.5 s).
    detail = await _until(lambda: _partitions(brokers[victim]), "partition details from the restarted node")
    replicas = {status["id"]: status for status in detail[0]["replicaStatus"]}
    assert replicas[leader]["inIsr"] and replicas[leader]["logEndOffset"] == len(acked)
    async with LiftbridgeClient(brokers) as lb:
        await lb.publish(b"last", stream="orders", ack_policy=AckPolicy.ALL)
        got = await _take(lb.subscribe("orders", start_position=StartPosition.EARLIEST), len(acked) + 1)
    assert [m.value for m in got] == [acked[offset] for offset in sorted(acked)] + [b"last"]


async def _partitions(broker: str) -> list[dict]:
    async with Client(broker, timeout=3) as client:
        return await client.partitions("orders")


async def _ok_isr(broker: str, size: int) -> bool:
    return len((await _partition(broker, "orders")).isr) == size


# ---- a node restarted at a new address (pysyncobj: DNS cache, connects that never time out) ----


async def test_node_restarted_at_a_new_address_rejoins_the_metadata_group(engine):
    from bascule.testing.containers import BasculeCluster

    # The engine's own dynamic addresses: a restarted container usually gets a new one.
    with BasculeCluster(3, stable_addresses=False) as cluster:
        # node-0 has the lowest Raft address: pysyncobj leaves it to the others to connect to it.
        cluster.kill(0)
        cluster.restart(0, wait=False)
        started = time.monotonic()
        try:
            cluster.node(0).wait_ready(timeout=15, brokers=cluster.server_ids)
            async with Client(cluster.brokers[1]) as client:
                await _until(lambda: _all_voters_connected(client), "all Raft voters connected", timeout=10)
        finally:
            print(f"restarted node: {time.monotonic() - started:.1f} s")


async def _all_voters_connected(client: Client) -> bool:
    status = await client.status()
    return all(voter["connected"] for voter in status["voters"])


# ---- compose.yaml's healthcheck ----------------------------------------------------------------------


def _compose_healthcheck() -> list[str]:
    compose = yaml.safe_load((ROOT / "compose" / "compose.yaml").read_text())
    test = compose["x-node"]["healthcheck"]["test"]
    assert test[0] == "CMD"
    return test[1:]


def _healthy(container, command: list[str]) -> bool:
    return container.get_wrapped_container().exec_run(command).exit_code == 0


async def test_the_compose_healthcheck_follows_the_nodes_readiness(engine):
    """The command compose.yaml's nodes are checked with, run in a real node's container: healthy while it
    serves, unhealthy once its NATS has gone silent (frozen: no reset tells the node, its PINGs must), healthy
    again when NATS is back."""
    from bascule.testing.containers import BasculeCluster

    command = _compose_healthcheck()
    with BasculeCluster(1) as cluster:
        node, nats_server = cluster.node(0), cluster.nats.get_wrapped_container()
        assert _healthy(node, command)
        nats_server.pause()
        await _eventually(lambda: not _healthy(node, command))
        nats_server.unpause()
        await _eventually(lambda: _healthy(node, command))


async def _eventually(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the healthcheck did not change in time"
        await asyncio.sleep(0.5)
