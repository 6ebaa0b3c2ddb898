"""Node configuration as given to test harnesses: nested or dotted Liftbridge keys."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["flat_config"]


def flat_config(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """Dotted keys, so that cluster-wide and per-node settings merge key by key."""
    flat: dict[str, Any] = {}
    for key, value in (config or {}).items():
        if isinstance(value, Mapping):
            for sub, leaf in flat_config(value).items():
                flat[f"{key}.{sub}"] = leaf
        else:
            flat[str(key)] = value
    return flat
