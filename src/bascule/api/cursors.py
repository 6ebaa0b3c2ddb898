"""Consumer cursors, kept as Liftbridge keeps them: messages of the internal ``__cursors`` stream.

A cursor lives in partition CRC-32("cursorId,stream,partition") mod N, keyed by that string, its
value a protobuf ``Cursor`` (stream, partition, cursorId, offset). The stream is compacted, so only
the latest record of each key stays. The latest value per key is found by reading the partition
forward, remembering how far it was read, so a lookup only reads what was written since the last
one; the index starts again from the log whenever this node's leadership of the partition is new
(a former follower's log may have been cut and written again since it last read).

The records earlier versions of bascule wrote (the offset alone, as 8 big-endian bytes) are still
read, so a node upgraded in place keeps its cursors: a value of 8 bytes whose first byte is 0x00 or
0xFF (any offset from -2**56 to 2**56 - 1) cannot be a ``Cursor`` (that byte would be field 0, or
wire type 7), so each record is told apart by its bytes, and the latest record of a key wins, old
or new. Compaction keeps the latest of
each key whatever its format.
"""

from __future__ import annotations

import logging
import struct
import zlib
from dataclasses import dataclass, field

from google.protobuf.message import DecodeError

from bascule.api.ports import Cluster, LedPartition, Publishing, Replicas
from bascule.h2grpc import Status
from bascule.partition.replica import PartitionReplica
from bascule.wire.entry import Record, decode_entries
from bascule.wire.names import CURSORS_STREAM
from bascule.wire.pb import api_pb2, internal_pb2

log = logging.getLogger(__name__)

OLD_OFFSET = struct.Struct(">q")  # the value of a cursor record written by earlier bascule
READ_BYTES = 1 << 20


class CursorError(Exception):
    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass
class CursorIndex:
    """The latest offset of each cursor key in one cursor partition, as read so far."""

    replica: PartitionReplica
    leader_epoch: int
    log_next_offset: int = 0  # how far the partition has been read
    offsets: dict[bytes, int] = field(default_factory=dict)


def cursor_key(cursor_id: str, stream: str, partition: int) -> bytes:
    return f"{cursor_id},{stream},{partition}".encode()


def encode_cursor(stream: str, partition: int, cursor_id: str, offset: int) -> bytes:
    cursor = internal_pb2.Cursor(stream=stream, partition=partition, cursorId=cursor_id, offset=offset)
    return cursor.SerializeToString()


def cursor_offset(value: bytes) -> int | None:
    """The offset a cursor record holds (a ``Cursor``, or earlier bascule's 8 bytes); None if the
    value is neither."""
    if len(value) == OLD_OFFSET.size and value[0] in (0x00, 0xFF):
        return int(OLD_OFFSET.unpack(value)[0])
    try:
        return int(internal_pb2.Cursor.FromString(value).offset)
    except DecodeError:
        return None


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
            raise CursorError(Status.INTERNAL, "cursor stream is not enabled (cursors.stream.partitions)")
        index = zlib.crc32(key) % count
        local = self.replicas.get(CURSORS_STREAM, index)
        leader = cursors.partitions[index].leader
        if local is None or leader != self.cluster.server_id or not local.replica.is_leader:
            raise CursorError(Status.FAILED_PRECONDITION, "Server not cursor partition leader")
        return index, local

    @staticmethod
    def _validate(stream: str, cursor_id: str) -> None:
        """Liftbridge's checks and words. As there, a cursor may name a stream or partition that does
        not exist (yet, or any more): it is the client's record of a position, kept whatever becomes
        of the stream (deleting a stream leaves its cursors too)."""
        if not stream:
            raise CursorError(Status.INVALID_ARGUMENT, "No stream provided")
        if not cursor_id:
            raise CursorError(Status.INVALID_ARGUMENT, "No cursorId provided")

    async def set(self, stream: str, partition: int, cursor_id: str, offset: int) -> None:
        self._validate(stream, cursor_id)
        key = cursor_key(cursor_id, stream, partition)
        index, local = self._partition(key)
        meta = self.cluster.state.partition(CURSORS_STREAM, index)
        if meta is not None and meta.paused:  # auto-paused while idle: a cursor write wakes it, as a publish does
            await self.cluster.call("resume", name=CURSORS_STREAM, partition=index)
        record = Record(value=encode_cursor(stream, partition, cursor_id, offset), key=key)
        await self.publishing.publish(local.replica, local.subject, record, api_pb2.AckPolicy.ALL, "")

    def fetch(self, stream: str, partition: int, cursor_id: str) -> int:
        self._validate(stream, cursor_id)
        key = cursor_key(cursor_id, stream, partition)
        index_no, local = self._partition(key)
        replica = local.replica
        index = self._indexes.get(index_no)
        if index is None or index.replica is not replica or index.leader_epoch != replica.leader_epoch:
            index = self._indexes[index_no] = CursorIndex(replica, replica.leader_epoch)
        _read_forward(index)
        return index.offsets.get(key, -1)


def _read_forward(index: CursorIndex) -> None:
    """Read the committed records the index has not seen, across the gaps compaction leaves."""
    replica = index.replica
    index.log_next_offset = max(index.log_next_offset, replica.oldest_offset)
    while index.log_next_offset <= replica.high_watermark:
        data, reach = replica.read_committed_through(index.log_next_offset, READ_BYTES)
        if not reach:
            break
        for entry in decode_entries(data, check_crc=False):
            offset = cursor_offset(entry.value)
            if entry.key is None or offset is None:
                log.error("invalid cursor record at %s/%s offset %d", replica.stream, replica.partition, entry.offset)
                continue
            index.offsets[entry.key] = offset
        index.log_next_offset += reach
