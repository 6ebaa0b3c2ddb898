"""What the servers cost, read from /proc (psutil is not a dependency): RSS, CPU time, load average."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def proc_status(pid: int | None) -> dict[str, int]:
    """VmRSS and VmHWM of `pid` in KiB."""
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


def cpu_seconds(pids: Iterable[int | None]) -> float:
    """User + system CPU time of the live processes `pids` (threads included)."""
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
    return total / CLOCK_TICKS


class CpuMeter:
    """CPU seconds spent by a set of processes between start() and stop()."""

    def __init__(self, pids: Iterable[int | None]) -> None:
        self.pids = [p for p in pids if p is not None]
        self._start = 0.0
        self._each: list[float] = []
        self.seconds = 0.0
        self.each: dict[int, float] = {}  # CPU seconds of each process, after stop()

    def start(self) -> CpuMeter:
        self._each = [cpu_seconds([pid]) for pid in self.pids]
        self._start = sum(self._each)
        return self

    def stop(self) -> float:
        each = [cpu_seconds([pid]) for pid in self.pids]
        self.each = {pid: now - then for pid, now, then in zip(self.pids, each, self._each, strict=True)}
        self.seconds = sum(each) - self._start
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
        self.sample()
        self._task = asyncio.create_task(self._sample_forever())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.sample()

    async def _sample_forever(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.interval)


async def idle_cpu_pct(pids: list[int | None], seconds: float = 5.0) -> float:
    """The CPU `pids` use over `seconds`, as a percentage of one core."""
    cpu = CpuMeter(pids).start()
    await asyncio.sleep(seconds)
    return 100.0 * cpu.stop() / seconds


def loadavg() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []
