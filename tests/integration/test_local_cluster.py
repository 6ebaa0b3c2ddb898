"""bascule.testing.local: real bascule and nats-server processes, started, faulted and cleaned up."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import shutil
import socket
import time
from pathlib import Path

import grpc
import pytest

from bascule.testing import LocalCluster, LocalNatsServer, LocalNode, LocalProcessError, free_port
from bascule.wire.pb import api_pb2, api_pb2_grpc


def _alive(pid: int) -> bool:
    """Exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def _state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2]


def _metadata(address: str, *streams: str, timeout: float = 5.0) -> api_pb2.FetchMetadataResponse:
    with grpc.insecure_channel(address) as channel:
        stub = api_pb2_grpc.APIStub(channel)
        return stub.FetchMetadata(api_pb2.FetchMetadataRequest(streams=list(streams)), timeout=timeout)


def _create_stream(address: str, name: str, replication_factor: int = 1) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = api_pb2_grpc.APIStub(channel)
        stub.CreateStream(
            api_pb2.CreateStreamRequest(name=name, subject=name, replicationFactor=replication_factor),
            timeout=10.0,
        )


def _stream_exists(address: str, name: str) -> bool:
    (entry,) = _metadata(address, name).streamMetadata
    return entry.error == api_pb2.StreamMetadata.Error.OK and 0 in entry.partitions


needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="checks processes through /proc")


# ---- no bascule node needed ------------------------------------------------------------------------


def test_free_port_is_bindable_and_never_repeated() -> None:
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    for port in ports[:5]:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))


@needs_proc
def test_nats_server_restarts_on_the_same_port(tmp_path: Path) -> None:
    nats = LocalNatsServer(tmp_path / "nats.log")
    try:
        nats.start()
        first_pid, url = nats.pid, nats.url
        nats.kill()
        assert not _alive(first_pid)
        nats.start()
        assert nats.url == url and nats.pid != first_pid
        with socket.create_connection((nats.host, nats.port), timeout=2) as conn:
            assert conn.recv(4) == b"INFO"
        nats.pause()
        assert _state(nats.pid) == "T"
        nats.resume()
        nats.stop()
        assert nats.returncode == 0
        assert "Server Exiting" in nats.log_tail(5)
    finally:
        nats.kill()


# ---- one node ---------------------------------------------------------------------------------------


@needs_proc
def test_stream_survives_kill_9_and_restart() -> None:
    with LocalCluster(1) as cluster:
        node = cluster.node(0)
        assert node.server_id == "node-0"
        assert cluster.brokers == [node.address]
        address, raft, data_dir = node.address, node.raft_address, node.data_dir

        async def create() -> None:
            from gufo.liftbridge.client import LiftbridgeClient

            async with LiftbridgeClient(cluster.brokers) as client:
                await client.create_stream("orders", subject="orders", wait_for_stream=True)

        asyncio.run(create())
        assert _stream_exists(address, "orders")

        old_pid = node.pid
        cluster.kill(0)
        assert not node.running and not _alive(old_pid)
        cluster.restart(0)
        assert node.pid != old_pid
        assert (node.address, node.raft_address, node.data_dir) == (address, raft, data_dir)
        assert _stream_exists(address, "orders")
        assert [b.id for b in _metadata(address).brokers] == ["node-0"]


@needs_proc
def test_pause_keeps_the_process_alive_and_resume_brings_it_back() -> None:
    with LocalCluster(1) as cluster:
        node = cluster.node(0)
        cluster.pause(0)
        try:
            assert node.running and _state(node.pid) == "T"
            with pytest.raises(grpc.RpcError) as raised:
                _metadata(node.address, timeout=0.5)
            assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            # A timeout names the node and quotes its log.
            with pytest.raises(LocalProcessError, match=r"(?s)not ready after .*bascule\.log"):
                node.wait_ready(timeout=0.5)
        finally:
            cluster.resume(0)
        assert _state(node.pid) != "T"
        node.wait_ready(timeout=10)
        assert node.running


@needs_proc
def test_context_manager_leaves_no_process_behind() -> None:
    with pytest.raises(RuntimeError, match="test failed"):
        with LocalCluster(1) as cluster:
            pids = {*cluster.node(0).pids(), *cluster.nats.pids()}
            cluster.pause(0)  # even a stopped process is cleaned up
            base_dir = cluster.base_dir
            raise RuntimeError("test failed")
    assert len(pids) >= 2
    assert [pid for pid in pids if _alive(pid)] == []
    # After a failure the logs are kept for inspection.
    assert (base_dir / "node-0" / "bascule.log").exists()
    shutil.rmtree(base_dir)


@needs_proc
def test_embedded_nats_node_takes_its_nats_server_down_with_it() -> None:
    with LocalCluster(1, embedded_nats=True) as cluster:
        assert cluster.nats is None
        node = cluster.node(0)
        assert "--embedded-nats" in node.command()
        assert cluster.nats_url == node.nats_url == f"nats://127.0.0.1:{node.embedded_nats_port}"
        group = node.pids()
        assert len(group) >= 2, f"expected the node and its nats-server, got {group}"
        cluster.kill(0)
        assert [pid for pid in group if _alive(pid)] == []
        cluster.restart(0)
        # Its nats-server is back at the same port.
        with socket.create_connection(("127.0.0.1", node.embedded_nats_port), timeout=2) as conn:
            assert conn.recv(4) == b"INFO"
        pids = node.pids()
    assert [pid for pid in pids if _alive(pid)] == []


@needs_proc
def test_a_node_that_cannot_start_reports_its_log(tmp_path: Path) -> None:
    node = LocalNode(tmp_path / "node", config={"clustering": {"min.insync.replicas": 0}})
    with pytest.raises(LocalProcessError, match=r"(?s)exited with status 2.*min\.insync\.replicas"):
        node.start(timeout=20)
    assert not node.running


@needs_proc
def test_standalone_node_on_a_given_nats(tmp_path: Path) -> None:
    nats = LocalNatsServer(tmp_path / "nats.log")
    try:
        nats.start()
        with LocalNode(tmp_path / "node", nats_servers=nats.url, raft_bootstrap_seed=True,
                       config={"streams": {"sync": "never"}}) as node:
            assert (tmp_path / "node" / "bascule.yaml").exists()
            _create_stream(node.address, "events")
            node.restart()
            assert _stream_exists(node.address, "events")
            pid = node.pid
        assert not _alive(pid)
    finally:
        nats.kill()


# ---- several nodes ----------------------------------------------------------------------------------


@pytest.mark.cluster
@needs_proc
def test_three_nodes_keep_their_stream_through_a_kill_and_a_nats_restart() -> None:
    with LocalCluster(3) as cluster:
        assert len({n.raft_address for n in cluster.nodes}) == 3
        for node in cluster.nodes:
            assert "--raft-bootstrap-peers" in node.command()
            assert sorted(b.id for b in _metadata(node.address).brokers) == cluster.server_ids
        _create_stream(cluster.brokers[1], "replicated", replication_factor=3)
        cluster.kill(0)
        assert _stream_exists(cluster.brokers[2], "replicated")
        cluster.restart(0)
        assert _stream_exists(cluster.brokers[0], "replicated")
        cluster.restart_nats()
        cluster.wait_ready()
        pids = [pid for node in cluster.nodes for pid in node.pids()] + cluster.nats.pids()
    assert [pid for pid in pids if _alive(pid)] == []


def test_fetch_metadata_lists_only_the_brokers_that_answer() -> None:
    """go-liftbridge dials every broker FetchMetadata lists: a killed node drops out of the list
    (its Raft connections close), and is listed again once it is back."""
    with LocalCluster(3) as cluster:
        cluster.kill(2)
        listed: list[str] = []
        for _ in range(100):
            listed = sorted(b.id for b in _metadata(cluster.brokers[0]).brokers)
            if listed == ["node-0", "node-1"]:
                break
            time.sleep(0.1)
        assert listed == ["node-0", "node-1"]
        cluster.restart(2)  # waits until every node lists all three again
        assert sorted(b.id for b in _metadata(cluster.brokers[1]).brokers) == cluster.server_ids


def _address_beyond_loopback() -> str | None:
    """An IPv4 address of this machine other than loopback (the one it would send from), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.254", 9))  # sends nothing: only picks the outgoing interface
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if ipaddress.ip_address(address).is_loopback or address == "0.0.0.0" else address


@pytest.mark.cluster
@needs_proc
def test_raft_beyond_loopback_runs_with_a_password_and_is_refused_without(tmp_path: Path) -> None:
    host = _address_beyond_loopback()
    if host is None:
        pytest.skip("this machine has no address beyond loopback")
    alone = LocalNode(tmp_path / "alone", host=host, embedded_nats=True, raft_bootstrap_seed=True,
                      env={"BASCULE_RAFT_PASSWORD": ""})
    with pytest.raises(LocalProcessError, match=r"(?s)exited with status 2.*is not a loopback address"):
        alone.start(timeout=20)
    # The cluster gives its nodes a password of its own; `listen` puts their gRPC API on `host` too.
    with LocalCluster(3, host=host, config={"listen": f"{host}:0"}) as cluster:
        assert all(node.raft_address.startswith(f"{host}:") for node in cluster.nodes)
        _create_stream(cluster.brokers[0], "replicated", replication_factor=3)
        assert _stream_exists(cluster.brokers[2], "replicated")


@needs_proc
def test_a_local_node_serving_mutual_tls_is_waited_for_and_reached_with_its_client_tls(tmp_path: Path) -> None:
    from conftest import issue

    from bascule.client import Client, ClientTls

    ca = issue(tmp_path, "ca", None)
    _, _, server_cert, server_key = issue(tmp_path, "node", ca[:2])
    _, _, client_cert, client_key = issue(tmp_path, "tester", ca[:2])
    tls = {"tls.cert": str(server_cert), "tls.key": str(server_key), "tls.client.auth.enabled": True,
           "tls.client.auth.ca": str(ca[2])}
    client_tls = ClientTls.from_files(str(ca[2]), str(client_cert), str(client_key))
    with LocalNode(tmp_path / "node", embedded_nats=True, raft_bootstrap_seed=True, config=tls,
                   client_tls=client_tls) as node:

        async def publish() -> int:
            async with Client(node.address, tls=node.client_tls) as client:
                await client.create_stream("tls", "tls")
                return (await client.publish("tls", b"x", ack_policy="all")).offset

        assert asyncio.run(publish()) == 0
