"""gRPC's framing of messages in an HTTP/2 stream, and the values of its headers: pure.

Each message is a 5-byte prefix (a compressed flag, then the length as uint32 big-endian) and the
message bytes. ``MessageReader`` takes DATA payloads as they arrive and returns whole messages;
``frame`` does the reverse for many messages at once, which is what lets a streaming call put a
hundred small messages in one DATA frame.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Iterable
from urllib.parse import quote, unquote, unquote_to_bytes

from bascule.h2grpc.status import Status

PREFIX = struct.Struct(">BI")
PREFIX_SIZE = PREFIX.size

# grpc-timeout: at most 8 digits and a unit (the gRPC over HTTP/2 spec).
_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
# Printable ASCII but "%" passes; the rest is percent-encoded (grpc-message, the spec's rule).
MAX_STATUS_MESSAGE = 4096
_MESSAGE_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")


class FramingError(Exception):
    """A message the peer sent that breaks gRPC's rules; ``status`` is the code to end the call with."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status


RESOURCE_EXHAUSTED = Status.RESOURCE_EXHAUSTED
INTERNAL = Status.INTERNAL


class MessageReader:
    """Whole messages out of a call's DATA payloads, each at most ``max_bytes`` once decompressed."""

    __slots__ = ("_buffer", "_max_bytes", "_compression")

    def __init__(self, max_bytes: int, compression: str | None = None) -> None:
        self._buffer = bytearray()
        self._max_bytes = max_bytes
        self._compression = compression  # the call's grpc-encoding; None: identity

    def feed(self, data: bytes) -> list[bytes]:
        """The messages ``data`` completes; FramingError for one too large or wrongly compressed."""
        buffer = self._buffer
        if not buffer and len(data) >= PREFIX_SIZE:
            flag, length = PREFIX.unpack_from(data)
            if len(data) == PREFIX_SIZE + length and not flag and length <= self._max_bytes:
                return [data[PREFIX_SIZE:]]  # the common case: one whole message per DATA frame
        buffer += data
        messages = []
        position = 0
        while len(buffer) - position >= PREFIX_SIZE:
            flag, length = PREFIX.unpack_from(buffer, position)
            if length > self._max_bytes:
                raise FramingError(
                    RESOURCE_EXHAUSTED, f"received message larger than max ({length} vs. {self._max_bytes})"
                )
            end = position + PREFIX_SIZE + length
            if len(buffer) < end:
                break
            message = bytes(buffer[position + PREFIX_SIZE : end])
            messages.append(self._decompressed(message) if flag else message)
            position = end
        del buffer[:position]
        return messages

    @property
    def pending(self) -> bool:
        """Whether part of a message is still waiting for the rest of it."""
        return bool(self._buffer)

    @property
    def buffered(self) -> int:
        """Bytes of a message still waiting for the rest of it."""
        return len(self._buffer)

    def _decompressed(self, message: bytes) -> bytes:
        if self._compression != "gzip":
            raise FramingError(
                INTERNAL, f"compressed message without a supported grpc-encoding ({self._compression or 'identity'})"
            )
        return gunzip(message, self._max_bytes)


def gunzip(data: bytes, max_bytes: int) -> bytes:
    """``data`` decompressed, refused (RESOURCE_EXHAUSTED) beyond ``max_bytes``: a small bomb
    must not become a large allocation."""
    message = bytearray()
    while True:  # a gzip stream may hold several members (RFC 1952), each decompressed in turn
        inflater = zlib.decompressobj(wbits=31)
        try:
            message += inflater.decompress(data, max_bytes + 1 - len(message))
        except zlib.error as error:
            raise FramingError(INTERNAL, f"could not decompress a gzip message: {error}") from error
        if len(message) > max_bytes:
            raise FramingError(RESOURCE_EXHAUSTED, f"decompressed message larger than max ({max_bytes})")
        if not inflater.eof:
            raise FramingError(INTERNAL, "truncated gzip message")
        data = inflater.unused_data
        if not data:
            return bytes(message)


def frame(messages: Iterable[bytes]) -> bytes:
    """The messages, each with its prefix, uncompressed, as one run of bytes."""
    pack = PREFIX.pack
    parts = []
    for message in messages:
        parts.append(pack(0, len(message)))
        parts.append(message)
    return b"".join(parts)


def frame_gzip(messages: Iterable[bytes]) -> bytes:
    pack = PREFIX.pack
    parts = []
    for message in messages:
        compressed = gzip.compress(message, compresslevel=6, mtime=0)
        parts.append(pack(1, len(compressed)))
        parts.append(compressed)
    return b"".join(parts)


def parse_timeout(value: str) -> float:
    """Seconds from a grpc-timeout value ("100m", "5S"); ValueError if it is not one."""
    digits, unit = value[:-1], value[-1:]
    if not 1 <= len(digits) <= 8 or not (digits.isascii() and digits.isdigit()) or unit not in _TIMEOUT_UNITS:
        raise ValueError(f"invalid grpc-timeout {value!r}")
    return int(digits) * _TIMEOUT_UNITS[unit]


def encode_status_message(text: str) -> str:
    """``text`` percent-encoded for grpc-message, cut to a size any client's header limit takes."""
    encoded = quote(text, safe=_MESSAGE_SAFE)
    if len(encoded) > MAX_STATUS_MESSAGE:
        encoded = encoded[:MAX_STATUS_MESSAGE]
        cut = encoded.rfind("%", len(encoded) - 2)
        if cut >= 0:
            encoded = encoded[:cut]  # not half an escape
        # Nor half a character: what is left decodes as UTF-8, the cut one dropped.
        whole = unquote_to_bytes(encoded).decode("utf-8", errors="ignore")
        encoded = quote(whole, safe=_MESSAGE_SAFE)
    return encoded


def decode_status_message(value: str) -> str:
    return unquote(value, errors="replace")


def accepts_gzip(accept_encoding: str | None) -> bool:
    return accept_encoding is not None and "gzip" in (part.strip() for part in accept_encoding.split(","))
