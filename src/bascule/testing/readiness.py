"""Waiting for a bascule node, however it runs (process or container), to serve its gRPC API."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import grpc

__all__ = ["wait_for_brokers"]


def wait_for_brokers(
    address: str, expected: set[str], timeout: float, check_alive: Callable[[], None],
    credentials: grpc.ChannelCredentials | None = None,
) -> str | None:
    """Poll FetchMetadata at `address` (over TLS with `credentials`) until it lists every broker id in
    `expected`: None then, or what was last seen when `timeout` ran out. `check_alive` raises when the
    server's process is gone."""
    import grpc

    from bascule.wire.pb import api_pb2, api_pb2_grpc

    deadline = time.monotonic() + timeout
    last = "no answer yet"
    # Short reconnect backoff: grpc's default (1 s, growing) would notice a starting node late.
    options = [
        ("grpc.initial_reconnect_backoff_ms", 50),
        ("grpc.min_reconnect_backoff_ms", 50),
        ("grpc.max_reconnect_backoff_ms", 250),
    ]
    channel = (grpc.insecure_channel(address, options=options) if credentials is None
               else grpc.secure_channel(address, credentials, options=options))
    with channel:
        stub = api_pb2_grpc.APIStub(channel)
        while True:
            check_alive()
            try:
                response = stub.FetchMetadata(api_pb2.FetchMetadataRequest(), timeout=1.0)
                listed = {broker.id for broker in response.brokers}
                if expected <= listed:
                    return None
                last = f"FetchMetadata lists brokers {sorted(listed)}, waiting for {sorted(expected - listed)}"
            except grpc.RpcError as exc:
                last = f"FetchMetadata: {exc.code().name}: {exc.details()}"
            if time.monotonic() > deadline:
                return last
