import argparse
import gzip
import os
import pwd
import random
import re
import textwrap

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bascule.config import (
    DEFAULT_NATS_URL,
    Config,
    ConfigError,
    add_server_arguments,
    default_data_dir,
    load_config,
    overrides_from_args,
    parse_duration,
    parse_size,
)
from bascule.config.loading import RAFT_PASSWORD_ENV


@pytest.fixture(autouse=True)
def no_raft_password_in_the_environment(monkeypatch):
    """`bascule server` reads $BASCULE_RAFT_PASSWORD: a shell that exports it must not change these tests."""
    monkeypatch.delenv(RAFT_PASSWORD_ENV, raising=False)


@pytest.fixture
def write_config(tmp_path):
    def write(text: str | bytes) -> str:
        path = tmp_path / "bascule.yaml"
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(textwrap.dedent(text))
        return str(path)

    return write


def load_text(write_config, text: str) -> Config:
    return load_config(write_config(text), {})


def parse_flags(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_server_arguments(parser)
    return parser.parse_args(argv)


# ---- defaults ------------------------------------------------------------------------------------


def test_defaults_are_liftbridges_except_loopback_binding_and_failure_detection():
    config = load_config(None, {})
    assert (config.listen_host, config.port, config.host) == ("127.0.0.1", 9292, "")
    assert config.logging.level == "info"
    assert config.data_dir == default_data_dir("liftbridge-default")
    assert config.nats.servers == (DEFAULT_NATS_URL,)
    assert not config.nats.embedded
    assert config.clustering.server_id == ""
    assert config.clustering.namespace == "liftbridge-default"
    assert config.clustering.raft_listen == "127.0.0.1:0"
    assert config.clustering.min_insync_replicas == 1
    # Liftbridge's 15 s each: a dead leader's partitions went 15 s without one (docs/operations.md).
    assert config.clustering.replica_max_lag_time == 5.0
    assert config.clustering.replica_max_leader_timeout == 2.0
    assert config.clustering.replica_max_idle_wait == 10.0
    assert config.clustering.replica_fetch_timeout == 3.0
    assert config.clustering.replication_max_bytes == 1024 * 1024
    assert config.streams.segment_max_bytes == 256 * 1024 * 1024
    assert config.streams.retention_max_age == config.streams.segment_max_age == 7 * 24 * 3600
    assert config.streams.cleaner_interval == 300.0
    assert config.streams.sync == "never"
    assert config.cursors.stream_partitions == 0
    assert config.ignored_settings == ()


def test_an_empty_file_gives_the_defaults(write_config):
    assert load_text(write_config, "") == load_config(None, {})


# ---- key forms -----------------------------------------------------------------------------------


def test_nested_dotted_and_mixed_keys_mean_the_same(write_config):
    nested = """
        clustering:
          server:
            id: a
          replica:
            max:
              lag:
                time: 20s
        cursors:
          stream:
            partitions: 1
    """
    dotted = """
        clustering.server.id: a
        clustering.replica.max.lag.time: 20s
        cursors.stream.partitions: 1
    """
    mixed = """
        clustering:
          server.id: a
          replica.max: {lag.time: 20s}
        cursors: {stream.partitions: 1}
    """
    configs = [load_text(write_config, text) for text in (nested, dotted, mixed)]
    assert configs[0] == configs[1] == configs[2]
    assert configs[0].clustering.server_id == "a"
    assert configs[0].clustering.replica_max_lag_time == 20.0
    assert configs[0].cursors.stream_partitions == 1


def test_keys_are_case_insensitive(write_config):
    assert load_text(write_config, "Clustering.Server.ID: a").clustering.server_id == "a"


def test_a_section_left_empty_sets_nothing(write_config):
    assert load_text(write_config, "clustering:\nstreams: {}\n") == load_config(None, {})


def test_liftbridge_example_file_loads(write_config):
    config = load_text(write_config, """
        listen: localhost:9293
        host: localhost
        data.dir: /tmp/liftbridge/server-2
        activity.stream.enabled: false
        logging:
          level: debug
          raft: true
        nats.servers:
          - nats://localhost:4300
          - nats://localhost:4301
        streams:
          retention.max:
            age: 24h
            messages: 100
        clustering:
          server.id: server-2
          raft.bootstrap.seed: true
          replica.max.lag.time: 20s
    """)
    assert (config.listen_host, config.port, config.advertised_host) == ("localhost", 9293, "localhost")
    assert config.data_dir == "/tmp/liftbridge/server-2"
    assert config.logging.level == "debug"
    assert config.nats.servers == ("nats://localhost:4300", "nats://localhost:4301")
    assert config.streams.retention_max_age == 24 * 3600
    assert config.streams.segment_max_age == 24 * 3600  # follows retention unless set
    assert config.streams.retention_max_messages == 100
    assert config.clustering.raft_bootstrap_seed
    assert config.logging.raft  # honoured now: Raft's own log lines at the configured level
    assert config.ignored_settings == () and not config.activity.enabled


# ---- value forms ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, seconds",
    [
        ("500ms", 0.5),
        ("15s", 15.0),
        ("2m", 120.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("1.5h", 5400.0),
        ("1m0.5s", 60.5),
        ("300us", 0.0003),
        ("250µs", 0.00025),
        ("10ns", 1e-8),
        ("0", 0.0),
        (7, 7.0),
        (2.5, 2.5),
        ("12", 12.0),
    ],
)
def test_duration_forms(value, seconds):
    config = load_config(None, {"clustering.replica.fetch.timeout": value})
    assert config.clustering.replica_fetch_timeout == pytest.approx(seconds)


@given(st.integers(0, 1000), st.integers(0, 59), st.integers(0, 59), st.integers(0, 999))
def test_parse_duration_adds_up_go_style_parts(hours, minutes, seconds, milliseconds):
    text = f"{hours}h{minutes}m{seconds}s{milliseconds}ms"
    assert parse_duration(text) == pytest.approx(hours * 3600 + minutes * 60 + seconds + milliseconds / 1000)


@pytest.mark.parametrize(
    "value, size",
    [(1048576, 1048576), ("1048576", 1048576), ("1MiB", 1 << 20), ("512KB", 512_000), ("2 GiB", 2 << 30),
     ("10b", 10), ("3mb", 3_000_000)],
)
def test_size_forms(value, size):
    assert load_config(None, {"streams.retention.max.bytes": value}).streams.retention_max_bytes == size
    assert parse_size(str(value)) == size


@pytest.mark.parametrize(
    "value, policy", [("never", "never"), ("always", "always"), ("ALWAYS", "always"), ("1s", 1.0), ("250ms", 0.25)]
)
def test_sync_policy_forms(value, policy):
    assert load_config(None, {"streams.sync": value}).streams.sync == policy


def test_lists_take_yaml_lists_or_comma_separated_strings(write_config):
    config = load_text(write_config, """
        nats.servers: nats://127.0.0.1:4300, nats://127.0.0.1:4301
        clustering.raft.bootstrap.peers: [127.0.0.1:5001, 127.0.0.1:5002]
        clustering.raft.password: shared
    """)
    assert config.nats.servers == ("nats://127.0.0.1:4300", "nats://127.0.0.1:4301")
    assert config.clustering.raft_bootstrap_peers == ("127.0.0.1:5001", "127.0.0.1:5002")


def test_embedded_nats_has_no_default_servers_and_its_config_file_implies_it():
    assert load_config(None, {"nats.embedded": True}).nats.servers == ()
    config = load_config(None, {"nats.embedded.config": "/etc/nats.conf"})
    assert config.nats.embedded and config.nats.embedded_config == "/etc/nats.conf"


def test_explicit_segment_age_is_kept():
    config = load_config(None, {"streams.retention.max.age": "1h", "streams.segment.max.age": "10m"})
    assert (config.streams.retention_max_age, config.streams.segment_max_age) == (3600.0, 600.0)


# ---- listen, port and the advertised host ---------------------------------------------------------


@pytest.mark.parametrize(
    "settings, listen_address, advertised",
    [
        ({}, "127.0.0.1:9292", "127.0.0.1"),
        ({"listen": "10.1.2.3:9300"}, "10.1.2.3:9300", "10.1.2.3"),
        ({"listen": "0.0.0.0:9300"}, "0.0.0.0:9300", "localhost"),
        ({"listen": ":9300"}, "0.0.0.0:9300", "localhost"),
        ({"listen": "[::]:9300"}, "[::]:9300", "localhost"),
        ({"listen": "[::1]:9300"}, "[::1]:9300", "::1"),
        ({"listen": "0.0.0.0:9300", "host": "broker.example"}, "0.0.0.0:9300", "broker.example"),
        ({"host": "broker.example"}, "broker.example:9292", "broker.example"),
        ({"listen": 9300}, "127.0.0.1:9300", "127.0.0.1"),
        ({"listen": "10.1.2.3:9300", "port": 9400}, "10.1.2.3:9400", "10.1.2.3"),
        ({"port": 0}, "127.0.0.1:0", "127.0.0.1"),
    ],
)
def test_listen_address_and_advertised_host(settings, listen_address, advertised):
    config = load_config(None, settings)
    assert (config.listen_address, config.advertised_host) == (listen_address, advertised)


# ---- errors name the key -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"clustering.replica.max.lag.time": "soon"},
         "clustering.replica.max.lag.time: expected a duration like 15s, got 'soon'"),
        ({"streams.retention.max.age": -5}, "streams.retention.max.age: expected a duration like 15s, got -5"),
        ({"streams.cleaner.interval": True}, "streams.cleaner.interval: expected a duration like 15s, got True"),
        ({"clustering.min.insync.replicas": 0}, "clustering.min.insync.replicas: expected an integer >= 1, got 0"),
        ({"cursors.stream.partitions": "two"}, "cursors.stream.partitions: expected an integer >= 0, got 'two'"),
        ({"streams.retention.max.bytes": -1}, "streams.retention.max.bytes: expected a size in bytes >= 0"),
        ({"streams.segment.max.bytes": "1 parsec"}, "streams.segment.max.bytes: expected a size in bytes from 1 to"),
        ({"streams.segment.max.bytes": "5GiB"},
         "streams.segment.max.bytes: expected a size in bytes from 1 to 4294967295"),
        ({"streams.sync": "sometimes"}, "streams.sync: expected never, always, or an fsync interval like 1s"),
        ({"streams.sync": "0s"}, "streams.sync: expected never, always, or an fsync interval like 1s"),
        ({"clustering.namespace": "a.b"}, "clustering.namespace: expected a non-empty name without whitespace"),
        ({"clustering.namespace": "a b"}, "clustering.namespace: expected a non-empty name"),
        ({"clustering.server.id": "x*"}, "clustering.server.id: expected a non-empty name"),
        ({"clustering.server.id": ""}, "clustering.server.id: expected a non-empty name"),
        ({"clustering.server.id": "a>"}, "clustering.server.id: expected a non-empty name"),
        ({"nats.servers": ["localhost:4222"]}, "nats.servers: expected a list of URLs like nats://127.0.0.1:4222"),
        ({"nats.servers": ["http://x:1"]}, "nats.servers: expected a list of URLs"),
        ({"nats.servers": ["nats://x:99999"]}, "nats.servers: expected a list of URLs"),
        ({"nats.embedded": "yes please"}, "nats.embedded: expected true or false"),
        ({"logging.level": "loud"}, "logging.level: expected one of debug, info, warn, error, got 'loud'"),
        ({"listen": "nowhere"}, "listen: expected host:port, like 127.0.0.1:9292, got 'nowhere'"),
        ({"port": 70000}, "port: expected an integer from 0 to 65535, got 70000"),
        ({"clustering.raft.listen": "0.0.0.0:0"}, "clustering.raft.listen: expected host:port with a host"),
        ({"clustering.raft.bootstrap.peers": "a b"}, "clustering.raft.bootstrap.peers: expected a list of peers"),
        ({"tls.cert": "server.pem"}, "tls.cert, tls.key: expected both set or neither"),
        ({"activity.stream.publish.ack.policy": "some"}, "activity.stream.publish.ack.policy: expected one of"),
        ({"streams.compact.enabled": "sometimes"}, "streams.compact.enabled: expected true or false"),
        ({"streams.encryption": "maybe"}, "streams.encryption: expected true or false"),
        ({"nats.user": "me", "nats.token": "t"}, "nats: give NATS one way to authenticate"),
        ({"nats.tls.cert": "client.pem"}, "nats: nats.tls.cert and nats.tls.key go together"),
        ({"clustering.replica.max.lag.tme": "15s"},
         "clustering.replica.max.lag.tme: unknown setting (did you mean clustering.replica.max.lag.time?)"),
        ({"frobnicate": 1}, "frobnicate: unknown setting"),
        ({"clustering": 5}, "clustering: expected a mapping of settings such as clustering.server.id, got 5"),
        ({"clustering.replica.max.lag": "15s"},
         "clustering.replica.max.lag: expected a mapping of settings such as clustering.replica.max.lag.time"),
    ],
)
def test_bad_settings_are_rejected_naming_the_key(settings, message):
    with pytest.raises(ConfigError) as raised:
        load_config(None, settings)
    assert str(raised.value).startswith(message)


def test_an_error_in_a_nested_file_names_the_full_dotted_key(write_config):
    with pytest.raises(ConfigError) as raised:
        load_text(write_config, "clustering:\n  replica:\n    max.lag.time: soon\n")
    assert str(raised.value) == "clustering.replica.max.lag.time: expected a duration like 15s, got 'soon'"


def test_a_key_given_twice_is_rejected(write_config):
    with pytest.raises(ConfigError, match=r"^clustering\.server\.id: given more than once"):
        load_text(write_config, "clustering.server.id: a\nclustering: {server.id: b}\n")


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


# ---- garbage files -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content, message",
    [
        ("- a\n- b\n", "expected a mapping of settings, got a list"),
        ("just some words\n", "expected a mapping of settings, got a str"),
        ("a: [1, 2\n", "not valid YAML"),
        ("port: 9292\n\tlisten: x\n", "not valid YAML"),
        (b"\x00\xff\xfe\x01junk\x9c", "not valid YAML"),
        (bytes(random.Random(7).randrange(256) for _ in range(512)), "not valid YAML"),
        ("1: a\n", "top level: setting names must be strings, got 1"),
        ("clustering: {7: a}\n", "clustering: setting names must be strings, got 7"),
        ("42\n", "expected a mapping of settings, got a int"),
        ("port: !!python/object/apply:os.system [true]\n", "not valid YAML"),
        (b"port: 92\x0092\n", "not valid YAML"),
        (gzip.compress(b"port: 9292\n"), "not valid YAML"),
        ("port: 9292.5\n", "port: expected an integer from 0 to 65535, got 9292.5"),
        ("cursors.stream.partitions: [1]\n", "cursors.stream.partitions: expected an integer >= 0, got [1]"),
        ("streams.retention.max.age: -1s\n", "streams.retention.max.age: expected a duration like 15s, got '-1s'"),
        ("clustering: {replica.fetch.timeout: -0.5}\n",
         "clustering.replica.fetch.timeout: expected a duration like 15s, got -0.5"),
        ("streams:\n  retention.max.agee: 1h\n",
         "streams.retention.max.agee: unknown setting (did you mean streams.retention.max.age?)"),
    ],
)
def test_garbage_files_give_a_clear_error(write_config, content, message):
    path = write_config(content)
    with pytest.raises(ConfigError) as raised:
        load_config(path, {})
    assert message in str(raised.value)


def test_a_missing_file_names_the_path(tmp_path):
    missing = tmp_path / "missing.yaml"
    with pytest.raises(ConfigError, match="missing.yaml: cannot read the configuration file"):
        load_config(str(missing), {})


def test_a_directory_is_not_a_configuration_file(tmp_path):
    with pytest.raises(ConfigError, match=f"^{re.escape(str(tmp_path))}: cannot read the configuration file"):
        load_config(str(tmp_path), {})


# ---- flags ---------------------------------------------------------------------------------------


def test_only_flags_given_become_overrides():
    assert overrides_from_args(parse_flags()) == {}
    assert overrides_from_args(parse_flags("-c", "bascule.yaml")) == {}


def test_every_liftbridge_flag_maps_to_its_setting():
    flags = parse_flags(
        "-c", "file.yaml", "--id", "a", "--ns", "prod", "-n", "nats://127.0.0.1:1,nats://127.0.0.1:2",
        "-e", "--nc", "nats.conf", "-d", "/data", "-p", "9300", "--tls-cert", "c.pem", "--tls-key", "k.pem",
        "-l", "debug", "--raft-bootstrap-seed", "--raft-bootstrap-peers", "p1,p2", "--raft-listen", "127.0.0.1:7000",
    )
    assert flags.config == "file.yaml"
    assert overrides_from_args(flags) == {
        "clustering.server.id": "a",
        "clustering.namespace": "prod",
        "nats.servers": ["nats://127.0.0.1:1", "nats://127.0.0.1:2"],
        "nats.embedded": True,
        "nats.embedded.config": "nats.conf",
        "data.dir": "/data",
        "port": 9300,
        "tls.cert": "c.pem",
        "tls.key": "k.pem",
        "logging.level": "debug",
        "clustering.raft.bootstrap.seed": True,
        "clustering.raft.bootstrap.peers": ["p1", "p2"],
        "clustering.raft.listen": "127.0.0.1:7000",
    }


def test_long_flag_aliases_and_repeated_lists():
    flags = parse_flags("--server-id", "a", "--namespace", "ns", "--embedded-nats-config", "n.conf",
                        "--nats-servers", "nats://127.0.0.1:1", "--nats-servers", "nats://127.0.0.1:2")
    overrides = overrides_from_args(flags)
    assert overrides["clustering.server.id"] == "a"
    assert overrides["clustering.namespace"] == "ns"
    assert overrides["nats.embedded.config"] == "n.conf"
    assert overrides["nats.servers"] == ["nats://127.0.0.1:1", "nats://127.0.0.1:2"]


def test_flags_win_over_the_file(write_config):
    path = write_config("""
        port: 9300
        logging.level: warn
        clustering: {server.id: from-file, namespace: file-ns}
        nats.servers: [nats://127.0.0.1:4300]
    """)
    flags = parse_flags("-c", path, "--id", "from-flag", "-p", "9400", "-n", "nats://127.0.0.1:4400")
    config = load_config(flags.config, overrides_from_args(flags))
    assert config.clustering.server_id == "from-flag"
    assert config.port == 9400
    assert config.nats.servers == ("nats://127.0.0.1:4400",)
    assert config.clustering.namespace == "file-ns"  # not overridden
    assert config.logging.level == "warn"


def test_data_dir_defaults_under_the_namespace():
    assert load_config(None, {"clustering.namespace": "prod"}).data_dir == default_data_dir("prod")


def test_bad_flag_values_name_the_setting():
    with pytest.raises(ConfigError, match=r"^clustering\.raft\.listen: expected host:port"):
        load_config(None, overrides_from_args(parse_flags("--raft-listen", "somewhere")))


# ---- the Raft transport needs a password beyond loopback ----------------------------------------------


@pytest.mark.parametrize("address", ["10.0.0.5:9393", "192.168.1.20:0", "n1:9393", "bascule.example.com:9393",
                                     "[2001:db8::1]:9393"])
def test_a_raft_address_beyond_loopback_without_a_password_is_refused(address):
    with pytest.raises(ConfigError) as raised:
        load_config(None, {"clustering.raft.listen": address})
    message = str(raised.value)
    assert message.startswith("clustering.raft.listen, clustering.raft.password: the Raft address ")
    assert "is not a loopback address and clustering.raft.password is empty" in message
    assert "unpickles every frame" in message and "remote code execution" in message
    assert RAFT_PASSWORD_ENV in message  # and how to give one


def test_the_raft_password_rule_holds_for_files_and_flags(write_config):
    with pytest.raises(ConfigError, match="is not a loopback address"):
        load_text(write_config, "clustering: {raft.listen: 10.0.0.5:9393}\n")
    with pytest.raises(ConfigError, match="is not a loopback address"):
        load_config(None, overrides_from_args(parse_flags("--raft-listen", "n1:9393")))
    with pytest.raises(ConfigError, match="is not a loopback address"):  # an empty password is none
        load_text(write_config, "clustering: {raft.listen: 10.0.0.5:9393, raft.password: ''}\n")


@pytest.mark.parametrize("address", ["127.0.0.1:0", "127.0.0.1:9393", "127.1.2.3:9393", "localhost:9393",
                                     "LocalHost:0", "[::1]:9393"])
def test_a_loopback_raft_address_needs_no_password(address):
    config = load_config(None, {"clustering.raft.listen": address})
    assert config.clustering.raft_password == ""


def test_the_default_raft_address_is_loopback_and_needs_no_password():
    assert load_config(None, {}).clustering.raft_password == ""


@pytest.mark.parametrize("address", ["10.0.0.5:9393", "n1:9393", "[2001:db8::1]:9393"])
def test_a_raft_address_beyond_loopback_with_a_password_is_allowed(write_config, address):
    config = load_text(write_config, f"clustering: {{raft.listen: '{address}', raft.password: s3cret}}\n")
    assert (config.clustering.raft_listen, config.clustering.raft_password) == (address, "s3cret")


def test_the_raft_password_can_come_from_the_environment(write_config, monkeypatch):
    flags = parse_flags("--raft-listen", "n1:9393")
    assert overrides_from_args(flags, {RAFT_PASSWORD_ENV: "from-env"})["clustering.raft.password"] == "from-env"
    assert "clustering.raft.password" not in overrides_from_args(flags, {RAFT_PASSWORD_ENV: ""})
    monkeypatch.setenv(RAFT_PASSWORD_ENV, "from-env")
    path = write_config("clustering.raft.password: from-file\n")
    config = load_config(path, overrides_from_args(parse_flags("-c", path, "--raft-listen", "n1:9393")))
    assert config.clustering.raft_password == "from-env"  # as flags do, the environment wins over the file


# ---- the data dir must be this user's -----------------------------------------------------------------


def test_a_data_dir_of_this_user_or_missing_is_accepted_and_not_made(tmp_path):
    assert load_config(None, {"data.dir": str(tmp_path)}).data_dir == str(tmp_path)
    assert load_config(None, {"data.dir": str(tmp_path / "new")}).data_dir == str(tmp_path / "new")
    assert not (tmp_path / "new").exists()  # the node makes it, private


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_a_data_dir_of_another_user_is_refused(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    nobody = pwd.getpwnam("nobody").pw_uid
    os.chown(data_dir, nobody, -1)
    with pytest.raises(ConfigError) as raised:
        load_config(None, overrides_from_args(parse_flags("-d", str(data_dir))))
    assert str(raised.value).startswith(f"data.dir: {data_dir} belongs to uid {nobody} (nobody), not to uid 0")
    assert "refusing to keep data where another user can read or change it" in str(raised.value)


def test_a_data_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "data").write_text("")
    with pytest.raises(ConfigError, match=r"^data\.dir: .*/data exists and is not a directory"):
        load_config(None, {"data.dir": str(tmp_path / "data")})


def test_mutual_tls_needs_server_tls_and_a_client_ca(write_config):
    config = load_text(write_config,
                       "tls: {cert: s.pem, key: s.key, client.auth.enabled: true, client.auth.ca: ca.pem}")
    assert (config.tls.client_auth, config.tls.client_auth_ca) == (True, "ca.pem")
    for text in (
        "tls: {client.auth.enabled: true, client.auth.ca: ca.pem}",  # no server certificate
        "tls: {cert: s.pem, key: s.key, client.auth.enabled: true}",  # no CA to check clients with
        "tls: {cert: s.pem, key: s.key, client.auth.ca: ca.pem}",  # a CA, but client auth off
    ):
        with pytest.raises(ConfigError, match="tls.client.auth"):
            load_text(write_config, text)


def test_authorization_needs_client_certificates_and_its_files(write_config):
    mtls = "cert: s.pem, key: s.key, client.auth.enabled: true, client.auth.ca: ca.pem"
    config = load_text(write_config, "tls: {" + mtls + ", client.authz.enabled: true, client.authz.model: m.conf, "
                                     "client.authz.policy: p.csv}")
    assert (config.tls.client_authz, config.tls.client_authz_model, config.tls.client_authz_policy) == (
        True, "m.conf", "p.csv")
    for text in (
        "tls: {cert: s.pem, key: s.key, client.authz.enabled: true, client.authz.model: m, client.authz.policy: p}",
        "tls: {" + mtls + ", client.authz.enabled: true, client.authz.model: m.conf}",
    ):
        with pytest.raises(ConfigError, match="tls.client.authz"):
            load_text(write_config, text)


def test_nats_urls_are_logged_without_their_secrets():
    from bascule.natsio.urls import redacted

    assert redacted("nats://alice:s3cret@10.0.0.1:4222") == "nats://alice:***@10.0.0.1:4222"
    assert redacted("nats://t0ken@nats.example:4222") == "nats://***@nats.example:4222"
    assert redacted("nats://127.0.0.1:4222") == "nats://127.0.0.1:4222"


def test_nats_credentials_and_tls_reach_the_nats_config_and_never_its_repr(write_config):
    config = load_text(write_config, "nats:\n  servers: [tls://n1:4222]\n  user: bascule\n  password: hunter2\n"
                                     "  tls.ca: /etc/ca.pem\n")
    auth = config.nats.auth
    assert (auth.user, auth.password, auth.tls_ca, auth.wants_tls) == ("bascule", "hunter2", "/etc/ca.pem", True)
    assert "hunter2" not in repr(config) and repr(auth) == "NatsAuth(user, tls)"
    assert auth.connect_fields(nonce=None) == {"user": "bascule", "pass": "hunter2"}


def test_nats_secrets_come_from_the_environment_too():
    import argparse

    from bascule.config.loading import overrides_from_args

    environ = {"BASCULE_NATS_PASSWORD": "p", "BASCULE_NATS_TOKEN": "", "BASCULE_RAFT_PASSWORD": "r"}
    assert overrides_from_args(argparse.Namespace(), environ) == {
        "nats.password": "p", "clustering.raft.password": "r"}


@pytest.mark.parametrize(
    ("go_style", "expected"),
    [
        (["-id", "a", "-ns", "x"], {"clustering.server.id": "a", "clustering.namespace": "x"}),
        (["-raft-bootstrap-seed", "-nats-servers=nats://h:4222"],
         {"clustering.raft.bootstrap.seed": True, "nats.servers": ["nats://h:4222"]}),
        (["-n", "nats://h:1", "-nc", "n.conf", "-e"],
         {"nats.servers": ["nats://h:1"], "nats.embedded.config": "n.conf", "nats.embedded": True}),
    ],
)
def test_liftbridge_go_style_single_dash_long_flags(go_style, expected):
    from bascule.config.loading import go_style_flags

    overrides = overrides_from_args(parse_flags(*go_style_flags(go_style)), environ={})
    assert {key: list(value) if isinstance(value, tuple) else value for key, value in overrides.items()} == expected


def test_liftbridge_environment_settings_lose_to_flags():
    environ = {"LIFTBRIDGE_CLUSTERING_SERVER_ID": "from-env", "LIFTBRIDGE_STREAMS.RETENTION.MAX.AGE": "1h",
               "LIFTBRIDGE_LOGGING_LEVEL": "debug", "LIFTBRIDGE_UNKNOWN_KEY": "ignored"}
    overrides = overrides_from_args(parse_flags("-l", "warn"), environ=environ)
    assert overrides == {"clustering.server.id": "from-env", "streams.retention.max.age": "1h", "logging.level": "warn"}
    config = load_config(None, overrides)
    assert config.clustering.server_id == "from-env" and config.streams.retention_max_age == 3600
    with pytest.raises(ConfigError, match="clustering.min.insync.replicas"):
        environ = {"LIFTBRIDGE_CLUSTERING_MIN_INSYNC_REPLICAS": "x"}
        load_config(None, overrides_from_args(parse_flags(), environ=environ))


# ---- the metrics endpoint ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "settings, host, port",
    [
        ({}, "127.0.0.1", None),
        ({"metrics.listen": "127.0.0.1:9100"}, "127.0.0.1", 9100),
        ({"metrics.listen": "0.0.0.0:9100"}, "0.0.0.0", 9100),
        ({"metrics.listen": ":9100"}, "0.0.0.0", 9100),
        ({"metrics.listen": "[::1]:9100"}, "::1", 9100),
        ({"metrics.listen": 9100}, "127.0.0.1", 9100),
        ({"metrics.listen": "127.0.0.1:0"}, "127.0.0.1", 0),
        ({"metrics.port": 9100}, "127.0.0.1", 9100),
        ({"metrics.listen": "10.1.2.3:9100", "metrics.port": 9200}, "10.1.2.3", 9200),
    ],
)
def test_metrics_endpoint_address(settings, host, port):
    metrics = load_config(None, settings).metrics
    assert (metrics.host, metrics.port) == (host, port)


def test_metrics_listen_in_a_file(write_config):
    config = load_text(write_config, "metrics:\n  listen: 0.0.0.0:9100\n")
    assert (config.metrics.host, config.metrics.port) == ("0.0.0.0", 9100)


def test_the_metrics_port_flag_keeps_the_host_of_the_file(write_config):
    path = write_config("metrics.listen: 10.1.2.3:9100\n")
    flags = parse_flags("-c", path, "--metrics-port", "9300")
    assert overrides_from_args(flags, environ={}) == {"metrics.port": 9300}
    config = load_config(flags.config, overrides_from_args(flags, environ={}))
    assert (config.metrics.host, config.metrics.port) == ("10.1.2.3", 9300)


def test_the_metrics_port_flag_alone_binds_loopback():
    config = load_config(None, overrides_from_args(parse_flags("--metrics-port", "9300"), environ={}))
    assert (config.metrics.host, config.metrics.port) == ("127.0.0.1", 9300)


def test_the_go_style_metrics_port_flag():
    from bascule.config.loading import go_style_flags

    assert overrides_from_args(parse_flags(*go_style_flags(["-metrics-port", "9300"])), environ={}) == {
        "metrics.port": 9300}


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"metrics.listen": "nowhere"}, "metrics.listen: expected host:port, like 127.0.0.1:9292, got 'nowhere'"),
        ({"metrics.listen": "127.0.0.1:99999"}, "metrics.listen: expected host:port"),
        ({"metrics.listen": "127.0.0.1:-1"}, "metrics.listen: expected host:port"),
        ({"metrics.listen": "a b:9100"}, "metrics.listen: expected host:port"),
        ({"metrics.listen": True}, "metrics.listen: expected host:port"),
        ({"metrics.listen": ["127.0.0.1:9100"]}, "metrics.listen: expected host:port"),
        ({"metrics.listen": 70000}, "metrics.listen: expected an integer from 0 to 65535, got 70000"),
        ({"metrics.port": "ninety"}, "metrics.port: expected an integer from 0 to 65535, got 'ninety'"),
        ({"metrics.port": -1}, "metrics.port: expected an integer from 0 to 65535, got -1"),
        ({"metrics.port": 9100.5}, "metrics.port: expected an integer from 0 to 65535, got 9100.5"),
        ({"metrics.lisen": "127.0.0.1:9100"}, "metrics.lisen: unknown setting (did you mean metrics.listen?)"),
        ({"metrics": 9100}, "metrics: expected a mapping of settings such as metrics.listen, got 9100"),
    ],
)
def test_bad_metrics_settings_are_rejected_naming_the_key(settings, message):
    with pytest.raises(ConfigError) as raised:
        load_config(None, settings)
    assert str(raised.value).startswith(message)


def test_a_bad_metrics_port_flag_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        parse_flags("--metrics-port", "http")
    assert "--metrics-port: invalid int value: 'http'" in capsys.readouterr().err


def test_compaction_and_the_cursor_streams_auto_pause_as_liftbridge_has_them():
    config = load_config(None, {})
    assert not config.streams.compact_enabled and config.cursors.stream_auto_pause_time == 60.0
    config = load_config(None, {"streams.compact.enabled": True, "cursors.stream.auto.pause.time": "0s"})
    assert config.streams.compact_enabled and config.cursors.stream_auto_pause_time == 0
    assert config.ignored_settings == ()


# ---- the gRPC port's limits ----------------------------------------------------------------------


def test_grpc_limits_default_to_the_documented_bounds_and_are_set_by_their_keys(write_config):
    from bascule.h2grpc import GrpcLimits

    assert load_config(None).grpc == GrpcLimits()
    config = load_text(write_config, textwrap.dedent("""\
        grpc:
          max.concurrent.calls: 100
          connection.output: 4MiB
          node.input: 128MiB
          flood.rate: 100
        """))
    assert config.grpc == GrpcLimits(max_concurrent_calls=100, connection_output=4 << 20, node_input=128 << 20,
                                     flood_rate=100)


@pytest.mark.parametrize("key, value", [
    ("grpc.max.concurrent.calls", 0), ("grpc.connection.output", "lots"), ("grpc.node.input", -1),
    ("grpc.frames.per.turn", 1), ("grpc.flood.rate", "fast"),
])
def test_a_bad_grpc_limit_names_its_key(key, value):
    with pytest.raises(ConfigError, match=f"^{re.escape(key)}: expected"):
        load_config(None, {key: value})


# ---- a secret the nodes of a cluster share --------------------------------------------------------


def test_bootstrap_peers_without_a_password_are_refused_naming_the_fix():
    with pytest.raises(ConfigError, match=r"^clustering\.raft\.password: empty.*BASCULE_RAFT_PASSWORD.*insecure"):
        load_config(None, {"clustering.raft.bootstrap.peers": "127.0.0.1:5001,127.0.0.1:5002"})
    load_config(None, {"clustering.raft.bootstrap.peers": "127.0.0.1:5001", "clustering.raft.bootstrap.seed": True})


@pytest.mark.parametrize("joins, settings, problem", [
    (False, {}, None),  # a lone node: its own random secret is enough
    (True, {}, "it is no seed, so it joins one; a single node is started with --raft-bootstrap-seed"),
    (True, {"raft_password": "shared"}, None),
    (True, {"raft_insecure": True}, None),
    (False, {"raft_bootstrap_peers": ("127.0.0.1:1", "127.0.0.1:2")}, "it names clustering.raft.bootstrap.peers"),
    (False, {"raft_insecure": True, "raft_password": "shared"}, "set one or the other"),
])
def test_a_node_that_joins_needs_a_shared_secret(joins, settings, problem):
    from bascule.config.model import ClusteringConfig
    from bascule.config.values import unshared_secret_error

    found = unshared_secret_error(ClusteringConfig(**settings), joins)
    assert (found is None) == (problem is None) and (problem is None or problem in found), found


def test_the_insecure_secret_is_for_one_machine_only():
    with pytest.raises(ConfigError, match=r"^clustering\.raft\.insecure: the Raft address 10\.0\.0\.1:9393 is not"):
        load_config(None, {"clustering.raft.insecure": True, "clustering.raft.listen": "10.0.0.1:9393"})
    with pytest.raises(ConfigError, match="set one or the other"):
        load_config(None, {"clustering.raft.insecure": True, "clustering.raft.password": "shared"})
