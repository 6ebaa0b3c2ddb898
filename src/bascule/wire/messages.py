"""Liftbridge's ``Message`` (what Subscribe streams), encoded straight from stored entries, already
framed as gRPC messages.

Building an ``api_pb2.Message`` per entry, serializing it and framing it cost more than everything
else a Subscribe does per message. The protobuf encoding of one is simple enough to write directly:
the fields that change per entry (offset, key, value, timestamp) are encoded here from the stored
bytes, and those an entry shares with the others of its call or its subject (stream, partition,
subject, reply subject, headers) are encoded once and reused. The result parses as the same
``Message`` that ``api_pb2`` would build (tested, for arbitrary entries).
"""

from __future__ import annotations

import struct

from crc32c import crc32c

from bascule.wire.entry import (
    CRC_POSITION,
    EMPTY_BODY_SIZE,
    ENTRY_HEADER,
    HEADER_SIZE,
    KEY_AND_VALUE_LENGTHS,
    CorruptEntry,
    across_gaps,
    decode_header_block,
    entry_error,
    native,
)

# Field tags: (field number << 3) | wire type (0 varint, 2 length-delimited).
_OFFSET, _KEY, _VALUE, _TIMESTAMP = b"\x08", b"\x12", b"\x1a", b"\x20"
_STREAM, _PARTITION, _SUBJECT, _REPLY, _HEADER = b"\x2a", b"\x30", b"\x3a", b"\x42", b"\x4a"
_MAP_KEY, _MAP_VALUE = b"\x0a", b"\x12"
_GRPC_PREFIX = struct.Struct(">BI").pack  # gRPC's message prefix: compressed flag, length
_UINT32 = struct.Struct(">I")
_CACHE_SIZE = 4096
_NO_HEADERS = b"\x00\x00"

# Varints below _TABLED, and the value's tag and length and the gRPC prefix of Messages below it, made
# once: up to 16,384 (2-byte varints) where the Python loop is Subscribe's, only 128 (1-byte varints)
# beside the C loop, where the full tables were 2.2 MiB of every node's memory for the few 2-byte
# varints left to Python (long ack fields, a young log's offsets).
_TABLED = 1 << 14 if native is None else 128
_SMALL_VARINTS = [bytes((n,)) for n in range(128)] + [bytes((n & 0x7F | 0x80, n >> 7)) for n in range(128, _TABLED)]
_PREFIXES_KEPT = min(_TABLED, 1 << 12)
_PREFIXES = [_GRPC_PREFIX(0, n) for n in range(_PREFIXES_KEPT)]  # for Messages below 4 KiB
_VALUE_HEADS = [_VALUE + _SMALL_VARINTS[n] for n in range(_TABLED)]  # the value's tag and length
_SMALL_OFFSET_FIELDS = [_OFFSET + _SMALL_VARINTS[n] for n in range(128)]
_OFFSET_LOW_7_BITS = [bytes((_OFFSET[0], n | 0x80)) for n in range(128)]  # tag, low 7 bits, more to come


def varint(number: int) -> bytes:
    """Protobuf's base-128 varint of a number (a negative int64 as its two's complement)."""
    if 0 <= number < _TABLED:
        return _SMALL_VARINTS[number]
    if number < 0:
        number += 1 << 64
    out = bytearray()
    while number >= 128:
        out.append((number & 0x7F) | 0x80)
        number >>= 7
    out.append(number)
    return bytes(out)


def _length_delimited(tag: bytes, data: bytes) -> bytes:
    return tag + varint(len(data)) + data


class MessageEncoder:
    """Subscribe's responses for one partition's entries: serialized ``Message``s, each with its
    gRPC prefix."""

    __slots__ = ("_call_fields", "_shared_fields")

    def __init__(self, stream: str, partition: int) -> None:
        self._call_fields = (_length_delimited(_STREAM, stream.encode()) if stream else b"") + (
            _PARTITION + varint(partition) if partition else b""
        )
        # header block -> the call's fields and the encoded subject, reply subject and headers
        self._shared_fields: dict[bytes, bytes] = {}

    def walk(
        self, chunk: bytes, first_offset: int, max_entries: int, check_crc: bool = True
    ) -> tuple[int, int, CorruptEntry | None, bytes]:
        """(length, reach, error, framed): the whole, intact entries at the start of the stored
        ``chunk`` that ``intact_prefix`` takes from ``first_offset`` (across the gaps of a
        compacted log) and how far they reach, and their framed Messages. A log reads through it
        (``CommitLog.read_through``): one walk that checks and encodes each entry."""
        return across_gaps(self.walk_consecutive, chunk, first_offset, max_entries, check_crc)

    def walk_consecutive(
        self, chunk: bytes, start: int, first_offset: int, max_entries: int, check_crc: bool = True
    ) -> tuple[int, int, CorruptEntry | None, bytes]:
        """(end, count, error, framed) of one run of entries at consecutive offsets from byte
        ``start``, in C when built; the C loop stops before any entry it does not pass, and the
        Python loop says why."""
        if native is None:
            return self.walk_python(chunk, first_offset, max_entries, check_crc, start)
        view = chunk if not start else memoryview(chunk)[start:]
        length, count, stopped, framed = native.encode_messages(
            view, first_offset, max_entries, check_crc, self._shared_fields_of
        )
        if not stopped:
            return start + length, count, None, framed
        end, more_count, error, more_framed = self.walk_python(
            chunk, first_offset + count, max_entries - count, check_crc, start=start + length
        )
        return end, count + more_count, error, framed + more_framed

    def _shared_fields_of(self, block: bytes, offset: int) -> bytes:
        return self._shared_fields.get(block) or self._encode_shared_fields(block, offset)

    def walk_python(
        self, chunk: bytes, first_offset: int, max_entries: int, check_crc: bool = True, start: int = 0
    ) -> tuple[int, int, CorruptEntry | None, bytes]:
        """``walk_consecutive`` as a Python loop, from byte ``start`` of ``chunk``: the C module's
        reference, and its stand-in."""
        # Per entry, as few Python operations as the format allows: this loop is Subscribe's cost.
        # Each Message goes out as pieces for one join (no concatenation per entry): the gRPC prefix,
        # the offset field, the value's tag and length, the value, and the fields shared with
        # neighbours (timestamp, stream, partition, subject, headers).
        parts: list[bytes] = []
        extend = parts.extend
        unpack_header, unpack_lengths, unpack_uint32 = ENTRY_HEADER.unpack_from, KEY_AND_VALUE_LENGTHS.unpack_from, \
            _UINT32.unpack_from
        shared_fields, prefixes, value_heads, low7 = self._shared_fields, _PREFIXES, _VALUE_HEADS, _OFFSET_LOW_7_BITS
        last_block, tail = None, b""
        last_timestamp, time_field, shared = None, b"", b""
        size, position, expected, stop = len(chunk), start, first_offset, first_offset + max_entries
        high, rest = -1, b""  # the offset past its low 7 bits, and those bits' varint
        error = None
        while position < size and expected < stop:
            if size - position < HEADER_SIZE:
                error = entry_error(chunk, position, expected)
                break
            offset, timestamp, _, body_size, stored_crc = unpack_header(chunk, position)
            body = position + HEADER_SIZE
            end = body + body_size
            if offset != expected or end > size or body_size < EMPTY_BODY_SIZE or check_crc and \
                    crc32c(chunk[body:end], crc32c(chunk[position:position + CRC_POSITION])) != stored_crc:
                error = entry_error(chunk, position, expected)
                break
            key_length, value_length = unpack_lengths(chunk, body)
            if key_length == -1:
                key = None
                value_start = body + 8
            elif 0 <= key_length <= body_size - EMPTY_BODY_SIZE:
                key = chunk[body + 4:body + 4 + key_length]
                (value_length,) = unpack_uint32(chunk, body + 4 + key_length)
                value_start = body + 8 + key_length
            else:
                error = CorruptEntry(f"entry at offset {offset} has a bad key length {key_length}")
                break
            value_end = value_start + value_length
            if value_end + 2 > end:
                error = CorruptEntry(f"entry at offset {offset}: its key and value overrun its body")
                break
            block = chunk[value_end:end]
            if block != last_block:
                last_block = block
                shared = shared_fields.get(block) or self._encode_shared_fields(block, offset)
                tail = time_field + shared
            if timestamp != last_timestamp:  # a burst's entries share theirs
                last_timestamp, time_field = timestamp, _TIMESTAMP + varint(timestamp)
                tail = time_field + shared
            if offset >> 7 != high:  # once per 128 offsets
                high = offset >> 7
                rest = varint(high) if high else b""
            offset_field = low7[offset & 0x7F] if high else _SMALL_OFFSET_FIELDS[offset]
            value_head = value_heads[value_length] if value_length < _TABLED else _VALUE + varint(value_length)
            length = 2 + len(rest) + len(value_head) + value_length + len(tail)
            if key:
                key_field = _KEY + varint(key_length) + key
                length += len(key_field)
                extend((_GRPC_PREFIX(0, length), key_field, offset_field, rest, value_head,
                        chunk[value_start:value_end], tail))
            else:
                extend((prefixes[length] if length < _PREFIXES_KEPT else _GRPC_PREFIX(0, length), offset_field, rest,
                        value_head, chunk[value_start:value_end], tail))
            position, expected = end, expected + 1
        return position, expected - first_offset, error, b"".join(parts)

    def _encode_shared_fields(self, block: bytes, offset: int) -> bytes:
        headers = decode_header_block(block, offset) if block != _NO_HEADERS else {}
        parts = [self._call_fields]
        subject = headers.get("subject", b"").decode(errors="replace").encode()
        reply = headers.get("reply", b"").decode(errors="replace").encode()
        if subject:
            parts.append(_length_delimited(_SUBJECT, subject))
        if reply:
            parts.append(_length_delimited(_REPLY, reply))
        for name, value in headers.items():
            entry = _length_delimited(_MAP_KEY, name.encode()) + _length_delimited(_MAP_VALUE, value)
            parts.append(_length_delimited(_HEADER, entry))
        fields = b"".join(parts)
        if len(self._shared_fields) >= _CACHE_SIZE:
            self._shared_fields.clear()
        self._shared_fields[block] = fields
        return fields
