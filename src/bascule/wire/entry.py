"""The stored-entry format: how one message sits in a segment file and on the replication wire.

Every entry, big-endian (see docs/design.md):

    0-7   offset            int64
    8-15  timestamp (ns)    int64
    16-23 leader epoch      uint64
    24-27 body size N       uint32
    28-31 CRC-32C           uint32, over bytes 0-27 and the body
    32..  body: key length int32 (-1 = no key), key, value length uint32, value,
          header count uint16, then per header: name length uint16, name (UTF-8),
          value length uint32, value

A leader's log bytes are its followers' log bytes, so this module is the only place that knows
the layout (``bascule.wire.messages``, Subscribe's encoder, reads it through the structs here, and
its tests hold it to ``decode_entries``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from crc32c import crc32c

try:
    from bascule.wire import _walk as native
except ImportError:  # installed without a C compiler: the Python loops below do the work
    native = None  # type: ignore[assignment]

ENTRY_HEADER = struct.Struct(">qqQII")
HEADER_SIZE = ENTRY_HEADER.size
CRC_POSITION = 28

_HEADER_BEFORE_CRC = struct.Struct(">qqQI")
_CRC = struct.Struct(">I")
KEY_AND_VALUE_LENGTHS = struct.Struct(">iI")
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")
_UINT16 = struct.Struct(">H")

_NO_KEY = -1
_NO_HEADERS = b"\x00\x00"
EMPTY_BODY_SIZE = KEY_AND_VALUE_LENGTHS.size + _UINT16.size  # no key, empty value, no headers
_MAX_UINT16 = 0xFFFF
_MAX_UINT32 = 0xFFFFFFFF
_MAX_INT32 = 0x7FFFFFFF
_MAX_INT64 = (1 << 63) - 1
_MAX_UINT64 = (1 << 64) - 1


WalkedEntry = tuple[int, int, int, int, int]  # what scan() yields: offset, leader epoch, timestamp, start, end
# A reader's walk over stored bytes (``stored_prefix``, Subscribe's ``MessageEncoder.walk``):
# (bytes, first offset, max entries, check CRC) -> (length, reach, error, what it makes of them),
# as ``intact_prefix`` walks them: offsets rise, maybe with gaps; ``max entries`` bounds the offsets.
EntryWalk = Callable[[bytes, int, int, bool], tuple[int, int, "CorruptEntry | None", bytes]]


class CorruptEntry(ValueError):
    """Bytes that are not a whole, intact entry: bad checksum, torn tail or inconsistent lengths."""


@dataclass(slots=True)
class Record:
    """What a producer hands to the log. A timestamp of 0 lets the log stamp it."""

    value: bytes
    key: bytes | None = None
    headers: dict[str, bytes] = field(default_factory=dict)
    timestamp: int = 0
    # ``headers`` already encoded (encode_headers): many captured messages share one subject,
    # and encoding their headers once instead of per message is a large part of an append.
    header_block: bytes | None = None


@dataclass(slots=True)
class Entry:
    """One stored message as a reader sees it. Not frozen: a frozen dataclass costs five times
    as much to build, and readers build one per message."""

    offset: int
    timestamp: int
    leader_epoch: int
    key: bytes | None
    value: bytes
    headers: dict[str, bytes]


# --- encoding -------------------------------------------------------------------------------


def encode_entries(
    first_offset: int, leader_epoch: int, records: Sequence[Record], timestamp: int, floor: int | None = None,
) -> tuple[bytes, list[WalkedEntry]]:
    """Encode ``records`` as consecutive entries from ``first_offset``, ready to write, with
    what ``scan`` would yield for them (the log indexes them without walking them again).

    A record's own nonzero timestamp wins over ``timestamp``. With a ``floor``, no entry's
    timestamp goes below it or below the entry's before it (a log's timestamps never go down).
    In C when built.
    """
    _check_range("first offset", first_offset, 0, _MAX_INT64 - len(records))
    _check_range("leader epoch", leader_epoch, 0, _MAX_UINT64)
    if native is None:
        return encode_entries_python(first_offset, leader_epoch, records, timestamp, floor)
    batch = records if isinstance(records, list) else list(records)  # the log's appends pass lists
    return native.encode_entries(batch, first_offset, leader_epoch, timestamp, floor, encode_headers, Record)


def encode_entries_python(
    first_offset: int, leader_epoch: int, records: Sequence[Record], timestamp: int, floor: int | None = None,
) -> tuple[bytes, list[WalkedEntry]]:
    """``encode_entries`` as a Python loop: the C module's reference."""
    pack_header = _HEADER_BEFORE_CRC.pack
    pack_crc = _CRC.pack
    parts: list[bytes] = []
    append = parts.append
    walked: list[WalkedEntry] = []
    walk = walked.append
    offset = first_offset
    position = 0
    for record in records:
        body = _encode_body(record)
        stamp = record.timestamp or timestamp
        if floor is not None:
            stamp = floor = max(stamp, floor)
        header = pack_header(offset, stamp, leader_epoch, len(body))
        append(header)
        append(pack_crc(crc32c(body, crc32c(header))))
        append(body)
        end = position + HEADER_SIZE + len(body)
        walk((offset, leader_epoch, stamp, position, end))
        position = end
        offset += 1
    return b"".join(parts), walked


def record_error(record: Record) -> str | None:
    """Why ``record`` cannot be an entry (too large, too many headers...), or None."""
    try:
        _encode_body(record)
    except ValueError as exc:
        return str(exc)
    return None


def _encode_body(record: Record) -> bytes:
    value = record.value
    key = record.key
    if len(value) > _MAX_UINT32:
        raise ValueError(f"value of {len(value)} bytes is too large for an entry")
    headers = record.header_block or (encode_headers(record.headers) if record.headers else _NO_HEADERS)
    if key:
        if len(key) > _MAX_INT32:
            raise ValueError(f"key of {len(key)} bytes is too large for an entry")
        parts: tuple[bytes, ...] = (_INT32.pack(len(key)), key, _UINT32.pack(len(value)), value, headers)
    else:
        key_length = _NO_KEY if key is None else 0
        parts = (KEY_AND_VALUE_LENGTHS.pack(key_length, len(value)), value, headers)
    body = b"".join(parts)
    if len(body) > _MAX_UINT32:
        raise ValueError(f"entry body of {len(body)} bytes is too large")
    return body


def encode_headers(headers: dict[str, bytes]) -> bytes:
    if len(headers) > _MAX_UINT16:
        raise ValueError(f"{len(headers)} headers is more than an entry can hold")
    parts = [_UINT16.pack(len(headers))]
    for name, value in headers.items():
        encoded_name = name.encode("utf-8")
        if len(encoded_name) > _MAX_UINT16:
            raise ValueError(f"header name of {len(encoded_name)} bytes is too long")
        if len(value) > _MAX_UINT32:
            raise ValueError(f"header {name!r} value of {len(value)} bytes is too large")
        parts += (_UINT16.pack(len(encoded_name)), encoded_name, _UINT32.pack(len(value)), value)
    return b"".join(parts)


def _check_range(what: str, number: int, lowest: int, highest: int) -> None:
    if not lowest <= number <= highest:
        raise ValueError(f"{what} {number} is outside [{lowest}, {highest}]")


# --- walking and decoding -------------------------------------------------------------------


def scan(
    buf: bytes | bytearray | memoryview, check_crc: bool = True
) -> Iterator[tuple[int, int, int, int, int]]:
    """Yield (offset, leader_epoch, timestamp, start, end) of each entry, checking its CRC.

    ``start`` and ``end`` are byte positions of the whole entry in ``buf``. Raises CorruptEntry
    at the first entry that is torn or fails its checksum, after yielding the good ones before it.
    ``check_crc=False`` only walks the boundaries, for bytes that were just encoded or that will
    be checked again when read.
    """
    view = memoryview(buf)
    size = len(view)
    position = 0
    while position < size:
        if size - position < HEADER_SIZE:
            raise CorruptEntry(
                f"torn entry header at byte {position}: {size - position} of {HEADER_SIZE} bytes"
            )
        offset, timestamp, leader_epoch, body_size, stored_crc = ENTRY_HEADER.unpack_from(
            view, position
        )
        body_start = position + HEADER_SIZE
        end = body_start + body_size
        if end > size:
            raise CorruptEntry(
                f"torn entry at byte {position} (offset {offset}): body of {body_size} bytes "
                f"but only {size - body_start} present"
            )
        if check_crc:
            _check_crc(view, position, body_start, end, stored_crc, offset)
        if body_size < EMPTY_BODY_SIZE:
            raise CorruptEntry(
                f"entry at byte {position} (offset {offset}) has a {body_size}-byte body, "
                f"below the minimum of {EMPTY_BODY_SIZE}"
            )
        yield offset, leader_epoch, timestamp, position, end
        position = end


def walked_prefix(buf: bytes | bytearray | memoryview, check_crc: bool = True) -> list[WalkedEntry]:
    """What ``scan`` yields for the whole, intact entries at the start of ``buf``, up to the
    first torn or damaged one (in C when built: a follower walks every replicated entry)."""
    if native is not None:
        return native.walked_entries(buf, check_crc)[0]
    walked: list[WalkedEntry] = []
    try:
        walked.extend(scan(buf, check_crc))
    except CorruptEntry:
        pass
    return walked


def intact_prefix(
    buf: bytes, first_offset: int, max_entries: int, check_crc: bool = True
) -> tuple[int, int, CorruptEntry | None]:
    """(length, reach, error) of the whole, intact entries at the start of ``buf`` whose offsets
    rise from ``first_offset`` and stay below ``first_offset + max_entries``. Offsets may skip
    (a compacted log has gaps) but never go back. ``reach`` is how many offsets from
    ``first_offset`` the entries account for: up to the last one's, or ``max_entries`` when the
    next entry is at or past that limit. ``error`` says why they stop before the end of ``buf``
    (a torn or damaged entry, one out of order), None otherwise. The log runs it on every read."""
    length, reach, error, _ = across_gaps(consecutive_prefix, buf, first_offset, max_entries, check_crc)
    return length, reach, error


# One run of consecutive entries from byte ``start`` of a buffer: (bytes, start, first offset,
# max entries, check CRC) -> (end, count, error, what the reader makes of them).
ConsecutiveRun = Callable[[bytes, int, int, int, bool], tuple[int, int, "CorruptEntry | None", bytes]]


def across_gaps(
    run: ConsecutiveRun, buf: bytes, first_offset: int, max_entries: int, check_crc: bool
) -> tuple[int, int, CorruptEntry | None, bytes]:
    """``run`` over each stretch of consecutive offsets in ``buf``, stepping over the gaps that
    compaction leaves between them: (length, reach, error, made), as ``intact_prefix`` says. An
    entry past a gap is taken only once it is found whole (and intact, with ``check_crc``): a
    damaged offset must not pass for a gap."""
    limit = first_offset + max_entries
    position, expected, made = 0, first_offset, []
    while True:
        position, count, error, part = run(buf, position, expected, limit - expected, check_crc)
        made.append(part)
        expected += count
        if error is None:
            reach = max_entries if expected >= limit else expected - first_offset
            return position, reach, None, made[0] if len(made) == 1 else b"".join(made)
        after_gap = _offset_after_gap(run, buf, position, expected, check_crc)
        if after_gap is None or after_gap >= limit:
            reach = expected - first_offset if after_gap is None else max_entries
            return position, reach, error if after_gap is None else None, b"".join(made)
        expected = after_gap


def _offset_after_gap(run: ConsecutiveRun, buf: bytes, position: int, expected: int, check_crc: bool) -> int | None:
    """The offset of the entry at ``position`` if it is past ``expected`` and whole; else None."""
    if len(buf) - position < HEADER_SIZE:
        return None
    offset = ENTRY_HEADER.unpack_from(buf, position)[0]
    if offset <= expected or run(buf, position, offset, 1, check_crc)[1] != 1:
        return None
    return offset


def consecutive_prefix(
    buf: bytes, start: int, first_offset: int, max_entries: int, check_crc: bool = True
) -> tuple[int, int, CorruptEntry | None, bytes]:
    """(end, count, error, b"") of the whole, intact entries from byte ``start`` of ``buf`` at
    consecutive offsets from ``first_offset``, at most ``max_entries``: in C when built."""
    if native is None:
        return *intact_prefix_python(buf, first_offset, max_entries, check_crc, start), b""
    view = buf if not start else memoryview(buf)[start:]
    length, count, stopped = native.intact_prefix(view, first_offset, max_entries, check_crc)
    end = start + length
    return end, count, entry_error(buf, end, first_offset + count) if stopped else None, b""


def intact_prefix_python(
    buf: bytes, first_offset: int, max_entries: int, check_crc: bool = True, start: int = 0
) -> tuple[int, int, CorruptEntry | None]:
    """One run of consecutive entries (``consecutive_prefix``) as a Python loop: the C module's
    reference, and its stand-in."""
    unpack, size, position, count, expected = ENTRY_HEADER.unpack_from, len(buf), start, 0, first_offset
    while position < size and count < max_entries:
        if size - position < HEADER_SIZE:
            return position, count, entry_error(buf, position, expected)
        offset, _, _, body_size, stored_crc = unpack(buf, position)
        end = position + HEADER_SIZE + body_size
        # Slices of bytes, not of a memoryview: cheaper for entries of a few hundred bytes.
        if offset != expected or end > size or body_size < EMPTY_BODY_SIZE or check_crc and \
                crc32c(buf[position + HEADER_SIZE:end], crc32c(buf[position:position + CRC_POSITION])) != stored_crc:
            return position, count, entry_error(buf, position, expected)
        position, count, expected = end, count + 1, expected + 1
    return position, count, None


def stored_prefix(
    buf: bytes, first_offset: int, max_entries: int, check_crc: bool = True
) -> tuple[int, int, CorruptEntry | None, bytes]:
    """``intact_prefix`` as an ``EntryWalk``: the entries' own bytes."""
    length, reach, error = intact_prefix(buf, first_offset, max_entries, check_crc)
    return length, reach, error, buf if length == len(buf) else buf[:length]


def entry_error(buf: bytes, position: int, expected_offset: int) -> CorruptEntry:
    """Why the entry at ``position`` of ``buf`` is not the whole, intact entry ``expected_offset``
    (the walks above find that it is not, and leave saying why to here)."""
    if len(buf) - position < HEADER_SIZE:
        return CorruptEntry(f"torn entry header at byte {position}")
    offset, _, _, body_size, stored_crc = ENTRY_HEADER.unpack_from(buf, position)
    end = position + HEADER_SIZE + body_size
    if offset != expected_offset:
        return CorruptEntry(f"expected offset {expected_offset}, found {offset}")
    if end > len(buf):
        return CorruptEntry(f"torn entry at byte {position} (offset {offset})")
    if body_size < EMPTY_BODY_SIZE:
        return CorruptEntry(f"entry {offset} at byte {position} has a {body_size}-byte body")
    return CorruptEntry(f"CRC mismatch in entry at byte {position} (offset {offset})")


def _check_crc(
    view: memoryview, start: int, body_start: int, end: int, stored_crc: int, offset: int
) -> None:
    actual_crc = crc32c(view[body_start:end], crc32c(view[start : start + CRC_POSITION]))
    if actual_crc != stored_crc:
        raise CorruptEntry(
            f"CRC mismatch in entry at byte {start} (offset {offset}): "
            f"stored {stored_crc:#010x}, computed {actual_crc:#010x}"
        )


def offset_and_epoch(header: bytes) -> tuple[int, int]:
    """(offset, leader epoch) from an entry's header; the CRC is not checked."""
    offset, _, leader_epoch, _, _ = ENTRY_HEADER.unpack_from(header)
    return offset, leader_epoch


def first_offset(buf: bytes | bytearray | memoryview) -> int:
    return ENTRY_HEADER.unpack_from(buf, 0)[0]


def last_offset(buf: bytes | bytearray | memoryview) -> int:
    """Offset of the last entry of whole entries: the offset of the first plus their count - 1."""
    count = 0
    position = 0
    size = len(buf)
    first = ENTRY_HEADER.unpack_from(buf, 0)[0]
    while position < size:
        position += HEADER_SIZE + ENTRY_HEADER.unpack_from(buf, position)[3]
        count += 1
    return first + count - 1


def valid_prefix(buf: bytes | bytearray | memoryview) -> tuple[int, int]:
    """(length in bytes, number of entries) of the longest run of whole, intact entries."""
    length = count = 0
    try:
        for *_, end in scan(buf):
            length = end
            count += 1
    except CorruptEntry:
        pass
    return length, count


def decode_entries(buf: bytes | bytearray | memoryview, check_crc: bool = True) -> list[Entry]:
    """Decode whole entries, raising CorruptEntry unless every byte of ``buf`` is intact.

    ``check_crc=False`` is for bytes whose checksums were just checked.
    """
    view = memoryview(buf)
    entries = []
    for offset, leader_epoch, timestamp, start, end in scan(view, check_crc):
        key, value, header_block = _body_parts(view, start + HEADER_SIZE, end, offset)
        headers = {} if header_block is None else decode_header_block(header_block, offset)
        entries.append(Entry(offset, timestamp, leader_epoch, None if key is None else bytes(key), bytes(value),
                             dict(headers)))
    return entries


def header_blocks_holding(buf: bytes, name: bytes) -> Iterator[tuple[int, int, bytes]]:
    """(offset, timestamp, header block) of each entry of ``buf`` (whole entries, their CRCs checked
    already) whose bytes hold ``name``: what a search for one header needs, without decoding the
    entries that cannot have it."""
    view = memoryview(buf)
    for offset, _, timestamp, start, end in walked_prefix(buf, check_crc=False):
        if buf.find(name, start, end) != -1:
            block = _body_parts(view, start + HEADER_SIZE, end, offset)[2]
            if block is not None:
                yield offset, timestamp, block


def _body_parts(
    view: memoryview, position: int, end: int, offset: int
) -> tuple[memoryview | None, memoryview, bytes | None]:
    # scan() has checked the body holds at least the key length, value length and header count.
    key_length = _INT32.unpack_from(view, position)[0]
    position += 4
    if key_length == _NO_KEY:
        key = None
    elif 0 <= key_length <= end - position - 6:
        key = view[position : position + key_length]
        position += key_length
    else:
        raise CorruptEntry(f"entry at offset {offset} has a bad key length {key_length}")
    value_length = _UINT32.unpack_from(view, position)[0]
    position += 4
    if value_length > end - position - 2:
        raise CorruptEntry(
            f"entry at offset {offset}: value of {value_length} bytes overruns the body"
        )
    value = view[position : position + value_length]
    position += value_length
    if view[position] == 0 and view[position + 1] == 0:  # no headers
        if position + 2 != end:
            raise CorruptEntry(f"entry at offset {offset} has {end - position - 2} bytes after its value")
        return key, value, None
    # The header block runs to the end of the body; captured messages of one subject share it.
    return key, value, bytes(view[position:end])


def decode_header_block(block: bytes, offset: int) -> dict[str, bytes]:
    """The headers of an entry's header block (count, then name/value pairs); the
    result is shared between entries with the same block: not to be changed."""
    headers = _decoded_header_blocks.get(block)
    if headers is None:
        view = memoryview(block)
        headers = _decode_headers(view, 2, len(block), offset, _UINT16.unpack_from(view, 0)[0])
        if len(_decoded_header_blocks) >= _HEADER_BLOCK_CACHE_SIZE:
            _decoded_header_blocks.clear()
        _decoded_header_blocks[block] = headers
    return headers


_HEADER_BLOCK_CACHE_SIZE = 4096
_decoded_header_blocks: dict[bytes, dict[str, bytes]] = {}


def _decode_headers(
    view: memoryview, position: int, end: int, offset: int, count: int
) -> dict[str, bytes]:
    headers = {}
    for _ in range(count):
        name_length = _read_length(view, _UINT16, position, end, offset, "header name length")
        position += 2
        raw_name = _take(view, position, name_length, end, offset, "header name")
        position += name_length
        value_length = _read_length(view, _UINT32, position, end, offset, "header value length")
        position += 4
        header_value = _take(view, position, value_length, end, offset, "header value")
        position += value_length
        try:
            headers[raw_name.decode("utf-8")] = header_value
        except UnicodeDecodeError as error:
            raise CorruptEntry(f"entry at offset {offset} has a non-UTF-8 header name") from error
    if position != end:
        raise CorruptEntry(
            f"entry at offset {offset} has {end - position} bytes after its last header"
        )
    return headers


def _read_length(
    view: memoryview, field_struct: struct.Struct, position: int, end: int, offset: int, what: str
) -> int:
    if position + field_struct.size > end:
        raise CorruptEntry(f"entry at offset {offset} ends inside its {what}")
    return field_struct.unpack_from(view, position)[0]


def _take(view: memoryview, position: int, length: int, end: int, offset: int, what: str) -> bytes:
    if position + length > end:
        raise CorruptEntry(
            f"entry at offset {offset}: {what} of {length} bytes overruns the entry body"
        )
    return bytes(view[position : position + length])
