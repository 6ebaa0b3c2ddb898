"""Message ids: what makes a write idempotent.

A message carrying the ``Nats-Msg-Id`` header (JetStream's name for it, so a NATS publisher moving
between the two keeps its code) is stored once per partition within the stream's deduplication
window: a second message with the same id in that window is not stored again, and its publisher is
acked with the first one's offset. The header is stored with the message, so the window travels
with the replicated log: a new leader rebuilds it from its log's tail.

Every path that writes takes the id from the same header: gRPC publishes (``headers``), Liftbridge
envelopes (their headers), plain NATS messages (the NATS header block), bascule's client and the
Spark sink (which set it).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TypeVar

from bascule.wire.entry import Record, decode_header_block, header_blocks_holding, native

_Decoded = TypeVar("_Decoded")

MESSAGE_ID_HEADER = "Nats-Msg-Id"
# An id longer than this is remembered by its SHA-256: the window's memory per id stays bounded
# whatever publishers send, and the same id always gives the same key.
MAX_KEPT_ID_BYTES = 64
_UINT16, _UINT32 = struct.Struct(">H"), struct.Struct(">I")
_ID_NAME_BYTES = MESSAGE_ID_HEADER.encode()
_ID_NAME = _UINT16.pack(len(_ID_NAME_BYTES)) + _ID_NAME_BYTES
# For each shared header block: what goes before and after a message's id in its encoding. The
# blocks are capture.stored_headers' (one per subject, bounded alike).
_AROUND_ID_CACHE_SIZE = 4096
_around_id: dict[bytes, tuple[bytes, bytes]] = {}


def message_id(headers: Mapping[str, bytes]) -> bytes | None:
    """The id a message's headers carry, or None (no header, or an empty one)."""
    value = headers.get(MESSAGE_ID_HEADER)
    return value or None


def message_ids(records: list[Record]) -> list[bytes | None] | None:
    """The records' message ids, or None when none has one (the common case costs no more)."""
    ids = [message_id(record.headers) for record in records]
    return ids if any(ids) else None


def headers_with_id(message_id: bytes, shared: Mapping[str, bytes], block: bytes) -> tuple[dict[str, bytes], bytes]:
    """The headers of a message whose only own header is its id, beside ``shared`` (the subject and
    reply ones every message gets, encoded as ``block``), and their encoding: ``block`` with the id
    in front, without encoding the others again (a fifth of ``encode_headers``' time)."""
    parts = _around_id.get(block)
    if parts is None:
        if len(_around_id) >= _AROUND_ID_CACHE_SIZE:
            _around_id.clear()
        parts = _around_id[block] = (_UINT16.pack(_UINT16.unpack_from(block)[0] + 1) + _ID_NAME, block[2:])
    head, tail = parts
    return {MESSAGE_ID_HEADER: message_id, **shared}, head + _UINT32.pack(len(message_id)) + message_id + tail


def stored_message_ids(buf: bytes) -> Iterator[tuple[int, int, bytes]]:
    """(offset, timestamp, message id) of each entry of ``buf`` (whole entries, their CRCs checked
    already) that has one. An id first among the headers, where bascule's writers put it, is read in
    place; elsewhere the entry's headers are decoded."""
    for offset, timestamp, block in header_blocks_holding(buf, _ID_NAME_BYTES):
        if block.startswith(_ID_NAME, 2):
            start = 2 + len(_ID_NAME) + _UINT32.size
            value = block[start:start + _UINT32.unpack_from(block, start - _UINT32.size)[0]]
        else:
            value = decode_header_block(block, offset).get(MESSAGE_ID_HEADER, b"")
        if value:
            yield offset, timestamp, value


# --- a PublishRequest's id, before protobuf reads it ------------------------------------------
# A map field costs upb a map per message (a third of a PublishRequest's decoding) and every look
# into it more: a request whose one header is its id has that header taken out of its bytes
# first, and the rest decoded as a request without headers.

_PUBLISH_HEADERS_FIELD = 5  # PublishRequest.headers, map<string, bytes>
_LENGTH_DELIMITED = 2
# A map entry as protobuf writes it: key (field 1) "Nats-Msg-Id", then value (field 2)'s tag.
_ID_ENTRY_HEAD = b"\x0a" + bytes([len(_ID_NAME_BYTES)]) + _ID_NAME_BYTES + b"\x12"
_MAX_TAG = 1 << 32  # upb reads no tag above 32 bits


def split_message_id(data: bytes) -> tuple[bytes, bytes] | None:
    """(the request's bytes without its id's header, the id) when ``data``, a PublishRequest's
    protobuf bytes, holds exactly one header (field 5) and it is a non-empty ``Nats-Msg-Id`` written
    as protobuf writes a map entry (key, then value, nothing else); None otherwise, and for bytes
    whose fields it cannot walk (protobuf then reads them, or says why not). Decoding what it
    leaves and putting the id back as the one header gives what decoding ``data`` gives. In C when
    built."""
    if native is not None:
        return native.split_message_id(data)
    return split_message_id_python(data)


def split_message_id_python(data: bytes) -> tuple[bytes, bytes] | None:
    """``split_message_id`` as a Python loop: the C function's reference."""
    size, position, found = len(data), 0, None
    while position < size:
        start = position
        tag, position = _varint(data, position, size)
        if tag < 0 or tag >= _MAX_TAG or tag >> 3 == 0:
            return None
        wire_type = tag & 7
        if wire_type == 0:
            _, position = _varint(data, position, size)
            if position < 0:
                return None
        elif wire_type == 1 or wire_type == 5:
            position += 8 if wire_type == 1 else 4
        elif wire_type == _LENGTH_DELIMITED:
            length, position = _varint(data, position, size)
            if length < 0 or length > size - position:
                return None
            if tag >> 3 == _PUBLISH_HEADERS_FIELD:
                if found is not None:
                    return None
                found = (start, position, position + length)
            position += length
        else:  # groups (deprecated), or no wire type at all
            return None
        if position > size or (tag >> 3 == _PUBLISH_HEADERS_FIELD and wire_type != _LENGTH_DELIMITED):
            return None
    if found is None:
        return None
    start, entry, end = found
    head_end = entry + len(_ID_ENTRY_HEAD)
    if data[entry:head_end] != _ID_ENTRY_HEAD:
        return None
    length, value = _varint(data, head_end, end)
    if length <= 0 or length != end - value:
        return None
    return data[:start] + data[end:], data[value:end]


def decode_with_id_python(decode: Callable[[bytes], _Decoded], data: bytes) -> tuple[_Decoded, bytes | None]:
    """(``decode`` of ``data`` without its id's header, the id) when ``split_message_id`` finds it,
    else (``decode(data)``, None): the C function's reference."""
    split = split_message_id_python(data)
    if split is None:
        return decode(data), None
    return decode(split[0]), split[1]


def record_with_id_python(record_type: type[Record], value: bytes, key: bytes | None, message_id: bytes,
                          shared: dict[str, bytes], block: bytes) -> Record:
    """The record of a message whose one own header is ``message_id``, beside ``shared`` (encoded
    as ``block``: see ``headers_with_id``): the C function's reference."""
    headers, with_id = headers_with_id(message_id, shared, block)
    return record_type(value, key, headers, 0, with_id)


# What the API decodes a PublishAsync request with, as decode_with_id(decode, data), and builds
# its record with: in C when built.
decode_with_id = native.decode_with_id if native is not None else decode_with_id_python
record_with_id = native.record_with_id if native is not None else record_with_id_python


def _varint(data: bytes, position: int, end: int) -> tuple[int, int]:
    """(value, position after it) of the varint at ``position``, at most 10 bytes before ``end``
    and below 2**64; (-1, -1) when there is none."""
    value = shift = 0
    while position < end and shift < 70:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (value, position) if value < 1 << 64 else (-1, -1)
        shift += 7
    return -1, -1


def message_id_field_size(message_id: bytes) -> int:
    """The bytes a header holding only ``message_id`` adds to a PublishRequest (its ByteSize)."""
    entry = len(_ID_ENTRY_HEAD) + _varint_size(len(message_id)) + len(message_id)
    return 1 + _varint_size(entry) + entry


def _varint_size(number: int) -> int:
    return max(1, (number.bit_length() + 6) // 7)


def window_keys(ids: Sequence[bytes | None]) -> Sequence[bytes | None]:
    """``window_key`` of each id (None: none): ``ids`` itself when every one is kept as it is (the
    usual case, found without a Python step per id)."""
    if max(map(len, filter(None, ids)), default=0) <= MAX_KEPT_ID_BYTES:
        return ids
    return [None if key is None else window_key(key) for key in ids]


def window_key(message_id: bytes) -> bytes:
    """What the deduplication window keeps for ``message_id``."""
    if len(message_id) <= MAX_KEPT_ID_BYTES:
        return message_id
    return hashlib.sha256(message_id).digest()
