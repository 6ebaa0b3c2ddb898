"""py-spy recordings of some processes during a trial, summarised into hot spots."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sysconfig
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from benchmarks.harness import REPO_ROOT, log

FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")

# Leaf frames that are a thread waiting (py-spy's own idle detection misses these here): not counted.
# "Thread.run" is grpc's poller thread blocked in its C completion queue, and "_worker" an idle
# executor thread; grpc's Cython work shows up as the self time of "Handle._run" (a loop callback)
# or of the grpc.aio frame that called it.
WAITING_FRAMES = frozenset({
    "EpollSelector.select (selectors.py)", "PollPoller.poll (pysyncobj/poller.py)",
    "SelectSelector.select (selectors.py)", "PollSelector.select (selectors.py)",
    "Thread.run (threading.py)", "_worker (concurrent/futures/thread.py)", "Condition.wait (threading.py)",
    "Event.wait (threading.py)", "Thread._wait_for_tstate_lock (threading.py)",
})

# Frames every sample of an asyncio server passes through: left out of the inclusive ranking.
BOILERPLATE_FRAMES = ("<frozen runpy>", "asyncio/runners.py", "asyncio/base_events.py", "asyncio/events.py",
                      "bascule/cli.py", "bascule/node/server.py", "threading.py", "<module> (", "worker_main (")


def py_spy_path() -> str | None:
    beside = os.path.join(sysconfig.get_path("scripts"), "py-spy")
    return beside if os.access(beside, os.X_OK) else shutil.which("py-spy")


class Profiler:
    """py-spy record of some processes, raw (collapsed-stack) output, summarised into hot spots."""

    def __init__(self, directory: Path, rate: int, native: bool = False) -> None:
        self.dir = directory
        self.rate = rate
        self.native = native
        self.binary = py_spy_path()
        self.summaries: dict[str, dict[str, Any]] = {}

    @contextlib.asynccontextmanager
    async def record(self, label: str, pids: dict[str, int | None]) -> AsyncIterator[None]:
        binary = self.binary
        if binary is None:
            log("py-spy not found (pip install py-spy): no profile")
            yield
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        running = [(name, *self._spawn(binary, label, name, pid)) for name, pid in pids.items() if pid is not None]
        await asyncio.sleep(0.5)  # let py-spy attach
        try:
            yield
        finally:
            for _, _, recorder in running:
                with contextlib.suppress(ProcessLookupError):
                    recorder.send_signal(signal.SIGINT)
            for name, out, recorder in running:
                await self._finish(f"{label}-{name}", out, recorder)

    def _spawn(self, binary: str, label: str, name: str, pid: int) -> tuple[Path, subprocess.Popen[bytes]]:
        out = self.dir / f"{label}-{name}.txt"
        command = [binary, "record", "--pid", str(pid), "--rate", str(self.rate),
                   "--format", "raw", "--threads", "-o", str(out)]
        if self.native:
            command.append("--native")
        with open(self.dir / f"{label}-{name}.py-spy.log", "wb") as log_file:
            return out, subprocess.Popen(command, stdout=log_file, stderr=log_file, start_new_session=True)

    async def _finish(self, name: str, out: Path, recorder: subprocess.Popen[bytes]) -> None:
        try:
            await asyncio.to_thread(recorder.wait, 20)
        except subprocess.TimeoutExpired:
            recorder.kill()
            recorder.wait()
        await asyncio.to_thread(self._summarize, name, out)

    def _summarize(self, name: str, out: Path) -> None:
        if out.exists():
            summary = summarize_profile(out)
            self.summaries[name] = summary
            (self.dir / f"{name}.summary.txt").write_text(format_profile(name, summary))


def short_frame(frame: str) -> str:
    """`function (file)`, the file relative to where its package lives."""
    match = FRAME.match(frame)
    if not match:
        return frame
    path = match.group("file")
    if path.startswith(f"{REPO_ROOT / 'benchmarks'}/"):
        return f"{match.group('func')} ({path.removeprefix(f'{REPO_ROOT}/')})"
    for marker in ("site-packages/", "src/", "lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{match.group('func')} ({path})"


def summarize_profile(path: Path, top: int = 25) -> dict[str, Any]:
    """Self (leaf) and inclusive sample counts per function, and the share of each thread."""
    self_counts: dict[str, int] = {}
    incl_counts: dict[str, int] = {}
    threads: dict[str, int] = {}
    thread_use: dict[str, list[int]] = {}  # thread name -> [busy, waiting] samples
    total = everything = waiting = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        thread, frames = _split_thread(stack.split(";"))
        if not frames:
            continue
        short = [short_frame(f) for f in frames]
        everything += count
        use = thread_use.setdefault(thread.split(": ", 1)[-1], [0, 0])
        if short[-1] in WAITING_FRAMES:
            waiting += count
            use[1] += count
            continue
        use[0] += count
        total += count
        threads[thread] = threads.get(thread, 0) + count
        self_counts[short[-1]] = self_counts.get(short[-1], 0) + count
        for name in set(short):
            if not any(marker in name for marker in BOILERPLATE_FRAMES):
                incl_counts[name] = incl_counts.get(name, 0) + count

    def ranked(counts: dict[str, int]) -> list[tuple[str, int, float]]:
        return [(k, v, 100.0 * v / total if total else 0.0)
                for k, v in sorted(counts.items(), key=lambda kv: -kv[1])[:top]]

    busy_share = {name: round(100.0 * b / (b + w), 1) for name, (b, w) in thread_use.items() if b + w}
    return {"samples": total, "all_samples": everything, "waiting_samples": waiting, "busy_pct": busy_share,
            "self": ranked(self_counts), "inclusive": ranked(incl_counts), "threads": ranked(threads)}


def _split_thread(frames: list[str]) -> tuple[str, list[str]]:
    """The thread a stack was sampled in, and its frames: --threads puts "process N:..." and/or
    "thread (0x...)" frames first."""
    thread = ""
    while frames and frames[0].startswith(("thread (", "process ")):
        if frames[0].startswith("thread ("):
            thread = frames[0]
        frames = frames[1:]
    return thread, frames


def format_profile(label: str, summary: dict[str, Any]) -> str:
    lines = [f"== {label}: {summary['samples']} busy samples (samples of threads waiting in select/poll/locks "
             f"left out); percentages are of the busy samples =="]
    if summary.get("busy_pct"):
        lines.append("busy share of each thread's samples: " + ", ".join(
            f"{name or '?'} {pct:.0f}%" for name, pct in summary["busy_pct"].items()))
    lines.append("busy samples by thread:")
    lines += [f"  {pct:5.1f}%  {name or '(unnamed)'}" for name, _, pct in summary["threads"][:6]]
    lines.append("self time (leaf frames):")
    lines += [f"  {pct:5.1f}%  {name}" for name, _, pct in summary["self"]]
    lines.append("inclusive:")
    lines += [f"  {pct:5.1f}%  {name}" for name, _, pct in summary["inclusive"]]
    return "\n".join(lines) + "\n"
