"""The harness's side of the load processes: start them, wait for READY, say GO, read the RESULT.

What runs inside them is `benchmarks.worker_process`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import bascule
from benchmarks.harness import READY_TIMEOUT, REPO_ROOT, BenchError, Context

WORKER_MODULE = "benchmarks.worker_process"


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    # The workers import bascule from wherever this process did, and the benchmarks from this checkout.
    paths = [str(REPO_ROOT), str(Path(bascule.__file__).resolve().parents[1])]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


class Worker:
    """One load process; its stderr goes to a log file, its stdout carries READY and RESULT lines."""

    def __init__(self, kind: str, spec: dict[str, Any], log_path: Path) -> None:
        self.kind, self.spec, self.log_path = kind, spec, log_path
        self.process: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    async def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = await asyncio.to_thread(open, self.log_path, "ab")
        with log_file:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", WORKER_MODULE, self.kind, json.dumps(self.spec),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=log_file,
                cwd=REPO_ROOT, env=worker_env(), start_new_session=True, limit=1 << 20,
            )

    async def _line(self, timeout: float) -> str:
        assert self.process is not None and self.process.stdout is not None
        try:
            raw = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        except TimeoutError:
            raise BenchError(f"worker {self.kind} (pid {self.pid}) said nothing for {timeout:.0f} s; "
                             f"log {self.log_path}:\n{self.log_tail()}") from None
        if not raw:
            await self.process.wait()
            raise BenchError(f"worker {self.kind} (pid {self.pid}) exited with {self.process.returncode}; "
                             f"log {self.log_path}:\n{self.log_tail()}")
        return raw.decode().strip()

    async def ready(self, timeout: float = READY_TIMEOUT) -> None:
        line = await self._line(timeout)
        if line != "READY":
            raise BenchError(f"worker {self.kind}: expected READY, got {line[:500]!r}\n{self.log_tail()}")

    def go(self) -> None:
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write(b"GO\n")

    async def result(self, timeout: float) -> dict[str, Any]:
        line = await self._line(timeout)
        tag, _, payload = line.partition(" ")
        if tag == "RESULT":
            return json.loads(payload)
        raise BenchError(f"worker {self.kind}: {line[:2000]}\n{self.log_tail()}")

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def kill(self) -> None:
        if self.process is None or self.process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)

    async def close(self) -> None:
        self.kill()
        if self.process is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.process.wait(), 5)


@contextlib.asynccontextmanager
async def workers(ctx: Context, kind: str, specs: Sequence[dict[str, Any]], name: str) -> AsyncIterator[list[Worker]]:
    """Start one worker per spec and wait until each is READY; kill them all on the way out."""
    started = [Worker(kind, spec, ctx.dir / "workers" / f"{name}-{i}.log") for i, spec in enumerate(specs)]
    try:
        for worker in started:
            await worker.start()
        await asyncio.gather(*(w.ready() for w in started))
        # In a profiled trial, the client side too; publishers of plain NATS are not of interest.
        if ctx.profiling and ctx.profiler is not None and not kind.startswith("nats_"):
            pids = {f"worker-{kind}-{i}": w.pid for i, w in enumerate(started)}
            async with ctx.profiler.record(ctx.profiling, pids):
                yield started
        else:
            yield started
    finally:
        await asyncio.gather(*(w.close() for w in started))
