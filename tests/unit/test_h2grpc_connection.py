"""The server side of gRPC over HTTP/2, sans I/O (bascule.h2grpc.connection), driven by python-hyper's
h2 as the client, with the bytes pumped both ways in memory."""

from __future__ import annotations

import gzip
import struct
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings
import hpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bascule.h2grpc.connection import (
    HEADERS_COST,
    PREFACE,
    CallCancelled,
    CallStarted,
    ConnectionEnded,
    GrpcConnection,
    MessagesReceived,
    PingAcked,
    RequestsEnded,
)
from bascule.h2grpc.messages import MessageReader, frame, frame_gzip
from bascule.h2grpc.status import Status

METHOD = "/bascule.Test/Echo"
EVENT_TYPES = (CallStarted, MessagesReceived, RequestsEnded, CallCancelled, ConnectionEnded, PingAcked)

# HTTP/2 frame types and flags, for the frames the h2 client will not send (it keeps the rules).
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7, 0x8
END_STREAM, END_HEADERS = 0x1, 0x4


# --- helpers -----------------------------------------------------------------------------------------


@dataclass
class Pair:
    server: GrpcConnection
    client: h2.connection.H2Connection
    client_events: list[h2.events.Event] = field(default_factory=list)


def connect(max_message_bytes: int = 1 << 20) -> Pair:
    """A server and an h2 client past the preface and the SETTINGS exchange."""
    server = GrpcConnection(max_message_bytes)
    server.initiate()
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    client.initiate_connection()
    pair = Pair(server, client)
    assert to_server(pair) == []
    to_client(pair)
    assert to_server(pair) == []  # the client's SETTINGS ACK
    pair.client_events.clear()
    return pair


def to_server(pair: Pair) -> list:
    """What the client wrote, given to the server; the server's events."""
    events = pair.server.receive(pair.client.data_to_send())
    assert all(isinstance(event, EVENT_TYPES) for event in events)
    return events


def to_client(pair: Pair, flush: bool = False) -> list[h2.events.Event]:
    """What the server wrote (after a flush if asked), given to the client; the client's events."""
    if flush:
        pair.server.flush()
    events = pair.client.receive_data(pair.server.data_to_send())
    pair.client_events.extend(events)
    return events


def raw_frame(frame_type: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame as bytes, for what the h2 client refuses to send."""
    return struct.pack(">BHBBI", len(payload) >> 16, len(payload) & 0xFFFF, frame_type, flags, stream_id) + payload


def frame_types(data: bytes) -> list[int]:
    """The types of the HTTP/2 frames in ``data``, in order."""
    types, position = [], 0
    while position < len(data):
        high, low, frame_type = struct.unpack_from(">BHB", data, position)
        types.append(frame_type)
        position += 9 + (high << 16 | low)
    assert position == len(data)
    return types


def open_call(
    pair: Pair,
    path: str = METHOD,
    *,
    timeout: str | None = None,
    encoding: str | None = None,
    accept_encoding: str | None = None,
    metadata: tuple[tuple[str, str], ...] = (),
    method: str = "POST",
    content_type: str = "application/grpc",
    end_stream: bool = False,
) -> int:
    """The client's HEADERS for a new call; its stream id (not yet given to the server)."""
    stream_id = pair.client.get_next_available_stream_id()
    headers = [
        (":method", method),
        (":scheme", "http"),
        (":path", path),
        (":authority", "localhost:1234"),
        ("content-type", content_type),
        ("te", "trailers"),
    ]
    if timeout is not None:
        headers.append(("grpc-timeout", timeout))
    if encoding is not None:
        headers.append(("grpc-encoding", encoding))
    if accept_encoding is not None:
        headers.append(("grpc-accept-encoding", accept_encoding))
    headers.extend(metadata)
    pair.client.send_headers(stream_id, headers, end_stream=end_stream)
    return stream_id


def send_messages(pair: Pair, stream_id: int, messages: list[bytes], *, compressed: bool = False,
                  end_stream: bool = False) -> None:
    """The messages framed into one DATA frame."""
    pair.client.send_data(stream_id, (frame_gzip if compressed else frame)(messages), end_stream=end_stream)


def end_call(pair: Pair, stream_id: int) -> None:
    pair.client.end_stream(stream_id)


def unary(pair: Pair, message: bytes = b"request", **headers) -> tuple[int, list]:
    """A whole unary request given to the server: its stream id and the server's events."""
    stream_id = open_call(pair, **headers)
    send_messages(pair, stream_id, [message], end_stream=True)
    return stream_id, to_server(pair)


@dataclass
class Response:
    headers: list[tuple[str, str]] | None = None
    headers_ended_stream: bool = False
    data: bytes = b""
    data_frames: int = 0
    trailers: list[tuple[str, str]] | None = None
    ended: bool = False
    reset: int | None = None

    @property
    def status(self) -> str | None:
        """grpc-status, from the trailers or from a trailers-only HEADERS."""
        for block in (self.trailers, self.headers if self.headers_ended_stream else None):
            if block is not None:
                return dict(block).get("grpc-status")
        return None

    def messages(self, compression: str | None = None) -> list[bytes]:
        reader = MessageReader(1 << 30, compression)
        messages = reader.feed(self.data)
        assert not reader.pending
        return messages


def response(pair: Pair, stream_id: int) -> Response:
    """What the client has seen of the stream so far."""
    result = Response()
    for event in pair.client_events:
        if getattr(event, "stream_id", None) != stream_id:
            continue
        if isinstance(event, h2.events.ResponseReceived):
            assert result.headers is None
            result.headers = list(event.headers)
            result.headers_ended_stream = event.stream_ended is not None
        elif isinstance(event, h2.events.DataReceived):
            assert result.headers is not None and result.trailers is None
            result.data += event.data
            result.data_frames += 1
        elif isinstance(event, h2.events.TrailersReceived):
            assert result.headers is not None and result.trailers is None
            result.trailers = list(event.headers)
        elif isinstance(event, h2.events.StreamEnded):
            result.ended = True
        elif isinstance(event, h2.events.StreamReset):
            result.reset = event.error_code
    return result


def only(events: list, kind: type) -> list:
    return [event for event in events if isinstance(event, kind)]


# --- calls in ------------------------------------------------------------------------------------------


def test_call_started_carries_method_metadata_and_timeout():
    pair = connect()
    stream_id = open_call(
        pair,
        "/pkg.Service/Method",
        timeout="250m",
        encoding="identity",
        accept_encoding="identity,gzip",
        metadata=(("x-trace-id", "abc"), ("authorization", "Bearer t"), ("x-bin-bin", "AAEC"),
                  ("user-agent", "grpc-test/1.0")),
    )
    events = to_server(pair)
    assert len(events) == 1
    started = events[0]
    assert isinstance(started, CallStarted)
    assert started.stream_id == stream_id
    assert started.method == "/pkg.Service/Method"
    assert started.timeout == pytest.approx(0.25)
    assert started.metadata == (("x-trace-id", "abc"), ("authorization", "Bearer t"), ("x-bin-bin", b"\x00\x01\x02"))
    names = {name for name, _ in started.metadata}
    assert not names & {"content-type", "te", "grpc-timeout", "grpc-encoding", "grpc-accept-encoding",
                        "user-agent"}
    assert not any(name.startswith(":") for name in names)


def test_call_without_timeout():
    pair = connect()
    open_call(pair)
    (started,) = to_server(pair)
    assert started.timeout is None
    assert started.metadata == ()


@pytest.mark.parametrize("value, seconds", [("1H", 3600.0), ("2M", 120.0), ("3S", 3.0), ("40m", 0.04),
                                            ("50u", 50e-6), ("60n", 60e-9)])
def test_timeout_units_in_seconds(value, seconds):
    pair = connect()
    open_call(pair, timeout=value)
    (started,) = to_server(pair)
    assert started.timeout == pytest.approx(seconds)


def test_repeated_metadata_keeps_every_value_in_order():
    pair = connect()
    open_call(pair, metadata=(("x-tag", "a"), ("x-other", "o"), ("x-tag", "b")))
    (started,) = to_server(pair)
    assert started.metadata == (("x-tag", "a"), ("x-other", "o"), ("x-tag", "b"))


@pytest.mark.parametrize("value, decoded", [("AAEC", b"\x00\x01\x02"), ("AAE", b"\x00\x01"), ("", b""),
                                            ("aGVsbG8=", b"hello"), ("aGVsbG8", b"hello")])
def test_binary_metadata_is_base64_decoded(value, decoded):
    pair = connect()
    open_call(pair, metadata=(("x-blob-bin", value),))
    (started,) = to_server(pair)
    assert started.metadata == (("x-blob-bin", decoded),)


def test_undecodable_binary_metadata_is_refused():
    pair = connect()
    stream_id = open_call(pair, metadata=(("x-blob-bin", "!!not base64!!"),), end_stream=True)
    assert to_server(pair) == []
    to_client(pair, flush=True)
    got = response(pair, stream_id)
    assert got.headers_ended_stream
    assert dict(got.headers)["grpc-status"] == "13"
    assert "binary metadata" in dict(got.headers)["grpc-message"]


def test_undecodable_binary_metadata_leaves_no_call_behind():
    pair = connect()
    stream_id = open_call(pair, metadata=(("x-blob-bin", "!!not base64!!"),))
    send_messages(pair, stream_id, [b"request"], end_stream=True)
    events = to_server(pair)
    assert events == []
    assert pair.server.active_calls() == 0


def test_unary_request_events_in_order_once():
    pair = connect()
    stream_id, events = unary(pair, b"hello")
    assert [type(event) for event in events] == [CallStarted, MessagesReceived, RequestsEnded]
    received = events[1]
    assert received.stream_id == stream_id
    assert received.messages == [b"hello"]
    assert received.flow_size == len(frame([b"hello"]))
    assert events[2].stream_id == stream_id
    pair.server.acknowledge(stream_id, received.flow_size)
    assert to_server(pair) == []
    assert pair.server.active_calls() == 1


def test_headers_with_end_stream_and_no_message():
    pair = connect()
    stream_id = open_call(pair, end_stream=True)
    events = to_server(pair)
    assert [type(event) for event in events] == [CallStarted, RequestsEnded]
    assert events[1].stream_id == stream_id


def test_end_stream_as_an_empty_data_frame():
    pair = connect()
    stream_id = open_call(pair)
    send_messages(pair, stream_id, [b"one"])
    assert [type(event) for event in to_server(pair)] == [CallStarted, MessagesReceived]
    end_call(pair, stream_id)
    assert [type(event) for event in to_server(pair)] == [RequestsEnded]


def test_many_small_messages_in_one_data_frame():
    pair = connect()
    stream_id = open_call(pair)
    messages = [b"m%03d" % i for i in range(200)]
    send_messages(pair, stream_id, messages, end_stream=True)
    events = to_server(pair)
    assert [type(event) for event in events] == [CallStarted, MessagesReceived, RequestsEnded]
    assert events[1].messages == messages
    assert events[1].flow_size == len(frame(messages))


def test_one_message_split_over_many_data_frames():
    pair = connect()
    stream_id = open_call(pair)
    assert len(to_server(pair)) == 1
    message = bytes(range(256)) * 40
    data = frame([message])
    pieces = [data[i:i + 97] for i in range(0, len(data), 97)]
    received = []
    for piece in pieces:
        pair.client.send_data(stream_id, piece)
        received.extend(to_server(pair))
    assert [type(event) for event in received] == [MessagesReceived]
    assert received[0].messages == [message]
    end_call(pair, stream_id)
    assert [type(event) for event in to_server(pair)] == [RequestsEnded]


def test_several_calls_interleaved():
    pair = connect()
    first = open_call(pair)
    second = open_call(pair)
    send_messages(pair, second, [b"to second"])
    send_messages(pair, first, [b"to first"], end_stream=True)
    events = to_server(pair)
    assert [(type(event), event.stream_id) for event in events] == [
        (CallStarted, first), (CallStarted, second), (MessagesReceived, second), (MessagesReceived, first),
        (RequestsEnded, first),
    ]
    assert pair.server.active_calls() == 2


def test_the_client_bytes_in_any_chunking():
    """The same events whether the socket delivers the bytes at once or one at a time."""
    whole = GrpcConnection(1 << 20)
    trickle = GrpcConnection(1 << 20)
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    client.initiate_connection()
    pair = Pair(whole, client)
    stream_id = open_call(pair, metadata=(("x-k", "v"),), timeout="1S")
    send_messages(pair, stream_id, [b"a", b"bb" * 100, b""], end_stream=True)
    data = client.data_to_send()
    expected = whole.receive(data)
    events = []
    for i in range(len(data)):
        events.extend(trickle.receive(data[i:i + 1]))
    assert events == expected
    assert [type(event) for event in events] == [CallStarted, MessagesReceived, RequestsEnded]
    assert events[1].messages == [b"a", b"bb" * 100, b""]


# --- responses -----------------------------------------------------------------------------------------


def test_response_headers_data_and_trailers():
    pair = connect()
    stream_id, _ = unary(pair)
    pair.server.send_messages(stream_id, [b"first", b"second"])
    pair.server.send_messages(stream_id, [b"third"])
    pair.server.finish(stream_id, Status.OK)
    pair.server.flush()
    to_client(pair)
    got = response(pair, stream_id)
    headers = dict(got.headers)
    assert headers[":status"] == "200"
    assert headers["content-type"] == "application/grpc"
    assert "grpc-status" not in headers
    assert "grpc-encoding" not in headers
    assert not got.headers_ended_stream
    assert got.messages() == [b"first", b"second", b"third"]
    assert got.data_frames == 1
    assert got.trailers == [("grpc-status", "0")]
    assert got.ended
    assert got.reset is None
    assert pair.server.active_calls() == 0
    assert pair.server.pending_bytes(stream_id) == 0


def test_messages_reach_the_client_only_on_flush():
    pair = connect()
    stream_id, _ = unary(pair)
    pair.server.send_messages(stream_id, [b"held"])
    assert pair.server.pending_bytes(stream_id) == len(frame([b"held"]))
    assert pair.server.data_to_send() == b""
    to_client(pair, flush=True)
    got = response(pair, stream_id)
    assert got.messages() == [b"held"]
    assert got.trailers is None and not got.ended
    pair.server.finish(stream_id, Status.OK)
    to_client(pair, flush=True)
    assert response(pair, stream_id).trailers == [("grpc-status", "0")]


def test_finish_without_messages_is_trailers_only():
    pair = connect()
    stream_id, _ = unary(pair)
    pair.server.finish(stream_id, Status.NOT_FOUND, "no such thing")
    to_client(pair, flush=True)
    got = response(pair, stream_id)
    assert got.headers_ended_stream
    assert got.trailers is None
    assert got.data == b""
    headers = dict(got.headers)
    assert headers[":status"] == "200"
    assert headers["content-type"] == "application/grpc"
    assert headers["grpc-status"] == str(int(Status.NOT_FOUND))
    assert headers["grpc-message"] == "no such thing"
    assert got.ended


def test_grpc_message_is_percent_encoded():
    pair = connect()
    stream_id, _ = unary(pair)
    pair.server.send_messages(stream_id, [b"partial"])
    pair.server.finish(stream_id, Status.INVALID_ARGUMENT, "100% naïve\nsecond line")
    to_client(pair, flush=True)
    trailers = dict(response(pair, stream_id).trailers)
    assert trailers["grpc-status"] == "3"
    assert trailers["grpc-message"] == "100%25 na%C3%AFve%0Asecond line"


def test_finish_before_the_client_ends_resets_the_rest_of_the_request():
    pair = connect()
    stream_id = open_call(pair)
    send_messages(pair, stream_id, [b"first of many"])
    to_server(pair)
    pair.server.finish(stream_id, Status.OK)
    to_client(pair, flush=True)
    got = response(pair, stream_id)
    assert got.status == "0"
    assert got.reset in (None, h2.errors.ErrorCodes.NO_ERROR)
    assert pair.server.active_calls() == 0
    # The rest of the request, already on its way, is ignored without harm to the connection.
    assert pair.server.receive(raw_frame(DATA, END_STREAM, stream_id, frame([b"late"]))) == []
    assert not pair.server.closed


def test_send_after_finish_is_ignored():
    pair = connect()
    stream_id, _ = unary(pair)
    pair.server.finish(stream_id, Status.OK)
    pair.server.send_messages(stream_id, [b"too late"])
    pair.server.finish(stream_id, Status.INTERNAL, "second finish")
    to_client(pair, flush=True)
    got = response(pair, stream_id)
    assert got.data == b""
    assert got.status == "0"


# --- requests refused ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "method, content_type, status",
    [("GET", "application/grpc", "405"), ("PUT", "application/grpc", "405"),
     ("POST", "application/json", "415"), ("POST", "text/plain", "415")],
)
def test_not_grpc_gets_an_http_error_and_no_call(method, content_type, status):
    pair = connect()
    stream_id = open_call(pair, method=method, content_type=content_type, end_stream=True)
    assert to_server(pair) == []
    to_client(pair)
    got = response(pair, stream_id)
    assert dict(got.headers)[":status"] == status
    assert got.headers_ended_stream
    assert pair.server.active_calls() == 0
    assert not pair.server.closed


def test_not_grpc_with_a_body_is_answered_then_ignored():
    pair = connect()
    stream_id = open_call(pair, content_type="application/json")
    pair.client.send_data(stream_id, b'{"a": 1}')
    assert to_server(pair) == []
    to_client(pair)
    assert dict(response(pair, stream_id).headers)[":status"] == "415"
    assert pair.server.receive(raw_frame(DATA, END_STREAM, stream_id, b"more")) == []
    assert not pair.server.closed


@pytest.mark.parametrize("content_type", ["application/grpc-web", "application/grpcfoo"])
def test_content_types_that_only_start_like_grpc(content_type):
    pair = connect()
    stream_id = open_call(pair, content_type=content_type, end_stream=True)
    assert to_server(pair) == []
    to_client(pair)
    assert dict(response(pair, stream_id).headers)[":status"] == "415"


@pytest.mark.parametrize("content_type", ["application/grpc+proto", "application/grpc+json",
                                          "application/grpc;charset=utf-8"])
def test_grpc_content_subtypes_are_accepted(content_type):
    pair = connect()
    open_call(pair, content_type=content_type)
    assert [type(event) for event in to_server(pair)] == [CallStarted]


@pytest.mark.parametrize("end_stream", [True, False])
def test_unsupported_grpc_encoding_is_unimplemented(end_stream):
    pair = connect()
    stream_id = open_call(pair, encoding="snappy", end_stream=end_stream)
    assert to_server(pair) == []
    to_client(pair)
    got = response(pair, stream_id)
    assert got.headers_ended_stream
    headers = dict(got.headers)
    assert headers["grpc-status"] == "12"
    assert "snappy" in headers["grpc-message"]
    assert "gzip" in headers["grpc-accept-encoding"]
    assert pair.server.active_calls() == 0


@pytest.mark.parametrize("value", ["5x", "123456789S", "-1S", "1.5S", "5"])
def test_invalid_grpc_timeout_is_internal(value):
    pair = connect()
    stream_id = open_call(pair, timeout=value, end_stream=True)
    assert to_server(pair) == []
    to_client(pair)
    got = response(pair, stream_id)
    assert got.headers_ended_stream
    assert dict(got.headers)["grpc-status"] == "13"
    assert pair.server.active_calls() == 0


def test_message_above_the_limit_ends_the_call_resource_exhausted():
    pair = connect(max_message_bytes=1000)
    stream_id = open_call(pair)
    assert [type(event) for event in to_server(pair)] == [CallStarted]
    pair.client.send_data(stream_id, frame([b"x" * 1001])[:5])  # the prefix alone is enough
    events = to_server(pair)
    assert [type(event) for event in events] == [CallCancelled]
    assert events[0].stream_id == stream_id
    to_client(pair, flush=True)
    got = response(pair, stream_id)
    assert got.status == str(int(Status.RESOURCE_EXHAUSTED))
    assert "larger than max" in dict(got.headers)["grpc-message"]
    assert pair.server.active_calls() == 0
    assert not pair.server.closed


def test_message_at_the_limit_is_received():
    pair = connect(max_message_bytes=1000)
    _, events = unary(pair, b"x" * 1000)
    assert events[1].messages == [b"x" * 1000]


def test_stream_ending_mid_message_is_internal():
    pair = connect()
    stream_id = open_call(pair)
    pair.client.send_data(stream_id, frame([b"0123456789"])[:8], end_stream=True)
    events = to_server(pair)
    assert [type(event) for event in events] == [CallStarted, CallCancelled]
    to_client(pair, flush=True)
    got = response(pair, stream_id)
    assert got.status == "13"
    assert pair.server.active_calls() == 0


def test_compressed_message_without_grpc_encoding_is_internal():
    pair = connect()
    stream_id = open_call(pair)
    send_messages(pair, stream_id, [b"packed"], compressed=True, end_stream=True)
    events = to_server(pair)
    assert [type(event) for event in events] == [CallStarted, CallCancelled]
    to_client(pair, flush=True)
    assert response(pair, stream_id).status == "13"


# --- cancellation ------------------------------------------------------------------------------------


def test_client_reset_cancels_the_call_and_later_sends_are_no_ops():
    pair = connect()
    stream_id = open_call(pair)
    send_messages(pair, stream_id, [b"request"])
    to_server(pair)
    pair.client.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
    events = to_server(pair)
    assert events == [CallCancelled(stream_id)]
    assert pair.server.active_calls() == 0
    pair.server.send_messages(stream_id, [b"answer"])
    pair.server.finish(stream_id, Status.OK)
    pair.server.acknowledge(stream_id, 100)
    pair.server.flush()
    assert pair.server.data_to_send() == b""
    assert pair.server.pending_bytes(stream_id) == 0


def test_client_reset_with_responses_queued_drops_them():
    pair = connect()
    stream_id, _ = unary(pair)
    pair.server.send_messages(stream_id, [b"queued"])
    pair.client.reset_stream(stream_id)
    assert to_server(pair) == [CallCancelled(stream_id)]
    pair.server.flush()
    assert pair.server.data_to_send() == b""


def test_server_reset_sends_rst_stream_cancel():
    pair = connect()
    stream_id, _ = unary(pair)
    pair.server.reset(stream_id)
    to_client(pair, flush=True)
    assert response(pair, stream_id).reset == h2.errors.ErrorCodes.CANCEL
    assert pair.server.active_calls() == 0
    pair.server.finish(stream_id, Status.OK)
    pair.server.flush()
    assert pair.server.data_to_send() == b""


# --- flow control ------------------------------------------------------------------------------------


def test_responses_beyond_the_client_window_wait_for_window_updates():
    pair = connect()
    stream_id, _ = unary(pair)
    messages = [bytes([i]) * 50_000 for i in range(5)]  # 250 KB against the client's 64 KiB windows
    total = len(frame(messages))
    pair.server.send_messages(stream_id, messages)
    pair.server.finish(stream_id, Status.OK)
    to_client(pair, flush=True)
    got = response(pair, stream_id)
    assert len(got.data) == 65535
    assert pair.server.pending_bytes(stream_id) == total - 65535
    assert got.trailers is None

    # Nothing more goes out while the client's windows stay shut.
    pair.server.flush()
    assert pair.server.data_to_send() == b""

    rounds = 0
    while not response(pair, stream_id).ended:
        rounds += 1
        assert rounds < 50
        sent_before = len(response(pair, stream_id).data)
        pair.client.increment_flow_control_window(40_000)
        pair.client.increment_flow_control_window(40_000, stream_id=stream_id)
        to_server(pair)
        to_client(pair, flush=True)
        got = response(pair, stream_id)
        assert len(got.data) > sent_before
        assert got.trailers is None or pair.server.pending_bytes(stream_id) == 0
    got = response(pair, stream_id)
    assert got.messages() == messages
    assert got.trailers == [("grpc-status", "0")]
    assert pair.server.pending_bytes(stream_id) == 0
    assert pair.server.active_calls() == 0


def test_acknowledged_data_reopens_the_client_window():
    """The client's usual way: acknowledge_received_data as the DATA is consumed."""
    pair = connect()
    stream_id, _ = unary(pair)
    messages = [b"%06d" % i + bytes(994) for i in range(300)]  # 300 KB
    pair.server.send_messages(stream_id, messages)
    pair.server.finish(stream_id, Status.OK)
    pair.server.flush()
    rounds = 0
    while not response(pair, stream_id).ended:
        rounds += 1
        assert rounds < 100
        for event in to_client(pair):
            if isinstance(event, h2.events.DataReceived):
                pair.client.acknowledge_received_data(event.flow_controlled_length, stream_id)
        to_server(pair)
        pair.server.flush()
    assert response(pair, stream_id).messages() == messages


def test_the_client_initial_window_setting_is_obeyed():
    pair = connect()
    pair.client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1000})
    to_server(pair)
    to_client(pair)
    stream_id, _ = unary(pair)
    pair.server.send_messages(stream_id, [bytes(5000)])
    to_client(pair, flush=True)
    assert len(response(pair, stream_id).data) == 1000
    assert pair.server.pending_bytes(stream_id) == 5005 - 1000
    pair.client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 100_000})
    to_server(pair)
    to_client(pair, flush=True)
    assert response(pair, stream_id).messages() == [bytes(5000)]


def test_the_client_max_frame_size_is_obeyed():
    pair = connect()
    pair.client.increment_flow_control_window(1 << 20)
    to_server(pair)
    stream_id, _ = unary(pair)
    pair.server.send_messages(stream_id, [bytes(60_000)])
    to_client(pair, flush=True)
    got = response(pair, stream_id)
    assert got.data_frames == 4  # 60005 bytes in frames of at most 16384
    assert got.messages() == [bytes(60_000)]


def test_many_small_messages_queued_before_a_flush_go_out_in_few_frames():
    pair = connect()
    stream_id = open_call(pair)
    to_server(pair)
    messages = [b"response %03d" % i for i in range(300)]
    for message in messages:
        pair.server.send_messages(stream_id, [message])
    pair.server.finish(stream_id, Status.OK)
    to_client(pair, flush=True)
    got = response(pair, stream_id)
    assert got.messages() == messages
    assert got.data_frames < 10
    assert got.status == "0"


def test_the_server_reopens_its_receive_windows_once_data_is_consumed():
    pair = connect()
    stream_id = open_call(pair)
    to_server(pair)
    window = pair.client.local_flow_control_window(stream_id)
    sent = 0
    updates = 0
    while sent < 3 << 20:  # three times the stream's window
        chunk = frame([bytes(100_000)])
        assert pair.client.local_flow_control_window(stream_id) >= len(chunk), "the server stalled the client"
        pair.client.send_data(stream_id, chunk)
        sent += len(chunk)
        for event in to_server(pair):
            assert isinstance(event, MessagesReceived)
            pair.server.acknowledge(stream_id, event.flow_size)
        for event in to_client(pair):
            updates += isinstance(event, h2.events.WindowUpdated)
    assert window > 0 and updates > 0


# --- compression ---------------------------------------------------------------------------------------


def test_gzip_request_and_gzip_responses():
    pair = connect()
    stream_id = open_call(pair, encoding="gzip", accept_encoding="identity,gzip")
    request = b"compress me " * 100
    send_messages(pair, stream_id, [request], compressed=True, end_stream=True)
    events = to_server(pair)
    assert [type(event) for event in events] == [CallStarted, MessagesReceived, RequestsEnded]
    assert events[1].messages == [request]
    answers = [b"answer one " * 50, b"answer two " * 50]
    pair.server.send_messages(stream_id, answers)
    pair.server.finish(stream_id, Status.OK)
    to_client(pair, flush=True)
    got = response(pair, stream_id)
    assert dict(got.headers)["grpc-encoding"] == "gzip"
    data = got.data
    position = 0
    decompressed = []
    while position < len(data):
        flag, length = struct.unpack_from(">BI", data, position)
        assert flag == 1
        body = data[position + 5:position + 5 + length]
        assert len(body) == length < 200
        decompressed.append(gzip.decompress(body))
        position += 5 + length
    assert decompressed == answers
    assert got.messages("gzip") == answers
    assert got.status == "0"


def test_gzip_request_without_accept_gets_identity_responses():
    pair = connect()
    stream_id = open_call(pair, encoding="gzip")
    send_messages(pair, stream_id, [b"packed"], compressed=True, end_stream=True)
    assert to_server(pair)[1].messages == [b"packed"]
    pair.server.send_messages(stream_id, [b"plain answer"])
    pair.server.finish(stream_id, Status.OK)
    to_client(pair, flush=True)
    got = response(pair, stream_id)
    assert "grpc-encoding" not in dict(got.headers)
    assert got.data[0] == 0
    assert got.messages() == [b"plain answer"]


def test_gzip_responses_of_self_framed_messages():
    pair = connect()
    stream_id = open_call(pair, encoding="gzip", accept_encoding="gzip", end_stream=True)
    to_server(pair)
    pair.server.send_framed(stream_id, frame([b"framed " * 30, b""]))
    pair.server.finish(stream_id, Status.OK)
    to_client(pair, flush=True)
    got = response(pair, stream_id)
    assert got.data[0] == 1
    assert got.messages("gzip") == [b"framed " * 30, b""]


def test_gzip_bomb_in_a_request_is_resource_exhausted():
    pair = connect(max_message_bytes=10_000)
    stream_id = open_call(pair, encoding="gzip")
    send_messages(pair, stream_id, [bytes(1_000_000)], compressed=True, end_stream=True)
    events = to_server(pair)
    assert [type(event) for event in events] == [CallStarted, CallCancelled]
    to_client(pair, flush=True)
    assert response(pair, stream_id).status == str(int(Status.RESOURCE_EXHAUSTED))


# --- the connection ------------------------------------------------------------------------------------


def test_go_away_names_the_last_stream():
    pair = connect()
    unary(pair)
    last, _ = unary(pair)
    pair.server.go_away()
    events = to_client(pair)
    (terminated,) = only(events, h2.events.ConnectionTerminated)
    assert terminated.last_stream_id == last
    assert terminated.error_code == h2.errors.ErrorCodes.NO_ERROR
    # The calls started go on.
    pair.server.finish(last, Status.OK)
    pair.server.flush()
    assert pair.server.data_to_send() != b""


def test_go_away_before_any_call():
    pair = connect()
    pair.server.go_away()
    (terminated,) = only(to_client(pair), h2.events.ConnectionTerminated)
    assert terminated.last_stream_id == 0


def test_ping_is_acked_after_the_client_answers():
    pair = connect()
    pair.server.ping(b"12345678")
    assert to_server(pair) == []
    events = to_client(pair)
    assert [event.ping_data for event in only(events, h2.events.PingReceived)] == [b"12345678"]
    assert to_server(pair) == [PingAcked()]


def test_client_ping_is_answered():
    pair = connect()
    pair.client.ping(b"abcdefgh")
    assert to_server(pair) == []
    events = to_client(pair)
    assert [event.ping_data for event in only(events, h2.events.PingAckReceived)] == [b"abcdefgh"]


def test_client_go_away_does_not_end_running_calls():
    pair = connect()
    stream_id, _ = unary(pair)
    pair.client.close_connection(last_stream_id=0)
    assert to_server(pair) == []
    pair.server.send_messages(stream_id, [b"still"])
    pair.server.finish(stream_id, Status.OK)
    pair.server.flush()
    assert pair.server.data_to_send() != b""


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", id="http1"),
        pytest.param(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", id="tls-hello"),
        pytest.param(PREFACE + raw_frame(HEADERS, END_HEADERS | END_STREAM, 1, b"\x82"), id="no-settings-first"),
        pytest.param(PREFACE + raw_frame(SETTINGS, 0, 0, b"") + raw_frame(DATA, 0, 0, b"x"), id="data-on-0"),
        pytest.param(PREFACE + raw_frame(SETTINGS, 0, 0, b"") + raw_frame(HEADERS, END_HEADERS, 2, b"\x82"),
                     id="even-stream"),
        pytest.param(PREFACE + raw_frame(SETTINGS, 0, 0, b"\x00"), id="bad-settings-size"),
        pytest.param(PREFACE + raw_frame(SETTINGS, 0, 0, b"") + raw_frame(HEADERS, END_HEADERS, 1, b"\xff\xff"),
                     id="bad-hpack"),
        pytest.param(PREFACE + raw_frame(SETTINGS, 0, 0, b"") + raw_frame(DATA, 0, 5, b"x"), id="data-idle"),
        pytest.param(PREFACE + raw_frame(SETTINGS, 0, 0, b"") + raw_frame(WINDOW_UPDATE, 0, 0, bytes(4)),
                     id="window-update-0"),
    ],
)
def test_protocol_errors_end_the_connection_with_goaway(data):
    server = GrpcConnection(1 << 20)
    server.initiate()
    server.data_to_send()
    events = server.receive(data)
    assert len(events) == 1 and isinstance(events[-1], ConnectionEnded)
    assert server.closed
    assert frame_types(server.data_to_send())[-1] == GOAWAY
    assert server.receive(PREFACE) == []


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(min_size=1, max_size=200), cuts=st.lists(st.integers(0, 200), max_size=5))
def test_garbage_ends_the_connection_and_never_raises(data, cuts):
    if PREFACE.startswith(data[:len(PREFACE)]):
        data = b"X" + data
    server = GrpcConnection(1 << 20)
    server.initiate()
    points = sorted({cut % (len(data) + 1) for cut in cuts} | {0, len(data)})
    events = []
    for start, end in zip(points, points[1:]):
        events.extend(server.receive(data[start:end]))
    assert any(isinstance(event, ConnectionEnded) for event in events)
    assert isinstance(events[-1], ConnectionEnded)
    assert server.closed
    server.flush()
    server.go_away()
    server.data_to_send()


def _request_block(encoder: hpack.Encoder, choice: int) -> bytes:
    headers = [(":method", "POST"), (":scheme", "http"), (":path", METHOD), (":authority", "a"),
               ("content-type", "application/grpc"), ("te", "trailers")]
    extra = [[], [("grpc-encoding", "gzip"), ("grpc-accept-encoding", "gzip")], [("grpc-timeout", "1S")],
             [("grpc-timeout", "bad")], [("content-type", "text/plain")], [("X-Upper", "v")],
             [("grpc-encoding", "zstd")], [("x-meta", "v" * 100)], [("x-id-bin", "AAEC")], [("x-id-bin", "%%")],
             [("x-m", "1"), ("x-m", "2")]]
    return encoder.encode(headers + extra[choice] if choice < len(extra) else headers)


_messages = st.builds(lambda bodies: frame(bodies), st.lists(st.binary(max_size=30), min_size=1, max_size=3))
_payload_strategies = [
    _messages,
    st.builds(lambda body: frame_gzip([body]), st.binary(max_size=30)),
    st.builds(lambda body: frame([body])[:-1], st.binary(min_size=1, max_size=30)),  # cut short
    st.builds(lambda n: struct.pack(">BI", 0, n), st.integers(0, 200)),  # a prefix alone
    st.binary(max_size=40),
]
_payloads = st.sampled_from([0, 0, 0, 0, 1, 2, 3, 4]).flatmap(_payload_strategies.__getitem__)
# Actions a client might take, most of them well-formed enough to get past the connection's checks so that
# the calls' state machines are explored, some not at all.
_action_strategies = {
    "open": st.tuples(st.just("open"), st.integers(0, 15), st.sampled_from([False, False, False, True]), st.booleans()),
    "data": st.tuples(st.just("data"), st.integers(0, 7), _payloads, st.integers(0, 255)),
    "respond": st.tuples(st.just("respond"), st.integers(0, 7), st.integers(0, 3)),
    "trailers": st.tuples(st.just("trailers"), st.integers(0, 7), st.booleans()),
    "rst": st.tuples(st.just("rst"), st.integers(0, 7), st.integers(0, 13)),
    "window": st.tuples(st.just("window"), st.integers(0, 7), st.integers(0, 1 << 31)),
    "settings": st.tuples(st.just("settings"), st.sampled_from([1, 2, 3, 4, 5, 6, 9]), st.integers(0, 1 << 20)),
    "ping": st.tuples(st.just("ping"), st.booleans(), st.binary(min_size=8, max_size=8)),
    "raw": st.tuples(st.just("raw"), st.integers(0, 11), st.integers(0, 255), st.integers(0, 9),
                     st.binary(max_size=40)),
}
_actions = st.sampled_from(
    ["open"] * 4 + ["data"] * 8 + ["respond"] * 3 + ["trailers", "rst", "window", "settings", "ping", "raw"]
).flatmap(_action_strategies.__getitem__)


def _pad(payload: bytes, flags: int) -> bytes:
    return bytes([3]) + payload + b"\0\0\0" if flags & 0x8 else payload


@pytest.mark.parametrize("hostile", [False, True], ids=["polite", "hostile"])
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=st.lists(_actions, min_size=3, max_size=40), cuts=st.lists(st.integers(0, 3000), max_size=6))
def test_random_frames_after_the_handshake_never_raise(hostile, actions, cuts):
    """Whatever a client sends once past the preface, and whatever the handlers answer meanwhile: events
    or the end of the connection, never an exception. A polite client sends no arbitrary frames and keeps
    its SETTINGS and WINDOW_UPDATE values in range, so that the calls' states are explored further."""
    server = GrpcConnection(64)
    server.initiate()
    encoder = hpack.Encoder()
    # The client's bytes, in chunks, with what the handlers do between chunks.
    steps: list[bytes | tuple[int, int]] = [PREFACE + raw_frame(SETTINGS, 0, 0, b"")]
    opened: list[int] = []
    next_id = 1
    for action in actions:
        kind = action[0]
        if not opened and kind in ("data", "trailers", "rst", "window", "respond") or not hostile and kind == "raw":
            continue
        if kind == "open":
            _, choice, end_stream, continued = action
            block = _request_block(encoder, choice)
            flags = END_STREAM if end_stream else 0
            if continued and len(block) > 4:
                steps.append(raw_frame(HEADERS, flags, next_id, block[:4])
                             + raw_frame(0x9, END_HEADERS, next_id, block[4:]))
            else:
                steps.append(raw_frame(HEADERS, flags | END_HEADERS, next_id, block))
            opened.append(next_id)
            next_id += 2
        elif kind == "data":
            _, which, payload, flags = action
            steps.append(raw_frame(DATA, flags & 0x9, opened[-1 - which % len(opened)], _pad(payload, flags)))
        elif kind == "trailers":
            _, which, end_stream = action
            steps.append(raw_frame(HEADERS, END_HEADERS | (END_STREAM if end_stream else 0),
                                   opened[-1 - which % len(opened)], encoder.encode([("x-trailer", "t")])))
        elif kind == "rst":
            steps.append(raw_frame(RST_STREAM, 0, opened[-1 - action[1] % len(opened)], struct.pack(">I", action[2])))
        elif kind == "window":
            _, which, increment = action
            increment = increment if hostile else 1 + increment % (1 << 20)
            stream_id = 0 if which == 0 else opened[-1 - which % len(opened)]
            steps.append(raw_frame(WINDOW_UPDATE, 0, stream_id, struct.pack(">I", increment)))
        elif kind == "settings":
            _, code, value = action
            if not hostile:
                value = {2: value % 2, 4: value, 5: 16384 + value}.get(code, value)
            steps.append(raw_frame(SETTINGS, 0, 0, struct.pack(">HI", code, value)))
        elif kind == "ping":
            steps.append(raw_frame(PING, 1 if action[1] else 0, 0, action[2]))
        elif kind == "raw":
            _, frame_type, flags, stream_id, payload = action
            steps.append(raw_frame(frame_type, flags, stream_id, payload))
        else:
            steps.append((opened[-1 - action[1] % len(opened)], action[2]))
    data = b"".join(step for step in steps if isinstance(step, bytes))
    boundaries = {cut % (len(data) + 1) for cut in cuts}
    position = 0
    for step in steps:
        if isinstance(step, bytes):
            # The step's bytes, cut where the socket happened to cut them.
            end = position + len(step)
            points = sorted({point for point in boundaries if position < point < end} | {position, end})
            chunks = [data[start:stop] for start, stop in zip(points, points[1:])]
            position = end
        else:
            chunks = []
            stream_id, answer = step
            if answer == 0:
                server.send_messages(stream_id, [b"answer"] * 3)
            elif answer == 1:
                server.send_framed(stream_id, frame([b"framed", b""]))
            elif answer == 2:
                server.finish(stream_id, Status.ABORTED, "done ✓")
            else:
                server.reset(stream_id)
            server.flush()
        for chunk in chunks:
            events = server.receive(chunk)
            assert all(isinstance(event, EVENT_TYPES) for event in events)
            for event in events:
                if isinstance(event, MessagesReceived):
                    assert all(len(message) <= 64 for message in event.messages)
                    server.acknowledge(event.stream_id, event.flow_size)
            if any(isinstance(event, ConnectionEnded) for event in events):
                assert server.closed
            if server.closed:
                assert server.receive(b"anything") == []
        server.flush()
        server.data_to_send()
    server.go_away()
    server.data_to_send()


# --- bugs ----------------------------------------------------------------------------------------------


def test_data_after_end_stream_forgets_the_call():
    pair = connect()
    stream_id, events = unary(pair)
    assert [type(event) for event in events] == [CallStarted, MessagesReceived, RequestsEnded]
    events = pair.server.receive(raw_frame(DATA, 0, stream_id, frame([b"after the end"])))
    assert events == [CallCancelled(stream_id)]
    to_client(pair)
    assert response(pair, stream_id).reset == h2.errors.ErrorCodes.STREAM_CLOSED
    assert pair.server.active_calls() == 0
    pair.server.finish(stream_id, Status.OK)
    pair.server.flush()
    assert pair.server.data_to_send() == b""


def test_data_beyond_the_stream_window_forgets_the_call():
    pair = connect()
    stream_id = open_call(pair)
    assert [type(event) for event in to_server(pair)] == [CallStarted]
    chunk = frame([bytes(600_000)])  # two of these exceed the 1 MiB stream window when not acknowledged
    assert [type(event) for event in pair.server.receive(raw_frame(DATA, 0, stream_id, chunk))] == [MessagesReceived]
    events = pair.server.receive(raw_frame(DATA, 0, stream_id, chunk))
    assert events == [CallCancelled(stream_id)]
    to_client(pair)
    assert response(pair, stream_id).reset == h2.errors.ErrorCodes.FLOW_CONTROL_ERROR
    assert pair.server.active_calls() == 0
    pair.server.finish(stream_id, Status.OK)
    pair.server.flush()
    assert pair.server.data_to_send() == b""


def test_headers_after_end_stream_do_not_end_the_requests_twice():
    pair = connect()
    stream_id, events = unary(pair)
    assert only(events, RequestsEnded) == [RequestsEnded(stream_id)]
    block = pair.client.encoder.encode([("x-trailer", "late")])
    events = pair.server.receive(raw_frame(HEADERS, END_HEADERS | END_STREAM, stream_id, block))
    assert only(events, RequestsEnded) == []


def test_request_trailers_crossing_the_answer_are_ignored():
    pair = connect()
    other, _ = unary(pair)
    stream_id = open_call(pair)
    send_messages(pair, stream_id, [b"first"])
    to_server(pair)
    pair.server.finish(stream_id, Status.OK)
    pair.server.flush()  # trailers-only and RST_STREAM(NO_ERROR), not yet read by the client
    pair.client.send_headers(stream_id, [("x-checksum", "1234")], end_stream=True)
    events = to_server(pair)
    assert not any(isinstance(event, ConnectionEnded) for event in events), events
    assert not pair.server.closed
    assert pair.server.active_calls() == 1  # the other call goes on
    to_client(pair)
    assert response(pair, stream_id).status == "0"
    assert other


def test_frames_of_one_stream_in_a_row_are_one_event_and_their_flow_is_given_back_whole():
    pair = connect()
    first = open_call(pair)
    to_server(pair)
    second = open_call(pair)
    for stream_id, message in ((first, b"a"), (first, b"b"), (second, b"c"), (first, b"d")):
        send_messages(pair, stream_id, [message])  # a DATA frame each, read in one go
    events = only(to_server(pair), MessagesReceived)
    assert [(e.stream_id, e.messages) for e in events] == [(first, [b"a", b"b"]), (second, [b"c"]), (first, [b"d"])]
    assert [e.flow_size for e in events] == [2 * len(frame([b"a"])), len(frame([b"c"])), len(frame([b"d"]))]


# --- what a connection holds, and what costs it work (issue 27) ------------------------------------


def test_queued_counts_response_bytes_until_they_are_framed_or_their_call_goes():
    pair = connect()
    first, second = open_call(pair), open_call(pair)
    to_server(pair)
    pair.server.send_messages(first, [b"a" * 1000])
    pair.server.send_framed(second, frame([b"b" * 500]))
    assert pair.server.queued == 1005 + 505
    pair.server.flush()
    assert pair.server.queued == 0  # both fit the client's windows: framed
    pair.client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
    to_server(pair)
    pair.server.send_messages(first, [b"c" * 100])
    pair.server.flush()
    assert pair.server.queued == 105  # no window: still queued
    pair.client.reset_stream(first)
    to_server(pair)
    assert pair.server.queued == 0  # the call went, and what it had queued


def test_incomplete_messages_over_the_input_budget_end_their_call_resource_exhausted():
    pair = connect()
    pair.server = GrpcConnection(1 << 20, max_buffered_input=3000)  # a fresh server, small budget
    pair.server.initiate()
    pair.client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    pair.client.initiate_connection()
    to_server(pair), to_client(pair), to_server(pair)
    first, second = open_call(pair), open_call(pair)
    for stream in (first, second):
        pair.client.send_data(stream, struct.pack(">BI", 0, 10_000) + b"x" * 2000)
    events = to_server(pair)
    assert [type(e) for e in events] == [CallStarted, CallStarted, CallCancelled]
    assert pair.server.buffered_input == 2005  # the first call's part (its prefix too); the second's went
    to_client(pair, flush=True)
    trailers = [e for e in pair.client_events if isinstance(e, h2.events.TrailersReceived | h2.events.ResponseReceived)]
    assert dict(trailers[-1].headers)["grpc-status"] == str(Status.RESOURCE_EXHAUSTED.value)


def test_pings_settings_resets_and_empty_data_are_counted_as_costly():
    pair = connect()
    stream = open_call(pair)
    to_server(pair)
    pair.server.costly_frames = 0
    pair.server.receive(raw_frame(PING, 0, 0, b"12345678") * 3 + raw_frame(SETTINGS, 0, 0)
                        + raw_frame(DATA, 0, stream) + raw_frame(RST_STREAM, 0, stream, b"\0\0\0\x08"))
    assert pair.server.costly_frames == 6


def test_calm_down_sends_goaway_enhance_your_calm():
    pair = connect()
    pair.server.calm_down("too much")
    events = to_client(pair)
    ended = [e for e in events if isinstance(e, h2.events.ConnectionTerminated)]
    assert ended and ended[0].error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM


def test_a_header_block_over_the_limit_ends_the_connection_before_decoding():
    pair = connect()
    events = pair.server.receive(raw_frame(HEADERS, END_HEADERS | END_STREAM, 1, b"\x00" * (65 << 10)))
    assert [type(e) for e in events] == [ConnectionEnded]


def test_a_receive_handles_at_most_its_share_of_frames_and_leaves_the_rest_for_the_next():
    pair = Pair(GrpcConnection(1 << 20, frames_per_receive=2 * HEADERS_COST + 1),
                h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8")))
    pair.server.initiate()
    pair.client.initiate_connection()
    for _ in range(3):
        stream = pair.client.get_next_available_stream_id()
        pair.client.send_headers(stream, [(":method", "POST"), (":scheme", "http"), (":path", METHOD),
                                          (":authority", "x"), ("content-type", "application/grpc")])
        pair.client.send_data(stream, frame([b"m"]), end_stream=True)
    first = pair.server.receive(pair.client.data_to_send())  # SETTINGS, then HEADERS and DATA a call
    assert [type(e) for e in first] == [CallStarted, MessagesReceived, RequestsEnded, CallStarted]
    assert pair.server.input_pending
    events = first
    while pair.server.input_pending:
        events += pair.server.receive()
    assert [type(e) for e in events] == [CallStarted, MessagesReceived, RequestsEnded] * 3
    assert pair.server.receive() == []
