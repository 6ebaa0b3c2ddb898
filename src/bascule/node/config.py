"""bascule's server configuration: Liftbridge's settings and flags, plus a few of bascule's own.

A configuration file is YAML with Liftbridge's keys, nested (``clustering: {server.id: a}``), dotted
(``clustering.server.id: a``) or mixed. Command-line flags become dotted-key overrides that win over
the file. Durations are seconds (float) once loaded; sizes are bytes (int).

bascule's own keys: ``clustering.raft.listen`` (host:port of the Raft transport, port 0 = pick one at
start), ``clustering.raft.password`` and ``streams.sync`` (``never``, ``always`` or an fsync interval).
"""

from __future__ import annotations

import argparse
import difflib
import math
import os
import re
import tempfile
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import yaml

from bascule.wire.settings import MAX_SEGMENT_BYTES

DEFAULT_NAMESPACE = "liftbridge-default"
DEFAULT_PORT = 9292
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
LOG_LEVELS = ("debug", "info", "warn", "error")
WILDCARD_HOSTS = ("", "0.0.0.0", "::")

MiB = 1024 * 1024
MINUTE = 60.0
HOUR = 60 * MINUTE


class ConfigError(ValueError):
    """A configuration file, flag or value that bascule cannot use."""


def default_data_dir(namespace: str) -> str:
    return os.path.join(tempfile.gettempdir(), "bascule", namespace)


@dataclass(frozen=True)
class LoggingConfig:
    level: str = "info"


@dataclass(frozen=True)
class TlsConfig:
    cert: str = ""
    key: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.cert)


@dataclass(frozen=True)
class NatsConfig:
    # Empty when embedded: the node connects to its own nats-server.
    servers: tuple[str, ...] = (DEFAULT_NATS_URL,)
    embedded: bool = False
    embedded_config: str = ""


@dataclass(frozen=True)
class ClusteringConfig:
    # "" = not configured: the node picks an id and keeps it in its data dir.
    server_id: str = ""
    namespace: str = DEFAULT_NAMESPACE
    raft_bootstrap_seed: bool = False
    raft_bootstrap_peers: tuple[str, ...] = ()
    raft_listen: str = "127.0.0.1:0"
    raft_password: str = ""
    min_insync_replicas: int = 1
    replica_max_lag_time: float = 15.0
    replica_max_leader_timeout: float = 15.0
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
    # "never", "always", or the fsync interval in seconds.
    sync: str | float = "never"


@dataclass(frozen=True)
class CursorsConfig:
    stream_partitions: int = 0
    stream_replication_factor: int = -1
    stream_auto_pause_time: float = 0.0


@dataclass(frozen=True)
class GroupsConfig:
    consumer_timeout: float = 15.0
    coordinator_timeout: float = 15.0


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
    groups: GroupsConfig = GroupsConfig()
    # Liftbridge settings that were given but have no effect in bascule, for the node to warn about.
    ignored_settings: tuple[str, ...] = ()

    @property
    def listen_address(self) -> str:
        return join_host_port(self.listen_host, self.port)

    @property
    def advertised_host(self) -> str:
        if self.host:
            return self.host
        if self.listen_host not in WILDCARD_HOSTS:
            return self.listen_host
        return "localhost"


def join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# ---- value parsers ------------------------------------------------------------------------------


class _BadValue(Exception):
    """Raised by a value parser with what it expected; load_config adds the key and the value."""

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


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise _BadValue("a string")
    return value


def _boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise _BadValue("true or false")


def _integer(minimum: int, maximum: float = math.inf) -> Parser:
    expected = f"an integer >= {minimum}" if maximum == math.inf else f"an integer from {minimum} to {maximum}"

    def parse(value: Any) -> int:
        if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
            raise _BadValue(expected)
        return value

    return parse


def _size(minimum: int, maximum: float = math.inf) -> Parser:
    expected = f"a size in bytes >= {minimum}, like 1048576 or 1MiB"
    if maximum != math.inf:
        expected = f"a size in bytes from {minimum} to {maximum}, like 1048576 or 1MiB"

    def parse(value: Any) -> int:
        if isinstance(value, str):
            try:
                value = parse_size(value)
            except ValueError:
                raise _BadValue(expected) from None
        if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
            raise _BadValue(expected)
        return value

    return parse


def _duration(value: Any) -> float:
    expected = "a duration like 15s"
    if isinstance(value, str):
        try:
            return parse_duration(value)
        except ValueError:
            raise _BadValue(expected) from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise _BadValue(expected)
    return float(value)


def _choice(*options: str) -> Parser:
    def parse(value: Any) -> str:
        if not isinstance(value, str) or value.lower() not in options:
            raise _BadValue("one of " + ", ".join(options))
        return value.lower()

    return parse


def _token(value: Any) -> str:
    if not isinstance(value, str) or not _TOKEN.fullmatch(value):
        raise _BadValue("a non-empty name without whitespace, '.', '*' or '>'")
    return value


_port = _integer(0, 65535)


def _split_host_port(value: Any) -> tuple[str, int]:
    expected = "host:port, like 127.0.0.1:9292"
    if not isinstance(value, str):
        raise _BadValue(expected)
    host, separator, port = value.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not separator or not port.isdigit() or int(port) > 65535 or re.search(r"\s", host):
        raise _BadValue(expected)
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
        raise _BadValue("host:port with a host peers can reach, like 127.0.0.1:0")
    return join_host_port(host, port)


def _nats_url(value: Any) -> str:
    expected = "URLs like nats://127.0.0.1:4222"
    if not isinstance(value, str):
        raise _BadValue(expected)
    url = value.strip()
    try:
        parts = urlsplit(url)
        port_is_valid = parts.port is None or parts.port > 0
    except ValueError:
        raise _BadValue(expected) from None
    if parts.scheme not in ("nats", "tls") or not parts.hostname or not port_is_valid or parts.path:
        raise _BadValue(expected)
    return url


def _list_of(item: Parser, expected: str) -> Parser:
    """A YAML list, or a comma-separated string as flags give it."""

    def parse(value: Any) -> tuple[Any, ...]:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if not isinstance(value, (list, tuple)):
            raise _BadValue(f"a list of {expected}")
        try:
            return tuple(item(entry) for entry in value)
        except _BadValue:
            raise _BadValue(f"a list of {expected}") from None

    return parse


def _peer(value: Any) -> str:
    if not isinstance(value, str) or not value or re.search(r"\s", value):
        raise _BadValue("a peer without whitespace")
    return value


def _sync_policy(value: Any) -> str | float:
    expected = "never, always, or an fsync interval like 1s"
    if isinstance(value, str) and value.lower() in ("never", "always"):
        return value.lower()
    try:
        interval = _duration(value)
    except _BadValue:
        raise _BadValue(expected) from None
    if interval <= 0:
        raise _BadValue(expected)
    return interval


def _disabled(feature: str) -> Parser:
    """A Liftbridge switch for a feature bascule lacks: accepted only when off."""

    def parse(value: Any) -> bool:
        if _boolean(value):
            raise _BadValue(f"false (bascule does not support {feature})")
        return False

    return parse


def _unset(feature: str) -> Parser:
    """A Liftbridge setting for a feature bascule lacks: accepted only when empty."""

    def parse(value: Any) -> str:
        if _string(value):
            raise _BadValue(f"an empty string (bascule does not support {feature})")
        return ""

    return parse


# ---- the settings --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Setting:
    parse: Parser
    # "section.field" it sets in Config; None when load_config derives fields from it or ignores it.
    target: str | None = None
    # A Liftbridge setting with no counterpart in bascule: checked, then ignored.
    ignored: bool = False


def _ignored(parse: Parser) -> _Setting:
    return _Setting(parse, ignored=True)


_SETTINGS: dict[str, _Setting] = {
    "listen": _Setting(_listen),
    "host": _Setting(_string, ".host"),
    "port": _Setting(_port),
    "data.dir": _Setting(_string),
    "logging.level": _Setting(_choice(*LOG_LEVELS), "logging.level"),
    "tls.cert": _Setting(_string, "tls.cert"),
    "tls.key": _Setting(_string, "tls.key"),
    "nats.servers": _Setting(_list_of(_nats_url, "URLs like nats://127.0.0.1:4222")),
    "nats.embedded": _Setting(_boolean),
    "nats.embedded.config": _Setting(_string, "nats.embedded_config"),
    "clustering.server.id": _Setting(_token, "clustering.server_id"),
    "clustering.namespace": _Setting(_token, "clustering.namespace"),
    "clustering.raft.bootstrap.seed": _Setting(_boolean, "clustering.raft_bootstrap_seed"),
    "clustering.raft.bootstrap.peers": _Setting(
        _list_of(_peer, "peers without whitespace"), "clustering.raft_bootstrap_peers"
    ),
    "clustering.raft.listen": _Setting(_raft_listen, "clustering.raft_listen"),
    "clustering.raft.password": _Setting(_string, "clustering.raft_password"),
    "clustering.min.insync.replicas": _Setting(_integer(1), "clustering.min_insync_replicas"),
    "clustering.replica.max.lag.time": _Setting(_duration, "clustering.replica_max_lag_time"),
    "clustering.replica.max.leader.timeout": _Setting(_duration, "clustering.replica_max_leader_timeout"),
    "clustering.replica.max.idle.wait": _Setting(_duration, "clustering.replica_max_idle_wait"),
    "clustering.replica.fetch.timeout": _Setting(_duration, "clustering.replica_fetch_timeout"),
    "clustering.replication.max.bytes": _Setting(_size(1), "clustering.replication_max_bytes"),
    "streams.retention.max.bytes": _Setting(_size(0), "streams.retention_max_bytes"),
    "streams.retention.max.messages": _Setting(_integer(0), "streams.retention_max_messages"),
    "streams.retention.max.age": _Setting(_duration, "streams.retention_max_age"),
    "streams.cleaner.interval": _Setting(_duration, "streams.cleaner_interval"),
    "streams.segment.max.bytes": _Setting(_size(1, MAX_SEGMENT_BYTES), "streams.segment_max_bytes"),
    "streams.segment.max.age": _Setting(_duration, "streams.segment_max_age"),
    "streams.auto.pause.time": _Setting(_duration, "streams.auto_pause_time"),
    "streams.auto.pause.disable.if.subscribers": _Setting(_boolean, "streams.auto_pause_disable_if_subscribers"),
    "streams.sync": _Setting(_sync_policy, "streams.sync"),
    "cursors.stream.partitions": _Setting(_integer(0), "cursors.stream_partitions"),
    "cursors.stream.replication.factor": _Setting(_integer(-1), "cursors.stream_replication_factor"),
    "cursors.stream.auto.pause.time": _Setting(_duration, "cursors.stream_auto_pause_time"),
    "groups.consumer.timeout": _Setting(_duration, "groups.consumer_timeout"),
    "groups.coordinator.timeout": _Setting(_duration, "groups.coordinator_timeout"),
    # Liftbridge features bascule lacks: fine when off, an error when asked for.
    "activity.stream.enabled": _ignored(_disabled("the activity stream")),
    "streams.compact.enabled": _ignored(_disabled("compaction")),
    "streams.encryption": _ignored(_disabled("encryption at rest")),
    "streams.concurrency.control": _ignored(_disabled("optimistic concurrency control")),
    "tls.client.auth.enabled": _ignored(_disabled("TLS client authentication")),
    "tls.client.auth.ca": _ignored(_unset("TLS client authentication")),
    "tls.client.authz.enabled": _ignored(_disabled("ACL authorization")),
    "tls.client.authz.model": _ignored(_unset("ACL authorization")),
    "tls.client.authz.policy": _ignored(_unset("ACL authorization")),
    "nats.user": _ignored(_unset("NATS authentication")),
    "nats.password": _ignored(_unset("NATS authentication")),
    "nats.tls.cert": _ignored(_unset("TLS to NATS")),
    "nats.tls.key": _ignored(_unset("TLS to NATS")),
    "nats.tls.ca": _ignored(_unset("TLS to NATS")),
    "logging.recovery": _ignored(_boolean),
    "logging.raft": _ignored(_boolean),
    "logging.nats": _ignored(_boolean),
    "batch.max.messages": _ignored(_integer(0)),
    "batch.max.time": _ignored(_duration),
    "metadata.cache.max.age": _ignored(_duration),
    "clustering.raft.snapshot.retain": _ignored(_integer(0)),
    "clustering.raft.snapshot.threshold": _ignored(_integer(0)),
    "clustering.raft.cache.size": _ignored(_integer(0)),
    "clustering.raft.max.quorum.size": _ignored(_integer(0)),
    "streams.compact.max.goroutines": _ignored(_integer(1)),
    "activity.stream.publish.timeout": _ignored(_duration),
    "activity.stream.publish.ack.policy": _ignored(_choice("none", "leader", "all")),
    "telemetry.enabled": _ignored(_boolean),
    "telemetry.interval.seconds": _ignored(_integer(0)),
}
# Prefixes that are only sections ("clustering"), not also settings ("nats.embedded").
_SECTIONS = {key.rsplit(".", i)[0] for key in _SETTINGS for i in range(1, key.count(".") + 1)} - _SETTINGS.keys()


# ---- loading -------------------------------------------------------------------------------------


def load_config(path: str | None, overrides: Mapping[str, object] | None = None) -> Config:
    """The configuration in the YAML file at `path` (None: defaults only), with dotted-key overrides."""
    settings = _flatten(_read_yaml(path)) if path else {}
    settings.update(_flatten(overrides or {}))
    return _build({key: _parse(key, value) for key, value in settings.items()})


def _read_yaml(path: str) -> Mapping[Any, Any]:
    try:
        with open(path, "rb") as file:
            document = yaml.safe_load(file)
    except OSError as error:
        raise ConfigError(f"{path}: cannot read the configuration file: {error.strerror}") from error
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from error
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: expected a mapping of settings, got a {type(document).__name__}")
    return document


def _flatten(mapping: Mapping[Any, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted, lower-case keys for every leaf of a nested mapping."""
    flat: dict[str, Any] = {}
    for name, value in mapping.items():
        if not isinstance(name, str):
            raise ConfigError(f"{prefix or 'top level'}: setting names must be strings, got {name!r}")
        key = f"{prefix}.{name}".lower() if prefix else name.lower()
        if isinstance(value, Mapping):
            leaves = _flatten(value, key)
        else:
            # An empty section ("clustering:" with nothing under it) sets nothing.
            leaves = {} if value is None and key in _SECTIONS else {key: value}
        for leaf, leaf_value in leaves.items():
            if leaf in flat:
                raise ConfigError(f"{leaf}: given more than once")
            flat[leaf] = leaf_value
    return flat


def _parse(key: str, value: Any) -> Any:
    setting = _SETTINGS.get(key)
    if key in _SECTIONS:
        example = next(name for name in _SETTINGS if name.startswith(key + "."))
        raise ConfigError(f"{key}: expected a mapping of settings such as {example}, got {value!r}")
    if setting is None:
        suggestion = difflib.get_close_matches(key, _SETTINGS, n=1)
        hint = f" (did you mean {suggestion[0]}?)" if suggestion else ""
        raise ConfigError(f"{key}: unknown setting{hint}")
    try:
        return setting.parse(value)
    except _BadValue as bad:
        raise ConfigError(f"{key}: expected {bad.expected}, got {value!r}") from None


def _build(values: dict[str, Any]) -> Config:
    fields = _fields_by_section(values)
    namespace = fields["clustering"].get("namespace", DEFAULT_NAMESPACE)
    listen_host, port = _listen_host_and_port(values)
    tls = TlsConfig(**fields["tls"])
    if bool(tls.cert) != bool(tls.key):
        raise ConfigError("tls.cert, tls.key: expected both set or neither")
    return Config(
        listen_host=listen_host,
        port=port,
        data_dir=values.get("data.dir") or default_data_dir(namespace),
        tls=tls,
        nats=_nats(values, fields["nats"]),
        streams=_streams(fields["streams"]),
        logging=LoggingConfig(**fields["logging"]),
        clustering=ClusteringConfig(**fields["clustering"]),
        cursors=CursorsConfig(**fields["cursors"]),
        groups=GroupsConfig(**fields["groups"]),
        ignored_settings=tuple(sorted(key for key in values if _SETTINGS[key].ignored)),
        **fields[""],
    )


def _fields_by_section(values: dict[str, Any]) -> defaultdict[str, dict[str, Any]]:
    sections: defaultdict[str, dict[str, Any]] = defaultdict(dict)
    for key, value in values.items():
        target = _SETTINGS[key].target
        if target is not None:
            section, name = target.split(".")
            sections[section][name] = value
    return sections


def _listen_host_and_port(values: dict[str, Any]) -> tuple[str, int]:
    """Liftbridge's rule: bind to `listen`, else to `host`, else (bascule's choice) to loopback only."""
    listen_host, listen_port = values.get("listen", (None, DEFAULT_PORT))
    if listen_host is None:
        host = values.get("host") or "127.0.0.1"
    else:
        host = listen_host or "0.0.0.0"
    return host, values.get("port", listen_port)


def _nats(values: dict[str, Any], fields: dict[str, Any]) -> NatsConfig:
    # As in Liftbridge, naming an embedded server's config file asks for an embedded server.
    embedded = values.get("nats.embedded", False) or bool(fields.get("embedded_config"))
    default_servers = () if embedded else (DEFAULT_NATS_URL,)
    servers = values.get("nats.servers") or default_servers
    return NatsConfig(servers=servers, embedded=embedded, **fields)


def _streams(fields: dict[str, Any]) -> StreamsConfig:
    # As in Liftbridge, segments roll at the retention age unless told otherwise.
    if "retention_max_age" in fields:
        fields.setdefault("segment_max_age", fields["retention_max_age"])
    return StreamsConfig(**fields)


# ---- command-line flags --------------------------------------------------------------------------

_FLAG_SETTINGS = {
    "server_id": "clustering.server.id",
    "namespace": "clustering.namespace",
    "nats_servers": "nats.servers",
    "embedded_nats": "nats.embedded",
    "embedded_nats_config": "nats.embedded.config",
    "data_dir": "data.dir",
    "port": "port",
    "tls_cert": "tls.cert",
    "tls_key": "tls.key",
    "level": "logging.level",
    "raft_bootstrap_seed": "clustering.raft.bootstrap.seed",
    "raft_bootstrap_peers": "clustering.raft.bootstrap.peers",
    "raft_listen": "clustering.raft.listen",
}


def _comma_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """Liftbridge's server flags, plus --raft-listen. Flags not given stay None (see overrides_from_args)."""
    add = parser.add_argument
    add("-c", "--config", metavar="FILE", help="load configuration from FILE")
    add("--id", "--server-id", dest="server_id", help="ID of the server in the cluster (default: stored or random)")
    add("--ns", "--namespace", dest="namespace", help=f"cluster namespace (default: {DEFAULT_NAMESPACE})")
    add("-n", "--nats-servers", dest="nats_servers", metavar="ADDR[,ADDR]", type=_comma_list, action="extend",
        help=f"connect to NATS at ADDR[,ADDR] (default: {DEFAULT_NATS_URL})")
    add("-e", "--embedded-nats", dest="embedded_nats", action="store_true", default=None,
        help="run a nats-server alongside this server")
    add("--nc", "--embedded-nats-config", dest="embedded_nats_config", metavar="FILE",
        help="configuration file for the embedded nats-server (implies --embedded-nats)")
    add("-d", "--data-dir", dest="data_dir", metavar="DIR", help="store data in DIR")
    add("-p", "--port", dest="port", type=int, help=f"port to bind to (default: {DEFAULT_PORT})")
    add("--tls-cert", dest="tls_cert", metavar="FILE", help="server certificate file")
    add("--tls-key", dest="tls_key", metavar="FILE", help="private key for the server certificate")
    add("-l", "--level", dest="level", choices=LOG_LEVELS, help="logging level (default: info)")
    add("--raft-bootstrap-seed", dest="raft_bootstrap_seed", action="store_true", default=None,
        help="bootstrap the Raft cluster with this server alone if there is no existing state")
    add("--raft-bootstrap-peers", dest="raft_bootstrap_peers", metavar="PEER[,PEER]", type=_comma_list,
        action="extend", help="bootstrap the Raft cluster with these peers if there is no existing state")
    add("--raft-listen", dest="raft_listen", metavar="HOST:PORT",
        help="address of this server's Raft transport (default: 127.0.0.1:0, a free port)")


def overrides_from_args(namespace: argparse.Namespace) -> dict[str, object]:
    """Dotted-key overrides for load_config, one for each server flag given."""
    return {
        key: getattr(namespace, dest)
        for dest, key in _FLAG_SETTINGS.items()
        if getattr(namespace, dest, None) is not None
    }
