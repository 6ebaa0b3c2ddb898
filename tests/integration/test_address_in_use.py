"""A second server on a port another process holds (issue 29): `bascule server` exits with status 1 and
one line naming the listener that could not bind (gRPC API, Raft transport, metrics endpoint, embedded
NATS), its address and the setting that moves it, instead of "[Errno 98]" or a traceback (Raft's port
used to hang the start in silence)."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from bascule.testing.ports import free_port

pytestmark = [pytest.mark.timeout(120)]


def held_port() -> socket.socket:
    """A listening socket on a free loopback port, as another server's would be."""
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", free_port()))
    holder.listen()
    return holder


@pytest.mark.parametrize(("listener", "setting"), [
    ("the gRPC API", "-p/--port"),
    ("the metadata Raft transport", "--raft-listen"),
    ("the metrics endpoint", "--metrics-port"),
    ("the embedded NATS server", "--embedded-nats-config"),
])
def test_a_listener_whose_address_is_held_is_named_at_start(tmp_path, listener, setting):
    ports = {name: free_port() for name in ("api", "raft", "metrics", "nats")}
    with held_port() as holder:
        held = holder.getsockname()[1]
        taken = {"the gRPC API": "api", "the metadata Raft transport": "raft", "the metrics endpoint": "metrics",
                 "the embedded NATS server": "nats"}[listener]
        ports[taken] = held
        (tmp_path / "nats.conf").write_text(f"listen: 127.0.0.1:{ports['nats']}\n")
        done = subprocess.run(
            [sys.executable, "-m", "bascule.cli", "server", "--embedded-nats", "--raft-bootstrap-seed",
             "--embedded-nats-config", str(tmp_path / "nats.conf"), "-d", str(tmp_path / "data"),
             "--port", str(ports["api"]), "--raft-listen", f"127.0.0.1:{ports['raft']}",
             "--metrics-port", str(ports["metrics"])],
            capture_output=True, text=True, timeout=60, cwd=tmp_path,
        )
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"bascule server: {listener} cannot listen on 127.0.0.1:{held}: address already in use")
    assert setting in last, last
    assert "Traceback" not in done.stderr and "Errno" not in done.stderr, done.stderr[-3000:]
