"""Which partition each written row goes to, as pure rules, as Kafka's sink decides: the row's own
partition (checked) wins; else the key's hash with go-liftbridge's key partitioner (bascule's
client's, so that Spark and clients put a key in the same partition); else, for a row carrying its
own message id, that id's hash; else round robin.

Every rule but round robin is a function of the row; round robin is one of the row's place in the
task's input and of where the task starts (`Partitioner.first`). A row written again by a retried
task or a re-run micro-batch, with the same message id, must go to the same partition, or the
partition's leader cannot know it for a duplicate (`ids`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from bascule.client.partitioners import RoundRobin, partition_by_key
from bascule.spark.errors import BasculeSparkError


class Partitioner:
    """The partitioner of one task. `kind` "key": keyed rows by their key's hash, keyless rows by
    their own message id's hash, or round robin; "roundrobin": every row by its own id's hash, or
    round robin, keys or not. Round robin goes on from batch to batch, and starts at `first` (modulo
    the partition count): tasks that start at different places spread a few rows each over every
    partition instead of all into partition 0."""

    def __init__(self, kind: str, first: int = 0) -> None:
        self.kind = kind
        self.first = first
        self._round_robin = RoundRobin()

    def group(
        self,
        streams: Sequence[str],
        partitions: Sequence[int | None],
        keys: Sequence[bytes | None],
        ids: Sequence[bytes | None],
        counts: Mapping[str, int],
    ) -> dict[tuple[str, int], list[int]]:
        """The rows' indexes, in row order, by the (stream, partition) they go to; `ids` holds the
        message ids the rows carry in their own headers, `counts` each stream's number of partitions."""
        groups: dict[tuple[str, int], list[int]] = {}
        for index, stream in enumerate(streams):
            partition = self._partition(stream, partitions[index], keys[index], ids[index], counts[stream])
            groups.setdefault((stream, partition), []).append(index)
        return groups

    def _partition(
        self, stream: str, partition: int | None, key: bytes | None, message_id: bytes | None, count: int
    ) -> int:
        if partition is not None:
            if not 0 <= partition < count:
                raise BasculeSparkError(
                    f"cannot write to partition {partition} of stream {stream!r}: it has partitions 0..{count - 1}"
                )
            return partition
        if key is not None and self.kind == "key":
            return partition_by_key(stream, key, b"", count)
        if message_id is not None:  # hashed as a key is: wherever the row is in the task's input
            return partition_by_key(stream, message_id, b"", count)
        return (self._round_robin(stream, key, b"", count) + self.first) % count
