"""TCP ports for test processes to listen on (`free_port`), and the host:port addresses made of them."""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

from bascule.testing.processes import LocalProcessError

__all__ = ["LOOPBACK", "free_port", "join_host_port"]

LOOPBACK = "127.0.0.1"

_ports_lock = threading.Lock()
_ports_handed_out: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _can_bind(host: str, port: int) -> bool:
    # No SO_REUSEADDR: a port with connections still in TIME_WAIT counts as taken, since the
    # process that gets it may bind without that option too.
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port nothing on `host` listens on, never the same one twice in this process.

    Ports come from below the kernel's ephemeral range when there is room there: an ephemeral
    port can be taken as the source port of some outgoing connection while a node is down, and
    a restarted node must be able to listen at the same port again.
    """
    low, _ = _ephemeral_range()
    with _ports_lock:
        if low > 11000:
            for _ in range(200):
                port = random.randint(10000, low - 1)
                if port not in _ports_handed_out and _can_bind(host, port):
                    _ports_handed_out.add(port)
                    return port
        for _ in range(200):
            with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
                probe.bind((host, 0))
                port = probe.getsockname()[1]
            if port not in _ports_handed_out:
                _ports_handed_out.add(port)
                return port
    raise LocalProcessError(f"no free port found on {host}")


def join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
