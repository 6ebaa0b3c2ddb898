"""What every part of the harness shares: the systems' names, the clock, the log, the error a trial
fails with, and the context a scenario runs in."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from benchmarks.profiling import Profiler

REPO_ROOT = Path(__file__).resolve().parents[1]
BASCULE, JETSTREAM, NATS = "bascule", "jetstream", "nats"
STREAM_SUBJECT_PREFIX = "bench"
POLL_INTERVAL = 0.01
READY_TIMEOUT = 60.0


class BenchError(RuntimeError):
    """A trial could not produce its figure: a timeout, a lost message, a process that died."""


def now() -> float:
    # CLOCK_MONOTONIC is system-wide on Linux: timestamps from the workers compare with ours.
    return time.monotonic()


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class Context:
    """One scenario's run: the command's arguments, its work dir, the message counts, the profiler."""

    args: argparse.Namespace
    dir: Path
    counts: dict[str, int]
    profiler: Profiler | None = None
    profiling: str | None = None  # the label of the profiled trial under way

    @property
    def payload_size(self) -> int:
        return self.args.size
