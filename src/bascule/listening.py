"""What a node says when one of its listeners cannot have its address: which listener (the gRPC API, the
metadata Raft transport, the metrics endpoint, the embedded NATS server), which address, and the setting
that moves it, instead of a bare "[Errno 98] address already in use"."""

from __future__ import annotations

import contextlib
import errno
import socket
from collections.abc import Iterator

__all__ = ["AddressInUse", "check_free", "naming_listener"]


class AddressInUse(OSError):
    """``listener`` cannot listen on ``address``: something else listens there."""

    def __init__(self, listener: str, address: str, setting: str) -> None:
        super().__init__(
            errno.EADDRINUSE,
            f"{listener} cannot listen on {address}: address already in use (another bascule server, such as "
            f"`make run`'s, or another program listens there; {setting} chooses another address)",
        )
        self.listener = listener
        self.address = address

    def __str__(self) -> str:
        return str(self.strerror)


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@contextlib.contextmanager
def naming_listener(listener: str, host: str, port: int, setting: str) -> Iterator[None]:
    """Within it, a bind that fails for an address in use raises ``AddressInUse`` naming ``listener``."""
    try:
        yield
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE or isinstance(exc, AddressInUse):
            raise
        raise AddressInUse(listener, _address(host, port), setting) from exc


def check_free(listener: str, host: str, port: int, setting: str) -> None:
    """Raises ``AddressInUse`` when something listens on ``host``:``port`` already, for listeners that
    bind where their errors cannot be seen (pysyncobj binds in its own thread and retries in silence).
    The probe binds as such a listener does (SO_REUSEADDR: connections in TIME_WAIT do not count)."""
    if port == 0:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with naming_listener(listener, host, port, setting):
            probe.bind((host, port))
