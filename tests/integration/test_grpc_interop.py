"""bascule's gRPC API (``proto.API``) driven by Node's @grpc/grpc-js, a client with its own HTTP/2
stack: tests/interop/node/interop.js runs its checks against a real in-process node with embedded
NATS and prints one JSON line per check. Needs ``node`` and ``npm``; the first run installs the
pinned packages (``npm ci``)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from conftest import running_node

from bascule.client import Client

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(420)]

NODE_DIR = Path(__file__).resolve().parents[1] / "interop" / "node"
LOCK_FILE = NODE_DIR / "package-lock.json"
INSTALLED_MARKER = NODE_DIR / "node_modules" / ".package-lock.json"  # npm rewrites it on every install
NPM_TIMEOUT = 300
INTEROP_TIMEOUT = 60
# NATS's default max_payload (1 MiB) limits a publish to a bit less than that; interop.js publishes
# a value of exactly 1 MiB, so the embedded NATS server takes larger messages.
NATS_CONFIG = "listen: 127.0.0.1:-1\nmax_payload: 4MB\n"


def _needs_install() -> bool:
    try:
        return INSTALLED_MARKER.stat().st_mtime < LOCK_FILE.stat().st_mtime
    except FileNotFoundError:
        return True


@pytest.fixture(scope="module")
def node_executable() -> str:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("the Node interop test needs `node` and `npm` on PATH")
    # One install at a time, should several test processes get here together.
    with open(Path(tempfile.gettempdir()) / "bascule-grpc-interop-npm.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _needs_install():
            try:
                done = subprocess.run(
                    [npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, capture_output=True, text=True,
                    timeout=NPM_TIMEOUT,
                )
            except subprocess.TimeoutExpired as exc:
                pytest.fail(f"npm ci did not finish in {NPM_TIMEOUT} s:\n{exc.stdout or ''}\n{exc.stderr or ''}")
            if done.returncode:
                pytest.fail(f"npm ci failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return node


async def _lines(stream: asyncio.StreamReader, into: list[str]) -> None:
    while line := await stream.readline():
        into.append(line.decode(errors="replace").rstrip("\n"))


async def run_interop(node: str, address: str, prefix: str) -> tuple[int | None, list[str], list[str]]:
    """interop.js's exit code (None when it had to be killed), stdout lines and stderr lines."""
    process = await asyncio.create_subprocess_exec(
        node, "interop.js", address, prefix, cwd=NODE_DIR, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out: list[str] = []
    err: list[str] = []
    readers = asyncio.gather(_lines(process.stdout, out), _lines(process.stderr, err))
    try:
        code: int | None = await asyncio.wait_for(process.wait(), INTEROP_TIMEOUT)
    except TimeoutError:
        process.kill()
        await process.wait()
        code = None
        err.append(f"(killed: interop.js did not finish in {INTEROP_TIMEOUT} s)")
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(readers, 5)
    return code, out, err


def report(out: list[str], err: list[str]) -> str:
    lines = []
    for line in out:
        try:
            check = json.loads(line)
        except ValueError:
            lines.append(f"  (not JSON) {line}")
            continue
        mark = "ok  " if check.get("ok") else "FAIL"
        known = " [known difference]" if check.get("known_difference") else ""
        lines.append(f"  {mark} {line}{known}")
    if err:
        lines.append("stderr:")
        lines.extend(f"  {line}" for line in err)
    return "\n".join(lines)


async def test_node_grpc_js_client_interoperates(tmp_path, node_executable):
    nats_config = tmp_path / "interop-nats.conf"
    nats_config.write_text(NATS_CONFIG)
    (tmp_path / "node").mkdir()
    async with running_node(tmp_path / "node", **{"nats.embedded.config": str(nats_config)}) as (_, address):
        async with Client(address) as client:
            await client.wait_ready()
        started = time.monotonic()
        code, out, err = await run_interop(node_executable, address, f"interop-{uuid.uuid4().hex[:8]}")
        elapsed = time.monotonic() - started
    print(f"interop.js exited {code} after {elapsed:.1f} s\n{report(out, err)}")
    assert code == 0, f"interop.js exited {code} after {elapsed:.1f} s:\n{report(out, err)}"
    checks = [json.loads(line) for line in out]
    assert checks and all(check["ok"] or check.get("known_difference") for check in checks), report(out, err)
