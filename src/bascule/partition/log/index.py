"""Sparse offset index of one segment, in memory; segment.py reads and writes its file.

The file is a run of big-endian (relative offset uint32, position uint32) points, one for the
first entry after every ``interval_bytes`` of log. A lookup lands on the nearest point at or
before the wanted offset and the segment walks entry headers from there.
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterable
from itertools import islice
from operator import lt

POINT_SIZE = 8  # relative offset and position, big-endian uint32 each

if array("I").itemsize != 4:  # pragma: no cover - every supported platform has 32-bit unsigned int
    raise ImportError("bascule's index needs a 4-byte array('I')")


class InvalidIndex(ValueError):
    """Index bytes that cannot describe a segment: points out of order."""


class SparseIndex:
    """(relative offset, position) points, both strictly increasing."""

    __slots__ = ("interval_bytes", "_relative_offsets", "_positions", "_unindexed_bytes")

    def __init__(self, interval_bytes: int) -> None:
        self.interval_bytes = interval_bytes
        self._relative_offsets = array("I")
        self._positions = array("I")
        # Bytes of entries appended since the last point; a new point is due past the interval.
        self._unindexed_bytes = 0

    @classmethod
    def decode(cls, data: bytes, interval_bytes: int, segment_size: int) -> SparseIndex:
        """Parse index file bytes; raises InvalidIndex unless the points are in order.

        A partial trailing point (a write cut short) is ignored.
        """
        whole = len(data) - len(data) % POINT_SIZE
        numbers = array("I")
        numbers.frombytes(data[:whole])
        if sys.byteorder == "little":
            numbers.byteswap()
        index = cls(interval_bytes)
        index._relative_offsets = numbers[0::2]
        index._positions = numbers[1::2]
        if not (
            _strictly_increasing(index._relative_offsets) and _strictly_increasing(index._positions)
        ):
            raise InvalidIndex("index points are not in increasing order")
        index._unindexed_bytes = segment_size - (index._positions[-1] if index._positions else 0)
        return index

    def encode(self, first_point: int = 0) -> bytes:
        """File bytes of the points from ``first_point`` on."""
        numbers = array("I", bytes(POINT_SIZE * (len(self._positions) - first_point)))
        numbers[0::2] = self._relative_offsets[first_point:]
        numbers[1::2] = self._positions[first_point:]
        if sys.byteorder == "little":
            numbers.byteswap()
        return numbers.tobytes()

    def add_entry(self, relative_offset: int, start: int, end: int) -> None:
        """Account for an entry appended at [start, end), adding a point if one is due."""
        if self._unindexed_bytes >= self.interval_bytes:
            self._relative_offsets.append(relative_offset)
            self._positions.append(start)
            self._unindexed_bytes = 0
        self._unindexed_bytes += end - start

    def add_scanned_entries(
        self,
        entries: Iterable[tuple[int, int, int, int, int]],
        base_offset: int,
        base_position: int,
    ) -> None:
        """add_entry for each entry as wire.entry.scan yields it, the offsets and positions
        shifted by the segment's base offset and the position the bytes were written at."""
        interval = self.interval_bytes
        unindexed = self._unindexed_bytes
        for offset, _, _, start, end in entries:
            if unindexed >= interval:
                self._relative_offsets.append(offset - base_offset)
                self._positions.append(base_position + start)
                unindexed = 0
            unindexed += end - start
        self._unindexed_bytes = unindexed

    def floor(self, relative_offset: int) -> tuple[int, int]:
        """The last point at or before ``relative_offset``; (0, 0), the segment start, if none."""
        index = bisect_right(self._relative_offsets, relative_offset) - 1
        if index < 0:
            return 0, 0
        return self._relative_offsets[index], self._positions[index]

    def floor_by(self, is_before: Callable[[int, int], bool]) -> tuple[int, int]:
        """The last point for which ``is_before(relative_offset, position)`` holds, (0, 0) if none.

        ``is_before`` must be true for a prefix of the points (e.g. "timestamp there < t").
        """
        low, high = 0, len(self._positions)
        while low < high:
            middle = (low + high) // 2
            if is_before(self._relative_offsets[middle], self._positions[middle]):
                low = middle + 1
            else:
                high = middle
        if low == 0:
            return 0, 0
        return self._relative_offsets[low - 1], self._positions[low - 1]

    def last_point(self) -> tuple[int, int]:
        """The last point, or (0, 0) for an index without points."""
        if not self._positions:
            return 0, 0
        return self._relative_offsets[-1], self._positions[-1]

    def drop_last_point(self) -> None:
        del self._relative_offsets[-1]
        del self._positions[-1]

    def restart_at_last_point(self) -> tuple[int, int]:
        """The last point (or the segment start), for re-adding the entries from there on."""
        self._unindexed_bytes = 0
        return self.last_point()

    def truncate(self, relative_offset: int, segment_size: int) -> None:
        """Forget points at or after ``relative_offset``, the segment now ``segment_size`` long."""
        keep = bisect_right(self._relative_offsets, relative_offset - 1)
        del self._relative_offsets[keep:]
        del self._positions[keep:]
        self._unindexed_bytes = segment_size - (self._positions[-1] if self._positions else 0)

    def truncate_beyond(self, segment_size: int) -> int:
        """Forget points at or past ``segment_size``; returns how many were dropped."""
        keep = bisect_right(self._positions, segment_size - 1)
        dropped = len(self._positions) - keep
        del self._relative_offsets[keep:]
        del self._positions[keep:]
        return dropped

    def __len__(self) -> int:
        return len(self._positions)


def _strictly_increasing(numbers: array) -> bool:
    return all(map(lt, numbers, islice(numbers, 1, None)))
