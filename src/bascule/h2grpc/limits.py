"""What one client can make the gRPC server hold or do: the bounds of docs/operations.md, "Limits of
the gRPC port", each a setting under ``grpc.`` in the node's configuration."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GrpcLimits:
    max_connections: int = 4096  # served at once by a node; beyond it a new one is closed at once
    max_concurrent_calls: int = 1000  # a connection's calls open at once (HTTP/2 MAX_CONCURRENT_STREAMS)
    call_output: int = 1 << 20  # responses queued for a call before its handler waits
    connection_output: int = 8 << 20  # ... for a connection
    node_output: int = 256 << 20  # ... for every connection together
    # Parts of messages waiting for the rest, over every connection (each connection has a budget
    # of its own: one largest message and a window): a connection that goes beyond it is closed.
    node_input: int = 256 << 20
    # Frames of one connection handled in a turn of the event loop (a new call counts as 32).
    frames_per_turn: int = 1024
    # PINGs, SETTINGS, resets and empty DATA frames a connection may send a second, and in a burst.
    flood_rate: float = 500.0
    flood_burst: float = 2000.0
