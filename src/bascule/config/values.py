"""Parsing and checking one setting's value, and the table of every setting bascule knows.

A parser takes what YAML or a flag gave (a string, number, bool or list) and returns the loaded value,
or raises BadValue saying what it expected; loading adds the key and the value to the message.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from bascule.wire.settings import MAX_DEDUP_MESSAGES, MAX_SEGMENT_BYTES

LOG_LEVELS = ("debug", "info", "warn", "error")
WILDCARD_HOSTS = ("", "0.0.0.0", "::")

MiB = 1024 * 1024
MINUTE = 60.0
HOUR = 60 * MINUTE


class BadValue(Exception):
    """A value a parser cannot use, with what it expected instead."""

    def __init__(self, expected: str) -> None:
        super().__init__(expected)
        self.expected = expected


Parser = Callable[[Any], Any]

_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": MINUTE, "h": HOUR}
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_DURATION_PART = re.compile(rf"({_NUMBER})(ns|us|µs|μs|ms|s|m|h)")
_DURATION = re.compile(rf"(?:{_DURATION_PART.pattern})+")
_SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE = re.compile(r"(\d+)\s*([kmgt]i?b|b)?", re.IGNORECASE)
# Names go into NATS subjects, where these characters separate or match tokens.
_TOKEN = re.compile(r"[^\s.*>]+")


def parse_duration(text: str) -> float:
    """Seconds in a Go-style duration ("500ms", "1h30m") or a bare number of seconds."""
    text = text.strip()
    if re.fullmatch(_NUMBER, text):
        return float(text)
    if not _DURATION.fullmatch(text):
        raise ValueError(f"not a duration: {text!r}")
    return sum(float(number) * _DURATION_UNITS[unit] for number, unit in _DURATION_PART.findall(text))


def parse_size(text: str) -> int:
    """Bytes in "1048576", "512KB" (powers of 1000) or "1MiB" (powers of 1024)."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"not a size: {text!r}")
    return int(match[1]) * _SIZE_UNITS[(match[2] or "").lower()]


def split_list(text: str) -> list[str]:
    """The items of a comma-separated list, the form flags give lists in."""
    return [part.strip() for part in text.split(",") if part.strip()]


def join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (an IP address, or a name) names this machine's loopback interface only:
    ``localhost`` or an address in 127.0.0.0/8 or ::1. Any other name counts as reachable from outside."""
    host = host.strip().removeprefix("[").removesuffix("]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def unauthenticated_raft_error(address: str, password: str) -> str | None:
    """Why the metadata Raft transport must not listen at ``address`` (host:port) with ``password``;
    None when it may. pysyncobj unpickles every frame a peer sends, and only a password makes it
    authenticate (and encrypt) them: without one, whoever reaches the port can run code in the server.
    Loopback needs none: only this machine reaches it."""
    if password or is_loopback_host(address.rpartition(":")[0]):
        return None
    return (
        f"the Raft address {address} is not a loopback address and clustering.raft.password is empty: "
        "pysyncobj unpickles every frame an unauthenticated peer sends, so anyone who can reach that port "
        "could run code in this server (remote code execution). Set clustering.raft.password (or the "
        "BASCULE_RAFT_PASSWORD environment variable) to the same secret on every node, or listen on loopback"
    )


def unshared_secret_error(clustering: Any, joins: bool) -> str | None:
    """Why a node configured as ``clustering`` (a ClusteringConfig) could never form its cluster;
    None when it can. ``joins``: the node has to join a cluster (no seed, no peers, no journal).
    Nodes talk Raft and sealed NATS under a secret they must share: a node given no password makes
    a random one of its own, which is enough for a lone node and for nothing else."""
    if clustering.raft_insecure:
        if clustering.raft_password:
            return "clustering.raft.insecure is set with clustering.raft.password: set one or the other"
        if not is_loopback_host(clustering.raft_listen.rpartition(":")[0]):
            return (f"clustering.raft.insecure: the Raft address {clustering.raft_listen} is not a loopback "
                    "address; the insecure shared secret is for development on one machine only")
        return None
    if clustering.raft_password or not (joins or len(clustering.raft_bootstrap_peers) > 1):
        return None
    if clustering.raft_bootstrap_peers:
        role = "it names clustering.raft.bootstrap.peers"
    else:
        role = "it is no seed, so it joins one; a single node is started with --raft-bootstrap-seed"
    return (
        f"clustering.raft.password: empty, and this node is to form a cluster with others ({role}). Nodes "
        "form a cluster only when every node, the seed included, has the same password: set "
        "clustering.raft.password (or the BASCULE_RAFT_PASSWORD environment variable) to the same secret on "
        "every node, or, for development on one machine, clustering.raft.insecure: true on every node"
    )


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise BadValue("a string")
    return value


def _boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise BadValue("true or false")


def _range(unit: str, minimum: int, maximum: float) -> str:
    return f"{unit} >= {minimum}" if maximum == math.inf else f"{unit} from {minimum} to {maximum}"


def _whole_number(value: Any, minimum: int, maximum: float, expected: str) -> int:
    # bool is an int in Python, but "port: true" is a mistake, not port 1.
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise BadValue(expected)
    return value


def _integer(minimum: int, maximum: float = math.inf) -> Parser:
    expected = _range("an integer", minimum, maximum)

    def parse(value: Any) -> int:
        if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
            value = int(value)
        return _whole_number(value, minimum, maximum, expected)

    return parse


def _size(minimum: int, maximum: float = math.inf) -> Parser:
    expected = _range("a size in bytes", minimum, maximum) + ", like 1048576 or 1MiB"

    def parse(value: Any) -> int:
        if isinstance(value, str):
            try:
                value = parse_size(value)
            except ValueError:
                raise BadValue(expected) from None
        return _whole_number(value, minimum, maximum, expected)

    return parse


def _duration(value: Any) -> float:
    expected = "a duration like 15s"
    if isinstance(value, str):
        try:
            return parse_duration(value)
        except ValueError:
            raise BadValue(expected) from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise BadValue(expected)
    return float(value)


def _choice(*options: str) -> Parser:
    def parse(value: Any) -> str:
        if not isinstance(value, str) or value.lower() not in options:
            raise BadValue("one of " + ", ".join(options))
        return value.lower()

    return parse


def _token(value: Any) -> str:
    if not isinstance(value, str) or not _TOKEN.fullmatch(value):
        raise BadValue("a non-empty name without whitespace, '.', '*' or '>'")
    return value


_port = _integer(0, 65535)


def _split_host_port(value: Any) -> tuple[str, int]:
    expected = "host:port, like 127.0.0.1:9292"
    if not isinstance(value, str):
        raise BadValue(expected)
    host, separator, port = value.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not separator or not port.isdigit() or int(port) > 65535 or re.search(r"\s", host):
        raise BadValue(expected)
    return host, int(port)


def _listen(value: Any) -> tuple[str | None, int]:
    """(host, port); host None when only a port is given, as Liftbridge allows."""
    if isinstance(value, int) and not isinstance(value, bool):
        return None, _port(value)
    return _split_host_port(value)


def _raft_listen(value: Any) -> str:
    host, port = _split_host_port(value)
    if host in WILDCARD_HOSTS:
        # Peers dial this address, so it must name this machine.
        raise BadValue("host:port with a host peers can reach, like 127.0.0.1:0")
    return join_host_port(host, port)


def _nats_url(value: Any) -> str:
    expected = "URLs like nats://127.0.0.1:4222"
    if not isinstance(value, str):
        raise BadValue(expected)
    url = value.strip()
    try:
        parts = urlsplit(url)
        port_is_valid = parts.port is None or parts.port > 0
    except ValueError:
        raise BadValue(expected) from None
    if parts.scheme not in ("nats", "tls") or not parts.hostname or not port_is_valid or parts.path:
        raise BadValue(expected)
    return url


def _list_of(item: Parser, expected: str) -> Parser:
    """A YAML list, or a comma-separated string as flags give it."""

    def parse(value: Any) -> tuple[Any, ...]:
        if isinstance(value, str):
            value = split_list(value)
        if not isinstance(value, (list, tuple)):
            raise BadValue(f"a list of {expected}")
        try:
            return tuple(item(entry) for entry in value)
        except BadValue:
            raise BadValue(f"a list of {expected}") from None

    return parse


def _peer(value: Any) -> str:
    if not isinstance(value, str) or not value or re.search(r"\s", value):
        raise BadValue("a peer without whitespace")
    return value


def _sync_policy(value: Any) -> str | float:
    expected = "never, always, or an fsync interval like 1s"
    if isinstance(value, str) and value.lower() in ("never", "always"):
        return value.lower()
    try:
        interval = _duration(value)
    except BadValue:
        raise BadValue(expected) from None
    if interval <= 0:
        raise BadValue(expected)
    return interval


def _unset(feature: str) -> Parser:
    """A Liftbridge setting for a feature bascule lacks: accepted only when empty."""

    def parse(value: Any) -> str:
        if _string(value):
            raise BadValue(f"an empty string (bascule does not support {feature})")
        return ""

    return parse


@dataclass(frozen=True)
class Setting:
    parse: Parser
    # "section.field" it sets in Config; None when loading derives fields from it or ignores it.
    target: str | None = None
    # A Liftbridge setting with no counterpart in bascule: checked, then ignored.
    ignored: bool = False


def _ignored(parse: Parser) -> Setting:
    return Setting(parse, ignored=True)


SETTINGS: dict[str, Setting] = {
    "listen": Setting(_listen),
    "host": Setting(_string, ".host"),
    "port": Setting(_port),
    "data.dir": Setting(_string),
    "logging.level": Setting(_choice(*LOG_LEVELS), "logging.level"),
    "logging.format": Setting(_choice("text", "json"), "logging.format"),
    "logging.raft": Setting(_boolean, "logging.raft"),
    "logging.nats": Setting(_boolean, "logging.nats"),
    "logging.recovery": Setting(_boolean, "logging.recovery"),
    "tls.cert": Setting(_string, "tls.cert"),
    "tls.key": Setting(_string, "tls.key"),
    "tls.client.auth.enabled": Setting(_boolean, "tls.client_auth"),
    "tls.client.auth.ca": Setting(_string, "tls.client_auth_ca"),
    "tls.client.authz.enabled": Setting(_boolean, "tls.client_authz"),
    "tls.client.authz.model": Setting(_string, "tls.client_authz_model"),
    "tls.client.authz.policy": Setting(_string, "tls.client_authz_policy"),
    "nats.servers": Setting(_list_of(_nats_url, "URLs like nats://127.0.0.1:4222")),
    "nats.embedded": Setting(_boolean),
    "nats.embedded.config": Setting(_string, "nats.embedded_config"),
    "nats.connect.timeout": Setting(_duration, "nats.connect_timeout"),
    # How the node authenticates to NATS (natsio.auth.NatsAuth, built by loading).
    "nats.user": Setting(_string),
    "nats.password": Setting(_string),
    "nats.token": Setting(_string),
    "nats.credentials": Setting(_string),
    "nats.nkey.seed": Setting(_string),
    "nats.tls.cert": Setting(_string),
    "nats.tls.key": Setting(_string),
    "nats.tls.ca": Setting(_string),
    "clustering.server.id": Setting(_token, "clustering.server_id"),
    "clustering.namespace": Setting(_token, "clustering.namespace"),
    "clustering.raft.bootstrap.seed": Setting(_boolean, "clustering.raft_bootstrap_seed"),
    "clustering.raft.bootstrap.peers": Setting(
        _list_of(_peer, "peers without whitespace"), "clustering.raft_bootstrap_peers"
    ),
    "clustering.raft.listen": Setting(_raft_listen, "clustering.raft_listen"),
    "clustering.raft.password": Setting(_string, "clustering.raft_password"),
    "clustering.raft.insecure": Setting(_boolean, "clustering.raft_insecure"),
    "clustering.min.insync.replicas": Setting(_integer(1), "clustering.min_insync_replicas"),
    "clustering.replica.max.lag.time": Setting(_duration, "clustering.replica_max_lag_time"),
    "clustering.replica.max.leader.timeout": Setting(_duration, "clustering.replica_max_leader_timeout"),
    "clustering.replica.max.idle.wait": Setting(_duration, "clustering.replica_max_idle_wait"),
    "clustering.replica.fetch.timeout": Setting(_duration, "clustering.replica_fetch_timeout"),
    "clustering.replication.max.bytes": Setting(_size(1), "clustering.replication_max_bytes"),
    "streams.retention.max.bytes": Setting(_size(0), "streams.retention_max_bytes"),
    "streams.retention.max.messages": Setting(_integer(0), "streams.retention_max_messages"),
    "streams.retention.max.age": Setting(_duration, "streams.retention_max_age"),
    "streams.cleaner.interval": Setting(_duration, "streams.cleaner_interval"),
    "streams.segment.max.bytes": Setting(_size(1, MAX_SEGMENT_BYTES), "streams.segment_max_bytes"),
    "streams.segment.max.age": Setting(_duration, "streams.segment_max_age"),
    "streams.auto.pause.time": Setting(_duration, "streams.auto_pause_time"),
    "streams.auto.pause.disable.if.subscribers": Setting(_boolean, "streams.auto_pause_disable_if_subscribers"),
    "streams.sync": Setting(_sync_policy, "streams.sync"),
    "streams.concurrency.control": Setting(_boolean, "streams.concurrency_control"),
    "streams.compact.enabled": Setting(_boolean, "streams.compact_enabled"),
    "streams.encryption": Setting(_boolean, "streams.encryption"),
    "streams.dedup.window": Setting(_duration, "streams.dedup_window"),
    "streams.dedup.max.messages": Setting(_integer(0, MAX_DEDUP_MESSAGES), "streams.dedup_max_messages"),
    "cursors.stream.partitions": Setting(_integer(0), "cursors.stream_partitions"),
    "cursors.stream.replication.factor": Setting(_integer(-1), "cursors.stream_replication_factor"),
    "cursors.stream.auto.pause.time": Setting(_duration, "cursors.stream_auto_pause_time"),
    "groups.consumer.timeout": Setting(_duration, "groups.consumer_timeout"),
    "groups.coordinator.timeout": Setting(_duration, "groups.coordinator_timeout"),
    "activity.stream.enabled": Setting(_boolean, "activity.enabled"),
    "activity.stream.publish.timeout": Setting(_duration, "activity.publish_timeout"),
    "activity.stream.publish.ack.policy": Setting(_choice("none", "leader", "all"), "activity.publish_ack_policy"),
    # bascule's HTTP endpoint of metrics and health probes (MetricsConfig, built by loading).
    "metrics.listen": Setting(_listen),
    "metrics.port": Setting(_port),
    # bascule's bounds on what one gRPC client can make a node hold or do (h2grpc.GrpcLimits).
    "grpc.max.connections": Setting(_integer(1), "grpc.max_connections"),
    "grpc.max.concurrent.calls": Setting(_integer(1, (1 << 31) - 1), "grpc.max_concurrent_calls"),
    "grpc.call.output": Setting(_size(64 << 10), "grpc.call_output"),
    "grpc.connection.output": Setting(_size(64 << 10), "grpc.connection_output"),
    "grpc.node.output": Setting(_size(64 << 10), "grpc.node_output"),
    "grpc.node.input": Setting(_size(1 << 20), "grpc.node_input"),
    "grpc.frames.per.turn": Setting(_integer(64), "grpc.frames_per_turn"),
    "grpc.flood.rate": Setting(_integer(1), "grpc.flood_rate"),
    "grpc.flood.burst": Setting(_integer(1), "grpc.flood_burst"),
    # Liftbridge settings with no effect in bascule: checked, then ignored.
    "batch.max.messages": _ignored(_integer(0)),
    "batch.max.time": _ignored(_duration),
    "metadata.cache.max.age": _ignored(_duration),
    "clustering.raft.snapshot.retain": _ignored(_integer(0)),
    "clustering.raft.snapshot.threshold": _ignored(_integer(0)),
    "clustering.raft.cache.size": _ignored(_integer(0)),
    "clustering.raft.max.quorum.size": _ignored(_integer(0)),
    "streams.compact.max.goroutines": _ignored(_integer(1)),
    "telemetry.enabled": _ignored(_boolean),
    "telemetry.interval.seconds": _ignored(_integer(0)),
}
# Prefixes that are only sections ("clustering"), not also settings ("nats.embedded").
SECTIONS = {key.rsplit(".", i)[0] for key in SETTINGS for i in range(1, key.count(".") + 1)} - SETTINGS.keys()
