"""Credentials never reach a node's log, at any level (issue 27): a node logging at debug, given a
Raft password and NATS credentials, serving calls that carry bearer tokens and API keys in their
metadata, some of them refused, writes none of them."""

from __future__ import annotations

import grpc
import pytest

from bascule.testing.local import LocalNatsServer, LocalNode
from bascule.wire.pb import api_pb2, api_pb2_grpc

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

RAFT_PASSWORD = "raft-secret-0f3c9"
NATS_PASSWORD = "nats-secret-7a1b2"
TOKEN = "bearer-secret-55e1d"
API_KEY = b"api-key-secret-c0ffee"


async def test_a_node_logging_at_debug_writes_no_credential(tmp_path):
    nats_server = LocalNatsServer(tmp_path / "nats.log", extra_args=["--user", "bascule", "--pass", NATS_PASSWORD])
    nats_server.start()
    try:
        config = {"clustering.raft.password": RAFT_PASSWORD, "nats.user": "bascule", "nats.password": NATS_PASSWORD}
        with LocalNode(tmp_path / "node", nats_servers=nats_server.url, raft_bootstrap_seed=True, config=config,
                       level="debug") as node:
            metadata = (("authorization", f"Bearer {TOKEN}"), ("x-api-key-bin", API_KEY))
            async with grpc.aio.insecure_channel(node.address) as channel:
                stub = api_pb2_grpc.APIStub(channel)
                await stub.CreateStream(api_pb2.CreateStreamRequest(subject="s", name="s"), metadata=metadata,
                                        timeout=10)
                await stub.Publish(api_pb2.PublishRequest(stream="s", value=b"v"), metadata=metadata, timeout=10)
                with pytest.raises(grpc.aio.AioRpcError):
                    await stub.Publish(api_pb2.PublishRequest(stream="missing", value=b"v"), metadata=metadata,
                                       timeout=10)
            log = node.log_path.read_bytes()
        assert b"DEBUG" in log  # it did log at debug
        for secret in (RAFT_PASSWORD.encode(), NATS_PASSWORD.encode(), TOKEN.encode(), API_KEY):
            assert secret not in log, secret
    finally:
        nats_server.stop()
