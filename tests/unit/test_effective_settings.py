"""A stream's effective settings (bascule.wire.settings.effective_settings): its own, else the node's,
with Liftbridge's quirks."""

from dataclasses import replace

from bascule.config import Config
from bascule.wire.names import CURSORS_STREAM
from bascule.wire.settings import effective_settings, min_isr_error

DEFAULTS = replace(
    Config().stream_defaults, retention_max_bytes=1000, retention_max_messages=100, retention_max_age=60.0,
    auto_pause_time=30.0, min_isr=2, cursors_auto_pause_time=5.0,
)


def test_a_stream_without_settings_gets_the_node_defaults():
    settings = effective_settings("s", {}, DEFAULTS)
    assert (settings.segment_max_bytes, settings.segment_max_age) == (DEFAULTS.segment_max_bytes,
                                                                      DEFAULTS.segment_max_age)
    assert (settings.retention_max_bytes, settings.retention_max_messages, settings.retention_max_age) == (
        1000, 100, 60.0)
    assert (settings.cleaner_interval, settings.compacted) == (DEFAULTS.cleaner_interval, DEFAULTS.compact_enabled)
    assert (settings.auto_pause_time, settings.auto_pause_unless_subscribed, settings.min_isr) == (
        30.0, DEFAULTS.auto_pause_disable_if_subscribers, 2)


def test_a_streams_own_settings_win():
    own = {"segment_max_bytes": 10, "segment_max_age": 1.5, "retention_max_bytes": 5, "retention_max_messages": 6,
           "retention_max_age": 7.0, "cleaner_interval": 8.0, "compact_enabled": True, "auto_pause_time": 9.0,
           "auto_pause_disable_if_subscribers": True, "min_isr": 3}
    settings = effective_settings("s", own, DEFAULTS)
    assert (settings.segment_max_bytes, settings.segment_max_age, settings.retention_max_bytes,
            settings.retention_max_messages, settings.retention_max_age, settings.cleaner_interval,
            settings.compacted, settings.auto_pause_time, settings.auto_pause_unless_subscribed,
            settings.min_isr) == (10, 1.5, 5, 6, 7.0, 8.0, True, 9.0, True, 3)


def test_an_explicit_zero_retention_limit_is_no_limit_but_other_zeros_are_the_default():
    zeros = {"retention_max_bytes": 0, "retention_max_messages": 0, "retention_max_age": 0,
             "segment_max_bytes": 0, "segment_max_age": 0, "cleaner_interval": 0, "min_isr": 0,
             "auto_pause_time": 0}
    settings = effective_settings("s", zeros, DEFAULTS)
    assert (settings.retention_max_bytes, settings.retention_max_messages, settings.retention_max_age) == (0, 0, 0)
    assert (settings.segment_max_bytes, settings.segment_max_age, settings.cleaner_interval, settings.min_isr) == (
        DEFAULTS.segment_max_bytes, DEFAULTS.segment_max_age, DEFAULTS.cleaner_interval, 2)
    assert settings.auto_pause_time == 0  # never pauses


def test_a_stream_is_compacted_as_its_own_setting_says_else_as_the_node_default():
    on, off = replace(DEFAULTS, compact_enabled=True), replace(DEFAULTS, compact_enabled=False)
    assert effective_settings("s", {"compact_enabled": True}, off).compacted
    assert effective_settings("s", {}, on).compacted
    assert not effective_settings("s", {"compact_enabled": False}, on).compacted
    assert not effective_settings("s", {}, off).compacted
    assert effective_settings(CURSORS_STREAM, {}, off).compacted  # the cleaner always compacts the cursors


def test_the_cursors_stream_pauses_by_the_servers_setting_and_never_while_read():
    stored = {"auto_pause_time": 99.0, "auto_pause_disable_if_subscribers": False, "compact_enabled": False}
    settings = effective_settings(CURSORS_STREAM, stored, DEFAULTS)
    assert (settings.auto_pause_time, settings.auto_pause_unless_subscribed, settings.compacted) == (5.0, True, True)


def test_the_node_defaults_come_from_its_configuration():
    config = Config()
    defaults = config.stream_defaults
    assert (defaults.segment_max_bytes, defaults.retention_max_age, defaults.min_isr,
            defaults.cursors_auto_pause_time) == (config.streams.segment_max_bytes, config.streams.retention_max_age,
                                                  config.clustering.min_insync_replicas,
                                                  config.cursors.stream_auto_pause_time)


def test_a_min_isr_above_the_replication_factor_is_refused_naming_where_it_comes_from():
    assert min_isr_error("s", {"min_isr": 2}, 1, DEFAULTS) == "min ISR 2 exceeds the replication factor 1"
    assert min_isr_error("s", {}, 1, DEFAULTS) == (
        "min ISR 2 (clustering.min.insync.replicas) exceeds the replication factor 1")
    assert min_isr_error("s", {"min_isr": 0}, 1, DEFAULTS).startswith("min ISR 2 (clustering")
    assert min_isr_error("s", {"min_isr": 1}, 1, DEFAULTS) is None
    assert min_isr_error("s", {"min_isr": 3}, 3, DEFAULTS) is None
    for every_broker_or_default in (-1, 0):
        assert min_isr_error("s", {"min_isr": 5}, every_broker_or_default, DEFAULTS) is None
