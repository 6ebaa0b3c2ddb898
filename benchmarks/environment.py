"""The machine and the software a run measured, for the head of its report."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from benchmarks.harness import REPO_ROOT
from benchmarks.metrics import loadavg

PACKAGES = ("nats-py", "grpcio", "protobuf", "pysyncobj", "uvloop")


def machine_info() -> dict[str, Any]:
    return {
        "nproc": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory": _memory(),
        "kernel": platform.release(),
        "loadavg_at_start": loadavg(),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _memory() -> str:
    try:
        return Path("/proc/meminfo").read_text().splitlines()[0].split(":", 1)[1].strip()
    except (OSError, IndexError):
        return ""


def versions() -> dict[str, Any]:
    found: dict[str, Any] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    try:
        from google.protobuf.internal import api_implementation

        found["protobuf_backend"] = api_implementation.Type()
    except Exception:  # noqa: BLE001 - informative only
        pass
    found["nats-server"] = _nats_server_version()
    revision = _bascule_revision()
    if revision:
        found["bascule_git"] = revision
    return found


def _nats_server_version() -> str:
    try:
        from bascule.natsio.server import nats_server_path

        out = subprocess.run([nats_server_path(), "--version"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or out.stderr.strip()
    except Exception as exc:  # noqa: BLE001 - informative only
        return f"unknown ({exc})"


def _bascule_revision() -> str | None:
    """The checkout's commit (+dirty when tracked files changed), or an exported snapshot's REVISION."""
    try:
        head = _git("rev-parse", "--short", "HEAD")
        if head:
            return head + ("+dirty" if _git("status", "--porcelain", "--untracked-files=no") else "")
    except Exception:  # noqa: BLE001 - informative only
        pass
    snapshot = REPO_ROOT / "REVISION"
    return snapshot.read_text().strip() if snapshot.exists() else None


def _git(*arguments: str) -> str:
    return subprocess.run(["git", "-C", str(REPO_ROOT), *arguments],
                          capture_output=True, text=True, timeout=10).stdout.strip()
