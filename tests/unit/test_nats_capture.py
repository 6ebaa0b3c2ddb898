"""The capture connection fed bytes directly: the bulk MSG/HMSG parser, message ids from HMSG
header blocks, PING/PONG pairing, and the names it refuses to put on a protocol line."""

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bascule.natsio import capture
from bascule.natsio.capture import MAX_CONTROL_LINE, CaptureConnection, _Link, header_message_id

LOOP = asyncio.new_event_loop()  # only to make futures; never run


@pytest.fixture(scope="module", autouse=True)
def close_loop():
    yield
    LOOP.close()


class RecordingTransport:
    def __init__(self):
        self.written = b""
        self.aborted = False

    def write(self, data):
        self.written += data

    def is_closing(self):
        return self.aborted

    def abort(self):
        self.aborted = True


def attach_link(conn):
    """A new socket for conn, greeted by the server as far as INFO."""
    link = conn._link = _Link(conn, conn.servers[0], LOOP)
    transport = RecordingTransport()
    link.connection_made(transport)
    link.data_received(b'INFO {"server_id":"x"}\r\n')
    return link, transport


def connection():
    conn = CaptureConnection(["nats://127.0.0.1:4222"], "test")
    link, transport = attach_link(conn)
    got = []
    sid = conn.subscribe("s.>", "q", got.extend)
    return link, transport, got, sid


def test_msg_hmsg_with_and_without_reply_in_one_read():
    link, _, got, sid = connection()
    headers = b"NATS/1.0\r\nA: b\r\n\r\n"
    data = (b"MSG s.a %d 5\r\nhello\r\n" % sid
            + b"MSG s.b %d r.1 0\r\n\r\n" % sid
            + b"HMSG s.c %d %d %d\r\n%sbody\r\n" % (sid, len(headers), len(headers) + 4, headers)
            + b"HMSG s.d %d in.2 %d %d\r\n%sxy\r\n" % (sid, len(headers), len(headers) + 2, headers))
    link.data_received(data)
    assert got == [("s.a", "", b"hello"), ("s.b", "r.1", b""), ("s.c", "", b"body"), ("s.d", "in.2", b"xy")]


def test_frames_split_at_every_byte_are_reassembled():
    link, _, got, sid = connection()
    data = b"MSG s.a %d 12\r\nhello\r\nworld\r\nPING\r\nMSG s.b %d 1\r\nx\r\n" % (sid, sid)
    for i in range(len(data)):
        link.data_received(data[i:i + 1])
    assert got == [("s.a", "", b"hello\r\nworld"), ("s.b", "", b"x")]


def test_a_large_message_over_many_reads_is_joined_once_whole():
    link, _, got, sid = connection()
    payload = bytes(range(256)) * 4096
    data = b"MSG s.big %d %d\r\n%s\r\nMSG s.next %d 2\r\nok\r\n" % (sid, len(payload), payload, sid)
    reads = [data[i:i + 4000] for i in range(0, len(data), 4000)]
    for read in reads[:-1]:
        link.data_received(read)
    assert got == [] and len(link._chunks) == len(reads) - 1  # nothing joined before the frame is whole
    link.data_received(reads[-1])
    assert got == [("s.big", "", payload), ("s.next", "", b"ok")]


def test_ping_is_answered_and_info_sends_connect_once_with_subscriptions():
    conn = CaptureConnection(["nats://127.0.0.1:4222"], "test")
    sid = conn.subscribe("s.>", "q", lambda deliveries: None)
    link, transport = attach_link(conn)
    link.data_received(b'PING\r\nINFO {"server_id":"x"}\r\n')
    assert transport.written.count(b"CONNECT ") == 1
    assert b"SUB s.> q %d\r\n" % sid in transport.written and transport.written.endswith(b"PING\r\nPONG\r\n")


def test_unsubscribed_messages_are_ignored():
    link, transport, got, sid = connection()
    link._owner.unsubscribe(sid)
    assert transport.written.endswith(b"UNSUB %d\r\n" % sid)
    link.data_received(b"MSG s.a %d 1\r\nx\r\n" % sid)
    assert got == []


@pytest.mark.parametrize("garbage", [b"MSG s.a notanumber 5\r\nhello\r\n", b"MSG s.a 1 5\r\nhelloXX",
                                     b"HMSG s.a 1 zz 5\r\nhello\r\n", b"MSG s.a\r\n"])
def test_garbage_frames_abort_the_connection(garbage):
    link, transport, got, _ = connection()
    link.data_received(garbage)
    assert transport.aborted and got == []


def test_a_frame_larger_than_any_server_sends_aborts_the_connection():
    link, transport, got, sid = connection()
    link.data_received(b"MSG s.a %d 99999999999999999999\r\n" % sid)
    assert transport.aborted and got == [] and link._needed == 0


HEADER_BLOCKS = [  # (header block, the message id it carries)
    (b"NATS/1.0\r\nNats-Msg-Id: a\r\n\r\n", b"a"),
    (b"NATS/1.0\r\nNats-Msg-Id:abc\r\n\r\n", b"abc"),
    (b"NATS/1.0 503\r\nNats-Msg-Id: a\r\n\r\n", b"a"),
    (b"NATS/1.0\r\nNats-Msg-Id: \t a b \t\r\n\r\n", b"a b"),
    (b"NATS/1.0\r\nA: b\r\nNats-Msg-Id: x\r\nC: d\r\n\r\n", b"x"),
    (b"NATS/1.0\r\nNats-Msg-Id: first\r\nNats-Msg-Id: second\r\n\r\n", b"first"),
    (b"NATS/1.0\r\nno colon here\r\nNats-Msg-Id: a\r\n\r\n", b"a"),
    (b"NATS/1.0\r\nNats-Msg-Id: a\r\n", b"a"),  # no blank line to end the block
    (b"NATS/1.0\r\nNats-Msg-Id: a:b\rc\nd\r\n\r\n", b"a:b\rc\nd"),
    (b"NATS/1.0\r\n\r\n", None),
    (b"NATS/1.0\r\nA: b\r\n\r\n", None),
    (b"NATS/1.0\r\nnats-msg-id: a\r\n\r\n", None),  # JetStream's match is case-sensitive
    (b"NATS/1.0\r\nNats-Msg-Id : a\r\n\r\n", None),
    (b"NATS/1.0\r\nNats-Msg-Id-X: a\r\n\r\n", None),
    (b"NATS/1.0\r\nX-Nats-Msg-Id: a\r\n\r\n", None),
    (b"NATS/1.0\r\nNats-Msg-Id a\r\n\r\n", None),  # the id's line without a colon
    (b"NATS/1.0\r\nNats-Msg-Id:\r\n\r\n", None),
    (b"NATS/1.0\r\nNats-Msg-Id: \t \r\n\r\n", None),
    (b"NATS/1.0\r\nNats-Msg-Id: a", None),  # the line not ended within the block
    (b"NATS/1.0\r\nNats-Msg-Id: a\r", None),
    (b"NATS/1.0 Nats-Msg-Id: a\r\n\r\n", None),
    (b"HTTP/1.1\r\nNats-Msg-Id: a\r\n\r\n", None),
    (b"\r\nNats-Msg-Id: a\r\n\r\n", None),
    (b"garbage", None),
]


@pytest.mark.parametrize(("block", "expected"), HEADER_BLOCKS)
def test_the_message_id_of_a_header_block(block, expected):
    assert header_message_id(block, 0, len(block)) == expected
    before = b"NATS/1.0\r\nNats-Msg-Id: outside\r\n"  # only buffer[start:end] counts
    buffer = before + block + b"Nats-Msg-Id: z\r\n"
    assert header_message_id(buffer, len(before), len(before) + len(block)) == expected


@pytest.mark.parametrize(("block", "expected"), HEADER_BLOCKS)
def test_an_hmsg_delivers_its_payload_whatever_its_header_block_and_its_id_when_it_has_one(block, expected):
    data = frame(1, b"s.a", b"r.1", block, b"body") + frame(1, b"s.b", b"", b"", b"plain")
    id_part = () if expected is None else (expected,)
    assert fed(capture.parse_frames, [data]) == ([("s.a", "r.1", b"body", *id_part), ("s.b", "", b"plain")], False)


def test_an_hmsg_with_an_id_is_delivered_with_it_split_at_every_byte():
    link, _, got, sid = connection()
    block = b"NATS/1.0\r\nA: b\r\nNats-Msg-Id: id-1\r\n\r\n"
    data = frame(sid, b"s.a", b"", block, b"one") + frame(sid, b"s.a", b"", block.replace(b"-1", b"-2"), b"two")
    for i in range(len(data)):
        link.data_received(data[i:i + 1])
    assert got == [("s.a", "", b"one", b"id-1"), ("s.a", "", b"two", b"id-2")]


def test_a_header_block_claiming_more_than_its_message_still_aborts_the_connection():
    link, transport, got, sid = connection()
    link.data_received(b"HMSG s.a %d 30 4\r\nNATS/1.0\r\nNats-Msg-Id: a\r\n\r\n" % sid)
    assert transport.aborted and got == []


def frame(sid: int, subject: bytes, reply: bytes, headers: bytes, payload: bytes) -> bytes:
    reply_part = reply + b" " if reply else b""
    if headers:
        sizes = b"%d %d" % (len(headers), len(headers) + len(payload))
        return b"HMSG %s %d %s%s\r\n%s%s\r\n" % (subject, sid, reply_part, sizes, headers, payload)
    return b"MSG %s %d %s%d\r\n%s\r\n" % (subject, sid, reply_part, len(payload), payload)


header_lines = st.builds(
    lambda name, separator, value: name + separator + value + b"\r\n",
    st.sampled_from([b"Nats-Msg-Id", b"nats-msg-id", b"Nats-Msg-Id ", b"A", b""]), st.sampled_from([b":", b": ", b""]),
    st.sampled_from([b"", b" ", b"\t", b"id-1", b" id-2 ", b"\r", b":"]) | st.binary(max_size=6),
)
header_blocks = st.one_of(
    st.sampled_from([block for block, _ in HEADER_BLOCKS]),
    st.builds(lambda status, lines, end: status + b"".join(lines) + end,
              st.sampled_from([b"NATS/1.0\r\n", b"NATS/1.0 503\r\n", b"NATS/1.1\r\n", b""]),
              st.lists(header_lines, max_size=4), st.sampled_from([b"\r\n", b"", b"\r"])),
    st.binary(max_size=40),
)
frames = st.builds(
    frame, st.sampled_from([1, 2]), st.sampled_from([b"s.a", b"s.b"]), st.sampled_from([b"", b"r.1"]),
    st.just(b"") | header_blocks,
    st.sampled_from([b"", b"x", b"hello", b"\r\n", b"a\r\nb", b"LIFT"]),
)
pieces = st.one_of(
    frames, frames, frames, st.sampled_from([b"PING\r\n", b"PONG\r\n", b"+OK\r\n"]), st.binary(max_size=8),
)


def fed(parse, reads):
    """What a link whose loop is ``parse`` delivers, and whether it gave up on the connection."""
    original = capture.parse_frames
    capture.parse_frames = parse
    try:
        link, transport, got, sid = connection()
        link._owner.subscribe("s.b", "", got.extend)
        for read in reads:
            if not transport.aborted:
                link.data_received(read)
        return got, transport.aborted
    finally:
        capture.parse_frames = original


@pytest.mark.skipif(capture._frames is None, reason="bascule.natsio._frames was not built (no C compiler)")
@given(st.lists(pieces, max_size=12), st.lists(st.integers(1, 40), max_size=6))
def test_the_frame_loop_in_c_delivers_what_the_python_loop_does(stream_pieces, cuts):
    data = b"".join(stream_pieces)
    reads, position = [], 0
    for cut in cuts:
        reads.append(data[position:position + cut])
        position += cut
    reads.append(data[position:])
    assert fed(capture._frames.parse_frames, reads) == fed(capture.parse_frames_python, reads)


@pytest.mark.skipif(capture._frames is None, reason="bascule.natsio._frames was not built (no C compiler)")
@given(header_blocks, st.binary(max_size=20))
def test_the_frame_loop_in_c_finds_the_message_ids_the_python_loop_finds(block, payload):
    data = frame(1, b"s.a", b"", block, payload)
    id_part = () if (found := header_message_id(block, 0, len(block))) is None else (found,)
    expected = ([("s.a", "", payload, *id_part)] if block else [("s.a", "", payload)], False)
    assert fed(capture._frames.parse_frames, [data]) == fed(capture.parse_frames_python, [data]) == expected


@given(st.binary(max_size=300))
def test_random_bytes_never_raise(data):
    link, _, _, _ = connection()
    link.data_received(data)


def live_connection():
    link, transport, got, sid = connection()
    link.data_received(b"PONG\r\n")  # to the PING after CONNECT
    assert link.live
    return link, transport, got, sid


def test_a_health_check_pong_is_not_taken_for_a_flush_pong():
    link, _, _, _ = live_connection()
    link.ping_for_health()
    flushed = link.ping()
    link.data_received(b"PONG\r\n")
    assert not flushed.done()
    link.data_received(b"PONG\r\n")
    assert flushed.done()


def test_a_lost_socket_fails_its_waiters_and_says_so():
    link, _, _, _ = live_connection()
    flushed = link.ping()
    link.connection_lost(None)
    assert isinstance(flushed.exception(), ConnectionError) and link.lost.done() and not link.live


def test_nothing_of_a_replaced_socket_reaches_the_next_or_the_handlers():
    old, _, got, sid = connection()
    old.data_received(b"MSG s.a %d 10\r\nhalf" % sid)
    new, _ = attach_link(old._owner)
    new.data_received(b"MSG s.b %d 2\r\nok\r\n" % sid)
    old.data_received(b"e a msg\r\nMSG s.c %d 1\r\nx\r\n" % sid)  # a read already under way
    assert got == [("s.b", "", b"ok")]


BAD_NAMES = ["a\r\nPUB x 1", "a\nb", "a\rb", "a b", "a\tb", "a\x00b", "a\x7fb", "a\u2028b", "a\u00a0b", "\ud800"]


@pytest.mark.parametrize("subject", BAD_NAMES + ["", "a" * MAX_CONTROL_LINE])
def test_a_subject_that_could_inject_or_break_a_protocol_line_is_refused(subject):
    link, transport, got, sid = connection()
    written = transport.written
    with pytest.raises(ValueError, match="subject"):
        link._owner.subscribe(subject, "", got.extend)
    with pytest.raises(ValueError, match="subject"):
        link._owner.subscribe(subject, "q", got.extend)
    assert transport.written == written and list(link._owner._subscriptions) == [sid]


@pytest.mark.parametrize("queue", BAD_NAMES + ["q" * MAX_CONTROL_LINE])
def test_a_queue_group_that_could_inject_or_break_a_protocol_line_is_refused(queue):
    link, transport, got, sid = connection()
    written = transport.written
    with pytest.raises(ValueError, match="queue group"):
        link._owner.subscribe("s.ok", queue, got.extend)
    assert transport.written == written and list(link._owner._subscriptions) == [sid]


def test_a_refused_subscription_never_reaches_a_later_connect():
    conn = CaptureConnection(["nats://127.0.0.1:4222"], "test")
    with pytest.raises(ValueError):
        conn.subscribe("a\r\nUNSUB 1", "", lambda deliveries: None)
    conn.subscribe("s.ok", "", lambda deliveries: None)
    _, transport = attach_link(conn)
    assert transport.written.count(b"\r\n") == 3 and b"SUB s.ok 1\r\n" in transport.written


def test_publish_many_leaves_out_only_the_messages_it_cannot_put_on_a_pub_line():
    link, transport, _, _ = live_connection()
    transport.written = b""
    link._owner.publish_many([("ok.1", b"a"), ("bad\r\nSUB x 9", b"b"), ("", b"c"), ("ok.2", b"\r\n")])
    assert transport.written == b"PUB ok.1 1\r\na\r\nPUB ok.2 2\r\n\r\n\r\n"
