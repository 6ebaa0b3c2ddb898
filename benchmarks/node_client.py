"""The Node gRPC client (benchmarks/node/grpc_bench.js) from the harness: its dependencies installed
once per run (``npm ci`` when node_modules is missing), and one run of it with the servers' CPU time
measured from GO to its result.

A Python grpc.aio client manages some 10-20k messages/s, below what the servers can do; @grpc/grpc-js
in Node does several times that, so the node_grpc_* metrics show the server rather than the client.
Without node or npm on PATH (or when npm ci fails), ``prepare`` says why and those metrics are left out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness import READY_TIMEOUT, REPO_ROOT, BenchError, log
from benchmarks.metrics import CpuMeter

NODE_DIR = REPO_ROOT / "benchmarks" / "node"
SCRIPT = NODE_DIR / "grpc_bench.js"
PACKAGES = ("@grpc/grpc-js", "@grpc/proto-loader")
NPM_CI_TIMEOUT = 300.0


@dataclass
class NodeSetup:
    """Whether the Node client can run: `node` is its path, else `reason` says why not."""

    node: str | None = None
    reason: str | None = None
    versions: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.node is not None

    def summary(self) -> dict[str, Any]:
        return {"available": self.ok, "reason": self.reason, **self.versions}


_setup: NodeSetup | None = None
_setup_lock: asyncio.Lock | None = None


def api_proto() -> Path:
    """The api.proto of the bascule this process imports (the one the servers run)."""
    import bascule

    return Path(bascule.__file__).resolve().parent / "wire" / "proto" / "api.proto"


def _installed() -> bool:
    return all((NODE_DIR / "node_modules" / name / "package.json").is_file() for name in PACKAGES)


def _installed_versions() -> dict[str, str]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = json.loads((NODE_DIR / "node_modules" / name / "package.json").read_text())["version"]
        except (OSError, ValueError, KeyError):
            pass
    return found


async def _run(*command: str, timeout: float) -> tuple[int, str]:
    """A command's exit status and its output (stdout and stderr together)."""
    process = await asyncio.create_subprocess_exec(
        *command, cwd=NODE_DIR, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, start_new_session=True,
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        _kill(process)
        await process.wait()
        return -1, f"{command[0]} {command[1] if len(command) > 1 else ''}: no exit after {timeout:.0f} s"
    assert process.returncode is not None
    return process.returncode, out.decode(errors="replace")


async def prepare() -> NodeSetup:
    """Once per process: find node, ``npm ci`` in benchmarks/node if its node_modules is missing.
    Says (in the log) why the Node metrics are skipped when they must be."""
    global _setup, _setup_lock
    if _setup is not None:
        return _setup
    if _setup_lock is None:
        _setup_lock = asyncio.Lock()
    async with _setup_lock:
        if _setup is None:
            _setup = await _prepare()
            if _setup.ok:
                log(f"Node gRPC client: node {_setup.versions.get('node')}, "
                    + ", ".join(f"{k} {v}" for k, v in _setup.versions.items() if k != "node"))
            else:
                log(f"Node gRPC client unavailable, node_grpc_* metrics skipped: {_setup.reason}")
    return _setup


async def _prepare() -> NodeSetup:
    node = shutil.which("node")
    if node is None:
        return NodeSetup(reason="node is not on PATH")
    status, out = await _run(node, "--version", timeout=30)
    if status != 0:
        return NodeSetup(reason=f"node --version failed: {out.strip()[-500:]}")
    node_version = out.strip()
    if not _installed():
        npm = shutil.which("npm")
        if npm is None:
            return NodeSetup(reason=f"{NODE_DIR / 'node_modules'} is missing and npm is not on PATH")
        log(f"Node gRPC client: npm ci in {NODE_DIR}")
        status, out = await _run(npm, "ci", "--no-audit", "--no-fund", timeout=NPM_CI_TIMEOUT)
        if status != 0 or not _installed():
            tail = "\n".join(out.strip().splitlines()[-15:])
            return NodeSetup(reason=f"npm ci failed (exit status {status}):\n{tail}")
    return NodeSetup(node=node, versions={"node": node_version, **_installed_versions()})


def _kill(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)


async def run_node(setup: NodeSetup, arguments: list[str], cpu_pids: list[int | None],
                   timeout: float) -> dict[str, Any]:
    """``node grpc_bench.js ARGUMENTS`` in its READY/GO mode (see run_client)."""
    assert setup.node is not None
    return await run_client([setup.node, str(SCRIPT), *arguments], cpu_pids, timeout, NODE_DIR)


async def raw_publish(address: str, stream: str, count: int, window: int, size: int, ack_policy: str,
                      cpu_pids: list[int | None], timeout: float, ids: bool = False,
                      leader_pid: int | None = None) -> dict[str, Any]:
    """benchmarks/raw_publish.py: PublishAsync from a client that writes a window of requests at once
    (the servers' cost, not grpc-js's), with a message id on each if ``ids``; its figures and
    ``server_cpu_us_per_msg`` (and ``leader_cpu_us_per_msg``, the partition leader's process alone,
    given ``leader_pid``)."""
    arguments = [sys.executable, str(REPO_ROOT / "benchmarks" / "raw_publish.py"), address, stream, str(count),
                 str(window), str(size), ack_policy, *(["ids"] if ids else [])]
    result = await run_client(arguments, cpu_pids, timeout, REPO_ROOT)
    if result.get("errors") or result.get("messages") != count:
        raise BenchError(f"raw publish: {result.get('messages')} of {count} acked, {result.get('errors')} failed")
    result["server_cpu_us_per_msg"] = 1e6 * result["server_cpu_seconds"] / count
    if leader_pid is not None:
        result["leader_cpu_us_per_msg"] = 1e6 * result["server_cpu_seconds_by_pid"].get(leader_pid, 0.0) / count
    return result


async def run_client(command: list[str], cpu_pids: list[int | None], timeout: float, cwd: Path) -> dict[str, Any]:
    """A client process in READY/GO mode: connected first, then the CPU time of `cpu_pids` counted
    from GO to its result (one JSON line). The result, with ``server_cpu_seconds``."""
    env = {**os.environ, "BENCH_GO": "1", "BASCULE_API_PROTO": str(api_proto())}
    process = await asyncio.create_subprocess_exec(
        *command, cwd=cwd, env=env, start_new_session=True,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    what = " ".join(Path(part).name if index < 2 else part for index, part in enumerate(command))
    try:
        try:
            ready = await asyncio.wait_for(process.stderr.readline(), READY_TIMEOUT)
        except TimeoutError:
            raise BenchError(f"{what}: not READY after {READY_TIMEOUT:.0f} s") from None
        if ready.strip() != b"READY":
            _kill(process)
            rest = await process.stderr.read()
            raise BenchError(f"{what}: {(ready + rest).decode(errors='replace').strip()[-2000:]}")
        cpu = CpuMeter(cpu_pids).start()
        process.stdin.write(b"GO\n")
        await process.stdin.drain()
        try:
            line = await asyncio.wait_for(process.stdout.readline(), timeout)
        except TimeoutError:
            raise BenchError(f"{what}: no result after {timeout:.0f} s") from None
        cpu.stop()
        errors = await asyncio.wait_for(process.stderr.read(), 10)
        await asyncio.wait_for(process.wait(), 10)
        if process.returncode != 0 or not line.strip():
            raise BenchError(f"{what}: exit status {process.returncode}: "
                             f"{errors.decode(errors='replace').strip()[-2000:]}")
        result: dict[str, Any] = json.loads(line)
    finally:
        _kill(process)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(process.wait(), 5)
    result["server_cpu_seconds"] = cpu.seconds
    result["server_cpu_seconds_by_pid"] = cpu.each
    return result


async def node_subscribe(setup: NodeSetup, address: str, stream: str, count: int, cpu_pids: list[int | None],
                         timeout: float) -> dict[str, Any]:
    """Subscribe from EARLIEST until `count` messages: the client's figures and
    ``server_cpu_us_per_msg``."""
    result = await run_node(setup, ["subscribe", address, stream, str(count)], cpu_pids, timeout)
    if result.get("messages") != count:
        raise BenchError(f"node subscribe: read {result.get('messages')} messages, expected {count}")
    result["server_cpu_us_per_msg"] = 1e6 * result["server_cpu_seconds"] / count
    return result


async def node_publish(setup: NodeSetup, address: str, stream: str, count: int, window: int, size: int,
                       ack_policy: str, cpu_pids: list[int | None], timeout: float) -> dict[str, Any]:
    """PublishAsync of `count` messages, `window` in flight: the client's figures and
    ``server_cpu_us_per_msg``. BenchError if any publish failed."""
    arguments = ["publish", address, stream, str(count), str(window), str(size), ack_policy]
    result = await run_node(setup, arguments, cpu_pids, timeout)
    if result.get("errors"):
        raise BenchError(f"node publish: {result['errors']} publishes failed; first error: {result.get('first_error')}")
    if result.get("acked") != count:
        raise BenchError(f"node publish: {result.get('acked')} of {count} publishes acked")
    result["server_cpu_us_per_msg"] = 1e6 * result["server_cpu_seconds"] / count
    return result
