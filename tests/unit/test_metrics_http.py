"""The metrics endpoint's HTTP: request heads parsed without a network, and its answers when the node
is not ready or its metrics cannot be collected (a stand-in node, a real socket)."""

import asyncio
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bascule.metrics import BadRequest, MetricsServer, Request, parse_request_head


@pytest.mark.parametrize(
    "head, request_",
    [
        (b"GET /metrics HTTP/1.1\r\nHost: localhost:9100\r\n\r\n", Request("GET", "/metrics")),
        (b"GET /readyz HTTP/1.0\r\n\r\n", Request("GET", "/readyz")),
        (b"HEAD /healthz?x=1&y=%20 HTTP/1.1\r\nUser-Agent: kube-probe/1.30\r\nAccept: */*\r\n\r\n",
         Request("HEAD", "/healthz")),
        (b"POST /metrics HTTP/1.1\r\nX-Empty:\r\nX-Tab:\ta\tb\r\n\r\n", Request("POST", "/metrics")),
        (b"GET /metrics HTTP/1.1\r\nX-Latin: caf\xe9\r\n\r\n", Request("GET", "/metrics")),
    ],
)
def test_request_heads_are_parsed(head, request_):
    assert parse_request_head(head) == request_


@pytest.mark.parametrize(
    "head",
    [
        b"",
        b"\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\n",  # no blank line
        b"GET /metrics HTTP/1.1\r\n\r\nextra",
        b"GET /metrics\r\n\r\n",
        b"GET /metrics HTTP/1.1 more\r\n\r\n",
        b"GET  /metrics HTTP/1.1\r\n\r\n",
        b"GET\t/metrics HTTP/1.1\r\n\r\n",
        b"G(T /metrics HTTP/1.1\r\n\r\n",
        b"GET metrics HTTP/1.1\r\n\r\n",
        b"GET http://host/metrics HTTP/1.1\r\n\r\n",
        b"GET /m\xe9trics HTTP/1.1\r\n\r\n",
        b"GET /metrics HTTP/2.0\r\n\r\n",
        b"GET /metrics http/1.1\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nno colon\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\n: no name\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost : x\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nX: a\x00b\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nX: a\rb\r\n\r\n",
        b"GET /metrics HTTP/1.1\nHost: x\n\n",
        bytes(random.Random(3).randrange(256) for _ in range(300)) + b"\r\n\r\n",
    ],
)
def test_malformed_request_heads_are_bad_requests(head):
    with pytest.raises(BadRequest):
        parse_request_head(head)


@given(st.binary(max_size=300))
def test_any_bytes_parse_or_raise_bad_request(data):
    for head in (data, data + b"\r\n\r\n"):
        try:
            request = parse_request_head(head)
        except BadRequest:
            continue
        assert request.path.startswith("/") and "?" not in request.path


class StandInNode:
    def __init__(self, not_ready: str | None) -> None:
        self.not_ready = not_ready

    def why_not_ready(self) -> str | None:
        return self.not_ready

    @property
    def state(self):
        raise RuntimeError("the metadata went away")


async def fetch(port: int, path: str) -> tuple[bytes, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
    response = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    status_line, _, rest = response.partition(b"\r\n")
    return status_line, rest.partition(b"\r\n\r\n")[2]


@pytest.mark.anyio
async def test_a_node_not_ready_gets_503_with_the_reason_and_a_failed_collection_500(caplog):
    server = MetricsServer(StandInNode("no metadata leader"))
    await server.start("127.0.0.1", 0)
    try:
        assert await fetch(server.port, "/readyz") == (b"HTTP/1.1 503 Service Unavailable", b"no metadata leader\n")
        assert await fetch(server.port, "/healthz") == (b"HTTP/1.1 200 OK", b"ok\n")
        status_line, _ = await fetch(server.port, "/metrics")
        assert status_line == b"HTTP/1.1 500 Internal Server Error"
        assert "collecting the metrics failed" in caplog.text
    finally:
        await server.stop()


@pytest.mark.anyio
async def test_stop_ends_connections_still_being_served():
    server = MetricsServer(StandInNode(None))
    await server.start("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /readyz HTTP/1.1\r\n")  # and nothing more: the server waits for the rest
    await asyncio.sleep(0.05)
    await asyncio.wait_for(server.stop(), 5)
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()


@pytest.mark.anyio
async def test_idle_connections_at_the_cap_make_room_for_a_probe():
    """Seventy connections that never send a request: a probe after them is answered at once, the
    longest idle of them dropped to make room (as nginx does)."""
    from bascule.metrics import MAX_CONNECTIONS

    server = MetricsServer(StandInNode(None))
    await server.start("127.0.0.1", 0)
    idle = []
    try:
        for _ in range(MAX_CONNECTIONS + 6):
            idle.append(await asyncio.open_connection("127.0.0.1", server.port))
        await asyncio.sleep(0.1)
        for _ in range(3):
            assert await asyncio.wait_for(fetch(server.port, "/healthz"), 1.0) == (b"HTTP/1.1 200 OK", b"ok\n")
        async def closed(reader: asyncio.StreamReader) -> bool:
            try:
                return await asyncio.wait_for(reader.read(), 0.5) == b""
            except TimeoutError:
                return False

        dropped = sum(await asyncio.gather(*(closed(reader) for reader, _ in idle)))
        assert dropped >= 7  # the 6 over the cap, and the one that made room for the first probe
    finally:
        for _, writer in idle:
            writer.close()
        await server.stop()
