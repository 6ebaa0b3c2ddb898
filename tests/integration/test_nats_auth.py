"""The node authenticates to a NATS server that requires it (user and password, token, nkey,
credentials file, TLS with a client certificate) on every connection it opens, the capture
connection included: a plain NATS publish to a stream's subject is captured."""

from __future__ import annotations

import asyncio
import os

import nats
import nkeys
import pytest
from conftest import issue, running_node

from bascule.client import Client
from bascule.natsio.auth import NatsAuth
from bascule.node.node import NatsRefused

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]


def nkey_pair() -> tuple[bytes, str]:
    """(seed, public key) of a new user nkey."""
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    return seed, nkeys.from_seed(seed).public_key.decode()


async def captures_and_acks(address: str, nats_url: str, **nats_options) -> None:
    """A stream gets a plain NATS publish (captured) and a gRPC publish (acked)."""
    async with Client(address) as client:
        await client.wait_ready()
        await client.create_stream("s", "s.in")
        nc = await nats.connect(nats_url, **nats_options)
        try:
            await nc.publish("s.in", b"plain")
            await nc.flush()
        finally:
            await nc.close()
        assert (await client.publish("s", b"acked", ack_policy="all")).offset == 1
        got = [m.value async for m in client.subscribe("s", start="earliest", stop_latest=True)]
        assert got == [b"plain", b"acked"]


def nats_conf(tmp_path, body: str):
    path = tmp_path / "auth-nats.conf"
    path.write_text("listen: 127.0.0.1:-1\n" + body)
    return str(path)


async def test_user_and_password(tmp_path):
    conf = nats_conf(tmp_path, 'authorization { user: bascule, password: "s3cret pass" }\n')
    async with running_node(tmp_path, **{"nats.embedded.config": conf, "nats.user": "bascule",
                                                 "nats.password": "s3cret pass"}) as (node, address):
        await captures_and_acks(address, node._embedded.url, user="bascule", password="s3cret pass")


async def test_a_wrong_password_stops_the_node_with_a_clear_error(tmp_path):
    conf = nats_conf(tmp_path, "authorization { user: bascule, password: right }\n")
    with pytest.raises(ExceptionGroup) as failure:  # what failed in the server's task group
        async with running_node(tmp_path, **{"nats.embedded.config": conf, "nats.user": "bascule",
                                                     "nats.password": "wrong"}):
            pass
    assert failure.group_contains(NatsRefused, match="Authorization Violation")
    assert "wrong" not in str(failure.value.exceptions)


async def test_token(tmp_path):
    conf = nats_conf(tmp_path, 'authorization { token: "t0ken" }\n')
    async with running_node(tmp_path, **{"nats.embedded.config": conf, "nats.token": "t0ken"}) as (
        node, address
    ):
        await captures_and_acks(address, node._embedded.url, token="t0ken")


async def test_nkey(tmp_path):
    seed, public = nkey_pair()
    seed_file = tmp_path / "user.nk"
    seed_file.write_bytes(seed + b"\n")
    seed_file.chmod(0o600)
    conf = nats_conf(tmp_path, f"authorization {{ users: [ {{ nkey: {public} }} ] }}\n")
    async with running_node(tmp_path, **{"nats.embedded.config": conf, "nats.nkey.seed": str(seed_file)}) as (
        node, address
    ):
        await captures_and_acks(address, node._embedded.url, nkeys_seed=str(seed_file))


async def test_mutual_tls(tmp_path):
    ca = issue(tmp_path, "ca", None)
    _, _, server_cert, server_key = issue(tmp_path, "nats-server", ca[:2])
    _, _, client_cert, client_key = issue(tmp_path, "bascule-node", ca[:2])
    conf = nats_conf(tmp_path, f'tls {{ cert_file: "{server_cert}", key_file: "{server_key}", '
                               f'ca_file: "{ca[2]}", verify: true }}\n')
    settings = {"nats.embedded.config": conf, "nats.tls.ca": str(ca[2]), "nats.tls.cert": str(client_cert),
                "nats.tls.key": str(client_key)}
    async with running_node(tmp_path, **settings) as (node, address):
        context = node.config.nats.auth.ssl_context()
        await captures_and_acks(address, node._embedded.url, tls=context)
        # Without a client certificate the server refuses the connection.
        stranger = NatsAuth(tls_ca=str(ca[2])).ssl_context()
        with pytest.raises((OSError, nats.errors.Error, TimeoutError)):
            await asyncio.wait_for(nats.connect(node._embedded.url, tls=stranger, max_reconnect_attempts=0,
                                                allow_reconnect=False, connect_timeout=2), 10)
