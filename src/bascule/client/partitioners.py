"""Which partition a published message goes to, as go-liftbridge decides it.

A partitioner is any callable ``(stream, key, value, partition_count) -> partition``. go-liftbridge's
key partitioner hashes the key with CRC-32 (IEEE; its ``hasher = crc32.ChecksumIEEE``, a missing key
hashing as empty) modulo the partition count, so Go and Python writers of the same keys agree.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Iterator
from typing import Protocol


class Partitioner(Protocol):
    def __call__(self, stream: str, key: bytes | None, value: bytes, partition_count: int) -> int: ...


def partition_by_key(stream: str, key: bytes | None, value: bytes, partition_count: int) -> int:
    """go-liftbridge's PartitionByKey: CRC-32 (IEEE) of the key mod the partition count."""
    if partition_count <= 0:
        return 0
    return zlib.crc32(key or b"") % partition_count


class RoundRobin:
    """go-liftbridge's PartitionByRoundRobin: each stream's messages go to its partitions in turn."""

    def __init__(self) -> None:
        self._counters: dict[str, Iterator[int]] = {}

    def __call__(self, stream: str, key: bytes | None, value: bytes, partition_count: int) -> int:
        if partition_count <= 0:
            return 0
        counter = self._counters.setdefault(stream, itertools.count())
        return next(counter) % partition_count


def choose_partition(
    partitioner: Partitioner, stream: str, key: bytes | None, value: bytes, partition_count: int
) -> int:
    """The partitioner's choice, checked: a partition the stream has."""
    partition = partitioner(stream, key, value, partition_count)
    if not 0 <= partition < max(partition_count, 1):
        raise ValueError(f"partitioner chose partition {partition} of a stream with {partition_count}")
    return partition
