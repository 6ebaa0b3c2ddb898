"""docs/design.md says where each thing lives: every module, file and name it gives in backquotes
exists (a renamed module otherwise leaves the design pointing at nothing)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from bascule.wire.pb import admin_pb2, api_pb2, data_pb2, health_pb2

ROOT = Path(__file__).resolve().parents[2]
QUOTED = re.findall(r"`([^`\s]+)`", (ROOT / "docs" / "design.md").read_text())
GRPC_SERVICES = {service.full_name for module in (admin_pb2, api_pb2, data_pb2, health_pb2)
                 for service in module.DESCRIPTOR.services_by_name.values()}


def test_every_file_the_design_names_exists() -> None:
    named = {token for token in QUOTED if re.fullmatch(r"[\w./-]+\.(py|c|md|toml|yaml|sh)", token)}
    in_repository = {path.name for top in ("src", "tests", "benchmarks") for path in (ROOT / top).rglob("*")}
    missing = sorted(
        token for token in named
        if not any((base / token).exists() for base in (ROOT, ROOT / "src" / "bascule", ROOT / "src"))
        and ("/" in token or token not in in_repository)
    )
    assert not missing, missing


def test_every_python_name_the_design_gives_exists() -> None:
    named = {token for token in QUOTED if re.fullmatch(r"bascule(\.\w+)+", token)}
    missing = sorted(token for token in named if token not in GRPC_SERVICES and not _resolves(token))
    assert not missing, missing


def _resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module, or a module's attribute (nested attributes included)."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False
