"""The loaded configuration: one frozen dataclass per Liftbridge section, with Liftbridge's defaults.

Durations are seconds (float); sizes are bytes (int).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field

from bascule.config.values import HOUR, MINUTE, WILDCARD_HOSTS, MiB, join_host_port
from bascule.h2grpc.limits import GrpcLimits
from bascule.natsio.auth import NatsAuth
from bascule.wire.settings import StreamDefaults

DEFAULT_NAMESPACE = "liftbridge-default"
DEFAULT_PORT = 9292
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"


def default_data_dir(namespace: str) -> str:
    return os.path.join(tempfile.gettempdir(), "bascule", namespace)


@dataclass(frozen=True)
class LoggingConfig:
    level: str = "info"
    format: str = "text"  # or "json": one JSON object per line
    raft: bool = False  # Liftbridge's switches: off, the component logs warnings and errors only
    nats: bool = False
    recovery: bool = False


@dataclass(frozen=True)
class TlsConfig:
    cert: str = ""
    key: str = ""
    client_auth: bool = False  # clients must present a certificate signed by client_auth_ca
    client_auth_ca: str = ""
    client_authz: bool = False  # calls checked by a Casbin model and policy (files)
    client_authz_model: str = ""
    client_authz_policy: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.cert)


@dataclass(frozen=True)
class NatsConfig:
    # Empty when embedded: the node connects to its own nats-server.
    servers: tuple[str, ...] = (DEFAULT_NATS_URL,)
    embedded: bool = False
    embedded_config: str = ""
    connect_timeout: float = 30.0  # how long a starting node tries to reach NATS before it gives up
    auth: NatsAuth = NatsAuth()


@dataclass(frozen=True)
class ClusteringConfig:
    # "" = not configured: the node picks an id and keeps it in its data dir.
    server_id: str = ""
    namespace: str = DEFAULT_NAMESPACE
    raft_bootstrap_seed: bool = False
    raft_bootstrap_peers: tuple[str, ...] = ()
    raft_listen: str = "127.0.0.1:0"
    raft_password: str = ""
    # Development on one machine: a secret every node of the namespace derives alike, instead of a
    # password (any local process can derive it too, and so join the cluster or run code in it).
    raft_insecure: bool = False
    min_insync_replicas: int = 1
    replica_max_lag_time: float = 5.0
    replica_max_leader_timeout: float = 2.0
    replica_max_idle_wait: float = 10.0
    replica_fetch_timeout: float = 3.0
    replication_max_bytes: int = 1 * MiB


@dataclass(frozen=True)
class StreamsConfig:
    retention_max_bytes: int = 0
    retention_max_messages: int = 0
    retention_max_age: float = 168 * HOUR
    cleaner_interval: float = 5 * MINUTE
    segment_max_bytes: int = 256 * MiB
    segment_max_age: float = 168 * HOUR
    auto_pause_time: float = 0.0
    auto_pause_disable_if_subscribers: bool = False
    compact_enabled: bool = False  # log compaction by key, for streams that do not set it
    concurrency_control: bool = False  # optimistic concurrency control, for streams that do not set it
    # Encryption at rest, for streams created without an ``encryption`` option (decided at creation).
    encryption: bool = False
    # Deduplication by message id (wire.dedup), for streams that do not set it: 0 turns it off.
    dedup_window: float = 2 * MINUTE
    dedup_max_messages: int = 100_000
    # "never", "always", or the fsync interval in seconds.
    sync: str | float = "never"


@dataclass(frozen=True)
class ActivityConfig:
    """Liftbridge's activity stream: stream changes published to ``__activity``."""

    enabled: bool = False
    publish_timeout: float = 5.0
    publish_ack_policy: str = "all"


@dataclass(frozen=True)
class CursorsConfig:
    stream_partitions: int = 0
    stream_replication_factor: int = -1
    stream_auto_pause_time: float = 1 * MINUTE  # Liftbridge's


@dataclass(frozen=True)
class GroupsConfig:
    consumer_timeout: float = 15.0
    coordinator_timeout: float = 15.0


@dataclass(frozen=True)
class MetricsConfig:
    """The HTTP endpoint of Prometheus metrics, /healthz and /readyz: off while ``port`` is None."""

    host: str = "127.0.0.1"
    port: int | None = None  # 0 = pick a free port at start


@dataclass(frozen=True)
class Config:
    listen_host: str = "127.0.0.1"
    port: int = DEFAULT_PORT  # 0 = pick a free port at start
    host: str = ""  # advertised to clients when set
    data_dir: str = field(default_factory=lambda: default_data_dir(DEFAULT_NAMESPACE))
    logging: LoggingConfig = LoggingConfig()
    tls: TlsConfig = TlsConfig()
    nats: NatsConfig = NatsConfig()
    clustering: ClusteringConfig = ClusteringConfig()
    streams: StreamsConfig = StreamsConfig()
    cursors: CursorsConfig = CursorsConfig()
    activity: ActivityConfig = ActivityConfig()
    groups: GroupsConfig = GroupsConfig()
    metrics: MetricsConfig = MetricsConfig()
    grpc: GrpcLimits = GrpcLimits()
    # Liftbridge settings that were given but have no effect in bascule, for the node to warn about.
    ignored_settings: tuple[str, ...] = ()

    @property
    def stream_defaults(self) -> StreamDefaults:
        streams = self.streams
        return StreamDefaults(
            segment_max_bytes=streams.segment_max_bytes, segment_max_age=streams.segment_max_age,
            retention_max_bytes=streams.retention_max_bytes, retention_max_messages=streams.retention_max_messages,
            retention_max_age=streams.retention_max_age, cleaner_interval=streams.cleaner_interval,
            compact_enabled=streams.compact_enabled, auto_pause_time=streams.auto_pause_time,
            auto_pause_disable_if_subscribers=streams.auto_pause_disable_if_subscribers,
            min_isr=self.clustering.min_insync_replicas, cursors_auto_pause_time=self.cursors.stream_auto_pause_time,
            concurrency_control=streams.concurrency_control,
            dedup_window=streams.dedup_window, dedup_max_messages=streams.dedup_max_messages,
        )

    @property
    def listen_address(self) -> str:
        return join_host_port(self.listen_host, self.port)

    @property
    def asks_for_tls(self) -> bool:
        """Whether any setting asks for TLS: on the gRPC API's listener (any tls.* file) or to NATS (a
        tls:// server, any nats.tls.* setting). `bascule server` imports ssl at start only then."""
        tls, auth = self.tls, self.nats.auth
        return bool(tls.cert or tls.key or tls.client_auth_ca or auth.wants_tls or auth.tls_key
                    or any(url.lower().startswith("tls://") for url in self.nats.servers))

    @property
    def advertised_host(self) -> str:
        if self.host:
            return self.host
        if self.listen_host not in WILDCARD_HOSTS:
            return self.listen_host
        # A wildcard is no address a client can dial.
        return "localhost"
