"""``bascule bench``: bascule against JetStream on loopback, one command (GitHub issue 5).

Every scenario starts its own servers (real processes, temporary directories), runs its trials against
bascule and then against JetStream, and stops everything again, whatever happened. Load comes from
worker processes (``python -m bascule.bench _worker KIND SPEC``) so that the measuring process is not
the bottleneck; workers connect, say READY, wait for GO on stdin, run, and print one RESULT line.

    bascule bench                       # every scenario, 3 trials, full message counts
    bascule bench --quick               # a short smoke run (1 trial, small counts)
    bascule bench --scenario capture_r3 --scenario acked_r3 --trials 5 --json results.json
    bascule bench --profile prof/       # plus one extra, unmeasured, py-spy-profiled trial

Scenarios (100-byte messages unless noted):

- capture_r1 / capture_r3: plain NATS publishes into a stream; rate = messages committed / time
  (bascule: HW reached the last offset; JetStream: stream state.messages reached the count).
- acked_r3: pipelined publishes with ack ALL, window 1000: bascule through gRPC PublishAsync and through
  Liftbridge envelopes with an ack inbox over NATS; JetStream through js.publish_async. Rate, p50/p99.
- consume_r3: read a prefilled R3 stream from the start (bascule client subscribe; JetStream ordered
  consumer).
- durable_r1: capture and acked rates with fsync before ack (bascule streams.sync=always; JetStream
  sync_interval: always).
- ceiling: one Python process receiving plain NATS messages from another, no stream at all.
- failover: SIGKILL of a partition (stream) leader in a 3-node cluster; time until an ack-ALL publish
  succeeds again.
- scale: bascule capture rate with 1, 10 and 100 partitions.
- restart: RSS of a node with 100 idle partitions and around 1M captured messages and a full read; time
  from process start to serving a subscribe of the last of those messages (SIGTERM and SIGKILL).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bascule.nats_flush import flush

BASCULE, JETSTREAM, NATS = "bascule", "jetstream", "nats"
SYSTEM_TITLES = {BASCULE: "bascule", JETSTREAM: "JetStream", NATS: "NATS"}
STREAM_SUBJECT_PREFIX = "bench"
POLL_INTERVAL = 0.01
READY_TIMEOUT = 60.0

# Message counts: full runs (the defaults) and --quick smoke runs.
FULL_COUNTS = {
    "capture": 500_000,
    "acked": 200_000,
    "consume": 200_000,
    "durable": 50_000,
    "ceiling": 1_000_000,
    "scale": 300_000,
    "restart": 1_000_000,
    "kills": 5,
}
QUICK_COUNTS = {
    "capture": 20_000,
    "acked": 10_000,
    "consume": 20_000,
    "durable": 5_000,
    "ceiling": 100_000,
    "scale": 20_000,
    "restart": 50_000,
    "kills": 2,
}

# name -> (unit, higher is better)
METRICS: dict[str, tuple[str, bool]] = {
    "rate": ("msg/s", True),
    "capture_rate": ("msg/s", True),
    "acked_rate": ("msg/s", True),
    "grpc_rate": ("msg/s", True),
    "nats_rate": ("msg/s", True),
    "publish_rate": ("msg/s", True),
    "p50_ms": ("ms", False),
    "p99_ms": ("ms", False),
    "max_ms": ("ms", False),
    "grpc_p50_ms": ("ms", False),
    "grpc_p99_ms": ("ms", False),
    "nats_p50_ms": ("ms", False),
    "nats_p99_ms": ("ms", False),
    "acked_p50_ms": ("ms", False),
    "acked_p99_ms": ("ms", False),
    "server_cpu_us_per_msg": ("CPU us/msg", False),
    "capture_cpu_us_per_msg": ("CPU us/msg", False),
    "acked_cpu_us_per_msg": ("CPU us/msg", False),
    "grpc_cpu_us_per_msg": ("CPU us/msg", False),
    "nats_cpu_us_per_msg": ("CPU us/msg", False),
    "failover_median_s": ("s", False),
    "failover_worst_s": ("s", False),
    "rss_start_mib": ("MiB", False),
    "rss_idle_100_mib": ("MiB", False),
    "idle_100_cpu_pct": ("% of a core", False),
    "rss_capture_peak_mib": ("MiB", False),
    "rss_after_capture_mib": ("MiB", False),
    "rss_read_peak_mib": ("MiB", False),
    "rss_after_read_mib": ("MiB", False),
    "read_rate": ("msg/s", True),
    "restart_graceful_s": ("s", False),
    "restart_kill_s": ("s", False),
    "restart_rss_mib": ("MiB", False),
}


class BenchError(RuntimeError):
    """A trial could not produce its figure: a timeout, a lost message, a process that died."""


# ---- small helpers ---------------------------------------------------------------------------------


def _now() -> float:
    # CLOCK_MONOTONIC is system-wide on Linux: timestamps from the workers compare with ours.
    return time.monotonic()


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def _median(values: Iterable[float]) -> float | None:
    values = [v for v in values if isinstance(v, (int, float))]
    return statistics.median(values) if values else None


def proc_status(pid: int | None) -> dict[str, int]:
    """VmRSS and VmHWM of `pid` in KiB, from /proc (psutil is not a dependency)."""
    found: dict[str, int] = {}
    if pid is None:
        return found
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return found
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0])
    return found


def rss_mib(pid: int | None) -> float | None:
    kib = proc_status(pid).get("VmRSS")
    return None if kib is None else kib / 1024


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pids: Iterable[int | None]) -> float:
    """User + system CPU time of the live processes `pids` (threads included), from /proc."""
    total = 0
    for pid in pids:
        if pid is None:
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / _CLOCK_TICKS


class CpuMeter:
    """CPU seconds spent by a set of processes between start() and stop()."""

    def __init__(self, pids: Iterable[int | None]) -> None:
        self.pids = [p for p in pids if p is not None]
        self._start = 0.0
        self.seconds = 0.0

    def start(self) -> CpuMeter:
        self._start = cpu_seconds(self.pids)
        return self

    def stop(self) -> float:
        self.seconds = cpu_seconds(self.pids) - self._start
        return self.seconds


class RssSampler:
    """Samples the summed VmRSS of some processes every `interval` s; `peak` is the largest sum, MiB."""

    def __init__(self, pids: Iterable[int | None], interval: float = 0.1) -> None:
        self.pids = [p for p in pids if p is not None]
        self.interval = interval
        self.peak = 0.0
        self._task: asyncio.Task[None] | None = None

    def sample(self) -> float:
        value = sum(rss_mib(p) or 0.0 for p in self.pids)
        self.peak = max(self.peak, value)
        return value

    async def __aenter__(self) -> RssSampler:
        async def loop() -> None:
            while True:
                self.sample()
                await asyncio.sleep(self.interval)

        self.sample()
        self._task = asyncio.create_task(loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.sample()


def loadavg() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


def machine_info() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        mem = Path("/proc/meminfo").read_text().splitlines()[0].split(":", 1)[1].strip()
    except (OSError, IndexError):
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "memory": mem,
        "kernel": platform.release(),
        "loadavg_at_start": loadavg(),
    }


def versions() -> dict[str, Any]:
    found: dict[str, Any] = {"python": platform.python_version()}
    for module, name in (("nats", "nats-py"), ("grpc", "grpcio"), ("google.protobuf", "protobuf"),
                         ("pysyncobj", "pysyncobj"), ("uvloop", "uvloop")):
        try:
            from importlib.metadata import version

            found[name] = version(name)
        except Exception:  # noqa: BLE001 - informative only
            found[name] = None
    try:
        from google.protobuf.internal import api_implementation

        found["protobuf_backend"] = api_implementation.Type()
    except Exception:  # noqa: BLE001
        pass
    try:
        from bascule.node.embedded_nats import nats_server_path

        out = subprocess.run([nats_server_path(), "--version"], capture_output=True, text=True, timeout=10)
        found["nats-server"] = out.stdout.strip() or out.stderr.strip()
    except Exception as exc:  # noqa: BLE001
        found["nats-server"] = f"unknown ({exc})"
    repo = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        if head:
            found["bascule_git"] = head + ("+dirty" if dirty else "")
    except Exception:  # noqa: BLE001
        pass
    if "bascule_git" not in found and (repo / "REVISION").exists():  # an exported snapshot
        found["bascule_git"] = (repo / "REVISION").read_text().strip()
    return found


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---- worker processes ----------------------------------------------------------------------------


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    # The workers import bascule from wherever this process did.
    package_root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = package_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
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
        with open(self.log_path, "ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bascule.bench", "_worker", self.kind, json.dumps(self.spec),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=log,
                env=_worker_env(), start_new_session=True, limit=1 << 20,
            )

    async def _line(self, timeout: float) -> str:
        assert self.process is not None and self.process.stdout is not None
        try:
            raw = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        except asyncio.TimeoutError:
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
        if ctx.profiling and ctx.profiler is not None and not kind.startswith("nats_"):
            # in a profiled trial, the client side too (publishers of plain NATS are not of interest)
            pids = {f"worker-{kind}-{i}": w.pid for i, w in enumerate(started)}
            async with ctx.profiler.record(ctx.profiling, pids):
                yield started
        else:
            yield started
    finally:
        await asyncio.gather(*(w.close() for w in started))


# ---- profiling -----------------------------------------------------------------------------------


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
        if self.binary is None:
            _log("py-spy not found (pip install py-spy): no profile")
            yield
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        running: list[tuple[str, Path, subprocess.Popen[bytes]]] = []
        for name, pid in pids.items():
            if pid is None:
                continue
            out = self.dir / f"{label}-{name}.txt"
            log = open(self.dir / f"{label}-{name}.py-spy.log", "wb")
            command = [self.binary, "record", "--pid", str(pid), "--rate", str(self.rate), "--format", "raw",
                       "--threads", "-o", str(out)]
            if self.native:
                command.append("--native")
            running.append((name, out, subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)))
            log.close()
        await asyncio.sleep(0.5)  # let py-spy attach
        try:
            yield
        finally:
            for _, _, proc in running:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGINT)
            for name, out, proc in running:
                try:
                    await asyncio.to_thread(proc.wait, 20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                if out.exists():
                    summary = summarize_profile(out)
                    self.summaries[f"{label}-{name}"] = summary
                    (self.dir / f"{label}-{name}.summary.txt").write_text(format_profile(f"{label}-{name}", summary))


_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def _short_frame(frame: str) -> str:
    match = _FRAME.match(frame)
    if not match:
        return frame
    path = match.group("file")
    for marker in ("site-packages/", "src/", "lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{match.group('func')} ({path})"


# Leaf frames that are a thread waiting (py-spy's own idle detection misses these here): not counted.
# "Thread.run" is grpc's poller thread blocked in its C completion queue, and "_worker" an idle
# executor thread; grpc's Cython work shows up as the self time of "Handle._run" (a loop callback)
# or of the grpc.aio frame that called it.
_WAITING = frozenset({
    "EpollSelector.select (selectors.py)", "PollPoller.poll (pysyncobj/poller.py)",
    "SelectSelector.select (selectors.py)", "PollSelector.select (selectors.py)",
    "Thread.run (threading.py)", "_worker (concurrent/futures/thread.py)", "Condition.wait (threading.py)",
    "Event.wait (threading.py)", "Thread._wait_for_tstate_lock (threading.py)",
})

# Frames every sample of an asyncio server passes through: left out of the inclusive ranking.
_BOILERPLATE = ("<frozen runpy>", "asyncio/runners.py", "asyncio/base_events.py", "asyncio/events.py",
                "bascule/cli.py", "bascule/node/server.py", "threading.py", "<module> (", "worker_main (",
                "main (bascule/bench.py)")


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
        frames = stack.split(";")
        thread = ""
        if frames and frames[0].startswith(("thread (", "process ")):
            # --threads puts "process N:..." and/or "thread (0x...)" frames first
            while frames and frames[0].startswith(("thread (", "process ")):
                if frames[0].startswith("thread ("):
                    thread = frames[0]
                frames = frames[1:]
        if not frames:
            continue
        short = [_short_frame(f) for f in frames]
        everything += count
        busy, idle = thread_use.setdefault(thread.split(": ", 1)[-1], [0, 0])
        if short[-1] in _WAITING:
            waiting += count
            thread_use[thread.split(": ", 1)[-1]][1] += count
            continue
        thread_use[thread.split(": ", 1)[-1]][0] += count
        total += count
        threads[thread] = threads.get(thread, 0) + count
        self_counts[short[-1]] = self_counts.get(short[-1], 0) + count
        for name in set(short):
            if not any(marker in name for marker in _BOILERPLATE):
                incl_counts[name] = incl_counts.get(name, 0) + count

    def ranked(counts: dict[str, int]) -> list[tuple[str, int, float]]:
        return [(k, v, 100.0 * v / total if total else 0.0)
                for k, v in sorted(counts.items(), key=lambda kv: -kv[1])[:top]]

    busy_share = {name: round(100.0 * b / (b + w), 1) for name, (b, w) in thread_use.items() if b + w}
    return {"samples": total, "all_samples": everything, "waiting_samples": waiting, "busy_pct": busy_share,
            "self": ranked(self_counts), "inclusive": ranked(incl_counts), "threads": ranked(threads)}


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


# ---- servers -------------------------------------------------------------------------------------


@dataclass
class Context:
    args: argparse.Namespace
    dir: Path
    counts: dict[str, int]
    profiler: Profiler | None = None
    profiling: str | None = None  # the label of the profiled trial under way

    @property
    def payload_size(self) -> int:
        return self.args.size


class BasculeSystem:
    """A LocalCluster (its own nats-server plus `size` bascule nodes) and the clients the harness uses."""

    def __init__(self, ctx: Context, name: str, size: int, config: dict[str, Any]) -> None:
        from bascule.testing.local import LocalCluster

        self.ctx = ctx
        self.cluster = LocalCluster(
            size, base_dir=ctx.dir / name, config=config, keep_data=True, level=ctx.args.bascule_log_level,
        )
        self.nc: Any = None
        self.probe: EnvelopeProbe | None = None
        self._clients: dict[str, Any] = {}

    async def __aenter__(self) -> BasculeSystem:
        try:
            await asyncio.to_thread(self.cluster.start)
            import nats

            self.nc = await nats.connect(self.cluster.nats_url, max_reconnect_attempts=-1)
            self.probe = await EnvelopeProbe.create(self.nc)
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None and exc_type is not asyncio.CancelledError:
            _log(f"bascule logs after a failure:\n{self.cluster.log_tails(15)}")
        await self.close()

    async def close(self) -> None:
        for client in self._clients.values():
            with contextlib.suppress(Exception):
                await client.close()
        self._clients.clear()
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.close()
        await asyncio.to_thread(self.cluster.stop)

    @property
    def nats_url(self) -> str:
        return self.cluster.nats_url

    def client(self, address: str | None = None) -> Any:
        from bascule.client import Client

        address = address or self.cluster.brokers[0]
        if address not in self._clients:
            self._clients[address] = Client(address, timeout=10.0)
        return self._clients[address]

    def node_pids(self) -> dict[str, int | None]:
        return {node.server_id: node.pid for node in self.cluster.nodes if node.running}

    def server_pids(self) -> list[int | None]:
        pids = [node.pid for node in self.cluster.nodes if node.running]
        if self.cluster.nats is not None:
            pids.append(self.cluster.nats.pid)
        return pids

    def address_of(self, server_id: str) -> str:
        return next(node.address for node in self.cluster.nodes if node.server_id == server_id)

    def index_of(self, server_id: str) -> int:
        return next(i for i, node in enumerate(self.cluster.nodes) if node.server_id == server_id)

    async def partitions(self, stream: str) -> dict[int, Any]:
        """The stream's partitions as some running node's metadata shows them (leader, ISR)."""
        from bascule.client import BasculeError

        last: Exception | None = None
        for node in self.cluster.nodes:
            if not node.running:
                continue
            try:
                metadata = await self.client(node.address).fetch_metadata(stream)
                info = metadata.streams.get(stream)
                if info is not None and info.exists:
                    return info.partitions
            except BasculeError as exc:
                last = exc
        raise BenchError(f"no node knows stream {stream}: {last}")

    async def high_watermarks(self, stream: str) -> dict[int, int]:
        """Each partition's HW as its leader reports it (one FetchMetadata per running node)."""
        from bascule.client import BasculeError

        async def ask(node: Any) -> dict[int, int]:
            try:
                metadata = await self.client(node.address).fetch_metadata(stream)
            except BasculeError:
                return {}
            info = metadata.streams.get(stream)
            if info is None or not info.exists:
                return {}
            return {pid: p.high_watermark for pid, p in info.partitions.items() if p.leader == node.server_id}

        found: dict[int, int] = {}
        for answer in await asyncio.gather(*(ask(n) for n in self.cluster.nodes if n.running)):
            found.update(answer)
        return found

    async def create_stream(self, name: str, subject: str, rf: int, partitions: int = 1,
                            timeout: float = 60.0) -> dict[int, int]:
        """Create a stream and wait until every partition leads with a full ISR and captures (an acked
        envelope went through each partition's subject). Returns each partition's HW after that probe."""
        from bascule.wire.names import partition_subject

        client = self.client()
        await client.create_stream(name, subject, replication_factor=rf, partitions=partitions)
        deadline = _now() + timeout
        while True:
            parts = await self.partitions(name)
            if len(parts) == partitions and all(p.leader and len(p.isr) == rf for p in parts.values()):
                break
            if _now() > deadline:
                raise BenchError(f"stream {name}: partitions not led with a full ISR after {timeout} s: {parts}")
            await asyncio.sleep(0.05)
        assert self.probe is not None
        limit = asyncio.Semaphore(20)

        async def probe(pid: int) -> None:
            async with limit:
                subject_p = partition_subject(subject, pid)
                while not await self.probe.publish(subject_p, b"probe", policy="all", timeout=1.0):
                    if _now() > deadline:
                        raise BenchError(f"stream {name}/{pid}: no ack for a probe on {subject_p} after {timeout} s")

        await asyncio.gather(*(probe(pid) for pid in range(partitions)))
        while True:
            hws = await self.high_watermarks(name)
            if len(hws) == partitions and all(h >= 0 for h in hws.values()):
                return hws
            if _now() > deadline:
                raise BenchError(f"stream {name}: HW not visible after the probes: {hws}")
            await asyncio.sleep(0.05)

    async def wait_committed(self, stream: str, targets: dict[int, int], stall: float) -> float:
        """Until every partition's HW reaches its target; returns when. Raises if progress stops."""
        return await _wait_progress(
            lambda: self.high_watermarks(stream),
            lambda hws: sum(max(0, min(hws.get(p, -1), t) - 0) for p, t in targets.items()),
            lambda hws: all(hws.get(p, -1) >= t for p, t in targets.items()),
            stall, f"bascule stream {stream}", targets,
            interval=POLL_INTERVAL if len(targets) == 1 else 0.05,
        )

    async def leader_of(self, stream: str, partition: int = 0) -> str:
        return (await self.partitions(stream))[partition].leader


async def _wait_progress(
    poll: Callable[[], Awaitable[Any]], progress: Callable[[Any], int], done: Callable[[Any], bool],
    stall: float, what: str, target: Any, interval: float = POLL_INTERVAL,
) -> float:
    last_progress, last_change = -1, _now()
    while True:
        state = await poll()
        now = _now()
        if done(state):
            return now
        value = progress(state)
        if value != last_progress:
            last_progress, last_change = value, now
        elif now - last_change > stall:
            raise BenchError(f"{what}: no progress for {stall:.0f} s; state {_brief(state)}, target {_brief(target)}")
        await asyncio.sleep(interval)


def _brief(value: Any, limit: int = 400) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


class EnvelopeProbe:
    """Liftbridge publish envelopes over plain NATS, each with its own ack inbox."""

    def __init__(self, nc: Any) -> None:
        self.nc = nc
        self.prefix = f"_INBOX.bench.{uuid.uuid4().hex[:12]}"
        self.waiters: dict[str, asyncio.Future[float]] = {}
        self.sequence = 0

    @classmethod
    async def create(cls, nc: Any) -> EnvelopeProbe:
        probe = cls(nc)
        await nc.subscribe(probe.prefix + ".*", cb=probe._on_ack)
        await flush(nc)
        return probe

    async def _on_ack(self, msg: Any) -> None:
        waiter = self.waiters.pop(msg.subject, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(_now())

    def envelope(self, value: bytes, policy: str) -> tuple[str, bytes]:
        from bascule.client import ACK_POLICIES
        from bascule.wire import envelope
        from bascule.wire.pb import api_pb2

        self.sequence += 1
        inbox = f"{self.prefix}.{self.sequence}"
        message = api_pb2.Message(value=value, ackInbox=inbox, correlationId=str(self.sequence),
                                  ackPolicy=ACK_POLICIES[policy])
        return inbox, envelope.encode_message(message, envelope.MsgType.PUBLISH)

    async def publish(self, subject: str, value: bytes, policy: str = "all", timeout: float = 1.0) -> float | None:
        """Publish and wait for the ack; the time it arrived, or None after `timeout`."""
        inbox, data = self.envelope(value, policy)
        waiter = self.waiters[inbox] = asyncio.get_running_loop().create_future()
        try:
            await self.nc.publish(subject, data)
            return await asyncio.wait_for(waiter, timeout)
        except asyncio.TimeoutError:
            return None
        finally:
            self.waiters.pop(inbox, None)


def _js_config(path: Path, sync_always: bool, extra: str = "") -> Path:
    lines = ["jetstream {",
             # Generous ingest buffers: plain publishes beyond them are dropped (default 100k msgs / 128 MiB).
             "  max_buffered_msgs: 10000000",
             "  max_buffered_size: 4GB"]
    if sync_always:
        lines.append("  sync_interval: always")
    lines.append("}")
    path.write_text("\n".join(lines) + "\n" + extra)
    return path


class JetStreamSystem:
    """`size` nats-servers with JetStream, each with its own store dir; with size > 1, routed into a cluster."""

    def __init__(self, ctx: Context, name: str, size: int, sync_always: bool = False) -> None:
        from bascule.node.embedded_nats import EmbeddedNats
        from bascule.testing.local import free_port

        self.ctx = ctx
        self.base = ctx.dir / name
        self.base.mkdir(parents=True, exist_ok=True)
        self.size = size
        route_ports = [free_port() for _ in range(size)] if size > 1 else []
        self.servers: list[Any] = []
        for i in range(size):
            config = _js_config(self.base / f"js{i}.conf", sync_always)
            options: dict[str, Any] = {}
            if size > 1:
                options = {
                    "cluster_name": "bench",
                    "cluster_listen": f"nats://127.0.0.1:{route_ports[i]}",
                    "routes": [f"nats://127.0.0.1:{p}" for j, p in enumerate(route_ports) if j != i],
                }
            self.servers.append(EmbeddedNats(
                host="127.0.0.1", port=0, config_file=config, jetstream=True,
                store_dir=self.base / f"store{i}", server_name=f"js{i}", log_dir=self.base / f"log{i}",
                **options,
            ))
        self.nc: Any = None
        self.js: Any = None

    async def __aenter__(self) -> JetStreamSystem:
        try:
            await asyncio.gather(*(s.start() for s in self.servers))
            await self.connect()
        except BaseException:
            await self.close()
            raise
        return self

    async def connect(self, index: int | None = None) -> None:
        import nats

        if self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.close()
        urls = [s.url for s in self.servers if s.running] if index is None else [self.servers[index].url]
        self.nc = await nats.connect(servers=urls, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
        self.js = self.nc.jetstream(timeout=5)
        deadline = _now() + READY_TIMEOUT
        while True:  # until a JetStream meta leader answers
            try:
                await self.js.account_info()
                return
            except Exception as exc:  # noqa: BLE001
                if _now() > deadline:
                    raise BenchError(f"JetStream not ready after {READY_TIMEOUT} s: {exc!r}\n{self.log_tails()}")
                await asyncio.sleep(0.2)

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None and exc_type is not asyncio.CancelledError:
            _log(f"JetStream logs after a failure:\n{self.log_tails()}")
        await self.close()

    async def close(self) -> None:
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.close()
            self.nc = None
        for server in self.servers:
            with contextlib.suppress(Exception):
                await server.stop()

    def log_tails(self, lines: int = 15) -> str:
        parts = []
        for i in range(self.size):
            path = self.base / f"log{i}" / "nats-server.log"
            try:
                tail = "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
            except OSError:
                tail = "(no log)"
            parts.append(f"--- js{i}: {path} ---\n{tail}")
        return "\n".join(parts)

    @property
    def nats_url(self) -> str:
        return next(s.url for s in self.servers if s.running)

    def server_pids(self) -> list[int | None]:
        # EmbeddedNats keeps its process private; the pid is read for /proc figures only.
        return [s._process.pid for s in self.servers if s._process is not None]

    async def create_stream(self, name: str, subject: str, replicas: int, timeout: float = 60.0) -> int:
        """Create a file-stored stream and wait until an acked publish goes through; returns messages held."""
        deadline = _now() + timeout
        while True:
            try:
                await self.js.add_stream(name=name, subjects=[subject], num_replicas=replicas, storage="file")
                break
            except Exception as exc:  # noqa: BLE001 - meta leader elections, timeouts
                if _now() > deadline:
                    raise BenchError(f"JetStream add_stream {name}: {exc!r}")
                await asyncio.sleep(0.2)
        while True:
            try:
                await self.js.publish(subject, b"probe", timeout=1.0)
                break
            except Exception as exc:  # noqa: BLE001
                if _now() > deadline:
                    raise BenchError(f"JetStream stream {name}: no ack for a probe: {exc!r}")
                await asyncio.sleep(0.1)
        return (await self.js.stream_info(name)).state.messages

    async def messages(self, name: str) -> int:
        try:
            return (await self.js.stream_info(name)).state.messages
        except Exception:  # noqa: BLE001 - a slow API answer under load is not progress lost
            return -1

    async def wait_stored(self, name: str, target: int, stall: float) -> float:
        return await _wait_progress(
            lambda: self.messages(name), lambda n: n, lambda n: n >= target,
            stall, f"JetStream stream {name}", target,
        )


# ---- scenario building blocks --------------------------------------------------------------------


def _publisher_specs(url: str, subjects: list[str], total: int, publishers: int, size: int) -> list[dict[str, Any]]:
    per = [total // publishers + (1 if i < total % publishers else 0) for i in range(publishers)]
    return [{"url": url, "subjects": subjects, "count": n, "size": size} for n in per]


def _per_subject_counts(specs: list[dict[str, Any]], subjects: int) -> list[int]:
    counts = [0] * subjects
    for spec in specs:
        n = spec["count"]
        for k in range(subjects):
            counts[k] += n // subjects + (1 if k < n % subjects else 0)
    return counts


async def _timed_publish(ctx: Context, url: str, subjects: list[str], count: int, name: str,
                         wait: Callable[[], Awaitable[float]], cpu_pids: list[int | None],
                         publishers: int | None = None) -> dict[str, Any]:
    """Publishers in worker processes, GO, and `wait` until the system committed; rates and CPU cost."""
    specs = _publisher_specs(url, subjects, count, publishers or ctx.args.publishers, ctx.payload_size)
    async with workers(ctx, "nats_pub", specs, name) as pubs:
        cpu = CpuMeter(cpu_pids).start()
        t0 = _now()
        for w in pubs:
            w.go()
        committed = await wait()
        cpu.stop()
        results = await asyncio.gather(*(w.result(60) for w in pubs))
    publish_end = max(r["end"] for r in results)
    return {
        "rate": count / (committed - t0),
        "publish_rate": count / (publish_end - t0),
        "server_cpu_us_per_msg": 1e6 * cpu.seconds / count,
        "seconds": committed - t0,
    }


@contextlib.asynccontextmanager
async def _maybe_profile(ctx: Context, label: str, pids: dict[str, int | None], on: bool) -> AsyncIterator[None]:
    if on and ctx.profiler is not None:
        ctx.profiling = label
        try:
            async with ctx.profiler.record(label, pids):
                yield
        finally:
            ctx.profiling = None
    else:
        yield


def _trials(ctx: Context) -> list[tuple[int, bool]]:
    """(trial number, profiled) pairs: the measured trials, then one profiled extra with --profile."""
    plan = [(i, False) for i in range(1, ctx.args.trials + 1)]
    if ctx.profiler is not None:
        plan.append((len(plan) + 1, True))
    return plan


async def _run_trials(ctx: Context, scenario: str, system: str,
                      trial: Callable[[int, bool], Awaitable[dict[str, Any]]]) -> list[dict[str, Any]]:
    results = []
    for number, profiled in _trials(ctx):
        tag = " (profiled, not counted)" if profiled else ""
        _log(f"{scenario} / {system}: trial {number}{tag}")
        started = _now()
        try:
            metrics = await trial(number, profiled)
        except (BenchError, asyncio.TimeoutError, OSError, RuntimeError) as exc:
            _log(f"{scenario} / {system}: trial {number} FAILED: {exc}")
            metrics = {"error": str(exc) or repr(exc)}
        metrics["loadavg"] = loadavg()
        metrics["wall_s"] = round(_now() - started, 2)
        if profiled:
            metrics["profiled"] = True
        else:
            _log(f"{scenario} / {system}: trial {number}: " + ", ".join(
                f"{k}={_fmt(v)}" for k, v in metrics.items() if k in METRICS or k == "error"))
        results.append(metrics)
    return results


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3g}"
    return str(value)


# ---- scenarios -----------------------------------------------------------------------------------


async def capture_scenario(ctx: Context, system: str, replicas: int, scenario: str,
                           sync_always: bool = False, count: int | None = None) -> list[dict[str, Any]]:
    count = count or ctx.counts["capture"]
    stall = ctx.args.stall_timeout
    if system == BASCULE:
        config = {"streams.sync": "always" if sync_always else "never"}
        async with BasculeSystem(ctx, f"{scenario}-bascule", replicas, config) as sys_:

            async def trial(n: int, profiled: bool) -> dict[str, Any]:
                stream, subject = f"cap{n}", f"{STREAM_SUBJECT_PREFIX}.cap{n}"
                base = await sys_.create_stream(stream, subject, replicas)
                targets = {0: base[0] + count}
                async with _maybe_profile(ctx, f"{scenario}", sys_.node_pids(), profiled):
                    metrics = await _timed_publish(
                        ctx, sys_.nats_url, [subject], count, f"{scenario}-{n}",
                        lambda: sys_.wait_committed(stream, targets, stall), sys_.server_pids(),
                    )
                await sys_.client().delete_stream(stream)
                return metrics

            return await _run_trials(ctx, scenario, system, trial)
    async with JetStreamSystem(ctx, f"{scenario}-jetstream", replicas, sync_always) as sys_:

        async def trial(n: int, profiled: bool) -> dict[str, Any]:
            stream, subject = f"cap{n}", f"{STREAM_SUBJECT_PREFIX}.cap{n}"
            base = await sys_.create_stream(stream, subject, replicas)
            metrics = await _timed_publish(
                ctx, sys_.nats_url, [subject], count, f"{scenario}-{n}",
                lambda: sys_.wait_stored(stream, base + count, stall), sys_.server_pids(),
            )
            await sys_.js.delete_stream(stream)
            return metrics

        return await _run_trials(ctx, scenario, system, trial)


async def run_capture_r1(ctx: Context, system: str) -> list[dict[str, Any]]:
    return await capture_scenario(ctx, system, 1, "capture_r1")


async def run_capture_r3(ctx: Context, system: str) -> list[dict[str, Any]]:
    return await capture_scenario(ctx, system, 3, "capture_r3")


def _latency_metrics(result: dict[str, Any], t0: float, count: int, prefix: str = "") -> dict[str, Any]:
    if result.get("errors"):
        raise BenchError(f"{result['errors']} publishes failed; first error: {result.get('first_error')}")
    return {
        f"{prefix}rate": count / (result["end"] - t0),
        f"{prefix}p50_ms": result["p50_ms"],
        f"{prefix}p99_ms": result["p99_ms"],
        f"{prefix}max_ms": result["max_ms"],
    }


async def _acked_run(ctx: Context, kind: str, spec: dict[str, Any], count: int, name: str,
                     cpu_pids: list[int | None], prefix: str = "") -> dict[str, Any]:
    async with workers(ctx, kind, [spec], name) as (worker,):
        cpu = CpuMeter(cpu_pids).start()
        t0 = _now()
        worker.go()
        # a cap against hangs, not a pace: fsync-bound acked publishes can run at a few hundred a second
        result = await worker.result(timeout=ctx.args.stall_timeout + count / 100)
        cpu.stop()
    metrics = _latency_metrics(result, t0, count, prefix)
    metrics[f"{prefix}cpu_us_per_msg"] = 1e6 * cpu.seconds / count
    return metrics


async def acked_scenario(ctx: Context, system: str, replicas: int, scenario: str,
                         sync_always: bool = False, count: int | None = None,
                         variants: Sequence[str] = ("grpc", "nats"), grpc_floor: bool = False) -> list[dict[str, Any]]:
    count = count or ctx.counts["acked"]
    window, size = ctx.args.window, ctx.payload_size
    if system == BASCULE:
        config = {"streams.sync": "always" if sync_always else "never"}
        async with BasculeSystem(ctx, f"{scenario}-bascule", replicas, config) as sys_:

            async def trial(n: int, profiled: bool) -> dict[str, Any]:
                metrics: dict[str, Any] = {}
                for variant in variants:
                    stream, subject = f"ack{n}{variant}", f"{STREAM_SUBJECT_PREFIX}.ack{n}{variant}"
                    await sys_.create_stream(stream, subject, replicas)
                    leader = await sys_.leader_of(stream)
                    if variant == "grpc":
                        kind = "bascule_acked_grpc"
                        spec = {"address": sys_.address_of(leader), "stream": stream, "partition": 0}
                    else:
                        kind = "bascule_acked_nats"
                        spec = {"url": sys_.nats_url, "subject": subject}
                    spec.update(count=count, window=window, size=size)
                    async with _maybe_profile(ctx, f"{scenario}-{variant}", sys_.node_pids(), profiled):
                        metrics.update(await _acked_run(ctx, kind, spec, count, f"{scenario}-{n}-{variant}",
                                                        sys_.server_pids(), prefix=f"{variant}_"))
                    await sys_.client().delete_stream(stream)
                if grpc_floor:
                    async with _grpc_floor_server(ctx, count, f"{scenario}-{n}-grpc-floor") as (address, pid):
                        spec = {"address": address, "stream": "floor", "partition": 0, "count": count,
                                "window": window, "size": size}
                        floor = await _acked_run(ctx, "bascule_acked_grpc", spec, count,
                                                 f"{scenario}-{n}-grpc-floor", [pid])
                    metrics.update(grpc_floor_rate=floor["rate"], grpc_floor_cpu_us_per_msg=floor["cpu_us_per_msg"])
                return metrics

            return await _run_trials(ctx, scenario, system, trial)
    async with JetStreamSystem(ctx, f"{scenario}-jetstream", replicas, sync_always) as sys_:

        async def trial(n: int, profiled: bool) -> dict[str, Any]:
            stream, subject = f"ack{n}", f"{STREAM_SUBJECT_PREFIX}.ack{n}"
            await sys_.create_stream(stream, subject, replicas)
            spec = {"url": sys_.nats_url, "subject": subject, "count": count, "window": window, "size": size}
            metrics = await _acked_run(ctx, "js_acked", spec, count, f"{scenario}-{n}", sys_.server_pids())
            metrics["server_cpu_us_per_msg"] = metrics.pop("cpu_us_per_msg")
            await sys_.js.delete_stream(stream)
            return metrics

        return await _run_trials(ctx, scenario, system, trial)


async def run_acked_r3(ctx: Context, system: str) -> list[dict[str, Any]]:
    return await acked_scenario(ctx, system, 3, "acked_r3", grpc_floor=True)


async def run_consume_r3(ctx: Context, system: str) -> list[dict[str, Any]]:
    count = ctx.counts["consume"]
    stall = ctx.args.stall_timeout
    scenario = "consume_r3"
    if system == BASCULE:
        async with BasculeSystem(ctx, f"{scenario}-bascule", 3, {}) as sys_:
            stream, subject = "consume", f"{STREAM_SUBJECT_PREFIX}.consume"
            base = await sys_.create_stream(stream, subject, 3)
            _log(f"{scenario} / bascule: prefilling {count} messages")
            await _timed_publish(ctx, sys_.nats_url, [subject], count, f"{scenario}-fill",
                                 lambda: sys_.wait_committed(stream, {0: base[0] + count}, stall), [])
            leader = await sys_.leader_of(stream)
            total = base[0] + count + 1  # the probe, then the prefill

            async def trial(n: int, profiled: bool) -> dict[str, Any]:
                spec = {"address": sys_.address_of(leader), "stream": stream, "partition": 0, "count": total}
                async with _maybe_profile(ctx, scenario, sys_.node_pids(), profiled):
                    metrics = await _consume_run(ctx, "bascule_consume", spec, total, f"{scenario}-{n}",
                                                 sys_.server_pids())
                async with _maybe_profile(ctx, f"{scenario}-grpc", sys_.node_pids(), profiled):
                    grpc_metrics = await _consume_run(ctx, "bascule_consume_grpc", spec, total,
                                                      f"{scenario}-{n}-grpc", sys_.server_pids())
                async with _grpc_floor_server(ctx, total, f"{scenario}-{n}-grpc-floor") as (address, pid):
                    reader = {"address": address, "stream": "floor", "partition": 0, "count": total}
                    floor = await _consume_run(ctx, "bascule_consume_grpc", reader, total,
                                               f"{scenario}-{n}-grpc-floor", [pid])
                return {**metrics, **{f"grpc_{name}": value for name, value in grpc_metrics.items()},
                        "grpc_floor_rate": floor["rate"], "grpc_floor_cpu_us_per_msg": floor["server_cpu_us_per_msg"]}

            return await _run_trials(ctx, scenario, system, trial)
    async with JetStreamSystem(ctx, f"{scenario}-jetstream", 3) as sys_:
        stream, subject = "consume", f"{STREAM_SUBJECT_PREFIX}.consume"
        base = await sys_.create_stream(stream, subject, 3)
        _log(f"{scenario} / jetstream: prefilling {count} messages")
        await _timed_publish(ctx, sys_.nats_url, [subject], count, f"{scenario}-fill",
                             lambda: sys_.wait_stored(stream, base + count, stall), [])
        total = base + count

        async def trial(n: int, profiled: bool) -> dict[str, Any]:
            spec = {"url": sys_.nats_url, "subject": subject, "count": total}
            return await _consume_run(ctx, "js_consume", spec, total, f"{scenario}-{n}", sys_.server_pids())

        return await _run_trials(ctx, scenario, system, trial)


@contextlib.asynccontextmanager
async def _grpc_floor_server(ctx: Context, count: int, name: str) -> AsyncIterator[tuple[str, int | None]]:
    """A gRPC server that does nothing but answer (a prebuilt message for Subscribe, an ack per
    PublishAsync request): what grpc.aio costs per message, whatever the server does. Yields its
    address and pid."""
    from bascule.testing.local import free_port

    port = free_port()
    spec = {"port": port, "count": count, "size": ctx.payload_size}
    async with workers(ctx, "grpc_floor_server", [spec], f"{name}-server") as (server,):
        server.go()
        yield f"127.0.0.1:{port}", server.pid


async def _consume_run(ctx: Context, kind: str, spec: dict[str, Any], count: int, name: str,
                       cpu_pids: list[int | None]) -> dict[str, Any]:
    async with workers(ctx, kind, [spec], name) as (worker,):
        cpu = CpuMeter(cpu_pids).start()
        t0 = _now()
        worker.go()
        result = await worker.result(timeout=ctx.args.stall_timeout + count / 1000)
        cpu.stop()
    if result["received"] != count:
        raise BenchError(f"read {result['received']} messages, expected {count}")
    return {
        "rate": count / (result["end"] - t0),
        "first_ms": 1000 * (result["first"] - t0),
        "server_cpu_us_per_msg": 1e6 * cpu.seconds / count,
    }


async def run_durable_r1(ctx: Context, system: str) -> list[dict[str, Any]]:
    """Capture and acked (window) rates with fsync before acks, one replica."""
    count = ctx.counts["durable"]
    capture = await capture_scenario(ctx, system, 1, "durable_r1", sync_always=True, count=count)
    acked = await acked_scenario(ctx, system, 1, "durable_r1", sync_always=True, count=count)
    merged = []
    for cap, ack in zip(capture, acked):
        row: dict[str, Any] = {}
        if "error" in cap or "error" in ack:
            row["error"] = "; ".join(x["error"] for x in (cap, ack) if "error" in x)
        row["capture_rate"] = cap.get("rate")
        row["capture_cpu_us_per_msg"] = cap.get("server_cpu_us_per_msg")
        # bascule's acked figures keep their grpc_/nats_ prefixes; JetStream's get an acked_ one
        for key, value in ack.items():
            if key in ("loadavg", "wall_s", "profiled", "error"):
                continue
            if system == JETSTREAM:
                key = "acked_" + ("cpu_us_per_msg" if key == "server_cpu_us_per_msg" else key)
            row[key] = value
        row["loadavg"], row["wall_s"] = ack.get("loadavg"), (cap.get("wall_s") or 0) + (ack.get("wall_s") or 0)
        if cap.get("profiled"):
            row["profiled"] = True
        merged.append({k: v for k, v in row.items() if v is not None})
    return merged


async def run_ceiling(ctx: Context, system: str) -> list[dict[str, Any]]:
    """One nats-py process receiving from another through one nats-server: no stream at all."""
    from bascule.node.embedded_nats import EmbeddedNats

    count = ctx.counts["ceiling"]
    config = ctx.dir / "ceiling-nats.conf"
    ctx.dir.mkdir(parents=True, exist_ok=True)
    # The publisher outruns the subscriber by design: the backlog must fit in the server's buffer for
    # the subscriber's connection (64 MiB by default, beyond which it is cut off as a slow consumer).
    config.write_text("max_pending: 2GB\n")
    server = EmbeddedNats(host="127.0.0.1", port=0, config_file=config, log_dir=ctx.dir / "ceiling-nats")
    await server.start()
    try:

        async def trial(n: int, profiled: bool) -> dict[str, Any]:
            subject = f"{STREAM_SUBJECT_PREFIX}.ceiling{n}"
            sub_spec = {"url": server.url, "subject": subject, "count": count}
            async with workers(ctx, "nats_sub", [sub_spec], f"ceiling-{n}-sub") as (sub,):
                pub_specs = _publisher_specs(server.url, [subject], count, 1, ctx.payload_size)
                async with workers(ctx, "nats_pub", pub_specs, f"ceiling-{n}-pub") as (pub,):
                    sub.go()
                    t0 = _now()
                    pub.go()
                    received = await sub.result(timeout=ctx.args.stall_timeout + count / 20_000)
                    sent = await pub.result(timeout=60)
            if received["received"] != count:
                raise BenchError(f"received {received['received']} of {count} (slow consumer?)")
            return {"rate": count / (received["end"] - t0), "publish_rate": count / (sent["end"] - t0)}

        return await _run_trials(ctx, "ceiling", system, trial)
    finally:
        await server.stop()


async def run_failover(ctx: Context, system: str) -> list[dict[str, Any]]:
    kills = ctx.counts["kills"]
    if system == BASCULE:
        config = {"clustering.replica.max.leader.timeout": "1s"}
        async with BasculeSystem(ctx, "failover-bascule", 3, config) as sys_:

            async def trial(n: int, profiled: bool) -> dict[str, Any]:
                stream, subject = f"fo{n}", f"{STREAM_SUBJECT_PREFIX}.fo{n}"
                await sys_.create_stream(stream, subject, 3)
                times, details = [], []
                for k in range(kills):
                    leader = await sys_.leader_of(stream)
                    index = sys_.index_of(leader)
                    seconds, extra = await _failover_once(
                        sys_.probe, subject, lambda: sys_.cluster.kill(index), ctx.args.failover_timeout,
                    )
                    new_leader = await sys_.leader_of(stream)
                    details.append({"killed": leader, "new_leader": new_leader, "seconds": seconds, **extra})
                    _log(f"failover / bascule: kill {k + 1}: {leader} -> {new_leader} in {_fmt(seconds)} s")
                    times.append(seconds)
                    await asyncio.to_thread(sys_.cluster.restart, index, True, None, graceful=False)
                    await _wait_full_isr(sys_, stream, 3, ctx.args.failover_timeout * 3)
                    await asyncio.sleep(1.0)
                await sys_.client().delete_stream(stream)
                return {"failover_median_s": statistics.median(times), "failover_worst_s": max(times),
                        "kills": details}

            return await _run_trials(ctx, "failover", system, trial)
    async with JetStreamSystem(ctx, "failover-jetstream", 3) as sys_:

        async def trial(n: int, profiled: bool) -> dict[str, Any]:
            stream, subject = f"fo{n}", f"{STREAM_SUBJECT_PREFIX}.fo{n}"
            await sys_.create_stream(stream, subject, 3)
            times, details = [], []
            for k in range(kills):
                info = await sys_.js.stream_info(stream)
                leader = info.cluster.leader
                index = int(leader.removeprefix("js"))
                await sys_.connect((index + 1) % 3)  # a prober that survives the kill
                probe = JetStreamProbe(sys_.nc)
                await probe.start()
                pid = sys_.server_pids()[index]
                seconds, extra = await _failover_once(
                    probe, subject, lambda: os.kill(pid, signal.SIGKILL), ctx.args.failover_timeout,
                )
                await sys_.servers[index].kill()  # reap it
                await asyncio.sleep(0.1)
                new_leader = (await sys_.js.stream_info(stream)).cluster.leader
                details.append({"killed": leader, "new_leader": new_leader, "seconds": seconds, **extra})
                _log(f"failover / jetstream: kill {k + 1}: {leader} -> {new_leader} in {_fmt(seconds)} s")
                times.append(seconds)
                await sys_.servers[index].start()
                await sys_.connect()
                await _wait_js_current(sys_, stream, ctx.args.failover_timeout * 3)
                await asyncio.sleep(1.0)
            await sys_.js.delete_stream(stream)
            return {"failover_median_s": statistics.median(times), "failover_worst_s": max(times),
                    "kills": details}

        return await _run_trials(ctx, "failover", system, trial)


class JetStreamProbe:
    """JetStream publishes with a reply inbox each (what js.publish does), acks told apart by inbox."""

    def __init__(self, nc: Any) -> None:
        self.nc = nc
        self.prefix = f"_INBOX.jsbench.{uuid.uuid4().hex[:12]}"
        self.waiters: dict[str, asyncio.Future[float]] = {}
        self.sequence = 0

    async def start(self) -> None:
        await self.nc.subscribe(self.prefix + ".*", cb=self._on_ack)
        await flush(self.nc)

    async def _on_ack(self, msg: Any) -> None:
        waiter = self.waiters.pop(msg.subject, None)
        if waiter is None or waiter.done():
            return
        try:
            ok = "error" not in json.loads(msg.data) and not (msg.headers or {}).get("Status")
        except ValueError:
            ok = False
        if ok:
            waiter.set_result(_now())

    async def publish(self, subject: str, value: bytes, policy: str = "all", timeout: float = 1.0) -> float | None:
        self.sequence += 1
        inbox = f"{self.prefix}.{self.sequence}"
        waiter = self.waiters[inbox] = asyncio.get_running_loop().create_future()
        try:
            await self.nc.publish(subject, value, reply=inbox)
            return await asyncio.wait_for(waiter, timeout)
        except asyncio.TimeoutError:
            return None
        except Exception:  # noqa: BLE001 - a publish while reconnecting fails: as good as no ack
            return None
        finally:
            self.waiters.pop(inbox, None)


async def _failover_once(probe: Any, subject: str, kill: Callable[[], Any], timeout: float,
                         interval: float = 0.01, probe_timeout: float = 2.0) -> tuple[float, dict[str, Any]]:
    """Probe every `interval` s; SIGKILL; the time from the kill to the first ack of a publish sent after it."""
    if await probe.publish(subject, b"before", timeout=5.0) is None:
        raise BenchError(f"no ack on {subject} before the kill")
    recovered: asyncio.Future[float] = asyncio.get_running_loop().create_future()
    pending: set[asyncio.Task[None]] = set()

    async def one() -> None:
        acked = await probe.publish(subject, b"failover-probe", timeout=probe_timeout)
        if acked is not None and not recovered.done():
            recovered.set_result(acked)

    t_kill = _now()
    kill()
    deadline = t_kill + timeout
    try:
        while not recovered.done():
            if _now() > deadline:
                raise BenchError(f"no ack-ALL publish on {subject} succeeded within {timeout} s of the kill")
            task = asyncio.create_task(one())
            pending.add(task)
            task.add_done_callback(pending.discard)
            await asyncio.sleep(interval)
        return recovered.result() - t_kill, {}
    finally:
        for task in list(pending):
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


async def _wait_full_isr(sys_: BasculeSystem, stream: str, rf: int, timeout: float) -> None:
    deadline = _now() + timeout
    while True:
        try:
            parts = await sys_.partitions(stream)
            if all(p.leader and len(p.isr) == rf for p in parts.values()):
                return
        except BenchError:
            parts = {}
        if _now() > deadline:
            raise BenchError(f"{stream}: ISR not back to {rf} after {timeout} s: {parts}")
        await asyncio.sleep(0.1)


async def _wait_js_current(sys_: JetStreamSystem, stream: str, timeout: float) -> None:
    deadline = _now() + timeout
    while True:
        try:
            info = await sys_.js.stream_info(stream)
            replicas = info.cluster.replicas or []
            if info.cluster.leader and len(replicas) == 2 and all(r.current and not r.offline for r in replicas):
                return
        except Exception:  # noqa: BLE001
            info = None
        if _now() > deadline:
            raise BenchError(f"JetStream {stream}: replicas not current after {timeout} s: {info}")
        await asyncio.sleep(0.1)


async def run_scale(ctx: Context, system: str) -> list[dict[str, Any]]:
    """bascule capture rate over 1, 10 and 100 partitions (publishers round-robin over partition subjects)."""
    from bascule.wire.names import partition_subject

    count = ctx.counts["scale"]
    replicas = ctx.args.scale_replicas
    nodes = max(3, replicas) if ctx.args.scale_nodes is None else ctx.args.scale_nodes
    stall = ctx.args.stall_timeout
    async with BasculeSystem(ctx, "scale-bascule", nodes, {}) as sys_:

        async def trial(n: int, profiled: bool) -> dict[str, Any]:
            metrics: dict[str, Any] = {}
            for partitions in ctx.args.scale_partitions:
                stream, subject = f"scale{n}p{partitions}", f"{STREAM_SUBJECT_PREFIX}.scale{n}p{partitions}"
                base = await sys_.create_stream(stream, subject, replicas, partitions)
                subjects = [partition_subject(subject, p) for p in range(partitions)]
                specs = _publisher_specs(sys_.nats_url, subjects, count, ctx.args.scale_publishers, ctx.payload_size)
                per = _per_subject_counts(specs, partitions)
                targets = {p: base[p] + per[p] for p in range(partitions)}
                async with _maybe_profile(ctx, f"scale-p{partitions}", sys_.node_pids(), profiled):
                    m = await _timed_publish(
                        ctx, sys_.nats_url, subjects, count, f"scale-{n}-p{partitions}",
                        lambda: sys_.wait_committed(stream, targets, stall), sys_.server_pids(),
                        publishers=ctx.args.scale_publishers,
                    )
                metrics[f"p{partitions}_rate"] = m["rate"]
                metrics[f"p{partitions}_cpu_us_per_msg"] = m["server_cpu_us_per_msg"]
                await sys_.client().delete_stream(stream)
                await asyncio.sleep(1.0)
            return metrics

        return await _run_trials(ctx, "scale", system, trial)


async def run_restart(ctx: Context, system: str) -> list[dict[str, Any]]:
    """Memory (idle partitions, 1M capture, a full read) and restart time of a one-node server."""
    count = ctx.counts["restart"]
    stall = ctx.args.stall_timeout
    idle_partitions = ctx.args.idle_partitions

    async def trial(n: int, profiled: bool) -> dict[str, Any]:
        if system == BASCULE:
            return await _restart_bascule(ctx, n, count, idle_partitions, stall)
        return await _restart_jetstream(ctx, n, count, idle_partitions, stall)

    return await _run_trials(ctx, "restart", system, trial)


async def _idle_cpu_pct(pids: list[int | None], seconds: float = 5.0) -> float:
    cpu = CpuMeter(pids).start()
    await asyncio.sleep(seconds)
    return 100.0 * cpu.stop() / seconds


async def _restart_bascule(ctx: Context, n: int, count: int, idle_partitions: int, stall: float) -> dict[str, Any]:
    from bascule.client import BasculeError, Client

    metrics: dict[str, Any] = {}
    async with BasculeSystem(ctx, f"restart-bascule-{n}", 1, {}) as sys_:
        node = sys_.cluster.nodes[0]
        await asyncio.sleep(1.0)
        metrics["rss_start_mib"] = rss_mib(node.pid)
        await sys_.client().create_stream("idle", f"{STREAM_SUBJECT_PREFIX}.idle", replication_factor=1,
                                          partitions=idle_partitions)
        await _wait_full_isr(sys_, "idle", 1, 60)
        await asyncio.sleep(2.0)
        metrics["rss_idle_100_mib"] = rss_mib(node.pid)
        metrics["idle_100_cpu_pct"] = await _idle_cpu_pct([node.pid])
        await sys_.client().delete_stream("idle")
        await asyncio.sleep(1.0)

        stream, subject = "big", f"{STREAM_SUBJECT_PREFIX}.big"
        base = await sys_.create_stream(stream, subject, 1)
        async with RssSampler([node.pid]) as sampler:
            m = await _timed_publish(ctx, sys_.nats_url, [subject], count, f"restart-{n}-fill",
                                     lambda: sys_.wait_committed(stream, {0: base[0] + count}, stall),
                                     sys_.server_pids())
        metrics["capture_rate"] = m["rate"]
        metrics["rss_capture_peak_mib"] = sampler.peak
        await asyncio.sleep(2.0)
        metrics["rss_after_capture_mib"] = rss_mib(node.pid)
        total = base[0] + count + 1
        last = total - 1
        async with RssSampler([node.pid]) as sampler:
            read = await _consume_run(ctx, "bascule_consume",
                                      {"address": node.address, "stream": stream, "partition": 0, "count": total},
                                      total, f"restart-{n}-read", sys_.server_pids())
        metrics["read_rate"] = read["rate"]
        metrics["rss_read_peak_mib"] = sampler.peak
        await asyncio.sleep(2.0)
        metrics["rss_after_read_mib"] = rss_mib(node.pid)

        async def serves_last() -> float:
            deadline = _now() + READY_TIMEOUT * 2
            last_error = "no answer"
            while True:
                if not node.running:
                    raise BenchError(f"node exited while restarting:\n{node.log_tail(20)}")
                async with Client(node.address, timeout=2.0) as client:
                    try:
                        async for message in client.subscribe(stream, 0, offset=last, stop_offset=last):
                            if message.offset == last:
                                return _now()
                    except BasculeError as exc:
                        last_error = str(exc)
                if _now() > deadline:
                    raise BenchError(f"offset {last} of {stream} not served {READY_TIMEOUT * 2} s after restart; "
                                     f"last: {last_error}\n{node.log_tail(20)}")
                await asyncio.sleep(0.05)

        for label, graceful in (("graceful", True), ("kill", False)):
            if graceful:
                await asyncio.to_thread(node.stop)
            else:
                await asyncio.to_thread(node.kill)
            t0 = _now()
            node.start(wait=False)
            metrics[f"restart_{label}_s"] = await serves_last() - t0
        await asyncio.sleep(1.0)
        metrics["restart_rss_mib"] = rss_mib(node.pid)
    return metrics


async def _restart_jetstream(ctx: Context, n: int, count: int, idle_streams: int, stall: float) -> dict[str, Any]:
    import nats
    from nats.js.api import ConsumerConfig, DeliverPolicy

    metrics: dict[str, Any] = {}
    async with JetStreamSystem(ctx, f"restart-jetstream-{n}", 1) as sys_:
        server = sys_.servers[0]
        await asyncio.sleep(1.0)
        metrics["rss_start_mib"] = rss_mib(sys_.server_pids()[0])
        for i in range(idle_streams):
            await sys_.js.add_stream(name=f"idle{i}", subjects=[f"{STREAM_SUBJECT_PREFIX}.idle.{i}"], storage="file")
        await asyncio.sleep(2.0)
        metrics["rss_idle_100_mib"] = rss_mib(sys_.server_pids()[0])
        metrics["idle_100_cpu_pct"] = await _idle_cpu_pct(sys_.server_pids())
        for i in range(idle_streams):
            await sys_.js.delete_stream(f"idle{i}")
        await asyncio.sleep(1.0)

        stream, subject = "big", f"{STREAM_SUBJECT_PREFIX}.big"
        base = await sys_.create_stream(stream, subject, 1)
        async with RssSampler(sys_.server_pids()) as sampler:
            m = await _timed_publish(ctx, sys_.nats_url, [subject], count, f"restart-{n}-fill",
                                     lambda: sys_.wait_stored(stream, base + count, stall), sys_.server_pids())
        metrics["capture_rate"] = m["rate"]
        metrics["rss_capture_peak_mib"] = sampler.peak
        await asyncio.sleep(2.0)
        metrics["rss_after_capture_mib"] = rss_mib(sys_.server_pids()[0])
        total = base + count
        async with RssSampler(sys_.server_pids()) as sampler:
            read = await _consume_run(ctx, "js_consume", {"url": sys_.nats_url, "subject": subject, "count": total},
                                      total, f"restart-{n}-read", sys_.server_pids())
        metrics["read_rate"] = read["rate"]
        metrics["rss_read_peak_mib"] = sampler.peak
        await asyncio.sleep(2.0)
        metrics["rss_after_read_mib"] = rss_mib(sys_.server_pids()[0])
        await sys_.nc.close()
        sys_.nc = None

        async def serves_last() -> float:
            deadline = _now() + READY_TIMEOUT * 2
            last_error = "no connection"
            while True:
                try:
                    nc = await nats.connect(server.url, connect_timeout=1, max_reconnect_attempts=0,
                                            allow_reconnect=False)
                except Exception:  # noqa: BLE001 - not listening yet
                    nc = None
                if nc is not None:
                    try:
                        js = nc.jetstream(timeout=2)
                        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=total)
                        sub = await js.subscribe(subject, stream=stream, ordered_consumer=True, config=config)
                        msg = await sub.next_msg(timeout=2)
                        if msg.metadata.sequence.stream == total:
                            return _now()
                        last_error = f"got sequence {msg.metadata.sequence.stream}"
                    except Exception as exc:  # noqa: BLE001 - JetStream still recovering
                        last_error = repr(exc)
                    finally:
                        with contextlib.suppress(Exception):
                            await nc.close()
                if _now() > deadline:
                    raise BenchError(f"JetStream: message {total} not served {READY_TIMEOUT * 2} s after restart; "
                                     f"last: {last_error}")
                await asyncio.sleep(0.05)

        for label in ("graceful", "kill"):
            if label == "graceful":
                await server.stop()
            else:
                await server.kill()
            t0 = _now()
            await server.start()
            metrics[f"restart_{label}_s"] = await serves_last() - t0
        await asyncio.sleep(1.0)
        metrics["restart_rss_mib"] = rss_mib(sys_.server_pids()[0])
    return metrics


# ---- the scenario table --------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    systems: tuple[str, ...]
    run: Callable[[Context, str], Awaitable[list[dict[str, Any]]]]
    # Rows of the table: a metric name, or (label, bascule's metric, JetStream's metric) when the two
    # differ; the ratio is bascule / JetStream.
    rows: tuple[str | tuple[str, str, str], ...] = ("rate",)
    profile: bool = False


def _scale_rows(partitions: Sequence[int]) -> tuple[str, ...]:
    return tuple(f"p{p}_{m}" for p in partitions for m in ("rate", "cpu_us_per_msg"))


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("capture_r1", "capture R1: plain NATS publishes into a 1-replica stream",
             (BASCULE, JETSTREAM), run_capture_r1, ("rate", "server_cpu_us_per_msg", "publish_rate"), True),
    Scenario("capture_r3", "capture R3: plain NATS publishes into a 3-replica stream (3 nodes)",
             (BASCULE, JETSTREAM), run_capture_r3, ("rate", "server_cpu_us_per_msg", "publish_rate"), True),
    Scenario("acked_r3", "acked R3: pipelined publishes, ack ALL, window 1000",
             (BASCULE, JETSTREAM), run_acked_r3,
             (("grpc_rate", "grpc_rate", "rate"), ("grpc_p50_ms", "grpc_p50_ms", "p50_ms"),
              ("grpc_p99_ms", "grpc_p99_ms", "p99_ms"), ("grpc_cpu_us_per_msg", "grpc_cpu_us_per_msg",
                                                         "server_cpu_us_per_msg"),
              ("nats_rate", "nats_rate", "rate"), ("nats_p50_ms", "nats_p50_ms", "p50_ms"),
              ("nats_p99_ms", "nats_p99_ms", "p99_ms"), ("nats_cpu_us_per_msg", "nats_cpu_us_per_msg",
                                                         "server_cpu_us_per_msg"),
              "grpc_floor_rate", "grpc_floor_cpu_us_per_msg"), True),
    Scenario("consume_r3", "consume: read a prefilled R3 stream from the start (bascule's client; gRPC Subscribe)",
             (BASCULE, JETSTREAM), run_consume_r3,
             ("rate", "first_ms", "server_cpu_us_per_msg", ("grpc_rate", "grpc_rate", "rate"),
              ("grpc_first_ms", "grpc_first_ms", "first_ms"),
              ("grpc_server_cpu_us_per_msg", "grpc_server_cpu_us_per_msg", "server_cpu_us_per_msg"),
              "grpc_floor_rate", "grpc_floor_cpu_us_per_msg"), True),
    Scenario("durable_r1", "durable R1: fsync before ack (sync=always / sync_interval: always)",
             (BASCULE, JETSTREAM), run_durable_r1,
             ("capture_rate", "capture_cpu_us_per_msg",
              ("grpc_rate", "grpc_rate", "acked_rate"), ("grpc_p50_ms", "grpc_p50_ms", "acked_p50_ms"),
              ("grpc_p99_ms", "grpc_p99_ms", "acked_p99_ms"),
              ("grpc_cpu_us_per_msg", "grpc_cpu_us_per_msg", "acked_cpu_us_per_msg"),
              ("nats_rate", "nats_rate", "acked_rate"), ("nats_p50_ms", "nats_p50_ms", "acked_p50_ms"),
              ("nats_p99_ms", "nats_p99_ms", "acked_p99_ms"),
              ("nats_cpu_us_per_msg", "nats_cpu_us_per_msg", "acked_cpu_us_per_msg"))),
    Scenario("ceiling", "ceiling: one nats-py process receiving from another (no stream)",
             (NATS,), run_ceiling, ("rate", "publish_rate")),
    Scenario("failover", "failover: SIGKILL of the partition/stream leader, until an ack-ALL publish succeeds",
             (BASCULE, JETSTREAM), run_failover, ("failover_median_s", "failover_worst_s")),
    Scenario("scale", "scale: bascule capture rate over partitions",
             (BASCULE,), run_scale, ()),
    Scenario("restart", "memory and restart of one node holding N messages",
             (BASCULE, JETSTREAM), run_restart,
             ("rss_start_mib", "rss_idle_100_mib", "idle_100_cpu_pct", "capture_rate", "rss_capture_peak_mib",
              "rss_after_capture_mib", "read_rate", "rss_read_peak_mib", "rss_after_read_mib",
              "restart_graceful_s", "restart_kill_s", "restart_rss_mib")),
)}
GROUPS = {"capture": ["capture_r1", "capture_r3"], "acked": ["acked_r3"], "consume": ["consume_r3"],
          "durable": ["durable_r1"], "memory": ["restart"]}

# units for the metrics only some scenarios have
METRICS.update({"first_ms": ("ms", False)})


def _metric_info(name: str) -> tuple[str, bool]:
    if name in METRICS:
        return METRICS[name]
    if name.endswith("_rate"):
        return "msg/s", True
    if name.endswith("_ms"):
        return "ms", False
    if name.endswith("cpu_us_per_msg"):
        return "CPU us/msg", False
    return "", True


# ---- the run -------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bascule bench",
        description="bascule against JetStream on loopback: every server and load process started here.",
    )
    parser.add_argument("--scenario", "-s", action="append", default=[],
                        help=f"scenario to run (repeatable, comma-separated): {', '.join(SCENARIOS)}; "
                             f"groups: {', '.join(GROUPS)}; default all")
    parser.add_argument("--system", action="append", default=[], choices=[BASCULE, JETSTREAM],
                        help="run only against this system (repeatable; default both)")
    parser.add_argument("--trials", type=int, default=None, help="trials per scenario and system (default 3; 1 with --quick)")
    parser.add_argument("--quick", action="store_true", help="short smoke run: small counts, 1 trial")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH ('-' = stdout)")
    parser.add_argument("--markdown", metavar="PATH", help="also write the table as Markdown to PATH")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument("--size", type=int, default=100, help="message payload bytes (default 100)")
    parser.add_argument("--window", type=int, default=1000, help="acked publishes in flight (default 1000)")
    parser.add_argument("--publishers", type=int, default=1, help="publisher processes for capture (default 1)")
    for key in ("capture", "acked", "consume", "durable", "ceiling", "scale", "restart"):
        parser.add_argument(f"--{key}-messages", type=int, metavar="N",
                            help=f"messages per {key} trial (default {FULL_COUNTS[key]:,}; "
                                 f"--quick {QUICK_COUNTS[key]:,})")
    parser.add_argument("--kills", type=int, help=f"leader kills per failover trial (default {FULL_COUNTS['kills']}; "
                                                  f"--quick {QUICK_COUNTS['kills']})")
    parser.add_argument("--failover-timeout", type=float, default=30.0, help="seconds to wait for recovery")
    parser.add_argument("--scale-partitions", default="1,10,100", help="partition counts (default 1,10,100)")
    parser.add_argument("--scale-replicas", type=int, default=3, help="replication factor in scale (default 3)")
    parser.add_argument("--scale-nodes", type=int, default=None, help="nodes in scale (default max(3, replicas))")
    parser.add_argument("--scale-publishers", type=int, default=2, help="publisher processes in scale (default 2)")
    parser.add_argument("--idle-partitions", type=int, default=100, help="idle partitions for the RSS figure")
    parser.add_argument("--stall-timeout", type=float, default=30.0,
                        help="fail a trial when nothing progresses for this many seconds (default 30)")
    parser.add_argument("--profile", metavar="DIR",
                        help="py-spy the bascule nodes in one extra, unmeasured trial of the profiled scenarios")
    parser.add_argument("--profile-rate", type=int, default=100, help="py-spy samples per second (default 100)")
    parser.add_argument("--profile-scenarios", default="",
                        help="comma-separated scenarios to profile (default: "
                             + ", ".join(s.name for s in SCENARIOS.values() if s.profile) + ")")
    parser.add_argument("--profile-native", action="store_true",
                        help="py-spy --native: show C/Cython frames too (grpc's, protobuf's)")
    parser.add_argument("--workdir", help="where the temporary directories go (default the system's)")
    parser.add_argument("--keep", action="store_true", help="keep data dirs and logs (their path is printed)")
    parser.add_argument("--bascule-log-level", default="info", help="bascule nodes' --level (default info)")
    return parser


def select_scenarios(names: list[str]) -> list[str]:
    if not names:
        return list(SCENARIOS)
    chosen: list[str] = []
    for item in names:
        for name in filter(None, (x.strip() for x in item.split(","))):
            expanded = GROUPS.get(name, [name])
            for one in expanded:
                if one not in SCENARIOS:
                    raise SystemExit(f"bascule bench: unknown scenario {one!r}; known: {', '.join(SCENARIOS)}")
                if one not in chosen:
                    chosen.append(one)
    return chosen


def summarize(report: dict[str, Any]) -> None:
    """Medians per metric and system, and the bascule/JetStream ratio, into report['scenarios'][*]['summary']."""
    for name, entry in report["scenarios"].items():
        scenario = SCENARIOS[name]
        rows = list(scenario.rows) or sorted({k for t in entry["trials"].get(BASCULE, []) for k in t
                                              if k.endswith(("_rate", "_cpu_us_per_msg"))},
                                             key=lambda k: (int(re.sub(r"\D.*", "", k[1:]) or 0), "rate" not in k))
        summary = []
        for row in rows:
            label, b_metric, j_metric = row if isinstance(row, tuple) else (row, row, row)
            medians, spreads = {}, {}
            for system, trials in entry["trials"].items():
                counted = [t for t in trials if not t.get("profiled")]
                metric = j_metric if system == JETSTREAM else b_metric
                values = [t[metric] for t in counted if isinstance(t.get(metric), (int, float))]
                medians[system] = _median(values)
                if len(values) > 1 and medians[system]:
                    spreads[system] = (max(values) - min(values)) / abs(medians[system])
            if all(v is None for v in medians.values()):
                continue
            b, j = medians.get(BASCULE), medians.get(JETSTREAM)
            unit, higher = _metric_info(b_metric)
            summary.append({"metric": label, "bascule_metric": b_metric, "jetstream_metric": j_metric,
                            "unit": unit, "higher_is_better": higher, "medians": medians,
                            "spread": spreads,
                            "ratio": (b / j) if b is not None and j else None})
        entry["summary"] = summary


def format_table(report: dict[str, Any]) -> str:
    out = []
    header = (f"{'scenario':<11} {'metric':<22} {'unit':<11} {'bascule':>17} {'JetStream':>17} {'NATS':>17} "
              f"{'b/JS':>7}")
    out.append(header)
    out.append("-" * len(header))
    for name, entry in report["scenarios"].items():
        errors = sum(1 for trials in entry["trials"].values() for t in trials if "error" in t)
        for row in entry.get("summary", []):
            med, spread = row["medians"], row.get("spread", {})
            cells = []
            for s in (BASCULE, JETSTREAM, NATS):
                cell = _fmt(med.get(s)) if med.get(s) is not None else "-"
                if s in spread:
                    cell += f" ±{min(999, round(50 * spread[s]))}%"
                cells.append(cell)
            ratio = f"{row['ratio']:.2f}" if row["ratio"] is not None else "-"
            better = "" if row["ratio"] is None else ("^" if row["higher_is_better"] else "v")
            out.append(f"{name:<11} {row['metric']:<22} {row['unit']:<11} {cells[0]:>17} {cells[1]:>17} "
                       f"{cells[2]:>17} {ratio:>6}{better}")
        if errors:
            out.append(f"{name:<11} ({errors} failed trial(s): see the log or --json)")
    out.append("medians over the counted trials, ±half the range (max-min) as % of the median; "
               "b/JS = bascule / JetStream (^ higher is better, v lower is better)")
    return "\n".join(out)


def format_markdown(report: dict[str, Any]) -> str:
    """The same table as format_table, as Markdown (for benchmarks/RESULTS.md)."""
    out = ["| scenario | metric | unit | bascule | JetStream | NATS | bascule/JetStream |",
           "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for name, entry in report["scenarios"].items():
        for row in entry.get("summary", []):
            med, spread = row["medians"], row.get("spread", {})
            cells = []
            for s in (BASCULE, JETSTREAM, NATS):
                cell = _fmt(med.get(s)) if med.get(s) is not None else ""
                if s in spread:
                    cell += f" ±{min(999, round(50 * spread[s]))}%"
                cells.append(cell)
            ratio = "" if row["ratio"] is None else f"{row['ratio']:.2f} {'↑' if row['higher_is_better'] else '↓'}"
            out.append(f"| {name} | {row['metric']} | {row['unit']} | {' | '.join(cells)} | {ratio} |")
        errors = [t["error"] for trials in entry["trials"].values() for t in trials if "error" in t]
        if errors:
            out.append(f"| {name} | {len(errors)} failed trial(s) | | | | | |")
    return "\n".join(out) + "\n"


async def run(args: argparse.Namespace) -> dict[str, Any]:
    counts = dict(QUICK_COUNTS if args.quick else FULL_COUNTS)
    for key in ("capture", "acked", "consume", "durable", "ceiling", "scale", "restart"):
        value = getattr(args, f"{key}_messages")
        if value is not None:
            counts[key] = value
    if args.kills is not None:
        counts["kills"] = args.kills
    systems = args.system or [BASCULE, JETSTREAM]
    names = select_scenarios(args.scenario)
    base = Path(tempfile.mkdtemp(prefix="bascule-bench-", dir=args.workdir))
    profiler = Profiler(Path(args.profile).resolve(), args.profile_rate, args.profile_native) if args.profile else None
    report: dict[str, Any] = {
        "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "machine": machine_info(),
        "versions": versions(),
        "settings": {"trials": args.trials, "quick": args.quick, "size": args.size, "window": args.window,
                     "publishers": args.publishers, "counts": counts,
                     "scale_partitions": args.scale_partitions, "scale_replicas": args.scale_replicas},
        "scenarios": {},
        "workdir": str(base),
    }
    _log(f"bascule bench: scenarios {', '.join(names)}; {args.trials} trial(s); work dir {base}")
    try:
        for name in names:
            scenario = SCENARIOS[name]
            profiled = name in args.profile_scenarios if args.profile_scenarios else scenario.profile
            ctx = Context(args, base / name, counts, profiler if profiled else None)
            ctx.dir.mkdir(parents=True, exist_ok=True)
            entry: dict[str, Any] = {"title": scenario.title, "trials": {}, "loadavg_before": loadavg()}
            report["scenarios"][name] = entry
            for system in scenario.systems:
                if system != NATS and system not in systems:
                    continue
                started = _now()
                _log(f"== {name} / {system}: {scenario.title}")
                try:
                    entry["trials"][system] = await scenario.run(ctx, system)
                except (BenchError, OSError, RuntimeError, asyncio.TimeoutError) as exc:
                    _log(f"{name} / {system} FAILED: {exc}")
                    entry["trials"][system] = [{"error": f"setup: {exc}"}]
                except Exception as exc:  # noqa: BLE001 - one broken scenario must not stop the others
                    _log(f"{name} / {system} FAILED:\n{traceback.format_exc()}")
                    entry["trials"][system] = [{"error": f"{type(exc).__name__}: {exc}"}]
                entry.setdefault("wall_s", {})[system] = round(_now() - started, 1)
            if not args.keep:
                shutil.rmtree(ctx.dir, ignore_errors=True)
    finally:
        report["machine"]["loadavg_at_end"] = loadavg()
        if profiler is not None:
            report["profiles"] = profiler.summaries
        if args.keep:
            _log(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    summarize(report)
    return report


def main(argv: list[str]) -> int:
    if argv and argv[0] == "_worker":
        return worker_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(argv)
    if args.list:
        for scenario in SCENARIOS.values():
            print(f"{scenario.name:<11} {scenario.title}")
        for group, members in GROUPS.items():
            print(f"{group:<11} = {', '.join(members)}")
        return 0
    if args.trials is None:
        args.trials = 1 if args.quick else 3
    args.scale_partitions = [int(x) for x in str(args.scale_partitions).split(",") if x.strip()]
    args.profile_scenarios = select_scenarios([args.profile_scenarios]) if args.profile_scenarios else []

    def terminate(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        report = asyncio.run(run(args))
    except KeyboardInterrupt:
        _log("interrupted: servers and workers stopped")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    out = sys.stderr if args.json == "-" else sys.stdout  # keep stdout pure JSON with --json -
    print(f"machine: {report['machine']['nproc']} x {report['machine']['cpu_model']}; load average "
          f"{report['machine']['loadavg_at_start']} -> {report['machine']['loadavg_at_end']}", file=out)
    print(format_table(report), file=out)
    if report.get("profiles"):
        print(f"\nprofiles (raw collapsed stacks and full summaries in {args.profile}):", file=out)
        for label, summary in report["profiles"].items():
            print(file=out)
            print(format_profile(label, {**summary, "self": summary["self"][:10],
                                         "inclusive": summary["inclusive"][:10]}), end="", file=out)
    if args.markdown:
        Path(args.markdown).write_text(format_markdown(report))
    if args.json:
        text = json.dumps(report, indent=2, default=str)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    failed = any("error" in t for e in report["scenarios"].values() for ts in e["trials"].values() for t in ts)
    return 1 if failed else 0


# ---- worker side ---------------------------------------------------------------------------------


def _emit(tag: str, payload: Any = None) -> None:
    sys.stdout.write(tag + ("" if payload is None else " " + json.dumps(payload)) + "\n")
    sys.stdout.flush()


async def _wait_go() -> float:
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    if line.strip() != "GO":
        raise SystemExit(3)  # the harness went away
    return _now()


def _latencies(values: list[float]) -> dict[str, float]:
    values.sort()
    return {"p50_ms": 1000 * _percentile(values, 0.50), "p99_ms": 1000 * _percentile(values, 0.99),
            "max_ms": 1000 * (values[-1] if values else float("nan"))}


async def _nats_connect(url: str) -> Any:
    import nats

    return await nats.connect(url, max_reconnect_attempts=-1, pending_size=64 * 1024 * 1024)


async def worker_nats_pub(spec: dict[str, Any]) -> dict[str, Any]:
    """Plain core-NATS publishes, round-robin over the subjects, then a flush."""
    nc = await _nats_connect(spec["url"])
    subjects, count = spec["subjects"], spec["count"]
    payload = b"x" * spec["size"]
    _emit("READY")
    start = await _wait_go()
    publish = nc.publish
    if len(subjects) == 1:
        subject = subjects[0]
        for _ in range(count):
            await publish(subject, payload)
    else:
        k = len(subjects)
        for i in range(count):
            await publish(subjects[i % k], payload)
    await flush(nc, timeout=600)
    end = _now()
    await nc.close()
    return {"start": start, "end": end, "count": count}


class Reception:
    """Counts received messages: when the first came, and `done` once `count` have."""

    def __init__(self, count: int) -> None:
        self.count, self.received, self.first, self.end = count, 0, 0.0, 0.0
        self.done = asyncio.get_running_loop().create_future()

    def got_one(self) -> bool:
        """One more message; True once the count is reached."""
        self.received += 1
        if self.received == 1:
            self.first = _now()
        if self.received >= self.count and not self.done.done():
            self.end = _now()
            self.done.set_result(None)
        return self.done.done()

    async def on_message(self, msg: Any) -> None:
        self.got_one()

    def result(self) -> dict[str, Any]:
        return {"first": self.first, "end": self.end, "received": self.received}


async def worker_nats_sub(spec: dict[str, Any]) -> dict[str, Any]:
    nc = await _nats_connect(spec["url"])
    count = spec["count"]
    reception = Reception(count)
    await nc.subscribe(spec["subject"], cb=reception.on_message, pending_msgs_limit=count + 10,
                       pending_bytes_limit=count * 512 + (1 << 20))
    await flush(nc)
    _emit("READY")
    await _wait_go()
    await reception.done
    await nc.close()
    return reception.result()


async def worker_bascule_acked_grpc(spec: dict[str, Any]) -> dict[str, Any]:
    """PublishAsync with ack ALL, at most `window` requests unacknowledged."""
    import grpc

    from bascule.wire.pb import api_pb2, api_pb2_grpc

    count, window = spec["count"], spec["window"]
    payload = b"x" * spec["size"]
    channel = grpc.aio.insecure_channel(spec["address"])
    stub = api_pb2_grpc.APIStub(channel)
    await stub.FetchMetadata(api_pb2.FetchMetadataRequest(), timeout=10)
    sent = [0.0] * count
    latencies: list[float] = []
    slots = asyncio.Semaphore(window)
    errors, first_error = 0, None
    _emit("READY")
    start = await _wait_go()

    async def requests() -> AsyncIterator[api_pb2.PublishRequest]:
        for i in range(count):
            await slots.acquire()
            sent[i] = _now()
            yield api_pb2.PublishRequest(stream=spec["stream"], partition=spec["partition"], value=payload,
                                         ackPolicy=api_pb2.AckPolicy.ALL, correlationId=str(i))

    call = stub.PublishAsync(requests())
    done = 0
    async for response in call:
        now = _now()
        if response.HasField("asyncError"):
            errors += 1
            first_error = first_error or response.asyncError.message
        else:
            latencies.append(now - sent[int(response.correlationId)])
        slots.release()
        done += 1
        if done == count:
            break
    end = _now()
    call.cancel()
    await channel.close()
    return {"start": start, "end": end, "acked": len(latencies), "errors": errors, "first_error": first_error,
            **_latencies(latencies)}


async def worker_bascule_acked_nats(spec: dict[str, Any]) -> dict[str, Any]:
    """Liftbridge publish envelopes on the partition subject, ack ALL to an inbox, `window` in flight."""
    from bascule.wire import envelope
    from bascule.wire.pb import api_pb2

    nc = await _nats_connect(spec["url"])
    count, window = spec["count"], spec["window"]
    payload = b"x" * spec["size"]
    prefix = f"_INBOX.benchack.{uuid.uuid4().hex[:12]}."
    sent = [0.0] * count
    latencies: list[float] = []
    slots = asyncio.Semaphore(window)
    finished = asyncio.get_running_loop().create_future()
    state = {"acked": 0, "bad": 0}
    cut = len(prefix)

    async def on_ack(msg: Any) -> None:
        now = _now()
        index = int(msg.subject[cut:])
        if state["acked"] == 0:  # check one ack in full
            ack = envelope.decode_message(msg.data, envelope.MsgType.ACK, api_pb2.Ack)
            if ack.correlationId != str(index):
                state["bad"] += 1
        latencies.append(now - sent[index])
        state["acked"] += 1
        slots.release()
        if state["acked"] == count and not finished.done():
            finished.set_result(now)

    await nc.subscribe(prefix + "*", cb=on_ack, pending_msgs_limit=count + 10)
    await flush(nc)
    _emit("READY")
    start = await _wait_go()
    subject = spec["subject"]
    header = envelope.header(envelope.MsgType.PUBLISH)
    for i in range(count):
        await slots.acquire()
        message = api_pb2.Message(value=payload, ackInbox=f"{prefix}{i}", correlationId=str(i),
                                  ackPolicy=api_pb2.AckPolicy.ALL)
        sent[i] = _now()
        await nc.publish(subject, header + message.SerializeToString())
    end = await finished
    await nc.close()
    return {"start": start, "end": end, "acked": state["acked"], "errors": state["bad"],
            "first_error": "ack with a wrong correlation id" if state["bad"] else None, **_latencies(latencies)}


async def worker_js_acked(spec: dict[str, Any]) -> dict[str, Any]:
    """js.publish_async with at most `window` publishes pending."""
    nc = await _nats_connect(spec["url"])
    count, window = spec["count"], spec["window"]
    js = nc.jetstream(publish_async_max_pending=window)
    payload = b"x" * spec["size"]
    latencies: list[float] = []
    state: dict[str, Any] = {"errors": 0, "first_error": None}
    finished = asyncio.get_running_loop().create_future()
    done_count = [0]
    _emit("READY")
    start = await _wait_go()
    subject = spec["subject"]

    def on_done(sent_at: float, future: asyncio.Future[Any]) -> None:
        now = _now()
        if future.cancelled() or future.exception() is not None:
            state["errors"] += 1
            state["first_error"] = state["first_error"] or repr(future.exception())
        else:
            latencies.append(now - sent_at)
        done_count[0] += 1
        if done_count[0] == count and not finished.done():
            finished.set_result(now)

    for _ in range(count):
        sent_at = _now()
        future = await js.publish_async(subject, payload)
        future.add_done_callback(lambda f, t=sent_at: on_done(t, f))
    end = await finished
    await nc.close()
    return {"start": start, "end": end, "acked": len(latencies), **state, **_latencies(latencies)}


async def worker_bascule_consume(spec: dict[str, Any]) -> dict[str, Any]:
    from bascule.client import Client

    reception = Reception(spec["count"])
    async with Client(spec["address"]) as client:
        await client.fetch_metadata()
        _emit("READY")
        start = await _wait_go()
        async for _ in client.subscribe(spec["stream"], spec["partition"], start="earliest"):
            if reception.got_one():
                break
    return {"start": start, **reception.result()}


async def worker_bascule_consume_grpc(spec: dict[str, Any]) -> dict[str, Any]:
    """Liftbridge's Subscribe as any Liftbridge client calls it: one gRPC message per record."""
    import grpc

    from bascule.wire.pb import api_pb2, api_pb2_grpc

    reception = Reception(spec["count"])
    channel = grpc.aio.insecure_channel(spec["address"])
    stub = api_pb2_grpc.APIStub(channel)
    await stub.FetchMetadata(api_pb2.FetchMetadataRequest(), timeout=10)
    _emit("READY")
    start = await _wait_go()
    request = api_pb2.SubscribeRequest(stream=spec["stream"], partition=spec["partition"],
                                       startPosition=api_pb2.StartPosition.EARLIEST)
    call = stub.Subscribe(request)
    handshake = True  # Liftbridge's first message is an empty one
    async for _ in call:
        if handshake:
            handshake = False
        elif reception.got_one():
            break
    call.cancel()
    await channel.close()
    return {"start": start, **reception.result()}


async def worker_grpc_floor_server(spec: dict[str, Any]) -> dict[str, Any]:
    """A Liftbridge API server whose Subscribe streams one prebuilt Message `count` times and whose
    PublishAsync acks each request at once."""
    import grpc

    from bascule.wire.pb import api_pb2, api_pb2_grpc

    message = api_pb2.Message(offset=123456, value=b"x" * spec["size"], timestamp=time.time_ns(), stream="floor",
                              subject=f"{STREAM_SUBJECT_PREFIX}.floor", headers={})

    class FloorAPI(api_pb2_grpc.APIServicer):
        async def FetchMetadata(self, request: Any, context: Any) -> Any:
            return api_pb2.FetchMetadataResponse()

        async def Subscribe(self, request: Any, context: Any) -> AsyncIterator[Any]:
            yield api_pb2.Message()
            for _ in range(spec["count"]):
                yield message

        async def PublishAsync(self, requests: Any, context: Any) -> AsyncIterator[Any]:
            async for request in requests:
                ack = api_pb2.Ack(stream=request.stream, offset=1, correlationId=request.correlationId,
                                  ackPolicy=request.ackPolicy)
                yield api_pb2.PublishResponse(ack=ack, correlationId=request.correlationId)

    server = grpc.aio.server()
    api_pb2_grpc.add_APIServicer_to_server(FloorAPI(), server)
    server.add_insecure_port(f"127.0.0.1:{spec['port']}")
    await server.start()
    _emit("READY")
    await _wait_go()
    await server.wait_for_termination()
    return {}


async def worker_js_consume(spec: dict[str, Any]) -> dict[str, Any]:
    nc = await _nats_connect(spec["url"])
    js = nc.jetstream()
    count = spec["count"]
    reception = Reception(count)
    await js.account_info()
    _emit("READY")
    start = await _wait_go()
    await js.subscribe(spec["subject"], cb=reception.on_message, ordered_consumer=True,
                       pending_msgs_limit=count + 10, pending_bytes_limit=count * 1024 + (1 << 20))
    await reception.done
    await nc.close()
    return {"start": start, **reception.result()}


WORKERS: dict[str, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]] = {
    "nats_pub": worker_nats_pub,
    "nats_sub": worker_nats_sub,
    "bascule_acked_grpc": worker_bascule_acked_grpc,
    "bascule_acked_nats": worker_bascule_acked_nats,
    "js_acked": worker_js_acked,
    "bascule_consume": worker_bascule_consume,
    "bascule_consume_grpc": worker_bascule_consume_grpc,
    "grpc_floor_server": worker_grpc_floor_server,
    "js_consume": worker_js_consume,
}


def worker_main(argv: list[str]) -> int:
    kind, spec = argv[0], json.loads(argv[1])
    try:
        import uvloop  # noqa: F401 - optional: the harness measures with it when installed

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    try:
        result = runner(WORKERS[kind](spec))
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - the harness gets one line, the log the traceback
        traceback.print_exc()
        _emit("ERROR", f"{type(exc).__name__}: {exc}")
        return 1
    _emit("RESULT", result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
