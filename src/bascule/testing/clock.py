"""A process's wall clock that a test can step while it runs: libfaketime (Debian's faketime package)
preloaded into the process, reading its offset from a file.

CLOCK_REALTIME is shifted by the offset in the file, which libfaketime reads again within a second or
two of a change, as an NTP step or a VM resume shifts a running machine's clock; CLOCK_MONOTONIC is
left alone, as a step leaves it.

    clock = SteppedClock(tmp / "node-2-clock")
    node.extra_env.update(clock.env())     # before the node starts
    clock.step(-3600)                       # an hour back, from now on
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

__all__ = ["LIBFAKETIME", "SteppedClock", "stepped_clock_unavailable_reason"]

LIBFAKETIME = next(iter(sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))), None)

# libfaketime 0.9.10 breaks Python 3.11's time.sleep when it leaves CLOCK_MONOTONIC alone: it shifts
# the absolute CLOCK_MONOTONIC deadline of clock_nanosleep by the wall-clock offset (EINVAL).
# pysyncobj's tick thread sleeps with it; waiting on an event takes another path.
SLEEP_SHIM = '''import threading, time


def _sleep(seconds):
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    threading.Event().wait(seconds)


time.sleep = _sleep
'''


def stepped_clock_unavailable_reason() -> str | None:
    return None if LIBFAKETIME is not None else "no libfaketime (Debian's faketime package: make faketime)"


class SteppedClock:
    """The offset file and the sleep shim of one process's clock, kept in ``directory``."""

    def __init__(self, directory: str | os.PathLike[str], offset_s: int = 0) -> None:
        self.directory = Path(directory)
        self.offset_file = self.directory / "clock-offset"
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "sitecustomize.py").write_text(SLEEP_SHIM)
        self.offset_s = 0
        self.step(offset_s)

    def env(self) -> dict[str, str]:
        """What the process needs in its environment (it must start with it)."""
        if LIBFAKETIME is None:
            raise RuntimeError(stepped_clock_unavailable_reason())
        python_path = os.pathsep.join(p for p in (str(self.directory), os.environ.get("PYTHONPATH", "")) if p)
        return {
            "LD_PRELOAD": LIBFAKETIME,
            "FAKETIME_TIMESTAMP_FILE": str(self.offset_file),
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "FAKETIME_CACHE_DURATION": "1",  # the file is read again within a second or two of a step
            "PYTHONPATH": python_path,
        }

    def step(self, offset_s: int) -> None:
        """From now on the process's wall clock reads ``offset_s`` seconds from the real one."""
        self.offset_file.write_text(f"{offset_s:+d}\n")
        self.offset_s = offset_s
