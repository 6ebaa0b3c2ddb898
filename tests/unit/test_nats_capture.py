"""The bulk MSG/HMSG parser of the capture connection, fed bytes directly."""

import pytest
from hypothesis import given, strategies as st

from bascule.node.nats_capture import CaptureConnection


class RecordingTransport:
    def __init__(self):
        self.written = b""
        self.aborted = False

    def write(self, data):
        self.written += data

    def is_closing(self):
        return False

    def abort(self):
        self.aborted = True


def connection():
    conn = CaptureConnection(["nats://127.0.0.1:4222"], "test")
    transport = RecordingTransport()
    conn.connection_made(transport)
    got = []
    sid = conn.subscribe("s.>", "q", got.extend)
    return conn, transport, got, sid


def test_msg_hmsg_with_and_without_reply_in_one_read():
    conn, _, got, sid = connection()
    headers = b"NATS/1.0\r\nA: b\r\n\r\n"
    data = (b"MSG s.a %d 5\r\nhello\r\n" % sid
            + b"MSG s.b %d r.1 0\r\n\r\n" % sid
            + b"HMSG s.c %d %d %d\r\n%sbody\r\n" % (sid, len(headers), len(headers) + 4, headers)
            + b"HMSG s.d %d in.2 %d %d\r\n%sxy\r\n" % (sid, len(headers), len(headers) + 2, headers))
    conn.data_received(data)
    assert got == [("s.a", "", b"hello"), ("s.b", "r.1", b""), ("s.c", "", b"body"), ("s.d", "in.2", b"xy")]


def test_frames_split_at_every_byte_are_reassembled():
    conn, _, got, sid = connection()
    data = b"MSG s.a %d 12\r\nhello\r\nworld\r\nPING\r\nMSG s.b %d 1\r\nx\r\n" % (sid, sid)
    for i in range(len(data)):
        conn.data_received(data[i:i + 1])
    assert got == [("s.a", "", b"hello\r\nworld"), ("s.b", "", b"x")]


def test_a_large_message_over_many_reads_is_joined_once_whole():
    conn, _, got, sid = connection()
    payload = bytes(range(256)) * 4096
    data = b"MSG s.big %d %d\r\n%s\r\nMSG s.next %d 2\r\nok\r\n" % (sid, len(payload), payload, sid)
    reads = [data[i:i + 4000] for i in range(0, len(data), 4000)]
    for read in reads[:-1]:
        conn.data_received(read)
    assert got == [] and len(conn._chunks) == len(reads) - 1  # nothing joined before the frame is whole
    conn.data_received(reads[-1])
    assert got == [("s.big", "", payload), ("s.next", "", b"ok")]


def test_ping_is_answered_and_info_sends_connect_once_with_subscriptions():
    conn, transport, _, sid = connection()
    transport.written = b""
    conn.data_received(b'INFO {"server_id":"x"}\r\nPING\r\nINFO {"server_id":"x"}\r\n')
    assert transport.written.count(b"CONNECT ") == 1
    assert b"SUB s.> q %d\r\n" % sid in transport.written and transport.written.endswith(b"PONG\r\n")


def test_unsubscribed_messages_are_ignored():
    conn, transport, got, sid = connection()
    conn.unsubscribe(sid)
    assert transport.written.endswith(b"UNSUB %d\r\n" % sid)
    conn.data_received(b"MSG s.a %d 1\r\nx\r\n" % sid)
    assert got == []


@pytest.mark.parametrize("garbage", [b"MSG s.a notanumber 5\r\nhello\r\n", b"MSG s.a 1 5\r\nhelloXX",
                                     b"HMSG s.a 1 zz 5\r\nhello\r\n", b"MSG s.a\r\n"])
def test_garbage_frames_abort_the_connection(garbage):
    conn, transport, got, _ = connection()
    conn.data_received(garbage)
    assert transport.aborted and got == []


@given(st.binary(max_size=300))
def test_random_bytes_never_raise(data):
    conn, _, _, _ = connection()
    conn.data_received(data)
