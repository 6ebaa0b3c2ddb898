"""The server side of one gRPC-over-HTTP/2 connection, sans I/O (h11's style).

Bytes from the socket go in (``receive``), call events come out; what the handlers answer goes in
(``send_messages``, ``send_framed``, ``finish``), bytes for the socket come out (``data_to_send``).
Messages queued for a stream are held until ``flush`` moves them into DATA frames as large as the
peer allows, so a streaming call that produced a hundred messages since the last flush sends them
in one or two frames. Nothing here reads a clock, a socket or a task: the shell does.

HTTP/2 framing (RFC 9113) is done here rather than by python-hyper's ``h2``: h2 spends about 11 us
of CPU per DATA frame it receives (measured: benchmarks/RESULTS.md), and a PublishAsync client
sends one frame per message, which put h2 alone above the whole per-message budget. Only what a
gRPC server needs is implemented: no server push, no priorities (parsed and ignored). HPACK is
python-hyper's ``hpack``. Every rule a client can break ends its stream (RST_STREAM) or the
connection (GOAWAY with the RFC's error code), never the server.
"""

from __future__ import annotations

import base64
import binascii
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import hpack
import hpack.exceptions

from bascule.h2grpc.messages import (
    FramingError,
    MessageReader,
    accepts_gzip,
    encode_status_message,
    frame,
    frame_gzip,
    parse_timeout,
)
from bascule.h2grpc.status import Status

Metadata = tuple[tuple[str, str | bytes], ...]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# Windows large enough that flow control never stalls a fast peer on a loopback or LAN link, small
# enough that a connection's buffered uploads stay bounded.
STREAM_WINDOW = 1 << 20
CONNECTION_WINDOW = 16 << 20
MAX_FRAME = 1 << 20  # what this side accepts; what it sends is what the peer accepts
MAX_HEADER_LIST = 64 << 10
HEADERS_COST = 32  # frames a HEADERS frame counts as, against a receive's share
_DEFAULT_WINDOW = 65535
_DEFAULT_FRAME = 16384
_MAX_WINDOW = (1 << 31) - 1
_SUPPORTED_ENCODINGS = ("identity", "gzip")
_RESERVED_HEADERS = frozenset({
    "content-type", "te", "grpc-timeout", "grpc-encoding", "grpc-accept-encoding", "user-agent",
})

# Frame types and flags.
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
# Error codes.
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 0x5, 0x6, 0x7, 0x8, 0x9
ENHANCE_YOUR_CALM = 0xB
# Settings.
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS = 0x1, 0x2, 0x3
INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = 0x4, 0x5, 0x6

_FRAME_HEADER = struct.Struct(">BHBBI")  # length as 8 + 16 bits, type, flags, stream id
_SETTING = struct.Struct(">HI")
_UINT32 = struct.Struct(">I")
_GOAWAY = struct.Struct(">II")


class _ConnectionError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(slots=True)
class CallStarted:
    stream_id: int
    method: str
    metadata: Metadata
    timeout: float | None  # seconds, from grpc-timeout


@dataclass(slots=True)
class MessagesReceived:
    stream_id: int
    messages: list[bytes]
    flow_size: int  # what to ``acknowledge`` once they are consumed


@dataclass(slots=True)
class RequestsEnded:
    """The client sent its last message."""

    stream_id: int


@dataclass(slots=True)
class CallCancelled:
    """The call is over for the handler: the client reset it, or it broke the rules (then the
    status was already sent)."""

    stream_id: int


@dataclass(slots=True)
class ConnectionEnded:
    reason: str


@dataclass(slots=True)
class PingAcked:
    pass


Event = CallStarted | MessagesReceived | RequestsEnded | CallCancelled | ConnectionEnded | PingAcked


@dataclass(slots=True)
class _Stream:
    reader: MessageReader
    compress_responses: bool
    send_window: int
    receive_window: int = STREAM_WINDOW
    unacknowledged: int = 0  # consumed bytes not yet given back in a WINDOW_UPDATE
    remote_closed: bool = False  # the client sent END_STREAM
    outbound: bytearray = field(default_factory=bytearray)
    headers_sent: bool = False
    trailers: list[tuple[str, str]] | None = None  # to send once ``outbound`` is empty


class GrpcConnection:
    """One HTTP/2 connection's gRPC calls, sans I/O.

    Bounds: at most ``max_concurrent_calls`` calls; a header block of at most MAX_HEADER_LIST bytes,
    checked before it is decoded; incoming data within the flow-control windows; parts of messages
    waiting for the rest of them at most ``max_buffered_input`` bytes over all calls (the call whose
    part would go beyond it ends RESOURCE_EXHAUSTED). What it queues to send is ``queued`` (the
    shell holds it to a budget); the frames that cost it work without being calls (PINGs and
    SETTINGS to answer, resets, empty DATA frames) are counted in ``costly_frames`` for the shell
    to judge, and ``calm_down`` ends a connection that abuses them (GOAWAY ENHANCE_YOUR_CALM).
    A receive handles at most ``frames_per_receive`` frames (a HEADERS frame counting as
    HEADERS_COST), so that the shell can share its turns among connections.
    """

    def __init__(self, max_message_bytes: int, max_buffered_input: int | None = None,
                 frames_per_receive: int | None = None, max_concurrent_calls: int = 1000) -> None:
        self._max_message_bytes = max_message_bytes
        self._max_concurrent_calls = max_concurrent_calls
        self._frames_per_receive = frames_per_receive or 1 << 62
        self.input_pending = False  # whole frames left unread by the last receive, for the next
        # One message of the largest size must always fit, with a window of the next one's start.
        self._max_buffered_input = max_buffered_input or max_message_bytes + STREAM_WINDOW
        self.queued = 0  # response bytes queued over all calls, not yet framed
        self.buffered_input = 0  # bytes of incomplete messages over all calls
        self.costly_frames = 0
        self._streams: dict[int, _Stream] = {}
        self._ready: set[int] = set()  # streams with something to flush
        self._out: list[bytes] = []
        self._buffer = bytearray()
        self._preface_seen = False
        self._settings_seen = False
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = MAX_HEADER_LIST
        self._encoder = hpack.Encoder()
        self._headers_in_progress: tuple[int, int, bytearray] | None = None  # (stream, flags, block)
        self._peer_window = _DEFAULT_WINDOW  # the peer's INITIAL_WINDOW_SIZE, for new streams
        self._peer_max_frame = _DEFAULT_FRAME
        self._send_window = _DEFAULT_WINDOW  # connection level
        self._receive_window = CONNECTION_WINDOW
        self._unacknowledged = 0
        self.highest_stream_id = 0
        self.closed = False

    # --- the connection ----------------------------------------------------------------------

    def initiate(self) -> None:
        settings = b"".join(_SETTING.pack(code, value) for code, value in (
            (INITIAL_WINDOW_SIZE, STREAM_WINDOW), (MAX_FRAME_SIZE, MAX_FRAME),
            (MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST), (MAX_CONCURRENT_STREAMS, self._max_concurrent_calls),
            (ENABLE_PUSH, 0),
        ))
        self._frame(SETTINGS, 0, 0, settings)
        self._frame(WINDOW_UPDATE, 0, 0, _UINT32.pack(CONNECTION_WINDOW - _DEFAULT_WINDOW))

    def data_to_send(self) -> bytes:
        data = b"".join(self._out)
        self._out.clear()
        return data

    def ping(self, opaque: bytes) -> None:
        self._frame(PING, 0, 0, opaque[:8].ljust(8, b"\0"))

    def go_away(self) -> None:
        """Tell the client to open no more calls here; those started go on (graceful shutdown)."""
        if not self.closed:
            self._frame(GOAWAY, 0, 0, _GOAWAY.pack(self.highest_stream_id, NO_ERROR))

    def active_calls(self) -> int:
        return len(self._streams)

    def calm_down(self, reason: str) -> None:
        """End the connection for abusing the protocol (GOAWAY ENHANCE_YOUR_CALM)."""
        self._fail(ENHANCE_YOUR_CALM, reason)

    def _drop(self, stream_id: int) -> _Stream | None:
        """Forget a stream, and what it had queued and buffered."""
        stream = self._streams.pop(stream_id, None)
        if stream is not None:
            self._ready.discard(stream_id)
            self.queued -= len(stream.outbound)
            self.buffered_input -= stream.reader.buffered
        return stream

    def receive(self, data: bytes = b"") -> list[Event]:
        """The events of the frames in ``data`` and those buffered before it: of at most
        ``frames_per_receive`` frames, the rest (``input_pending``) left for the next call. A HEADERS
        frame counts as HEADERS_COST frames: a call costs its header block's decoding and a handler."""
        self.input_pending = False
        if self.closed:
            return []
        events: list[Event] = []
        buffer = self._buffer
        buffer += data
        try:
            position = 0
            if not self._preface_seen:
                if not PREFACE.startswith(bytes(buffer[:len(PREFACE)])):
                    raise _ConnectionError(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                if len(buffer) < len(PREFACE):
                    return events
                self._preface_seen = True
                position = len(PREFACE)
            end = len(buffer)
            frames = 0
            while end - position >= 9:
                if frames >= self._frames_per_receive:
                    self.input_pending = True
                    break
                high, low, frame_type, flags, stream_id = _FRAME_HEADER.unpack_from(buffer, position)
                frames += HEADERS_COST if frame_type == HEADERS else 1
                length = high << 16 | low
                if length > MAX_FRAME:
                    raise _ConnectionError(FRAME_SIZE_ERROR, f"a frame of {length} bytes exceeds {MAX_FRAME}")
                if end - position - 9 < length:
                    break
                payload = bytes(buffer[position + 9:position + 9 + length])
                position += 9 + length
                self._dispatch(frame_type, flags, stream_id & 0x7FFFFFFF, payload, events)
            del buffer[:position]
        except _ConnectionError as error:
            self._fail(error.code, str(error))
            events.append(ConnectionEnded(f"HTTP/2 error: {error}"))
        return events

    def _fail(self, code: int, message: str) -> None:
        if not self.closed:
            self._frame(GOAWAY, 0, 0, _GOAWAY.pack(self.highest_stream_id, code) + message[:200].encode())
            self.closed = True
        self._buffer.clear()

    def _frame(self, frame_type: int, flags: int, stream_id: int, payload: bytes) -> None:
        length = len(payload)
        self._out.append(_FRAME_HEADER.pack(length >> 16, length & 0xFFFF, frame_type, flags, stream_id))
        self._out.append(payload)

    # --- frames in ------------------------------------------------------------------------------

    def _dispatch(self, frame_type: int, flags: int, stream_id: int, payload: bytes, events: list[Event]) -> None:
        if not self._settings_seen and frame_type != SETTINGS:
            raise _ConnectionError(PROTOCOL_ERROR, "the first frame of a connection must be SETTINGS")
        if self._headers_in_progress is not None and frame_type != CONTINUATION:
            raise _ConnectionError(PROTOCOL_ERROR, "a header block was interrupted")
        if frame_type == DATA:
            self._data(flags, stream_id, payload, events)
        elif frame_type == HEADERS:
            self._headers(flags, stream_id, payload, events)
        elif frame_type == CONTINUATION:
            self._continuation(flags, stream_id, payload, events)
        elif frame_type == WINDOW_UPDATE:
            self._window_update(stream_id, payload, events)
        elif frame_type == SETTINGS:
            self._settings(flags, stream_id, payload)
        elif frame_type == PING:
            self._ping(flags, stream_id, payload, events)
        elif frame_type == RST_STREAM:
            if stream_id == 0 or len(payload) != 4:
                raise _ConnectionError(PROTOCOL_ERROR if stream_id == 0 else FRAME_SIZE_ERROR, "bad RST_STREAM")
            self.costly_frames += 1
            if self._drop(stream_id) is not None:
                events.append(CallCancelled(stream_id))
        elif frame_type == GOAWAY:
            if stream_id != 0 or len(payload) < 8:
                raise _ConnectionError(PROTOCOL_ERROR, "bad GOAWAY")
            # The client opens no more calls; those it has go on until the socket closes.
        elif frame_type == PRIORITY:
            if stream_id == 0 or len(payload) != 5:
                raise _ConnectionError(PROTOCOL_ERROR, "bad PRIORITY")
        elif frame_type == PUSH_PROMISE:
            raise _ConnectionError(PROTOCOL_ERROR, "a client may not push")
        # Unknown frame types are ignored, as the RFC requires.

    def _data(self, flags: int, stream_id: int, payload: bytes, events: list[Event]) -> None:
        if stream_id == 0:
            raise _ConnectionError(PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        if not size and not flags & END_STREAM:
            self.costly_frames += 1
        if size > self._receive_window:
            raise _ConnectionError(FLOW_CONTROL_ERROR, "DATA beyond the connection's window")
        self._receive_window -= size
        stream = self._streams.get(stream_id)
        if stream is None:
            if stream_id > self.highest_stream_id:
                raise _ConnectionError(PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            self._give_back(size)  # a call already over: only the connection's window matters
            return
        if stream.remote_closed or size > stream.receive_window:
            self._stream_error(stream_id, STREAM_CLOSED if stream.remote_closed else FLOW_CONTROL_ERROR, events)
            self._give_back(size)
            return
        stream.receive_window -= size
        data = _unpadded(payload, flags) if flags & PADDED else payload
        reader = stream.reader
        buffered = reader.buffered
        try:
            messages = reader.feed(data) if data else []
        except FramingError as error:
            self.finish(stream_id, error.status, str(error))
            self._give_back(size)
            events.append(CallCancelled(stream_id))
            return
        finally:
            self.buffered_input += reader.buffered - buffered
        if self.buffered_input > self._max_buffered_input:
            self.buffered_input -= reader.buffered
            stream.reader = MessageReader(0)  # what it held goes, and nothing more is taken
            self.finish(stream_id, Status.RESOURCE_EXHAUSTED, "incomplete messages over the connection's budget")
            self._give_back(size)
            events.append(CallCancelled(stream_id))
            return
        if messages:
            last = events[-1] if events else None
            if isinstance(last, MessagesReceived) and last.stream_id == stream_id:
                # Frames of one stream in a row (a client writing a request per frame): one event.
                last.messages += messages
                last.flow_size += size
            else:
                events.append(MessagesReceived(stream_id, messages, size))
        else:
            self.acknowledge(stream_id, size)  # part of a message, or padding: the rest must come
        if flags & END_STREAM:
            self._remote_end(stream_id, stream, events)

    def _headers(self, flags: int, stream_id: int, payload: bytes, events: list[Event]) -> None:
        if stream_id == 0:
            raise _ConnectionError(PROTOCOL_ERROR, "HEADERS on stream 0")
        block = payload
        if flags & PADDED:
            block = _unpadded(block, flags)
        if flags & PRIORITY_FLAG:
            if len(block) < 5:
                raise _ConnectionError(FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            block = block[5:]
        if len(block) > MAX_HEADER_LIST:
            raise _ConnectionError(ENHANCE_YOUR_CALM, "a header block beyond the header list size allowed")
        if flags & END_HEADERS:
            self._header_block(stream_id, flags, block, events)
        else:
            self._headers_in_progress = (stream_id, flags, bytearray(block))

    def _continuation(self, flags: int, stream_id: int, payload: bytes, events: list[Event]) -> None:
        in_progress = self._headers_in_progress
        if in_progress is None or in_progress[0] != stream_id:
            raise _ConnectionError(PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        block = in_progress[2]
        block += payload
        if len(block) > MAX_HEADER_LIST:
            raise _ConnectionError(ENHANCE_YOUR_CALM, "a header block beyond the header list size allowed")
        if flags & END_HEADERS:
            self._headers_in_progress = None
            self._header_block(stream_id, in_progress[1], bytes(block), events)

    def _header_block(self, stream_id: int, flags: int, block: bytes, events: list[Event]) -> None:
        try:
            headers = cast(list[tuple[str, str]], self._decoder.decode(block))  # str: not raw
        except hpack.exceptions.OversizedHeaderListError:
            # The decoder's table is now unknown: the connection cannot go on.
            raise _ConnectionError(COMPRESSION_ERROR, "header list too large") from None
        except (hpack.exceptions.HPACKError, UnicodeDecodeError, ValueError) as error:
            raise _ConnectionError(COMPRESSION_ERROR, f"undecodable header block: {error}") from None
        stream = self._streams.get(stream_id)
        if stream is not None:  # trailers from the client: they may only end the stream, once
            if stream.remote_closed or not flags & END_STREAM:
                self._stream_error(stream_id, STREAM_CLOSED if stream.remote_closed else PROTOCOL_ERROR, events)
                return
            self._remote_end(stream_id, stream, events)
            return
        if stream_id % 2 == 0:
            raise _ConnectionError(PROTOCOL_ERROR, f"HEADERS on stream {stream_id}, which a client cannot open")
        if stream_id <= self.highest_stream_id:
            return  # a stream this side has closed: frames crossing its end are ignored (RFC 9113 5.1)
        self.highest_stream_id = stream_id
        if len(self._streams) >= self._max_concurrent_calls:
            self._reset(stream_id, REFUSED_STREAM)
            return
        self._request(stream_id, flags, headers, events)

    def _request(self, stream_id: int, flags: int, headers: list[tuple[str, str]], events: list[Event]) -> None:
        pseudo: dict[str, str] = {}
        values: dict[str, str] = {}
        for name, value in headers:
            if name.startswith(":"):
                pseudo[name] = value
            else:
                values.setdefault(name, value)
        if any(name != name.lower() for name in values):
            self._reset(stream_id, PROTOCOL_ERROR)  # HTTP/2 header names are lowercase
            return
        content_type = values.get("content-type", "")
        if pseudo.get(":method") != "POST" or not _is_grpc(content_type):
            # Not gRPC at all: an HTTP answer, as the spec says (415 for the wrong content type).
            status = "405" if pseudo.get(":method") != "POST" else "415"
            self._send_headers(stream_id, [(":status", status)], end_stream=True)
            self._ignore_rest(stream_id, flags)
            return
        encoding = values.get("grpc-encoding", "identity")
        if encoding not in _SUPPORTED_ENCODINGS:
            self._refuse(stream_id, flags, Status.UNIMPLEMENTED, f"grpc-encoding {encoding!r} is not supported",
                         [("grpc-accept-encoding", ",".join(_SUPPORTED_ENCODINGS))])
            return
        timeout = None
        if "grpc-timeout" in values:
            try:
                timeout = parse_timeout(values["grpc-timeout"])
            except ValueError as error:
                self._refuse(stream_id, flags, Status.INTERNAL, str(error))
                return
        try:
            metadata = tuple(_metadata(name, value) for name, value in headers
                             if not name.startswith(":") and name not in _RESERVED_HEADERS)
        except (ValueError, binascii.Error) as error:
            self._refuse(stream_id, flags, Status.INTERNAL, f"bad binary metadata: {error}")
            return
        compressed = encoding == "gzip"
        stream = _Stream(
            MessageReader(self._max_message_bytes, "gzip" if compressed else None),
            compress_responses=compressed and accepts_gzip(values.get("grpc-accept-encoding")),
            send_window=self._peer_window,
        )
        self._streams[stream_id] = stream
        events.append(CallStarted(stream_id, pseudo.get(":path", ""), metadata, timeout))
        if flags & END_STREAM:
            self._remote_end(stream_id, stream, events)

    def _stream_error(self, stream_id: int, code: int, events: list[Event]) -> None:
        self._reset(stream_id, code)
        self._drop(stream_id)
        events.append(CallCancelled(stream_id))

    def _refuse(self, stream_id: int, flags: int, status: Status, message: str,
                extra: Sequence[tuple[str, str]] = ()) -> None:
        self._send_headers(stream_id, _trailers_only(status, message, extra), end_stream=True)
        self._ignore_rest(stream_id, flags)

    def _ignore_rest(self, stream_id: int, flags: int) -> None:
        if not flags & END_STREAM:
            self._reset(stream_id, NO_ERROR)  # answered: the client need not send the rest

    def _remote_end(self, stream_id: int, stream: _Stream, events: list[Event]) -> None:
        stream.remote_closed = True
        if stream.reader.pending:
            self.finish(stream_id, Status.INTERNAL, "the request ended in the middle of a message")
            events.append(CallCancelled(stream_id))
            return
        events.append(RequestsEnded(stream_id))

    def _window_update(self, stream_id: int, payload: bytes, events: list[Event]) -> None:
        if len(payload) != 4:
            raise _ConnectionError(FRAME_SIZE_ERROR, "WINDOW_UPDATE of the wrong size")
        increment = _UINT32.unpack(payload)[0] & 0x7FFFFFFF
        if stream_id == 0:
            if increment == 0:
                raise _ConnectionError(PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > _MAX_WINDOW:
                raise _ConnectionError(FLOW_CONTROL_ERROR, "the connection's window overflowed")
            self._ready.update(sid for sid, stream in self._streams.items() if stream.outbound or stream.trailers)
            return
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        if increment == 0 or stream.send_window + increment > _MAX_WINDOW:
            self._stream_error(stream_id, PROTOCOL_ERROR if increment == 0 else FLOW_CONTROL_ERROR, events)
            return
        stream.send_window += increment
        self._ready.add(stream_id)

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != 0:
            raise _ConnectionError(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise _ConnectionError(FRAME_SIZE_ERROR, "a SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise _ConnectionError(FRAME_SIZE_ERROR, "SETTINGS of the wrong size")
        self.costly_frames += 1
        self._settings_seen = True
        for position in range(0, len(payload), 6):
            code, value = _SETTING.unpack_from(payload, position)
            if code == INITIAL_WINDOW_SIZE:
                if value > _MAX_WINDOW:
                    raise _ConnectionError(FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE beyond 2^31-1")
                delta, self._peer_window = value - self._peer_window, value
                for stream in self._streams.values():
                    stream.send_window += delta
                self._ready.update(self._streams)
            elif code == MAX_FRAME_SIZE:
                if not _DEFAULT_FRAME <= value <= (1 << 24) - 1:
                    raise _ConnectionError(PROTOCOL_ERROR, f"MAX_FRAME_SIZE {value} out of range")
                self._peer_max_frame = value
            elif code == HEADER_TABLE_SIZE:
                self._encoder.header_table_size = min(value, 1 << 16)
            elif code == ENABLE_PUSH and value > 1:
                raise _ConnectionError(PROTOCOL_ERROR, "ENABLE_PUSH must be 0 or 1")
        self._frame(SETTINGS, ACK, 0, b"")

    def _ping(self, flags: int, stream_id: int, payload: bytes, events: list[Event]) -> None:
        if stream_id != 0 or len(payload) != 8:
            raise _ConnectionError(PROTOCOL_ERROR if stream_id else FRAME_SIZE_ERROR, "bad PING")
        if flags & ACK:
            events.append(PingAcked())
        else:
            self.costly_frames += 1
            self._frame(PING, ACK, 0, payload)

    # --- flow control of what comes in ---------------------------------------------------------

    def acknowledge(self, stream_id: int, size: int) -> None:
        """Reopen the windows by ``size`` bytes the handler has consumed (WINDOW_UPDATEs go out
        once a quarter of a window is owed, not per message)."""
        if size <= 0:
            return
        stream = self._streams.get(stream_id)
        if stream is not None and not stream.remote_closed:
            stream.unacknowledged += size
            if stream.unacknowledged >= STREAM_WINDOW // 4:
                self._frame(WINDOW_UPDATE, 0, stream_id, _UINT32.pack(stream.unacknowledged))
                stream.receive_window += stream.unacknowledged
                stream.unacknowledged = 0
        self._give_back(size)

    def _give_back(self, size: int) -> None:
        self._unacknowledged += size
        if self._unacknowledged >= CONNECTION_WINDOW // 4:
            self._frame(WINDOW_UPDATE, 0, 0, _UINT32.pack(self._unacknowledged))
            self._receive_window += self._unacknowledged
            self._unacknowledged = 0

    # --- answering calls -----------------------------------------------------------------------

    def send_messages(self, stream_id: int, messages: list[bytes]) -> None:
        """Queue serialized response messages (sent by ``flush``)."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.trailers is not None:
            return  # the call is over (reset, or refused for breaking the rules)
        outbound = stream.outbound
        before = len(outbound)
        outbound += frame_gzip(messages) if stream.compress_responses else frame(messages)
        self.queued += len(outbound) - before
        self._ready.add(stream_id)

    def send_framed(self, stream_id: int, data: bytes) -> None:
        """Queue response messages the handler framed itself (each with its 5-byte prefix)."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.trailers is not None:
            return
        before = len(stream.outbound)
        if stream.compress_responses:
            stream.outbound += frame_gzip(MessageReader(len(data)).feed(data))
        else:
            stream.outbound += data
        self.queued += len(stream.outbound) - before
        self._ready.add(stream_id)

    def pending_bytes(self, stream_id: int) -> int:
        stream = self._streams.get(stream_id)
        return len(stream.outbound) if stream is not None else 0

    def finish(self, stream_id: int, status: Status, message: str = "") -> None:
        """End the call with ``status`` once what is queued for it is sent."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.trailers is not None:
            return
        stream.trailers = [("grpc-status", str(int(status)))]
        if message:
            stream.trailers.append(("grpc-message", encode_status_message(message)))
        self._ready.add(stream_id)

    def reset(self, stream_id: int) -> None:
        """Abandon the call (RST_STREAM CANCEL): for a call whose status cannot be sent."""
        if self._drop(stream_id) is not None:
            self._reset(stream_id, CANCEL)

    def _reset(self, stream_id: int, code: int) -> None:
        self._frame(RST_STREAM, 0, stream_id, _UINT32.pack(code))

    def flush(self) -> None:
        """Move queued messages and trailers into frames, as far as flow control allows."""
        if self.closed:
            return
        for stream_id in list(self._ready):
            stream = self._streams.get(stream_id)
            if stream is None or self._flush_stream(stream_id, stream):
                self._ready.discard(stream_id)

    def _flush_stream(self, stream_id: int, stream: _Stream) -> bool:
        """True once nothing is left to send for the stream now."""
        outbound = stream.outbound
        if outbound:
            if not stream.headers_sent:
                self._send_headers(stream_id, _response_headers(stream.compress_responses))
                stream.headers_sent = True
            sent = 0
            total = len(outbound)
            while sent < total:
                size = min(self._send_window, stream.send_window, self._peer_max_frame, total - sent)
                if size <= 0:
                    break
                self._frame(DATA, 0, stream_id, bytes(outbound[sent:sent + size]))
                self._send_window -= size
                stream.send_window -= size
                sent += size
            del outbound[:sent]
            self.queued -= sent
            if outbound:
                return False  # the rest waits for a WINDOW_UPDATE
        trailers = stream.trailers
        if trailers is not None:
            if stream.headers_sent:
                self._send_headers(stream_id, trailers, end_stream=True)
            else:
                self._send_headers(stream_id, _trailers_only_headers(trailers), end_stream=True)
            self._drop(stream_id)
            if not stream.remote_closed:
                self._reset(stream_id, NO_ERROR)  # answered: the client need not send the rest
        return True

    def _send_headers(self, stream_id: int, headers: list[tuple[str, str]], end_stream: bool = False) -> None:
        block = self._encoder.encode(headers)
        limit = self._peer_max_frame
        flags = END_STREAM if end_stream else 0
        if len(block) <= limit:
            self._frame(HEADERS, flags | END_HEADERS, stream_id, block)
            return
        self._frame(HEADERS, flags, stream_id, block[:limit])
        for start in range(limit, len(block), limit):
            last = start + limit >= len(block)
            self._frame(CONTINUATION, END_HEADERS if last else 0, stream_id, block[start:start + limit])


def _is_grpc(content_type: str) -> bool:
    """application/grpc, or application/grpc+<codec> or ;<parameters> (not grpc-web or the like)."""
    return content_type == "application/grpc" or content_type.startswith(("application/grpc+", "application/grpc;"))


def _metadata(name: str, value: str) -> tuple[str, str | bytes]:
    """A header as gRPC metadata: binary ("-bin") values base64-decoded, as grpc.aio gives them."""
    if name.endswith("-bin"):
        return name, base64.b64decode(value + "=" * (-len(value) % 4), validate=True)
    return name, value


def _unpadded(payload: bytes, flags: int) -> bytes:
    if not payload:
        raise _ConnectionError(PROTOCOL_ERROR, "a padded frame without its pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise _ConnectionError(PROTOCOL_ERROR, "padding as long as the frame")
    return payload[1:len(payload) - pad]


def _response_headers(compressed: bool) -> list[tuple[str, str]]:
    headers = [(":status", "200"), ("content-type", "application/grpc")]
    if compressed:
        headers.append(("grpc-encoding", "gzip"))
    headers.append(("grpc-accept-encoding", ",".join(_SUPPORTED_ENCODINGS)))
    return headers


def _trailers_only_headers(trailers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(":status", "200"), ("content-type", "application/grpc"), *trailers]


def _trailers_only(status: Status, message: str, extra: Sequence[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    trailers = [("grpc-status", str(int(status))), ("grpc-message", encode_status_message(message)), *extra]
    return _trailers_only_headers(trailers)
