"""The client's routing rules, pure: where a call goes, which failures send it elsewhere, and where
a broken subscription picks up."""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Iterable, Sequence

import grpc

from bascule.client.model import Metadata
from bascule.wire.pb import api_pb2

CURSORS_STREAM = "__cursors"

# Liftbridge's refusals from a broker that does not lead the partition (Subscribe, cursors).
NOT_LEADER_DETAILS = frozenset({"Server not partition leader", "Server not cursor partition leader"})

# Failures after which the cached partition leaders may be stale (a failover, a deleted stream).
_STALE_CODES = frozenset({
    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.INTERNAL, grpc.StatusCode.DEADLINE_EXCEEDED,
})


class NoRoute(Exception):
    """No broker to send a partition's call to yet (no leader known): retried like UNAVAILABLE."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


def leaves_metadata_stale(code: grpc.StatusCode) -> bool:
    return code in _STALE_CODES


def worth_retrying(code: grpc.StatusCode, details: str) -> bool:
    """A broker gone or not yet ready (no metadata leader, leadership moving), or a broker that is
    not the partition's leader: after a metadata refresh the call may go through."""
    return code == grpc.StatusCode.UNAVAILABLE or (
        code == grpc.StatusCode.FAILED_PRECONDITION and details in NOT_LEADER_DETAILS
    )


def subscription_complete(code: grpc.StatusCode, details: str, reverse: bool) -> bool:
    """A subscription that reached its stop position (or, reading backwards, the oldest message)."""
    return code == grpc.StatusCode.RESOURCE_EXHAUSTED or (
        reverse and (code, details) == (grpc.StatusCode.UNKNOWN, "EOF")
    )


def partition_address(
    metadata: Metadata, stream: str, partition: int, read_isr_replica: bool = False,
    choose: Callable[[Sequence[str]], str] = random.choice,
) -> str | None:
    """The address to send a partition's call to: its leader's, or for a read from any in-sync
    replica one of the ISR's (leader included), as go-liftbridge picks; None while unknown."""
    info = metadata.streams.get(stream)
    meta = info.partitions.get(partition) if info is not None and info.exists else None
    if meta is None:
        return None
    if read_isr_replica:
        reachable = [metadata.brokers[b] for b in meta.isr if b in metadata.brokers]
        if reachable:
            return choose(reachable)
    return metadata.brokers.get(meta.leader)


def next_broker(current: str, seeds: Iterable[str], metadata: Metadata | None) -> str:
    """The broker to fail over to from ``current``: the next of the seeds and the brokers the
    metadata lists, in that order, round and round."""
    known = list(dict.fromkeys([*seeds, *(metadata.brokers.values() if metadata else ())]))
    if current not in known:
        return known[0]
    return known[(known.index(current) + 1) % len(known)]


def cursor_partition(cursor_id: str, stream: str, partition: int, cursor_partitions: int) -> int:
    """The partition of the cursors stream that holds a cursor: go-liftbridge's and Liftbridge's
    CRC-32 (IEEE) of "cursorId,stream,partition" mod the cursors stream's partition count."""
    return zlib.crc32(f"{cursor_id},{stream},{partition}".encode()) % max(cursor_partitions, 1)


def resumed(request: api_pb2.SubscribeRequest, last_offset: int | None) -> api_pb2.SubscribeRequest:
    """The request that picks a broken subscription up right after the last message delivered
    (unchanged if none was): no message twice, none skipped; its stop position stays."""
    if last_offset is None:
        return request
    again = api_pb2.SubscribeRequest()
    again.CopyFrom(request)
    again.startPosition, again.startOffset = api_pb2.StartPosition.OFFSET, last_offset + 1
    return again
