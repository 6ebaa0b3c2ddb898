"""A node's operations endpoint: Prometheus metrics, /healthz and /readyz over HTTP/1.1.

Off unless ``metrics.listen`` or ``--metrics-port`` sets it. The series are read from the node when
Prometheus scrapes (a collector on a registry of the endpoint's own, not prometheus_client's global one).
What the message paths count, they count in plain integers of the objects they use (replicas, logs, the
capture path), never through prometheus_client, whose every increment takes a lock; gRPC calls are counted
by ``GrpcCalls``, the gRPC server's observer. A connection carries one request and is closed after its
response: a scraper or a probe needs no more. docs/operations.md lists every series.
"""

from __future__ import annotations

import asyncio
import logging
import platform
import re
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from importlib.metadata import version
from itertools import accumulate

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Info, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from bascule.h2grpc.status import Status
from bascule.metadata.state import Partition
from bascule.node.node import Node
from bascule.partition.log import fsync_seconds
from bascule.partition.replica import PartitionReplica

log = logging.getLogger(__name__)

MAX_REQUEST_HEAD = 8 * 1024  # request line and header fields; scrapers and probes send a few hundred bytes
REQUEST_TIMEOUT = 10.0  # for the whole head: a client that trickles it holds a connection no longer
WRITE_TIMEOUT = 10.0
LINGER_TIME = 1.0
LINGER_BYTES = 64 * 1024
# At most this many connections; at the cap, the one idle longest (no request yet, or answered and
# lingering) makes room for a new one, as nginx does: idle connections cannot lock probes out.
MAX_CONNECTIONS = 64

PARTITION_LABELS = ("stream", "partition")
TEXT = "text/plain; charset=utf-8"
# A unary call takes well under a millisecond to a few seconds; a streaming one (Subscribe) lasts as
# long as its client reads, and lands in the last buckets.
GRPC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0, 600.0)


# ---- gRPC calls, as the gRPC server observes them ------------------------------------------------


class _MethodCalls:
    __slots__ = ("codes", "ends", "buckets", "seconds")

    def __init__(self) -> None:
        self.codes = [0] * len(Status)  # calls by status code, but those that ended normally
        self.ends = [0] * len(Status)  # calls that ended normally (``h2grpc.Ended``), by status code
        self.buckets = [0] * (len(GRPC_BUCKETS) + 1)  # calls by duration, the last beyond every bound
        self.seconds = 0.0


class GrpcCalls:
    """Calls by method: how many ended with each status code, whether that was a normal end, and how
    long they took. ``observe`` is the gRPC server's observer (``h2grpc.server.CallObserver``), on the
    event loop: no lock. A collector of the two series."""

    def __init__(self) -> None:
        self.methods: dict[str, _MethodCalls] = {}  # the server's own method paths, and h2grpc's "unknown"

    def observe(self, method: str, code: Status, seconds: float, ended: bool) -> None:
        calls = self.methods.get(method)
        if calls is None:
            calls = self.methods[method] = _MethodCalls()
        (calls.ends if ended else calls.codes)[code] += 1
        calls.buckets[bisect_left(GRPC_BUCKETS, seconds)] += 1
        calls.seconds += seconds

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "bascule_grpc_requests",
            "gRPC calls that ended, by method, status code and outcome (ok, end: a read's normal end, error).",
            labels=["method", "code", "outcome"],
        )
        durations = HistogramMetricFamily(
            "bascule_grpc_request_duration_seconds",
            "Time from a gRPC call's start to its end (a streaming call's whole life), by method.", labels=["method"],
        )
        for method, calls in sorted(self.methods.items()):
            for code, count, ends in zip(Status, calls.codes, calls.ends):
                if count:
                    requests.add_metric([method, code.name, "ok" if code is Status.OK else "error"], count)
                if ends:
                    requests.add_metric([method, code.name, "end"], ends)
            durations.add_metric([method], _cumulative(GRPC_BUCKETS, calls.buckets), calls.seconds)
        yield requests
        yield durations


# ---- the series --------------------------------------------------------------------------------


class NodeCollector:
    """The node's series of docs/operations.md (not the gRPC calls', ``GrpcCalls``, nor the process' and the
    build's, prometheus_client's), read from ``node`` at each scrape."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def collect(self) -> Iterator[Metric]:
        yield from _partition_metrics(self.node)
        yield from _partition_counters(self.node)
        yield from _cluster_metrics(self.node)
        yield from _raft_metrics(self.node)
        yield from _nats_metrics(self.node)
        yield from _capture_metrics(self.node)
        yield _fsync_histogram()


_PARTITION_GAUGES = {
    "log_end_offset": "Offset the next message appended to this replica's log gets.",
    "oldest_offset": "Oldest offset of this replica's log, where reads from the earliest start (log end if empty).",
    "size_bytes": "Bytes of the entries this replica's log holds, as stored (its segments' log files).",
    "high_watermark": "Offset of the partition's last committed message, as this replica knows it (-1: none).",
    "isr_size": "Members of the partition's in-sync replica set, in the metadata.",
    "replicas": "Replicas of the partition, in the metadata.",
    "leader": "1 while this node leads the partition, else 0.",
    "under_replicated": "1 while this node leads the partition and its ISR is smaller than its replicas, else 0.",
    "acks_held": "Writes this leader stored whose acks wait for its lease: no follower showed it still leads.",
}


def _partition_metrics(node: Node) -> Iterator[Metric]:
    gauges = {
        name: GaugeMetricFamily(f"bascule_partition_{name}", documentation, labels=PARTITION_LABELS)
        for name, documentation in _PARTITION_GAUGES.items()
    }
    lag = GaugeMetricFamily(
        "bascule_partition_follower_lag",
        "Messages of the leader's log the follower lacked at its last fetch; on the partition's leader only.",
        labels=(*PARTITION_LABELS, "follower"),
    )
    for labels, replica, assigned in _local_partitions(node):
        for name, value in _partition_values(replica, assigned).items():
            gauges[name].add_metric(labels, value)
        for follower, behind in _follower_lags(replica).items():
            lag.add_metric([*labels, follower], behind)
    yield from gauges.values()
    yield lag


def _local_partitions(node: Node) -> Iterator[tuple[list[str], PartitionReplica, Partition]]:
    """(their stream and partition labels, the replica, the partition's metadata) of the open replicas."""
    state = node.state
    for (stream, partition), local in node.partitions.items():
        assigned = state.partition(stream, partition)
        if not local.replica.closed and assigned is not None:
            yield [stream, str(partition)], local.replica, assigned


_PARTITION_COUNTERS = {
    "messages_in": "Messages appended to this replica's log since it was opened: as leader, or replicated as follower.",
    "bytes_in": "Bytes of the entries appended to this replica's log since it was opened, as stored.",
    "leader_elections": "Leader changes of the partition since it was created (its leader epoch in the metadata).",
    "isr_shrinks": "Members the partition's ISR lost while this node led it, as the metadata applied it.",
    "isr_expands": "Members the partition's ISR gained while this node led it, as the metadata applied it.",
    "duplicates": "Messages not stored again while this node led the partition: their Nats-Msg-Id was in its "
                  "deduplication window.",
}
_READERS = ("subscriber", "follower")


def _partition_counters(node: Node) -> Iterator[Metric]:
    counters = {
        name: CounterMetricFamily(f"bascule_partition_{name}", documentation, labels=PARTITION_LABELS)
        for name, documentation in _PARTITION_COUNTERS.items()
    }
    messages_out = CounterMetricFamily(
        "bascule_partition_messages_out",
        "Messages sent since the replica was opened: read by subscribers, or fetched by followers from this leader.",
        labels=(*PARTITION_LABELS, "reader"),
    )
    bytes_out = CounterMetricFamily(
        "bascule_partition_bytes_out",
        "Bytes sent since the replica was opened: to subscribers as their calls carry them, to followers as stored.",
        labels=(*PARTITION_LABELS, "reader"),
    )
    for labels, replica, assigned in _local_partitions(node):
        for name, value in _partition_counts(replica, assigned).items():
            counters[name].add_metric(labels, value)
        for reader, messages, sent in zip(
            _READERS, (replica.messages_to_subscribers, replica.messages_to_followers),
            (replica.bytes_to_subscribers, replica.bytes_to_followers),
        ):
            messages_out.add_metric([*labels, reader], messages)
            bytes_out.add_metric([*labels, reader], sent)
    yield from counters.values()
    yield messages_out
    yield bytes_out


def _partition_counts(replica: PartitionReplica, assigned: Partition) -> dict[str, int]:
    return {
        "messages_in": replica.log.appended_entries,
        "bytes_in": replica.log.appended_bytes,
        "leader_elections": assigned.leader_epoch,
        "isr_shrinks": replica.isr_shrinks,
        "isr_expands": replica.isr_expansions,
        "duplicates": replica.duplicates,
    }


def _partition_values(replica: PartitionReplica, assigned: Partition) -> dict[str, int]:
    isr, replicas = len(assigned.isr), len(assigned.replicas)
    return {
        "log_end_offset": replica.log.next_offset,
        "oldest_offset": replica.oldest_offset,
        "size_bytes": replica.log.size_bytes,
        "high_watermark": replica.high_watermark,
        "isr_size": isr,
        "replicas": replicas,
        "leader": int(replica.is_leader),
        "under_replicated": int(replica.is_leader and isr < replicas),
        "acks_held": replica.acks_held,
    }


def _follower_lags(replica: PartitionReplica) -> dict[str, int]:
    """By follower, what the leader's log holds beyond the follower's last fetch; {} unless leading."""
    tracker = replica.tracker
    if tracker is None:
        return {}
    lags = {}
    for follower in sorted(tracker.replicas - {tracker.leader_id}):
        fetched_from = tracker.progress(follower).log_end_offset
        if fetched_from is not None:
            lags[follower] = tracker.leader_log_end - fetched_from
    return lags


def _cluster_metrics(node: Node) -> Iterator[Metric]:
    live = node.live_brokers()
    partitions = [p for stream in node.state.streams.values() for p in stream.partitions.values()]
    yield GaugeMetricFamily(
        "bascule_partitions_under_replicated",
        "Partitions of the cluster whose ISR is smaller than their replicas, in this node's metadata.",
        value=sum(len(p.isr) < len(p.replicas) for p in partitions),
    )
    yield GaugeMetricFamily(
        "bascule_partitions_offline",
        "Partitions of the cluster with no leader, or one that is not among the brokers this node sees live.",
        value=sum(p.leader not in live for p in partitions),
    )


def _raft_metrics(node: Node) -> Iterator[Metric]:
    quorum = node.raft.quorum()
    yield GaugeMetricFamily("bascule_raft_leader", "1 while this node leads the metadata Raft group, else 0.",
                            value=int(node.raft.is_leader))
    yield GaugeMetricFamily("bascule_raft_term", "The metadata Raft group's term, as this node knows it.",
                            value=quorum["term"])
    yield GaugeMetricFamily("bascule_raft_commit_index",
                            "Index of the last metadata journal entry this node knows committed.",
                            value=quorum["commit_index"])
    connected = GaugeMetricFamily(
        "bascule_raft_voter_connected", "1 while this node is connected to the voter (itself included), else 0.",
        labels=["voter"],
    )
    match_index = GaugeMetricFamily(
        "bascule_raft_voter_match_index",
        "Index of the last metadata journal entry the voter is known to hold; on the Raft leader only.",
        labels=["voter"],
    )
    for voter in quorum["voters"]:
        connected.add_metric([voter["address"]], int(voter["connected"]))
        if voter["match_index"] >= 0:
            match_index.add_metric([voter["address"]], voter["match_index"])
    yield connected
    yield match_index


def _nats_metrics(node: Node) -> Iterator[Metric]:
    client = node.nats_client
    yield GaugeMetricFamily("bascule_nats_connected", "1 while the node's NATS connection is up, else 0.",
                            value=int(client.is_connected))
    yield CounterMetricFamily("bascule_nats_reconnects", "Times the node's NATS connection was re-established.",
                              value=client.stats["reconnects"])
    dropped = CounterMetricFamily(
        "bascule_internal_messages_dropped",
        "Node-to-node messages dropped unread because their seal did not verify, by reason.",
        labels=["reason"],
    )
    for reason, count in node.internal_nats.rejected.items():
        dropped.add_metric([reason.name.lower()], count)
    yield dropped


def _capture_metrics(node: Node) -> Iterator[Metric]:
    dropped = CounterMetricFamily(
        "bascule_capture_messages_dropped",
        "Messages captured from NATS and given up on before they were stored, so never acked, by reason.",
        labels=["reason"],
    )
    for reason, count in node.capture.dropped.items():
        dropped.add_metric([reason], count)
    yield dropped


def _fsync_histogram() -> Metric:
    counts, seconds = fsync_seconds.snapshot()
    histogram = HistogramMetricFamily(
        "bascule_log_fsync_seconds", "Time the partition logs' syncs spent in fsync, one observation per sync.",
    )
    histogram.add_metric([], _cumulative(fsync_seconds.bounds, counts), seconds)
    return histogram


def _cumulative(bounds: Sequence[float], counts: Sequence[int]) -> Sequence[tuple[str, float]]:
    """Prometheus' buckets (upper bound, observations up to it) from a count per bucket."""
    return list(zip([*map(str, bounds), "+Inf"], accumulate(counts)))


# ---- HTTP, sans I/O ------------------------------------------------------------------------------


class BadRequest(ValueError):
    """A request head that is not HTTP/1.x."""


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # without its query


_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_ORIGIN_FORM = re.compile(r"/[\x21-\x7e]*")
_VERSION = re.compile(r"HTTP/1\.[01]")
_FIELD_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")


def parse_request_head(head: bytes) -> Request:
    """The request an HTTP/1.x request head (request line, header fields, blank line) makes. Header
    fields are checked for form only: no endpoint reads them."""
    if not head.endswith(b"\r\n\r\n"):
        raise BadRequest("incomplete request head")
    request_line, *fields = head[:-4].decode("latin-1").split("\r\n")
    parts = request_line.split(" ")
    if len(parts) != 3:
        raise BadRequest("expected a request line: METHOD /path HTTP/1.1")
    method, target, version = parts
    if not _TOKEN.fullmatch(method) or not _ORIGIN_FORM.fullmatch(target) or not _VERSION.fullmatch(version):
        raise BadRequest("expected a request line: METHOD /path HTTP/1.1")
    for field in fields:
        name, colon, value = field.partition(":")
        if not colon or not _TOKEN.fullmatch(name) or not _FIELD_VALUE.fullmatch(value):
            raise BadRequest("malformed header field")
    return Request(method, target.partition("?")[0])


@dataclass(frozen=True)
class Response:
    status: HTTPStatus
    body: bytes
    content_type: str = TEXT
    allow: str = ""  # the Allow header of a 405

    def encode(self, with_body: bool = True) -> bytes:
        head = (
            f"HTTP/1.1 {self.status.value} {self.status.phrase}\r\n"
            f"Content-Type: {self.content_type}\r\nContent-Length: {len(self.body)}\r\n"
            + (f"Allow: {self.allow}\r\n" if self.allow else "")
            + "Connection: close\r\n\r\n"
        )
        return head.encode("ascii") + (self.body if with_body else b"")


def _text(status: HTTPStatus, text: str) -> Response:
    return Response(status, f"{text}\n".encode())


_HEAD_TOO_LARGE = _text(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, f"request head over {MAX_REQUEST_HEAD} bytes")


# ---- the server ------------------------------------------------------------------------------------


class MetricsServer:
    """The endpoint of one node: start after the node, stop before it."""

    def __init__(self, node: Node, grpc_calls: GrpcCalls | None = None) -> None:
        self.node = node
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(NodeCollector(node))
        ProcessCollector(registry=self.registry)
        Info("bascule_build", "The bascule and Python versions the node runs.", registry=self.registry).info(
            {"version": version("bascule"), "python": platform.python_version()}
        )
        if grpc_calls is not None:
            self.registry.register(grpc_calls)
        self.port = 0  # once started: the one bound
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._idle: dict[asyncio.Task[None], None] = {}  # connections that may be dropped, the longest idle first
        self._endpoints: dict[str, Callable[[], Response]] = {
            "/metrics": self._metrics, "/healthz": lambda: _text(HTTPStatus.OK, "ok"), "/readyz": self._readiness,
        }

    async def start(self, host: str, port: int) -> None:
        """Listen on ``host``:``port`` (0: a free port, then in ``self.port``)."""
        self._server = await asyncio.start_server(
            self._accept, host, port, limit=MAX_REQUEST_HEAD, reuse_address=True,
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening and end the connections being served: none reads the node after this."""
        if self._server is None:
            return
        self._server.close()
        for connection in self._connections:
            connection.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()

    def _respond(self, request: Request) -> Response:
        endpoint = self._endpoints.get(request.path)
        if endpoint is None:
            return _text(HTTPStatus.NOT_FOUND, "not found: try /metrics, /healthz or /readyz")
        if request.method not in ("GET", "HEAD"):
            return Response(HTTPStatus.METHOD_NOT_ALLOWED, b"GET or HEAD only\n", allow="GET, HEAD")
        return endpoint()

    def _metrics(self) -> Response:
        try:
            exposition = generate_latest(self.registry)
        except Exception:
            log.exception("collecting the metrics failed")
            return _text(HTTPStatus.INTERNAL_SERVER_ERROR, "collecting the metrics failed")
        return Response(HTTPStatus.OK, exposition, CONTENT_TYPE_LATEST)

    def _readiness(self) -> Response:
        problem = self.node.why_not_ready()
        if problem is not None:
            return _text(HTTPStatus.SERVICE_UNAVAILABLE, problem)
        return _text(HTTPStatus.OK, "ready")

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # A task of this server's own rather than the one asyncio makes of a coroutine callback:
        # Python 3.11 logs that one as an error when stop() cancels it.
        if len(self._connections) >= MAX_CONNECTIONS:
            if not self._idle:
                writer.close()
                return
            longest_idle = next(iter(self._idle))
            del self._idle[longest_idle]
            self._connections.discard(longest_idle)
            longest_idle.cancel()
        connection = asyncio.create_task(self._serve_connection(reader, writer))
        self._connections.add(connection)
        connection.add_done_callback(self._ended)

    def _ended(self, connection: asyncio.Task[None]) -> None:
        self._connections.discard(connection)
        self._idle.pop(connection, None)

    def _idling(self, idle: bool) -> None:
        connection = asyncio.current_task()
        assert connection is not None
        if idle:
            self._idle[connection] = None
        else:
            self._idle.pop(connection, None)

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            self._idling(True)
            answer = await self._answer(reader)
            self._idling(False)
            if answer:
                writer.write(answer)
                await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT)
                writer.write_eof()
                self._idling(True)
                await _linger(reader)
        except (ConnectionError, TimeoutError):
            pass  # the client left, or stalled: nobody to answer
        finally:
            writer.close()

    async def _answer(self, reader: asyncio.StreamReader) -> bytes:
        """The response to the request ``reader`` brings; b"" when the client closed without sending."""
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT)
        except asyncio.LimitOverrunError:
            return _HEAD_TOO_LARGE.encode()
        except asyncio.IncompleteReadError as closed:
            if not closed.partial:
                return b""
            head = closed.partial  # the client stopped sending midway: judged as it is
        try:
            request = parse_request_head(head)
        except BadRequest as bad:
            return _text(HTTPStatus.BAD_REQUEST, str(bad)).encode()
        return self._respond(request).encode(with_body=request.method != "HEAD")


async def _linger(reader: asyncio.StreamReader) -> None:
    """Read what the client still sends, for a moment, before closing: closing a socket with unread
    input resets the connection, and the reset can destroy the response before the client reads it."""
    discarded = 0
    try:
        async with asyncio.timeout(LINGER_TIME):
            while discarded < LINGER_BYTES and (chunk := await reader.read(LINGER_BYTES)):
                discarded += len(chunk)
    except (ConnectionError, TimeoutError):
        pass
