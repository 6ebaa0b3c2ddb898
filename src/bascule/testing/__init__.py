"""Helpers for tests that need real bascule processes; see `bascule.testing.local`."""

from bascule.testing.local import LocalCluster, LocalNatsServer, LocalNode
from bascule.testing.ports import free_port
from bascule.testing.processes import LocalProcessError

__all__ = [
    "LocalCluster",
    "LocalNatsServer",
    "LocalNode",
    "LocalProcessError",
    "free_port",
]
