"""The two systems under test, started on loopback and driven the way the scenarios need: bascule (a
LocalCluster of nodes around their own nats-server) and NATS JetStream (nats-servers routed together)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bascule.natsio.flush import flush
from bascule.natsio.publisher import EnvelopePublisher
from benchmarks.harness import POLL_INTERVAL, READY_TIMEOUT, BenchError, Context, log, now


class BasculeSystem:
    """A LocalCluster (its own nats-server plus `size` bascule nodes) and the clients the harness uses."""

    def __init__(self, ctx: Context, name: str, size: int, config: dict[str, Any]) -> None:
        from bascule.testing.local import LocalCluster

        self.ctx = ctx
        self.cluster = LocalCluster(
            size, base_dir=ctx.dir / name, config=config, keep_data=True, level=ctx.args.bascule_log_level,
        )
        self.nc: Any = None
        self.publisher: EnvelopePublisher | None = None
        self._clients: dict[str, Any] = {}

    async def __aenter__(self) -> BasculeSystem:
        try:
            await asyncio.to_thread(self.cluster.start)
            import nats

            self.nc = await nats.connect(self.cluster.nats_url, max_reconnect_attempts=-1)
            self.publisher = await EnvelopePublisher.start(self.nc, "bench")
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None and exc_type is not asyncio.CancelledError:
            log(f"bascule logs after a failure:\n{self.cluster.log_tails(15)}")
        await self.close()

    async def close(self) -> None:
        for client in self._clients.values():
            with contextlib.suppress(Exception):
                await client.close()
        self._clients.clear()
        if self.publisher is not None:
            with contextlib.suppress(Exception):
                await self.publisher.close()
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.close()
        await asyncio.to_thread(self.cluster.stop)

    @property
    def nats_url(self) -> str:
        return self.cluster.nats_url

    def client(self, address: str | None = None) -> Any:
        from bascule.client import Client

        address = address or self.cluster.brokers[0]
        if address not in self._clients:
            self._clients[address] = Client(address, timeout=10.0)
        return self._clients[address]

    def node_pids(self) -> dict[str, int | None]:
        return {node.server_id: node.pid for node in self.cluster.nodes if node.running}

    def server_pids(self) -> list[int | None]:
        pids = [node.pid for node in self.cluster.nodes if node.running]
        if self.cluster.nats is not None:
            pids.append(self.cluster.nats.pid)
        return pids

    def address_of(self, server_id: str) -> str:
        return next(node.address for node in self.cluster.nodes if node.server_id == server_id)

    def index_of(self, server_id: str) -> int:
        return next(i for i, node in enumerate(self.cluster.nodes) if node.server_id == server_id)

    async def acked_publish(self, subject: str, value: bytes, timeout: float = 1.0) -> float | None:
        """An ack-ALL envelope on `subject`: when its ack arrived, or None after `timeout`."""
        from bascule.wire.pb import api_pb2

        assert self.publisher is not None
        message = api_pb2.Message(value=value, ackPolicy=api_pb2.AckPolicy.ALL)
        try:
            await self.publisher.request(subject, message, timeout)
        except TimeoutError:
            return None
        return now()

    async def partitions(self, stream: str) -> dict[int, Any]:
        """The stream's partitions as some running node's metadata shows them (leader, ISR)."""
        from bascule.client import BasculeError

        last: Exception | None = None
        for node in self.cluster.nodes:
            if not node.running:
                continue
            try:
                metadata = await self.client(node.address).fetch_metadata(stream)
                info = metadata.streams.get(stream)
                if info is not None and info.exists:
                    return info.partitions
            except BasculeError as exc:
                last = exc
        raise BenchError(f"no node knows stream {stream}: {last}")

    async def high_watermarks(self, stream: str) -> dict[int, int]:
        """Each partition's HW as its leader reports it (one FetchMetadata per running node)."""
        from bascule.client import BasculeError

        async def ask(node: Any) -> dict[int, int]:
            try:
                metadata = await self.client(node.address).fetch_metadata(stream)
            except BasculeError:
                return {}
            info = metadata.streams.get(stream)
            if info is None or not info.exists:
                return {}
            return {pid: p.high_watermark for pid, p in info.partitions.items() if p.leader == node.server_id}

        found: dict[int, int] = {}
        for answer in await asyncio.gather(*(ask(n) for n in self.cluster.nodes if n.running)):
            found.update(answer)
        return found

    async def create_stream(self, name: str, subject: str, rf: int, partitions: int = 1,
                            timeout: float = 60.0) -> dict[int, int]:
        """Create a stream and wait until every partition leads with a full ISR and captures (an acked
        envelope went through each partition's subject). Returns each partition's HW after that probe."""
        from bascule.wire.names import partition_subject

        await self.client().create_stream(name, subject, replication_factor=rf, partitions=partitions)
        deadline = now() + timeout
        while True:
            parts = await self.partitions(name)
            if len(parts) == partitions and all(p.leader and len(p.isr) == rf for p in parts.values()):
                break
            if now() > deadline:
                raise BenchError(f"stream {name}: partitions not led with a full ISR after {timeout} s: {parts}")
            await asyncio.sleep(0.05)
        limit = asyncio.Semaphore(20)

        async def probe(pid: int) -> None:
            async with limit:
                subject_p = partition_subject(subject, pid)
                while not await self.acked_publish(subject_p, b"probe"):
                    if now() > deadline:
                        raise BenchError(f"stream {name}/{pid}: no ack for a probe on {subject_p} after {timeout} s")

        await asyncio.gather(*(probe(pid) for pid in range(partitions)))
        while True:
            hws = await self.high_watermarks(name)
            if len(hws) == partitions and all(h >= 0 for h in hws.values()):
                return hws
            if now() > deadline:
                raise BenchError(f"stream {name}: HW not visible after the probes: {hws}")
            await asyncio.sleep(0.05)

    async def wait_committed(self, stream: str, targets: dict[int, int], stall: float) -> float:
        """Until every partition's HW reaches its target; returns when. Raises if progress stops."""
        return await wait_progress(
            lambda: self.high_watermarks(stream),
            lambda hws: sum(max(0, min(hws.get(p, -1), t)) for p, t in targets.items()),
            lambda hws: all(hws.get(p, -1) >= t for p, t in targets.items()),
            stall, f"bascule stream {stream}", targets,
            interval=POLL_INTERVAL if len(targets) == 1 else 0.05,
        )

    async def wait_full_isr(self, stream: str, rf: int, timeout: float) -> None:
        deadline = now() + timeout
        while True:
            try:
                parts = await self.partitions(stream)
                if all(p.leader and len(p.isr) == rf for p in parts.values()):
                    return
            except BenchError:
                parts = {}
            if now() > deadline:
                raise BenchError(f"{stream}: ISR not back to {rf} after {timeout} s: {parts}")
            await asyncio.sleep(0.1)

    async def leader_of(self, stream: str, partition: int = 0) -> str:
        return (await self.partitions(stream))[partition].leader


async def wait_progress(
    poll: Callable[[], Awaitable[Any]], progress: Callable[[Any], int], done: Callable[[Any], bool],
    stall: float, what: str, target: Any, interval: float = POLL_INTERVAL,
) -> float:
    """Poll until `done`; returns when. Raises once `progress` has not moved for `stall` seconds."""
    last_progress, last_change = -1, now()
    while True:
        state = await poll()
        polled = now()
        if done(state):
            return polled
        value = progress(state)
        if value != last_progress:
            last_progress, last_change = value, polled
        elif polled - last_change > stall:
            raise BenchError(f"{what}: no progress for {stall:.0f} s; state {_brief(state)}, target {_brief(target)}")
        await asyncio.sleep(interval)


def _brief(value: Any, limit: int = 400) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def jetstream_config(path: Path, sync_always: bool) -> Path:
    lines = ["jetstream {",
             # Generous ingest buffers: plain publishes beyond them are dropped (default 100k msgs / 128 MiB).
             "  max_buffered_msgs: 10000000",
             "  max_buffered_size: 4GB"]
    if sync_always:
        lines.append("  sync_interval: always")
    lines.append("}")
    path.write_text("\n".join(lines) + "\n")
    return path


class JetStreamSystem:
    """`size` nats-servers with JetStream, each with its own store dir; with size > 1, routed into a cluster."""

    def __init__(self, ctx: Context, name: str, size: int, sync_always: bool = False) -> None:
        from bascule.natsio.server import EmbeddedNats
        from bascule.testing import free_port

        self.ctx = ctx
        self.base = ctx.dir / name
        self.base.mkdir(parents=True, exist_ok=True)
        self.size = size
        route_ports = [free_port() for _ in range(size)] if size > 1 else []
        self.servers: list[Any] = []
        for i in range(size):
            config = jetstream_config(self.base / f"js{i}.conf", sync_always)
            options: dict[str, Any] = {}
            if size > 1:
                options = {
                    "cluster_name": "bench",
                    "cluster_listen": f"nats://127.0.0.1:{route_ports[i]}",
                    "routes": [f"nats://127.0.0.1:{p}" for j, p in enumerate(route_ports) if j != i],
                }
            self.servers.append(EmbeddedNats(
                host="127.0.0.1", port=0, config_file=config, jetstream=True,
                store_dir=self.base / f"store{i}", server_name=f"js{i}", log_dir=self.base / f"log{i}",
                **options,
            ))
        self.nc: Any = None
        self.js: Any = None

    async def __aenter__(self) -> JetStreamSystem:
        try:
            await asyncio.gather(*(s.start() for s in self.servers))
            await self.connect()
        except BaseException:
            await self.close()
            raise
        return self

    async def connect(self, index: int | None = None) -> None:
        """(Re)connect to every running server, or to server `index` alone; returns once JetStream answers."""
        import nats

        if self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.close()
        urls = [s.url for s in self.servers if s.running] if index is None else [self.servers[index].url]
        self.nc = await nats.connect(servers=urls, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
        self.js = self.nc.jetstream(timeout=5)
        deadline = now() + READY_TIMEOUT
        while True:  # until a JetStream meta leader answers
            try:
                await self.js.account_info()
                return
            except Exception as exc:  # noqa: BLE001
                if now() > deadline:
                    raise BenchError(
                        f"JetStream not ready after {READY_TIMEOUT} s: {exc!r}\n{self.log_tails()}") from exc
                await asyncio.sleep(0.2)

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None and exc_type is not asyncio.CancelledError:
            log(f"JetStream logs after a failure:\n{self.log_tails()}")
        await self.close()

    async def close(self) -> None:
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.close()
            self.nc = None
        for server in self.servers:
            with contextlib.suppress(Exception):
                await server.stop()

    def log_tails(self, lines: int = 15) -> str:
        parts = []
        for i in range(self.size):
            path = self.base / f"log{i}" / "nats-server.log"
            try:
                tail = "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
            except OSError:
                tail = "(no log)"
            parts.append(f"--- js{i}: {path} ---\n{tail}")
        return "\n".join(parts)

    @property
    def nats_url(self) -> str:
        return next(s.url for s in self.servers if s.running)

    def server_pids(self) -> list[int | None]:
        # EmbeddedNats keeps its process private; the pid is read for /proc figures only.
        return [s._process.pid for s in self.servers if s._process is not None]

    async def stop_server(self, index: int, timeout: float) -> int | None:
        """SIGTERM server `index`, SIGKILL if it has not exited after `timeout` s; its exit status."""
        process = self.servers[index]._process  # read for its exit status only, as server_pids reads the pid
        await self.servers[index].stop(timeout)
        return None if process is None else process.returncode

    async def create_stream(self, name: str, subject: str, replicas: int, timeout: float = 60.0) -> int:
        """Create a file-stored stream and wait until an acked publish goes through; returns messages held."""
        deadline = now() + timeout
        while True:
            try:
                await self.js.add_stream(name=name, subjects=[subject], num_replicas=replicas, storage="file")
                break
            except Exception as exc:  # noqa: BLE001 - meta leader elections, timeouts
                if now() > deadline:
                    raise BenchError(f"JetStream add_stream {name}: {exc!r}") from exc
                await asyncio.sleep(0.2)
        while True:
            try:
                await self.js.publish(subject, b"probe", timeout=1.0)
                break
            except Exception as exc:  # noqa: BLE001
                if now() > deadline:
                    raise BenchError(f"JetStream stream {name}: no ack for a probe: {exc!r}") from exc
                await asyncio.sleep(0.1)
        return (await self.js.stream_info(name)).state.messages

    async def messages(self, name: str) -> int:
        try:
            return (await self.js.stream_info(name)).state.messages
        except Exception:  # noqa: BLE001 - a slow API answer under load is not progress lost
            return -1

    async def wait_stored(self, name: str, target: int, stall: float) -> float:
        return await wait_progress(
            lambda: self.messages(name), lambda n: n, lambda n: n >= target,
            stall, f"JetStream stream {name}", target,
        )

    async def wait_current(self, stream: str, timeout: float) -> None:
        """Until the stream has a leader and both its other replicas are current."""
        deadline = now() + timeout
        while True:
            try:
                info = await self.js.stream_info(stream)
                replicas = info.cluster.replicas or []
                if info.cluster.leader and len(replicas) == 2 and all(r.current and not r.offline for r in replicas):
                    return
            except Exception:  # noqa: BLE001
                info = None
            if now() > deadline:
                raise BenchError(f"JetStream {stream}: replicas not current after {timeout} s: {info}")
            await asyncio.sleep(0.1)


class JetStreamProbe:
    """JetStream publishes with a reply inbox each (what js.publish does), acks told apart by inbox."""

    def __init__(self, nc: Any) -> None:
        self.nc = nc
        self.prefix = f"_INBOX.jsbench.{uuid.uuid4().hex[:12]}"
        self.waiters: dict[str, asyncio.Future[float]] = {}
        self.sequence = 0

    async def start(self) -> None:
        await self.nc.subscribe(self.prefix + ".*", cb=self._on_ack)
        await flush(self.nc)

    async def _on_ack(self, msg: Any) -> None:
        waiter = self.waiters.pop(msg.subject, None)
        if waiter is None or waiter.done():
            return
        try:
            ok = "error" not in json.loads(msg.data) and not (msg.headers or {}).get("Status")
        except ValueError:
            ok = False
        if ok:
            waiter.set_result(now())

    async def acked_publish(self, subject: str, value: bytes, timeout: float = 1.0) -> float | None:
        """When the stream's ack arrived, or None after `timeout` (or when the publish failed)."""
        self.sequence += 1
        inbox = f"{self.prefix}.{self.sequence}"
        waiter = self.waiters[inbox] = asyncio.get_running_loop().create_future()
        try:
            await self.nc.publish(subject, value, reply=inbox)
            return await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            return None
        except Exception:  # noqa: BLE001 - a publish while reconnecting fails: as good as no ack
            return None
        finally:
            self.waiters.pop(inbox, None)
