"""Building a Config from a YAML file and command-line overrides, and the server's flags.

Every problem becomes a ConfigError that names the dotted key (or the file) it is about: a bad value,
and also a configuration that would not be safe to run: a Raft transport reachable from other machines
without a password, or a data dir that belongs to another user.
"""

from __future__ import annotations

import argparse
import difflib
import os
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from bascule import durable
from bascule.config.model import (
    DEFAULT_NAMESPACE,
    DEFAULT_NATS_URL,
    DEFAULT_PORT,
    ActivityConfig,
    ClusteringConfig,
    Config,
    CursorsConfig,
    GroupsConfig,
    LoggingConfig,
    MetricsConfig,
    NatsConfig,
    StreamsConfig,
    TlsConfig,
    default_data_dir,
)
from bascule.config.values import (
    LOG_LEVELS,
    SECTIONS,
    SETTINGS,
    BadValue,
    split_list,
    unauthenticated_raft_error,
    unshared_secret_error,
)
from bascule.h2grpc.limits import GrpcLimits
from bascule.natsio.auth import NatsAuth, NatsAuthError

# The Raft password from the environment, for secrets kept out of command lines (which every user of the
# machine can read) and configuration files: `bascule server` takes it as clustering.raft.password.
RAFT_PASSWORD_ENV = "BASCULE_RAFT_PASSWORD"
NATS_PASSWORD_ENV = "BASCULE_NATS_PASSWORD"  # secrets kept out of files and command lines
NATS_TOKEN_ENV = "BASCULE_NATS_TOKEN"


class ConfigError(ValueError):
    """A configuration file, flag or value that bascule cannot use."""


def load_config(path: str | None, overrides: Mapping[str, object] | None = None) -> Config:
    """The configuration in the YAML file at `path` (None: defaults only), with dotted-key overrides."""
    settings = _flatten(_read_yaml(path)) if path else {}
    settings.update(_flatten(overrides or {}))
    config = _build({key: _parse(key, value) for key, value in settings.items()})
    _check_data_dir(config.data_dir)
    return config


def _read_yaml(path: str) -> Mapping[Any, Any]:
    import yaml  # only for a configuration file: PyYAML is 5-10 ms of a start without one

    try:
        # Bytes, so that PyYAML rather than open() reports a file that is not text.
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
            leaves = {} if value is None and key in SECTIONS else {key: value}
        for leaf, leaf_value in leaves.items():
            if leaf in flat:
                raise ConfigError(f"{leaf}: given more than once")
            flat[leaf] = leaf_value
    return flat


def _parse(key: str, value: Any) -> Any:
    setting = SETTINGS.get(key)
    if key in SECTIONS:
        example = next(name for name in SETTINGS if name.startswith(key + "."))
        raise ConfigError(f"{key}: expected a mapping of settings such as {example}, got {value!r}")
    if setting is None:
        suggestion = difflib.get_close_matches(key, SETTINGS, n=1)
        hint = f" (did you mean {suggestion[0]}?)" if suggestion else ""
        raise ConfigError(f"{key}: unknown setting{hint}")
    try:
        return setting.parse(value)
    except BadValue as bad:
        raise ConfigError(f"{key}: expected {bad.expected}, got {value!r}") from None


def _build(values: dict[str, Any]) -> Config:
    fields = _fields_by_section(values)
    namespace = fields["clustering"].get("namespace", DEFAULT_NAMESPACE)
    listen_host, port = _listen_host_and_port(values)
    tls = TlsConfig(**fields["tls"])
    if bool(tls.cert) != bool(tls.key):
        raise ConfigError("tls.cert, tls.key: expected both set or neither")
    if tls.client_auth and not (tls.enabled and tls.client_auth_ca):
        raise ConfigError("tls.client.auth.enabled: needs tls.cert, tls.key and tls.client.auth.ca")
    if tls.client_auth_ca and not tls.client_auth:
        raise ConfigError("tls.client.auth.ca: set, but tls.client.auth.enabled is false")
    if tls.client_authz and not (tls.client_auth and tls.client_authz_model and tls.client_authz_policy):
        raise ConfigError("tls.client.authz.enabled: needs tls.client.auth (the client's identity), "
                          "tls.client.authz.model and tls.client.authz.policy")
    clustering = ClusteringConfig(**fields["clustering"])
    secret_problem = unshared_secret_error(clustering, joins=False)  # the node checks a join at start
    if secret_problem:
        raise ConfigError(secret_problem)
    raft_problem = unauthenticated_raft_error(clustering.raft_listen, clustering.raft_password)
    if raft_problem:
        raise ConfigError(f"clustering.raft.listen, clustering.raft.password: {raft_problem}")
    return Config(
        listen_host=listen_host,
        port=port,
        data_dir=values.get("data.dir") or default_data_dir(namespace),
        tls=tls,
        nats=_nats(values, fields["nats"]),
        streams=_streams(fields["streams"]),
        logging=LoggingConfig(**fields["logging"]),
        clustering=clustering,
        cursors=CursorsConfig(**fields["cursors"]),
        activity=ActivityConfig(**fields["activity"]),
        groups=GroupsConfig(**fields["groups"]),
        metrics=_metrics(values),
        grpc=GrpcLimits(**fields["grpc"]),
        ignored_settings=tuple(sorted(key for key in values if SETTINGS[key].ignored)),
        **fields[""],
    )


def _check_data_dir(data_dir: str) -> None:
    """Refuse a data dir that exists and is no directory of this process's user (the node makes one
    that is missing, and takes group and world access away from its own)."""
    try:
        durable.owned_directory(data_dir)
    except (durable.ForeignDirectory, NotADirectoryError) as error:
        raise ConfigError(f"data.dir: {error}") from None
    except OSError as error:
        raise ConfigError(f"data.dir: cannot use {data_dir}: {error.strerror}") from None


def _fields_by_section(values: dict[str, Any]) -> defaultdict[str, dict[str, Any]]:
    sections: defaultdict[str, dict[str, Any]] = defaultdict(dict)
    for key, value in values.items():
        target = SETTINGS[key].target
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


def _metrics(values: dict[str, Any]) -> MetricsConfig:
    """The API's rule for the metrics endpoint: `metrics.port` (the flag) wins over the port of
    `metrics.listen`; without a host in `metrics.listen` it binds loopback only."""
    if "metrics.listen" not in values and "metrics.port" not in values:
        return MetricsConfig()
    listen_host, listen_port = values.get("metrics.listen", (None, None))
    host = "127.0.0.1" if listen_host is None else listen_host or "0.0.0.0"
    return MetricsConfig(host=host, port=values.get("metrics.port", listen_port))


def _nats(values: dict[str, Any], fields: dict[str, Any]) -> NatsConfig:
    # As in Liftbridge, naming an embedded server's config file asks for an embedded server.
    embedded = values.get("nats.embedded", False) or bool(fields.get("embedded_config"))
    default_servers = () if embedded else (DEFAULT_NATS_URL,)
    servers = values.get("nats.servers") or default_servers
    try:
        auth = NatsAuth(
            user=values.get("nats.user", ""), password=values.get("nats.password", ""),
            token=values.get("nats.token", ""), credentials=values.get("nats.credentials", ""),
            nkey_seed=values.get("nats.nkey.seed", ""), tls_cert=values.get("nats.tls.cert", ""),
            tls_key=values.get("nats.tls.key", ""), tls_ca=values.get("nats.tls.ca", ""),
            tls=any(url.startswith("tls://") for url in servers),
        )
    except NatsAuthError as exc:
        raise ConfigError(f"nats: {exc}") from None
    return NatsConfig(servers=servers, embedded=embedded, auth=auth, **fields)


def _streams(fields: dict[str, Any]) -> StreamsConfig:
    # As in Liftbridge, segments roll at the retention age unless told otherwise.
    if "retention_max_age" in fields:
        fields.setdefault("segment_max_age", fields["retention_max_age"])
    return StreamsConfig(**fields)


# argparse dest -> the dotted key it overrides.
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
    "metrics_port": "metrics.port",
}


class VersionAction(argparse.Action):
    """argparse's ``version`` action, the version looked up only when asked: importlib.metadata
    searches sys.path for it, milliseconds of every start of the server otherwise."""

    def __init__(self, option_strings: list[str], dest: str) -> None:
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, nargs=0,
                         help="show program's version number and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        from importlib.metadata import version

        print(f"bascule {version('bascule')}")
        parser.exit()


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """Liftbridge's server flags, plus --raft-listen and --metrics-port. Flags not given stay None (see
    overrides_from_args)."""
    add = parser.add_argument
    add("--version", action=VersionAction)
    add("-c", "--config", metavar="FILE", help="load configuration from FILE")
    add("--id", "--server-id", dest="server_id", help="ID of the server in the cluster (default: stored or random)")
    add("--ns", "--namespace", dest="namespace", help=f"cluster namespace (default: {DEFAULT_NAMESPACE})")
    add("-n", "--nats-servers", dest="nats_servers", metavar="ADDR[,ADDR]", type=split_list, action="extend",
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
    add("--raft-bootstrap-peers", dest="raft_bootstrap_peers", metavar="PEER[,PEER]", type=split_list,
        action="extend", help="bootstrap the Raft cluster with these peers if there is no existing state")
    add("--raft-listen", dest="raft_listen", metavar="HOST:PORT",
        help="address of this server's Raft transport (default: 127.0.0.1:0, a free port)")
    add("--metrics-port", dest="metrics_port", metavar="PORT", type=int,
        help="serve Prometheus metrics, /healthz and /readyz over HTTP on PORT "
             "(on 127.0.0.1 unless metrics.listen names a host; default: off)")


def go_style_flags(argv: list[str]) -> list[str]:
    """``argv`` with Liftbridge's Go-style single-dash long flags (``-id a``, ``-raft-bootstrap-seed``,
    ``-ns=x``) written as the double-dash ones they are: argparse would read ``-ns x`` as ``-n s``."""
    probe = argparse.ArgumentParser(add_help=False)
    add_server_arguments(probe)
    long_flags = {flag for action in probe._actions for flag in action.option_strings if flag.startswith("--")}
    rewritten = []
    for arg in argv:
        name = arg.split("=", 1)[0]
        if arg == "--":
            rewritten.append(arg)
            rewritten.extend(argv[len(rewritten):])
            break
        rewritten.append("-" + arg if not name.startswith("--") and "-" + name in long_flags else arg)
    return rewritten


def _environment_settings(environ: Mapping[str, str]) -> dict[str, object]:
    """Liftbridge's environment overrides: $LIFTBRIDGE_<KEY> for a setting ``key``, its dots kept
    (as viper reads them) or written as underscores (as a shell can export them)."""
    found: dict[str, object] = {}
    for key in SETTINGS:
        for name in (f"LIFTBRIDGE_{key.upper()}", f"LIFTBRIDGE_{key.upper().replace('.', '_')}"):
            if name in environ:
                found[key] = environ[name]
    return found


def overrides_from_args(
    namespace: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> dict[str, object]:
    """Dotted-key overrides for load_config: Liftbridge's $LIFTBRIDGE_* settings in the environment
    (``environ``, default os.environ), each server flag given, and the secrets the environment holds:
    $BASCULE_RAFT_PASSWORD, $BASCULE_NATS_PASSWORD and $BASCULE_NATS_TOKEN."""
    environ = os.environ if environ is None else environ
    overrides = _environment_settings(environ)  # flags win over the environment, as in Liftbridge
    overrides.update({
        key: getattr(namespace, dest)
        for dest, key in _FLAG_SETTINGS.items()
        if getattr(namespace, dest, None) is not None
    })
    for variable, key in ((RAFT_PASSWORD_ENV, "clustering.raft.password"), (NATS_PASSWORD_ENV, "nats.password"),
                          (NATS_TOKEN_ENV, "nats.token")):
        if environ.get(variable):
            overrides[key] = environ[variable]
    return overrides
