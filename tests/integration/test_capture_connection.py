"""The capture connection against a real nats-server: delivery, message ids from NATS headers,
queue groups, reconnect, one socket at a time, and half-open connections found by PING."""

import asyncio
import collections

import nats
import pytest

from bascule.natsio.capture import CaptureConnection
from bascule.natsio.server import EmbeddedNats

pytestmark = pytest.mark.anyio


async def wait_for(predicate, timeout=5.0):
    for _ in range(int(timeout / 0.02)):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


async def test_delivers_payloads_subjects_replies_and_survives_a_server_restart(tmp_path):
    server = EmbeddedNats(port=0, log_dir=tmp_path)
    await server.start()
    capture = CaptureConnection([server.url], "test-capture")
    try:
        await capture.connect()
        got = []
        capture.subscribe("cap.>", "grp", got.extend)
        await capture.flush()
        nc = await nats.connect(server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
        await nc.publish("cap.a", b"plain", reply="inbox.1")
        await nc.publish("cap.b", b"with headers", headers={"X": "1"})
        for i in range(2000):
            await nc.publish("cap.c", b"m%d" % i)
        await nc.flush()
        await wait_for(lambda: len(got) == 2002)
        assert got[0] == ("cap.a", "inbox.1", b"plain")
        assert got[1] == ("cap.b", "", b"with headers")
        assert [p for _, _, p in got[2:]] == [b"m%d" % i for i in range(2000)]
        await server.stop()
        await server.start()
        await wait_for(lambda: nc.is_connected, 10)
        got.clear()
        for _ in range(50):  # resubscription races the publisher's reconnect: publish until seen
            await nc.publish("cap.after", b"again")
            await nc.flush()
            if got:
                break
            await asyncio.sleep(0.1)
        assert got and got[0] == ("cap.after", "", b"again")
        await nc.close()
    finally:
        await capture.close()
        await server.stop()


async def test_delivers_the_message_id_of_nats_headers_with_the_message(tmp_path):
    server = EmbeddedNats(port=0, log_dir=tmp_path)
    await server.start()
    capture = CaptureConnection([server.url], "test-capture")
    nc = None
    try:
        await capture.connect()
        got = []
        capture.subscribe("ids.>", "", got.extend)
        await capture.flush()
        nc = await nats.connect(server.url)
        await nc.publish("ids.a", b"with id", headers={"Nats-Msg-Id": "a"})
        await nc.publish("ids.b", b"id among others", reply="inbox.2",
                         headers={"X-Trace": "t", "Nats-Msg-Id": " b-2 ", "Z": "z"})
        await nc.publish("ids.c", b"other headers", headers={"X": "1"})
        await nc.publish("ids.d", b"case differs", headers={"nats-msg-id": "d"})
        await nc.publish("ids.e", b"plain")
        await nc.flush()
        await wait_for(lambda: len(got) == 5)
        assert got == [("ids.a", "", b"with id", b"a"), ("ids.b", "inbox.2", b"id among others", b"b-2"),
                       ("ids.c", "", b"other headers"), ("ids.d", "", b"case differs"), ("ids.e", "", b"plain")]
    finally:
        if nc is not None:
            await nc.close()
        await capture.close()
        await server.stop()


async def test_publish_many_sends_every_message_in_order(tmp_path):
    server = EmbeddedNats(port=0, log_dir=tmp_path)
    await server.start()
    capture = CaptureConnection([server.url], "test-capture")
    nc = None
    try:
        await capture.connect()
        nc = await nats.connect(server.url)
        got = []

        async def on_message(msg):
            got.append((msg.subject, msg.data))

        await nc.subscribe("acks.>", cb=on_message)
        # nats-py's flush can return before its SUB has gone out; its own message coming back cannot.
        await nc.publish("acks.probe", b"")
        await wait_for(lambda: got)
        got.clear()
        sent = [(f"acks.{i % 3}", b"\r\n payload %d" % i) for i in range(500)] + [("acks.empty", b"")]
        capture.publish_many(sent)
        await capture.flush()
        await wait_for(lambda: len(got) == len(sent))
        assert got == sent
    finally:
        if nc is not None:
            await nc.close()
        await capture.close()
        await server.stop()


LOOPBACK = "127.0.0.1"


class Pipe:
    """One client connection through the proxy, and its connection to the server."""

    def __init__(self, client_writer):
        self.writers = [client_writer]
        self.flowing = asyncio.Event()
        self.flowing.set()


class Proxy:
    """A TCP proxy on 127.0.0.1 in front of nats-server. It counts the connections it gets and can
    stall them (nothing passes either way, nothing is closed: a half-open connection), cut them,
    or drop the next ones in the middle of the NATS handshake."""

    def __init__(self, upstream_port):
        self.upstream_port = upstream_port
        self.accepted = 0
        self.most_open = 0
        self._pipes = set()
        self._handshakes_to_drop = 0
        self._tasks = set()
        self._server = None

    @property
    def url(self):
        return f"nats://{LOOPBACK}:{self._server.sockets[0].getsockname()[1]}"

    @property
    def open(self):
        return len(self._pipes)

    async def start(self):
        self._server = await asyncio.start_server(self._serve, LOOPBACK, 0)

    async def close(self):
        self._server.close()
        self.resume()
        self.cut()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)

    def stall(self):
        for pipe in self._pipes:
            pipe.flowing.clear()

    def resume(self):
        for pipe in self._pipes:
            pipe.flowing.set()

    def cut(self):
        for pipe in list(self._pipes):
            self._close(pipe)

    def drop_handshakes(self, count):
        """The next `count` connections get the server's INFO and are closed when the client answers."""
        self._handshakes_to_drop = count

    async def _serve(self, client_reader, client_writer):
        self._tasks.add(asyncio.current_task())
        self.accepted += 1
        dropped_on_answer = self._handshakes_to_drop > 0
        self._handshakes_to_drop -= dropped_on_answer
        pipe = Pipe(client_writer)
        self._pipes.add(pipe)  # counted open from the accept on, as the client sees it
        self.most_open = max(self.most_open, self.open)
        server_reader, server_writer = await asyncio.open_connection(LOOPBACK, self.upstream_port)
        pipe.writers.append(server_writer)
        if pipe not in self._pipes:
            server_writer.close()
            return
        await asyncio.gather(self._pump(pipe, client_reader, server_writer, dropped_on_answer),
                             self._pump(pipe, server_reader, client_writer, False))

    async def _pump(self, pipe, reader, writer, drop_on_data):
        try:
            while data := await reader.read(65536):
                await pipe.flowing.wait()
                if drop_on_data:
                    break
                writer.write(data)
        except OSError:
            pass
        finally:
            self._close(pipe)

    def _close(self, pipe):
        if pipe in self._pipes:
            self._pipes.discard(pipe)
            for writer in pipe.writers:
                writer.close()


@pytest.fixture
async def nats_server(tmp_path):
    server = EmbeddedNats(port=0, log_dir=tmp_path)
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def proxy(nats_server):
    proxy = Proxy(nats_server.port)
    await proxy.start()
    yield proxy
    await proxy.close()


def count_sequence_numbers(counts):
    def on_messages(deliveries):
        counts.update(int(payload) for _, _, payload in deliveries)
    return on_messages


async def publish_numbered(nc, subject, numbers):
    for number in numbers:
        await nc.publish(subject, b"%d" % number)
    await nc.flush()


async def test_server_restarts_while_publishing_capture_each_message_at_most_once(nats_server):
    capture = CaptureConnection([nats_server.url], "test-capture")
    nc = await nats.connect(nats_server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.05)
    counts = collections.Counter()
    published = 0

    async def publish_steadily():
        nonlocal published
        while True:
            for _ in range(20):
                published += 1
                await nc.publish("seq", b"%d" % published)
            await asyncio.sleep(0.005)

    try:
        await capture.connect()
        capture.subscribe("seq", "", count_sequence_numbers(counts))
        await capture.flush()
        publisher = asyncio.create_task(publish_steadily())
        for _ in range(3):
            await asyncio.sleep(0.4)
            await nats_server.stop()
            await nats_server.start()
        await asyncio.sleep(0.4)
        publisher.cancel()
        await wait_for(lambda: nc.is_connected, 10)
        await capture.flush()  # subscribed again on the new socket
        tail = range(published + 1, published + 1001)
        await publish_numbered(nc, "seq", tail)
        await wait_for(lambda: all(counts[number] for number in tail))
        await asyncio.sleep(0.2)  # room for any duplicate to arrive
        assert max(counts.values()) == 1, [n for n, c in counts.items() if c > 1][:20]
        assert len(counts) > published / 2  # most got through: the outages are short
    finally:
        await nc.close()
        await capture.close()


async def test_a_half_open_connection_is_found_by_ping_and_replaced(nats_server, proxy):
    capture = CaptureConnection([proxy.url], "test-capture", ping_interval=0.1, max_pings_out=2)
    nc = await nats.connect(nats_server.url)
    got = []
    try:
        await capture.connect()
        capture.subscribe("ho", "", got.extend)
        await capture.flush()
        await nc.publish("ho", b"before")
        await nc.flush()
        await wait_for(lambda: got == [("ho", "", b"before")])
        proxy.stall()
        await wait_for(lambda: proxy.accepted == 2)  # only a PING timeout can notice the stall
        await capture.flush()
        await nc.publish("ho", b"after")
        await nc.flush()
        await wait_for(lambda: len(got) == 2)
        assert got[1] == ("ho", "", b"after")
        proxy.resume()
        await wait_for(lambda: proxy.open == 1)  # the stalled socket was closed by the capture side
        assert proxy.accepted == 2
    finally:
        await nc.close()
        await capture.close()


async def test_connections_lost_during_redials_never_open_a_second_socket(nats_server, proxy):
    capture = CaptureConnection([proxy.url], "test-capture")
    nc = await nats.connect(nats_server.url)
    counts = collections.Counter()
    try:
        await capture.connect()
        capture.subscribe("race", "", count_sequence_numbers(counts))
        await capture.flush()
        proxy.drop_handshakes(3)
        proxy.cut()
        await wait_for(lambda: proxy.accepted == 5)
        await capture.flush()
        await publish_numbered(nc, "race", range(500))
        await wait_for(lambda: len(counts) == 500)
        await asyncio.sleep(0.3)  # room for a stray redial or duplicate
        assert max(counts.values()) == 1
        assert (proxy.accepted, proxy.open, proxy.most_open) == (5, 1, 1)
    finally:
        await nc.close()
        await capture.close()
