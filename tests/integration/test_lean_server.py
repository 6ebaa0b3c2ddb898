"""What a running node loads: a node alone never makes a Raft connection nor seals a value, so it never
loads cryptography (6.7 MiB resident, most of it its Rust extension); an encrypted stream brings it in
when the first value is sealed, and the values still open."""

from pathlib import Path

import pytest

from bascule.client import Client
from bascule.testing.local import LocalCluster

pytestmark = pytest.mark.anyio

KEY = "0123456789abcdef0123456789abcdef"


def maps_cryptography(pid: int) -> bool:
    return "/cryptography/" in Path(f"/proc/{pid}/maps").read_text()


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

            await client.create_stream("sealed", "sealed.in", encryption=True)
            await client.publish("sealed", b"secret", ack_policy="all")
            assert [m.value async for m in client.subscribe("sealed", start="earliest", stop_latest=True)] == [
                b"secret"]
            assert maps_cryptography(node.pid)
