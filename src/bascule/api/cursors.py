"""Consumer cursors, kept as messages in the internal ``__cursors`` stream.

A cursor lives in partition CRC-32("cursorId,stream,partition") mod N, keyed by that
string, its offset the value. The latest value per key is found by reading the
partition forward, remembering how far it was read, so a lookup only reads what
was written since the last one.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

import grpc

from bascule.api.ports import Cluster, LedPartition, Publishing, Replicas
from bascule.wire.entry import Record
from bascule.wire.names import CURSORS_STREAM
from bascule.wire.pb import api_pb2

OFFSET = struct.Struct(">q")


class CursorError(Exception):
    def __init__(self, status: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass
class CursorIndex:
    log_next_offset: int = 0  # how far the partition has been read
    offsets: dict[bytes, int] = field(default_factory=dict)


def cursor_key(cursor_id: str, stream: str, partition: int) -> bytes:
    return f"{cursor_id},{stream},{partition}".encode()


class Cursors:
    def __init__(self, cluster: Cluster, replicas: Replicas, publishing: Publishing) -> None:
        self.cluster = cluster
        self.replicas = replicas
        self.publishing = publishing
        self._indexes: dict[int, CursorIndex] = {}

    async def SetCursor(self, request, context):
        try:
            await self.set(request.stream, request.partition, request.cursorId, request.offset)
        except CursorError as exc:
            await context.abort(exc.status, exc.message)
        return api_pb2.SetCursorResponse()

    async def FetchCursor(self, request, context):
        try:
            offset = self.fetch(request.stream, request.partition, request.cursorId)
        except CursorError as exc:
            await context.abort(exc.status, exc.message)
        return api_pb2.FetchCursorResponse(offset=offset)

    def _partition(self, key: bytes) -> tuple[int, LedPartition]:
        cursors = self.cluster.state.streams.get(CURSORS_STREAM)
        count = len(cursors.partitions) if cursors is not None else 0
        if cursors is None or not count:
            raise CursorError(grpc.StatusCode.INTERNAL, "cursor stream is not enabled (cursors.stream.partitions)")
        index = zlib.crc32(key) % count
        local = self.replicas.get(CURSORS_STREAM, index)
        leader = cursors.partitions[index].leader
        if local is None or leader != self.cluster.server_id or not local.replica.is_leader:
            raise CursorError(grpc.StatusCode.FAILED_PRECONDITION, "Server not cursor partition leader")
        return index, local

    def _validate(self, stream: str, partition: int, cursor_id: str) -> None:
        if not cursor_id:
            raise CursorError(grpc.StatusCode.INVALID_ARGUMENT, "No cursor id provided")
        if self.cluster.state.partition(stream, partition) is None:
            raise CursorError(grpc.StatusCode.NOT_FOUND, "No such partition")

    async def set(self, stream: str, partition: int, cursor_id: str, offset: int) -> None:
        self._validate(stream, partition, cursor_id)
        key = cursor_key(cursor_id, stream, partition)
        _, local = self._partition(key)
        await self.publishing.publish(
            local.replica, local.subject, Record(value=OFFSET.pack(offset), key=key), api_pb2.AckPolicy.ALL, ""
        )

    def fetch(self, stream: str, partition: int, cursor_id: str) -> int:
        self._validate(stream, partition, cursor_id)
        key = cursor_key(cursor_id, stream, partition)
        index_no, local = self._partition(key)
        index = self._indexes.setdefault(index_no, CursorIndex())
        if index.log_next_offset > local.replica.log.next_offset:
            index = self._indexes[index_no] = CursorIndex()  # the log was truncated under us
        self._read_forward(index, local)
        return index.offsets.get(key, -1)

    def _read_forward(self, index: CursorIndex, local: LedPartition) -> None:
        replica = local.replica
        index.log_next_offset = max(index.log_next_offset, replica.log.oldest_offset)
        while index.log_next_offset <= replica.high_watermark:
            entries = replica.read_committed(index.log_next_offset, 1000)
            if not entries:
                break
            for entry in entries:
                if entry.key is not None and len(entry.value) == OFFSET.size:
                    index.offsets[entry.key] = OFFSET.unpack(entry.value)[0]
            index.log_next_offset = entries[-1].offset + 1
