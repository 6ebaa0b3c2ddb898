"""What a running node loads: a node alone never makes a Raft connection nor seals a value, so it never
loads cryptography (6.7 MiB resident, most of it its Rust extension); an encrypted stream brings it in
when the first value is sealed, and the values still open. A node whose configuration asks for no TLS
does not load ssl (libssl, 4.4 MiB with OpenSSL's initialisation) unless a NATS server asks for TLS; one
configured for TLS loads it at start."""

from pathlib import Path

import pytest

from bascule.client import Client
from bascule.testing.local import LocalCluster, LocalNode

pytestmark = pytest.mark.anyio

KEY = "0123456789abcdef0123456789abcdef"


def maps_cryptography(pid: int) -> bool:
    return "/cryptography/" in Path(f"/proc/{pid}/maps").read_text()


def maps_ssl(pid: int) -> bool:
    maps = Path(f"/proc/{pid}/maps").read_text()
    return "/_ssl." in maps or "/libssl" in maps


async def test_a_node_alone_loads_cryptography_only_to_seal_a_value(tmp_path):
    # LocalCluster gives its nodes a Raft password: the encryptor exists, unused by a lone voter.
    with LocalCluster(1, embedded_nats=True, base_dir=tmp_path, env={"BASCULE_ENCRYPTION_KEY": KEY}) as cluster:
        node = cluster.nodes[0]
        async with Client(node.address) as client:
            await client.wait_ready()
            await client.create_stream("plain", "plain.in")
            await client.publish("plain", b"in the clear", ack_policy="all")
            assert [m.value async for m in client.subscribe("plain", start="earliest", stop_latest=True)] == [
                b"in the clear"]
            assert not maps_cryptography(node.pid)
            assert not maps_ssl(node.pid)

            await client.create_stream("sealed", "sealed.in", encryption=True)
            await client.publish("sealed", b"secret", ack_policy="all")
            assert [m.value async for m in client.subscribe("sealed", start="earliest", stop_latest=True)] == [
                b"secret"]
            assert maps_cryptography(node.pid)


def nats_tls_config(tmp_path, certificates) -> str:
    """An embedded nats-server's configuration that requires TLS of its clients."""
    _, _, cert, key = certificates
    path = tmp_path / "tls-nats.conf"
    path.write_text(f'listen: 127.0.0.1:-1\ntls {{ cert_file: "{cert}", key_file: "{key}" }}\n')
    return str(path)


async def publishes(node) -> bool:
    async with Client(node.address) as client:
        await client.wait_ready()
        await client.create_stream("s", "s.in")
        await client.publish("s", b"x", ack_policy="all")
        return [m.value async for m in client.subscribe("s", start="earliest", stop_latest=True)] == [b"x"]


async def test_a_nats_server_asking_for_tls_gets_it_from_a_node_configured_for_none(tmp_path):
    from conftest import issue

    ca = issue(tmp_path, "ca", None)
    conf = nats_tls_config(tmp_path, issue(tmp_path, "nats-server", ca[:2]))
    # The node trusts the server's CA as a system CA (OpenSSL's SSL_CERT_FILE): no TLS setting of its own.
    node = LocalNode(tmp_path / "node", embedded_nats=True, raft_bootstrap_seed=True,
                     config={"nats.embedded.config": conf}, env={"SSL_CERT_FILE": str(ca[2])})
    with node:
        assert await publishes(node)
        assert maps_ssl(node.pid)


async def test_a_node_configured_for_nats_tls_loads_ssl_at_start(tmp_path):
    from conftest import issue

    ca = issue(tmp_path, "ca", None)
    conf = nats_tls_config(tmp_path, issue(tmp_path, "nats-server", ca[:2]))
    node = LocalNode(tmp_path / "node", embedded_nats=True, raft_bootstrap_seed=True,
                     config={"nats.embedded.config": conf, "nats.tls.ca": str(ca[2])})
    with node:
        assert maps_ssl(node.pid)
        assert await publishes(node)
