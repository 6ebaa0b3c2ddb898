"""How long the logs' syncs spend in fsync: one fixed-bucket histogram for every log of the process,
which the metrics endpoint reads (the log package knows nothing of Prometheus). Syncs run in threads
of their own, so it takes a lock: once per sync, never per message."""

from __future__ import annotations

import threading
from bisect import bisect_left

# From an SSD with a write cache (tens of microseconds) to a disk that is failing (seconds).
FSYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class DurationHistogram:
    """Durations in seconds, counted in the first bucket whose upper bound they do not exceed (or
    beyond the last bound), with their sum."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self._counts = [0] * (len(bounds) + 1)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        index = bisect_left(self.bounds, seconds)
        with self._lock:
            self._counts[index] += 1
            self._sum += seconds

    def snapshot(self) -> tuple[list[int], float]:
        """(the count of each bucket, the one beyond every bound last; the sum of the durations)."""
        with self._lock:
            return list(self._counts), self._sum


fsync_seconds = DurationHistogram(FSYNC_BUCKETS)
