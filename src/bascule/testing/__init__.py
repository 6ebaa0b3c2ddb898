"""Helpers for tests that need real bascule processes; see `bascule.testing.local`."""

from bascule.testing.local import (
    LocalCluster,
    LocalNatsServer,
    LocalNode,
    LocalProcessError,
    free_port,
)

__all__ = [
    "LocalCluster",
    "LocalNatsServer",
    "LocalNode",
    "LocalProcessError",
    "free_port",
]
