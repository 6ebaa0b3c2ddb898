"""bascule's server configuration: Liftbridge's settings and flags, plus a few of bascule's own.

A configuration file is YAML with Liftbridge's keys, nested (``clustering: {server.id: a}``), dotted
(``clustering.server.id: a``) or mixed. Command-line flags become dotted-key overrides that win over
the file. Durations are seconds (float) once loaded; sizes are bytes (int).

bascule's own keys: ``clustering.raft.listen`` (host:port of the Raft transport, port 0 = pick one at
start), ``clustering.raft.password``, ``streams.sync`` (``never``, ``always`` or an fsync interval), and
``metrics.listen`` and ``metrics.port`` (the HTTP endpoint of metrics and health probes; off unless set).
``bascule server`` also takes the Raft password from $BASCULE_RAFT_PASSWORD.

Loading refuses what would be unsafe to run: a Raft address other than loopback without a password
(pysyncobj unpickles what peers send: without a password, anyone who reaches the port runs code in the
server), and a data dir that belongs to another user.

``model`` holds the dataclasses, ``values`` the parsing of each setting, ``loading`` the file, flags
and errors.
"""

from bascule.config.loading import ConfigError, VersionAction, add_server_arguments, load_config, overrides_from_args
from bascule.config.model import DEFAULT_NATS_URL, ClusteringConfig, Config, default_data_dir
from bascule.config.values import parse_duration, parse_size

__all__ = [
    "DEFAULT_NATS_URL",
    "ClusteringConfig",
    "Config",
    "ConfigError",
    "VersionAction",
    "add_server_arguments",
    "default_data_dir",
    "load_config",
    "overrides_from_args",
    "parse_duration",
    "parse_size",
]
