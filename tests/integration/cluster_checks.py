"""Helpers for the end-to-end fault tests (tests/integration/test_cluster_faults.py).

- ``FAST``: cluster config with short replication timeouts, so that a failover takes about a second.
- ``Publisher``: a background ack-ALL load that follows the partition leader and records every ack.
- ``view``/``leader_of``/``wait_for``: the partition as the live nodes see it.
- ``read_node``: a node's committed messages (Subscribe, readISRReplica) up to its HW.
- ``check_converged``/``check_acked``/``check_stored_logs``: the invariants of
  /work/shared/reference/replication-scenarios.md, live and on the stopped nodes' files.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import nats

from bascule.client import BasculeError, Client, PartitionInfo
from bascule.partition.log import CommitLog, checkpoint
from bascule.testing.local import LocalCluster
from bascule.wire import envelope
from bascule.wire.entry import scan
from bascule.wire.pb import api_pb2, api_pb2_grpc

FAST: dict[str, Any] = {
    "clustering.replica.max.leader.timeout": "1s",
    "clustering.replica.max.lag.time": "2s",
    "clustering.replica.max.idle.wait": "500ms",
    "clustering.replica.fetch.timeout": "1s",
    "clustering.min.insync.replicas": 2,
}

RPC_TIMEOUT = 1.0
ALL_NODES = [0, 1, 2]


class InvariantViolation(AssertionError):
    pass


# ---- waiting -------------------------------------------------------------------------------------


async def wait_for(
    check: Callable[[], Awaitable[Any]], timeout: float, what: str, cluster: LocalCluster | None = None,
    interval: float = 0.1,
) -> Any:
    """Poll the coroutine function `check` until it returns something other than None or False; that value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = await check()
        except Exception as exc:  # noqa: BLE001 - a node may be down or not ready: keep polling
            last = exc
        else:
            if last is not None and last is not False:
                return last
        if time.monotonic() > deadline:
            logs = "\n" + cluster.log_tails(25) if cluster is not None else ""
            raise AssertionError(f"timed out after {timeout:.1f} s waiting for {what}; last: {last!r}{logs}")
        await asyncio.sleep(interval)


# ---- metadata --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeView:
    """One node's answer to FetchMetadata for a stream's partition 0 (HW and newest are its own log's)."""

    index: int
    server_id: str
    partition: PartitionInfo | None
    brokers: dict[str, str]


async def node_view(cluster: LocalCluster, index: int, stream: str) -> NodeView | None:
    """The node's metadata view, None when it does not answer in time (down or paused)."""
    node = cluster.node(index)
    if not node.running:
        return None
    try:
        async with Client(node.address, timeout=RPC_TIMEOUT) as client:
            metadata = await client.fetch_metadata(stream)
    except (TimeoutError, BasculeError):
        return None
    info = metadata.streams.get(stream)
    partition = info.partitions.get(0) if info is not None and info.exists else None
    return NodeView(index, node.server_id, partition, metadata.brokers)


async def views(cluster: LocalCluster, stream: str, indexes: list[int] | None = None) -> list[NodeView]:
    indexes = list(range(len(cluster))) if indexes is None else indexes
    found = await asyncio.gather(*(node_view(cluster, i, stream) for i in indexes))
    return [v for v in found if v is not None]


def index_of(cluster: LocalCluster, server_id: str) -> int:
    return cluster.server_ids.index(server_id)


async def leader_of(cluster: LocalCluster, stream: str, indexes: list[int] | None = None) -> str | None:
    """The partition leader most answering nodes name (a node lagging behind Raft, or a zombie, is outvoted)."""
    named = Counter(v.partition.leader for v in await views(cluster, stream, indexes) if v.partition)
    return named.most_common(1)[0][0] if named else None


async def agreed_partition(cluster: LocalCluster, stream: str, indexes: list[int]) -> PartitionInfo | None:
    """Partition metadata when the given nodes all answer and agree on leader and ISR, else None."""
    found = await views(cluster, stream, indexes)
    if len(found) != len(indexes) or any(v.partition is None for v in found):
        return None
    first = found[0].partition
    if any((v.partition.leader, sorted(v.partition.isr)) != (first.leader, sorted(first.isr)) for v in found):
        return None
    return first


def raft_status(cluster: LocalCluster, index: int, timeout: float = 1.0) -> dict | None:
    """pysyncobj's status of a node's metadata Raft member (its TCP utility command), None if it does not
    answer. Blocking: call it through asyncio.to_thread. bascule has no API for the metadata leader."""
    from pysyncobj.utility import TcpUtility

    node = cluster.node(index)
    if not node.running:
        return None
    try:
        password = node.extra_env.get("BASCULE_RAFT_PASSWORD")
        return TcpUtility(password=password, timeout=timeout).executeCommand(node.raft_address, ["status"])
    except Exception:  # noqa: BLE001 - down, paused, or mid-restart
        return None


async def raft_leader_index(cluster: LocalCluster, indexes: list[int] | None = None) -> int | None:
    """The node whose Raft member says it is the leader (state 2) and that the others name as leader."""
    indexes = list(range(len(cluster))) if indexes is None else indexes
    statuses = await asyncio.gather(*(asyncio.to_thread(raft_status, cluster, i) for i in indexes))
    by_address = {cluster.node(i).raft_address: i for i in indexes}
    leaders = [i for i, s in zip(indexes, statuses) if s and s.get("state") == 2]
    named = {str(s.get("leader")) for s in statuses if s}
    if len(leaders) == 1 and named == {cluster.node(leaders[0]).raft_address}:
        return by_address[cluster.node(leaders[0]).raft_address]
    return None


async def create_stream(cluster: LocalCluster, name: str, replication_factor: int = 3, min_isr: int = 2) -> None:
    async with Client(cluster.brokers[0]) as client:
        await client.create_stream(name, f"{name}.in", replication_factor=replication_factor, min_isr=min_isr)
    nodes = ALL_NODES if replication_factor == 3 else None
    if nodes is not None:
        await wait_for(lambda: converged(cluster, name, nodes), 15, f"{name}: a leader and a full ISR", cluster)
    else:
        await wait_for(lambda: leader_of(cluster, name), 15, f"{name}: a leader", cluster)


async def leader_index(cluster: LocalCluster, stream: str, among: list[int] | None = None) -> int:
    leader = await wait_for(lambda: leader_of(cluster, stream, among), 15, f"{stream}: a leader", cluster)
    return index_of(cluster, leader)


async def new_leader(cluster: LocalCluster, stream: str, among: list[int], old: str, timeout: float = 15) -> int:
    """Until the nodes `among` agree on a leader other than `old`; its index."""

    async def elected():
        info = await agreed_partition(cluster, stream, among)
        return info.leader if info is not None and info.leader != old else None

    return index_of(cluster, await wait_for(elected, timeout, f"{stream}: a leader other than {old}", cluster))


async def restart(cluster: LocalCluster, index: int) -> None:
    """Start a stopped (killed) node again, without blocking the event loop."""
    node = cluster.node(index)
    node.start(wait=False)
    await asyncio.to_thread(node.wait_ready, 30, cluster.running_server_ids)


async def publish_all_acked(cluster: LocalCluster, stream: str, values: list[bytes], timeout: float = 20) -> dict:
    """Publish `values` (ack ALL) to the current leader, retrying the batch until it is acked."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        leader = cluster.node(await leader_index(cluster, stream))
        try:
            async with Client(leader.address, timeout=3) as client:
                acks = await client.publish_many(stream, values, ack_policy="all")
            return {ack.offset: value for ack, value in zip(acks, values)}
        except (TimeoutError, BasculeError) as exc:
            last = exc
            await asyncio.sleep(0.2)
    raise AssertionError(f"{stream}: batch not acked within {timeout} s: {last!r}\n{cluster.log_tails(25)}")


def stop_and_check_files(cluster: LocalCluster, streams: dict[str, dict[int, bytes]]) -> None:
    cluster.stop()
    for stream, acked in streams.items():
        check_stored_logs(cluster, stream, acked)


def leader_epochs(cluster: LocalCluster, index: int, stream: str) -> list[tuple[int, int]]:
    """(epoch, start offset) pairs of a node's leader-epoch checkpoint (a plain file read)."""
    saved = checkpoint.read_epochs(partition_dir(cluster, index, stream))
    return saved.history.entries if saved is not None else []


# ---- load ----------------------------------------------------------------------------------------------


@dataclass
class Publisher:
    """Publishes unique values in small ack-ALL batches (publish_many), following the partition leader.

    A failed batch is sent again to whichever node leads then, so a value may be stored twice; only
    acked values must survive. ``acked`` maps each acked offset to its value; two acks naming one
    offset with different values are an invariant violation, collected in ``conflicts``.
    """

    cluster: LocalCluster
    stream: str
    batch: int = 5
    timeout: float = 2.0
    pause: float = 0.01
    tag: str = "v"
    acked: dict[int, bytes] = field(default_factory=dict)
    conflicts: list[str] = field(default_factory=list)
    batches_acked: int = 0
    failures: int = 0
    errors: Counter = field(default_factory=Counter)
    error_messages: list[str] = field(default_factory=list)
    last_ack_time: float = 0.0
    longest_silence: float = 0.0  # the longest time between two acked batches
    _seq: int = 0
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task | None = None

    def start(self) -> Publisher:
        self._task = asyncio.create_task(self._run())
        return self

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), self.timeout + 5)
            except TimeoutError:
                self._task.cancel()
                await asyncio.gather(self._task, return_exceptions=True)

    @property
    def values_sent(self) -> int:
        return self._seq

    async def wait_acks(self, more: int, timeout: float) -> None:
        """Until `more` further batches are acked (the load is flowing)."""
        target = self.batches_acked + more
        deadline = time.monotonic() + timeout
        while self.batches_acked < target:
            if self._task is not None and self._task.done():
                self._task.result()
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"the ack-ALL load stalled: {self.batches_acked} batches acked, {self.failures} failures "
                    f"{dict(self.errors)}\n{self.cluster.log_tails(25)}"
                )
            await asyncio.sleep(0.05)

    async def _run(self) -> None:
        clients: dict[str, Client] = {}
        try:
            while not self._stop.is_set():
                values = [f"{self.tag}-{self._seq + i}".encode() for i in range(self.batch)]
                self._seq += self.batch
                while not self._stop.is_set():
                    address = await self._leader_address()
                    if address is None:
                        await asyncio.sleep(0.1)
                        continue
                    client = clients.get(address)
                    if client is None:
                        client = clients[address] = Client(address, timeout=self.timeout)
                    try:
                        acks = await asyncio.wait_for(
                            client.publish_many(self.stream, values, ack_policy="all"), self.timeout + 1
                        )
                    except (TimeoutError, BasculeError, grpc.RpcError) as exc:
                        self.failures += 1
                        self.errors[getattr(getattr(exc, "code", None), "name", type(exc).__name__)] += 1
                        if len(self.error_messages) < 10:
                            self.error_messages.append(f"{address}: {exc}")
                        # Forget the cached leader: next time ask again.
                        await clients.pop(address).close()
                        await asyncio.sleep(0.1)
                        continue
                    self._record(acks, values)
                    break
                await asyncio.sleep(self.pause)
        finally:
            for client in clients.values():
                await client.close()

    def _record(self, acks: list, values: list[bytes]) -> None:
        for ack, value in zip(acks, values):
            self._record_ack(ack.offset, value)
        self._batch_acked()

    def _record_ack(self, offset: int, value: bytes) -> None:
        previous = self.acked.setdefault(offset, value)
        if previous != value:
            self.conflicts.append(f"offset {offset} acked for {previous!r} and for {value!r}")

    def _batch_acked(self) -> None:
        now = time.monotonic()
        if self.last_ack_time:
            self.longest_silence = max(self.longest_silence, now - self.last_ack_time)
        self.batches_acked += 1
        self.last_ack_time = now

    async def _leader_address(self) -> str | None:
        found = await views(self.cluster, self.stream)
        named = Counter(v.partition.leader for v in found if v.partition)
        if not named:
            return None
        leader = named.most_common(1)[0][0]
        for v in found:
            if leader in v.brokers:
                return v.brokers[leader]
        return None


@dataclass
class Observer:
    """A consumer that keeps reading the partition from its leader, across failovers, resuming at the next
    offset it has not seen. Every offset must come once, in order, and never with another value later
    ("one offset never holds two different messages as seen by any reader over time")."""

    cluster: LocalCluster
    stream: str
    seen: list[bytes] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task | None = None

    def start(self) -> Observer:
        self._task = asyncio.create_task(self._run())
        return self

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while not self._stop.is_set():
            found = await views(self.cluster, self.stream)
            named = Counter(v.partition.leader for v in found if v.partition)
            address = next((v.brokers.get(named.most_common(1)[0][0]) for v in found), None) if named else None
            if address is None:
                await asyncio.sleep(0.1)
                continue
            try:
                await self._read(address)
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.1)

    async def _read(self, address: str) -> None:
        start = len(self.seen)
        request = api_pb2.SubscribeRequest(
            stream=self.stream, partition=0, startPosition=api_pb2.StartPosition.OFFSET, startOffset=start,
        )
        async with grpc.aio.insecure_channel(address) as channel:
            call = api_pb2_grpc.APIStub(channel).Subscribe(request, timeout=1.5)
            first = True
            try:
                async for m in call:
                    if first:
                        first = False
                        continue
                    if m.offset != len(self.seen):
                        self.violations.append(f"{address}: read offset {m.offset}, expected {len(self.seen)}")
                        return
                    self.seen.append(m.value)
                    if self._stop.is_set():
                        return
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise

    def check(self, final: list[Stored]) -> None:
        """What it read is a prefix of the final log."""
        if self.violations:
            raise InvariantViolation(f"reader saw offsets out of order: {self.violations[:5]}")
        for offset, value in enumerate(self.seen[: len(final)]):
            if final[offset].value != value:
                raise InvariantViolation(
                    f"offset {offset} was read as {value!r}, and now holds {final[offset].value!r}"
                )
        if len(self.seen) > len(final):
            raise InvariantViolation(f"reader saw {len(self.seen)} messages, the final log has {len(final)}")


async def publish_direct(address: str, stream: str, value: bytes, policy: str, timeout: float) -> int:
    """Publish through the gRPC API of exactly this node (no leader lookup); the acked offset."""
    request = api_pb2.PublishRequest(
        stream=stream, value=value, ackPolicy={"leader": 0, "all": 1}[policy], correlationId="direct"
    )
    async with grpc.aio.insecure_channel(address) as channel:
        response = await api_pb2_grpc.APIStub(channel).Publish(request, timeout=timeout)
    if not response.HasField("ack"):
        raise AssertionError(f"no ack in {response}")
    return response.ack.offset


# ---- reading -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stored:
    offset: int
    timestamp: int
    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...]


async def read_node(address: str, stream: str, isr_replica: bool = True, timeout: float = 10.0) -> list[Stored]:
    """Every committed message the node at `address` serves, from the earliest to its HW (STOP_LATEST)."""
    request = api_pb2.SubscribeRequest(
        stream=stream, partition=0, readISRReplica=isr_replica,
        startPosition=api_pb2.StartPosition.EARLIEST, stopPosition=api_pb2.StopPosition.STOP_LATEST,
    )
    found: list[Stored] = []
    async with grpc.aio.insecure_channel(address, options=[("grpc.max_receive_message_length", 1 << 26)]) as ch:
        call = api_pb2_grpc.APIStub(ch).Subscribe(request, timeout=timeout)
        first = True
        try:
            async for m in call:
                if first:
                    first = False
                    continue
                found.append(Stored(m.offset, m.timestamp, m.key, m.value, tuple(sorted(m.headers.items()))))
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
    return found


def check_contiguous(messages: list[Stored], who: str) -> None:
    offsets = [m.offset for m in messages]
    if offsets != list(range(len(offsets))):
        gaps = [(a, b) for a, b in zip(offsets, offsets[1:]) if b != a + 1]
        raise InvariantViolation(f"{who}: offsets not contiguous from 0 (first {offsets[:1]}, jumps {gaps[:5]})")


def check_acked(messages: list[Stored], acked: dict[int, bytes], who: str) -> None:
    """Every acked (offset, value) is there."""
    by_offset = {m.offset: m.value for m in messages}
    missing = [o for o in sorted(acked) if o not in by_offset]
    wrong = [(o, acked[o], by_offset[o]) for o in sorted(acked) if o in by_offset and by_offset[o] != acked[o]]
    if missing or wrong:
        raise InvariantViolation(
            f"{who}: {len(missing)} acked offsets missing (first {missing[:5]}), "
            f"{len(wrong)} hold another value (first {wrong[:3]}); {len(acked)} acked, {len(messages)} read"
        )


async def converged(cluster: LocalCluster, stream: str, indexes: list[int]) -> PartitionInfo | None:
    """When every given node is in the ISR (as all of them see it) and all report the same HW."""
    agreed = await agreed_partition(cluster, stream, indexes)
    if agreed is None or sorted(agreed.isr) != sorted(cluster.node(i).server_id for i in indexes):
        return None
    found = await views(cluster, stream, indexes)
    hws = {v.partition.high_watermark for v in found}
    return agreed if len(hws) == 1 else None


async def check_live(
    cluster: LocalCluster, stream: str, acked: dict[int, bytes], indexes: list[int] | None = None,
    timeout: float = 20.0,
) -> list[Stored]:
    """Wait until the replicas agree (whole ISR, one HW), then read every replica up to its HW: contiguous,
    every acked message present, and the replicas identical. Returns the leader's messages."""
    indexes = list(range(len(cluster))) if indexes is None else indexes
    info = await wait_for(lambda: converged(cluster, stream, indexes), timeout,
                          f"replicas {indexes} to converge (all in the ISR, one HW)", cluster)
    leader = cluster.node(index_of(cluster, info.leader))
    leader_messages = await read_node(leader.address, stream, isr_replica=False)
    check_contiguous(leader_messages, f"leader {leader.server_id}")
    check_acked(leader_messages, acked, f"leader {leader.server_id}")
    for i in indexes:
        node = cluster.node(i)
        if node.server_id == info.leader:
            continue
        messages = await read_node(node.address, stream)
        check_contiguous(messages, f"replica {node.server_id}")
        common = min(len(messages), len(leader_messages))
        for mine, theirs in zip(messages[:common], leader_messages[:common]):
            if mine != theirs:
                raise InvariantViolation(
                    f"replica {node.server_id} differs from leader {leader.server_id} at offset {mine.offset}: "
                    f"{mine} != {theirs}"
                )
    return leader_messages


# ---- stored logs ---------------------------------------------------------------------------------------


def partition_dir(cluster: LocalCluster, index: int, stream: str) -> Path:
    return newest_incarnation(cluster.node(index).stored_dir, stream) / "0"


def newest_incarnation(data_dir: Path, stream: str) -> Path:
    """A stream's directory on a node: ``<name>@<creation time>``, the newest if several."""
    found = sorted((data_dir / "streams").glob(f"{stream}@*"), key=lambda d: int(d.name.rsplit("@", 1)[1]))
    return found[-1] if found else data_dir / "streams" / f"{stream}@missing"


@dataclass
class StoredLog:
    server_id: str
    hw: int
    entries: list[bytes]  # raw stored bytes of each entry, index = offset
    epochs: list[int]


def read_stored_log(cluster: LocalCluster, index: int, stream: str) -> StoredLog:
    """A stopped node's partition log, read from its segment files (raw entry bytes) and HW checkpoint."""
    node = cluster.node(index)
    assert not node.running, f"{node.server_id} must be stopped to read its files"
    path = partition_dir(cluster, index, stream)
    hw = checkpoint.read_high_watermark(path)
    with CommitLog.open(path) as commit_log:
        raw = b""
        offset = commit_log.oldest_offset
        assert offset == 0, f"{node.server_id}: log starts at {offset}"
        while offset < commit_log.next_offset:
            chunk = commit_log.read_raw(offset, 1 << 20)
            raw += chunk
            offset = commit_log.next_offset if not chunk else offset + sum(1 for _ in scan(chunk))
    entries, epochs = [], []
    for expected, (offset, epoch, _, start, end) in enumerate(scan(raw)):
        assert offset == expected, f"{node.server_id}: stored offset {offset} at position {expected}"
        entries.append(raw[start:end])
        epochs.append(epoch)
    return StoredLog(node.server_id, -1 if hw is None else hw, entries, epochs)


def check_stored_logs(
    cluster: LocalCluster, stream: str, acked: dict[int, bytes], indexes: list[int] | None = None,
) -> list[StoredLog]:
    """On stopped nodes: replicas byte-identical up to the smaller HW; acked messages in every replica's
    committed part and in the longest HW."""
    from bascule.wire.entry import decode_entries

    indexes = list(range(len(cluster))) if indexes is None else indexes
    logs = [read_stored_log(cluster, i, stream) for i in indexes]
    for a in logs:
        for b in logs:
            if a.server_id >= b.server_id:
                continue
            upto = min(a.hw, b.hw)
            for offset in range(upto + 1):
                if a.entries[offset] != b.entries[offset]:
                    raise InvariantViolation(
                        f"{a.server_id} and {b.server_id} differ at offset {offset} below HW {upto} "
                        f"(epochs {a.epochs[offset]} vs {b.epochs[offset]})"
                    )
    best = max(logs, key=lambda lg: lg.hw)
    if acked and best.hw < max(acked):
        raise InvariantViolation(f"highest HW {best.hw} ({best.server_id}) is below acked offset {max(acked)}")
    values = {o: decode_entries(best.entries[o])[0].value for o in range(best.hw + 1)}
    wrong = [(o, v, values.get(o)) for o, v in sorted(acked.items()) if values.get(o) != v]
    if wrong:
        raise InvariantViolation(f"{best.server_id}: acked messages missing or changed on disk: {wrong[:5]}")
    return logs


class EnvelopePublisher(Publisher):
    """Publisher's load through the capture path: Liftbridge envelopes on the stream's subject over
    plain NATS, each with its own ack inbox (ack ALL), ``batch`` in flight at a time. Every ack is
    recorded as it arrives; a batch not fully acked within ``timeout`` is sent again (as new values'
    duplicates: only acked values must survive)."""

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        nc = await nats.connect(self.cluster.nats_url, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
        prefix = f"_INBOX.faults.{uuid.uuid4().hex}."
        waiting: dict[str, tuple[bytes, asyncio.Future]] = {}

        async def on_ack(msg: Any) -> None:
            value, acked = waiting.pop(msg.subject, (None, None))
            if acked is None or acked.done():
                return
            ack = envelope.decode_message(msg.data, envelope.MsgType.ACK, api_pb2.Ack)
            self._record_ack(ack.offset, value)
            acked.set_result(ack)

        await nc.subscribe(prefix + "*", cb=on_ack)
        sent = 0
        try:
            while not self._stop.is_set():
                values = [f"{self.tag}-{self._seq + i}".encode() for i in range(self.batch)]
                self._seq += self.batch
                while not self._stop.is_set():
                    futures = []
                    for value in values:
                        sent += 1
                        inbox = f"{prefix}{sent}"
                        futures.append(loop.create_future())
                        waiting[inbox] = (value, futures[-1])
                        message = api_pb2.Message(value=value, ackInbox=inbox, correlationId=inbox,
                                                  ackPolicy=api_pb2.AckPolicy.ALL)
                        enveloped = envelope.encode_message(message, envelope.MsgType.PUBLISH)
                        await nc.publish(self.stream_subject, enveloped)
                    try:
                        await asyncio.wait_for(asyncio.gather(*futures), self.timeout)
                    except TimeoutError:
                        self.failures += 1
                        self.errors["ack timeout"] += 1
                        waiting.clear()
                        continue
                    self._batch_acked()
                    break
                await asyncio.sleep(self.pause)
        finally:
            await nc.close()

    @property
    def stream_subject(self) -> str:
        return f"{self.stream}.in"  # how the fault tests name a stream's subject (partition 0)


@contextlib.asynccontextmanager
async def running_publisher(cluster: LocalCluster, stream: str, kind: type[Publisher] | None = None, **kwargs: Any):
    publisher = (kind or Publisher)(cluster, stream, **kwargs).start()
    try:
        yield publisher
    finally:
        await publisher.stop()


@contextlib.asynccontextmanager
async def running_observer(cluster: LocalCluster, stream: str):
    observer = Observer(cluster, stream).start()
    try:
        yield observer
    finally:
        await observer.stop()
