"""Which partition each written row goes to, as pure rules: the row's own partition (checked), or
the partitioner's: Liftbridge's PartitionByKey, or round robin."""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence

from bascule.spark.errors import BasculeSparkError


def key_partition(key: bytes | None, count: int) -> int:
    """Liftbridge's PartitionByKey: CRC-32 (IEEE) of the key, modulo the partition count; no key
    hashes as the empty key."""
    return zlib.crc32(key or b"") % count if count > 0 else 0


class Partitioner:
    """The partitioner of one task (`kind` "key" or "roundrobin"); round robin goes on from batch
    to batch."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._next_round_robin = 0

    def group(
        self,
        streams: Sequence[str],
        partitions: Sequence[int | None],
        keys: Sequence[bytes | None],
        counts: Mapping[str, int],
    ) -> dict[tuple[str, int], list[int]]:
        """The rows' indexes, in row order, by the (stream, partition) they go to; `counts` holds
        each stream's number of partitions."""
        groups: dict[tuple[str, int], list[int]] = {}
        for index, stream in enumerate(streams):
            partition = self._partition(stream, partitions[index], keys[index], counts[stream])
            groups.setdefault((stream, partition), []).append(index)
        return groups

    def _partition(self, stream: str, partition: int | None, key: bytes | None, count: int) -> int:
        if partition is not None:
            if not 0 <= partition < count:
                raise BasculeSparkError(
                    f"cannot write to partition {partition} of stream {stream!r}: it has partitions 0..{count - 1}"
                )
            return partition
        if self.kind == "roundrobin":
            self._next_round_robin += 1
            return (self._next_round_robin - 1) % count
        return key_partition(key, count)
