"""TCP proxies on the routes of a test's NATS cluster, so that a test can cut them (`LocalCluster(nats_cluster=True)`).

Server i solicits its route to server j through a proxy of its own for that ordered pair (``RouteProxies.urls``),
owned by the test process and run on a thread of its own (the cluster's calls block, and the routes must keep
flowing meanwhile). A cut is made on those proxies:

- ``cut_server(i)``: every route of server i, both ways; ``cut_pair(i, j)``: the routes between i and j. Their
  connections are reset and new ones refused until ``heal``, so the servers see the routes drop at once.
- ``cut_one_way(i, j)``: what server i sends to server j is held (not read, so TCP holds it back, as on a
  network that lost every packet one way); the connections stay up and the other direction flows. ``heal``
  lets the held bytes through, unchanged.

The servers advertise a route address that refuses every connection (``advertise_address``): every server lists all
the others' proxies, so gossip would only add direct routes, around the proxies.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from bascule.testing.ports import LOOPBACK, free_port, join_host_port

__all__ = ["Direction", "RouteProxies", "RouteProxy"]

CHUNK = 65536
# Route pooling opens a few connections per pair; many more means something loops.
MAX_CONNECTIONS = 64
CALL_TIMEOUT = 10.0
Result = TypeVar("Result")


class Direction(enum.Enum):
    UPSTREAM = "to the target"  # bytes the connecting (source) server sends
    DOWNSTREAM = "to the source"  # bytes the target server answers


class RouteProxy:
    """Forwards every connection to ``port`` to ``target_port``, both ways; runs on one event loop."""

    def __init__(self, port: int, target_port: int, host: str = LOOPBACK) -> None:
        self.host = host
        self.port = port
        self.target_port = target_port
        self.refusing = False
        self._held: set[Direction] = set()
        self._flowing: dict[Direction, asyncio.Event] = {}
        self._connections: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"nats://{join_host_port(self.host, self.port)}"

    @property
    def connections(self) -> int:
        return len(self._connections)

    async def start(self) -> None:
        # Made here, on the loop that runs them: the proxies may be started again on another.
        self._flowing = {direction: asyncio.Event() for direction in Direction}
        for direction, flowing in self._flowing.items():
            if direction not in self._held:
                flowing.set()
        self._server = await asyncio.start_server(self._accepted, self.host, self.port)

    async def close(self) -> None:
        self.reset()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def reset(self) -> None:
        """Abort every connection (the peers see a reset) and refuse new ones until ``heal``."""
        self.refusing = True
        for source, target in list(self._connections):
            source.transport.abort()
            target.transport.abort()

    def hold(self, direction: Direction) -> None:
        """Stop reading that direction of every connection, new ones included, until ``heal``."""
        self._held.add(direction)
        self._flowing[direction].clear()

    def heal(self) -> None:
        self.refusing = False
        self._held.clear()
        for flowing in self._flowing.values():
            flowing.set()

    async def _accepted(self, source_reader: asyncio.StreamReader, source: asyncio.StreamWriter) -> None:
        if self.refusing or len(self._connections) >= MAX_CONNECTIONS:
            source.transport.abort()
            return
        try:
            target_reader, target = await asyncio.open_connection(self.host, self.target_port)
        except OSError:
            source.transport.abort()  # the target server is down: so is the route
            return
        pair = (source, target)
        self._connections.add(pair)
        try:
            await asyncio.gather(
                self._pipe(source_reader, target, Direction.UPSTREAM),
                self._pipe(target_reader, source, Direction.DOWNSTREAM),
            )
        finally:
            self._connections.discard(pair)
            source.transport.abort()
            target.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: Direction) -> None:
        flowing = self._flowing[direction]
        try:
            while True:
                await flowing.wait()
                data = await reader.read(CHUNK)
                if not data:
                    break
                await flowing.wait()  # a hold that came while the read waited holds what it read too
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        # The peer closed this direction: pass the end on, as TCP would, and let the other direction finish.
        with contextlib.suppress(ConnectionError, OSError, RuntimeError):
            if writer.can_write_eof() and not writer.transport.is_closing():
                writer.write_eof()


class RouteProxies:
    """A proxy per ordered pair of the servers whose cluster ports are ``cluster_ports``, on a thread of their own.

    Not started until ``start``; ``close`` stops the thread. Every call blocks until the proxies have acted.
    """

    def __init__(self, cluster_ports: list[int], host: str = LOOPBACK) -> None:
        self.host = host
        self.size = len(cluster_ports)
        self.links = {
            (source, target): RouteProxy(free_port(host), cluster_ports[target], host)
            for source in range(self.size) for target in range(self.size) if source != target
        }
        self.advertise_port = free_port(host)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._refuser: asyncio.Server | None = None

    def urls(self, source: int) -> list[str]:
        """The route URLs server ``source`` solicits: one proxy to each other server."""
        return [link.url for (start, _), link in sorted(self.links.items()) if start == source]

    @property
    def advertise_address(self) -> str:
        """The host:port every server advertises as its route address."""
        return join_host_port(self.host, self.advertise_port)

    def start(self) -> None:
        if self._thread is not None:
            return
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="nats-route-proxies", daemon=True)
        self._thread.start()
        self._call(self._start_all())

    def close(self) -> None:
        if self._thread is None or self._loop is None:
            return
        self._call(self._close_all())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CALL_TIMEOUT)
        self._loop.close()
        self._thread = self._loop = None

    def cut_server(self, index: int) -> None:
        """Reset every route of server ``index`` and refuse new ones until ``heal``."""
        self._on_loop(_reset, [link for (source, target), link in self.links.items() if index in (source, target)])

    def cut_pair(self, first: int, second: int) -> None:
        """Reset the routes between two servers and refuse new ones until ``heal``."""
        self._on_loop(_reset, [self.links[first, second], self.links[second, first]])

    def cut_one_way(self, source: int, target: int) -> None:
        """Hold what server ``source`` sends to server ``target``; the other way keeps flowing."""
        self._on_loop(self._hold_one_way, source, target)

    def heal(self) -> None:
        """Every route forwards again; held bytes go through."""
        self._on_loop(_heal, list(self.links.values()))

    def connections(self, source: int, target: int) -> int:
        """The connections the proxy from ``source`` to ``target`` forwards now."""
        return self._on_loop(lambda: self.links[source, target].connections)

    def _hold_one_way(self, source: int, target: int) -> None:
        self.links[source, target].hold(Direction.UPSTREAM)
        self.links[target, source].hold(Direction.DOWNSTREAM)

    async def _start_all(self) -> None:
        self._refuser = await asyncio.start_server(_refuse, self.host, self.advertise_port)
        for link in self.links.values():
            await link.start()

    async def _close_all(self) -> None:
        for link in self.links.values():
            await link.close()
        if self._refuser is not None:
            self._refuser.close()
            await self._refuser.wait_closed()

    def _on_loop(self, function: Callable[..., Result], *args: Any) -> Result:
        async def call() -> Result:
            return function(*args)

        return self._call(call())

    def _call(self, work: Coroutine[Any, Any, Result]) -> Result:
        if self._loop is None:
            work.close()
            raise RuntimeError("the route proxies are not running")
        return asyncio.run_coroutine_threadsafe(work, self._loop).result(CALL_TIMEOUT)


def _reset(links: list[RouteProxy]) -> None:
    for link in links:
        link.reset()


def _heal(links: list[RouteProxy]) -> None:
    for link in links:
        link.heal()


async def _refuse(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.transport.abort()
