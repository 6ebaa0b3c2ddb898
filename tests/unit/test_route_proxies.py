"""The route proxies of a test's NATS cluster (bascule.testing.routes): bytes pass unchanged whatever they are,
half-closes pass on, and cuts reset, refuse or hold what they should."""

from __future__ import annotations

import os
import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from bascule.testing.ports import LOOPBACK, free_port
from bascule.testing.routes import RouteProxies

GREETING = b"INFO {}\r\n"  # a route's first bytes come from the server it reaches
QUIET = 0.3  # long enough for bytes in flight on loopback to arrive


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.sendall(GREETING)
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def echo_port() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer((LOOPBACK, 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture
def proxies(echo_port: int) -> Iterator[RouteProxies]:
    """Two servers: 0 (no one listens there) and 1 (the echo server); link (0, 1) reaches the echo."""
    routes = RouteProxies([free_port(), echo_port])
    routes.start()
    yield routes
    routes.close()


def _connect(routes: RouteProxies, source: int, target: int) -> socket.socket:
    connection = socket.create_connection((LOOPBACK, routes.links[source, target].port), timeout=5)
    assert _receive(connection, len(GREETING)) == GREETING
    return connection


def _receive(connection: socket.socket, size: int) -> bytes:
    received = b""
    while len(received) < size:
        chunk = connection.recv(size - len(received))
        if not chunk:
            break
        received += chunk
    return received


def _closed(connection: socket.socket) -> bool:
    """The proxy closed or reset the connection (rather than keeping it silent)."""
    connection.settimeout(5)
    try:
        return connection.recv(1) == b""
    except ConnectionResetError:
        return True


def _quiet(connection: socket.socket) -> bool:
    connection.settimeout(QUIET)
    try:
        connection.recv(1)
    except TimeoutError:
        return True
    return False


def test_garbage_and_large_bursts_pass_unchanged(proxies: RouteProxies) -> None:
    garbage = os.urandom(3 << 20)
    with _connect(proxies, 0, 1) as connection:
        sender = threading.Thread(target=connection.sendall, args=(garbage,))
        sender.start()
        assert _receive(connection, len(garbage)) == garbage
        sender.join()


def test_a_half_close_passes_on_and_the_answer_still_comes_back(proxies: RouteProxies) -> None:
    with _connect(proxies, 0, 1) as connection:
        connection.sendall(b"PUB x 5\r\nhel")  # a frame cut short
        connection.shutdown(socket.SHUT_WR)
        assert _receive(connection, 12) == b"PUB x 5\r\nhel"
        assert _closed(connection)
    deadline = time.monotonic() + 5
    while proxies.connections(0, 1) and time.monotonic() < deadline:  # the proxy's own end follows the client's
        time.sleep(0.01)
    assert proxies.connections(0, 1) == 0


def test_a_target_that_is_down_is_a_closed_route(proxies: RouteProxies) -> None:
    with socket.create_connection((LOOPBACK, proxies.links[1, 0].port), timeout=5) as connection:
        assert _closed(connection)


def test_a_pair_cut_resets_the_routes_and_refuses_new_ones_until_healed(proxies: RouteProxies) -> None:
    with _connect(proxies, 0, 1) as connection:
        proxies.cut_pair(0, 1)
        assert _closed(connection)
    with socket.create_connection((LOOPBACK, proxies.links[0, 1].port), timeout=5) as refused:
        assert _closed(refused)
    proxies.heal()
    with _connect(proxies, 0, 1) as connection:
        connection.sendall(b"PING\r\n")
        assert _receive(connection, 6) == b"PING\r\n"


def test_a_server_cut_resets_its_routes_both_ways(proxies: RouteProxies) -> None:
    with _connect(proxies, 0, 1) as connection:
        proxies.cut_server(0)
        assert _closed(connection)
    assert proxies.links[1, 0].refusing and proxies.links[0, 1].refusing


def test_a_one_way_cut_holds_that_way_only_and_heal_delivers_what_it_held(proxies: RouteProxies) -> None:
    proxies.cut_one_way(0, 1)
    with socket.create_connection((LOOPBACK, proxies.links[0, 1].port), timeout=5) as connection:
        assert _receive(connection, len(GREETING)) == GREETING  # the way back flows
        connection.sendall(b"held bytes")
        assert _quiet(connection)
        proxies.heal()
        connection.settimeout(5)
        assert _receive(connection, 10) == b"held bytes"


def test_a_one_way_cut_holds_the_answers_of_routes_the_other_server_opened(proxies: RouteProxies) -> None:
    """Server 1's route into server 0 (link (1, 0)) carries server 0's answers back: those are held."""
    proxies.cut_one_way(1, 0)
    with socket.create_connection((LOOPBACK, proxies.links[0, 1].port), timeout=5) as connection:
        assert _quiet(connection)  # the greeting is what server 1 sends server 0
        proxies.heal()
        connection.settimeout(5)
        assert _receive(connection, len(GREETING)) == GREETING
