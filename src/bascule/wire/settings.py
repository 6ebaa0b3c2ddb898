"""A stream's settings as the metadata keeps them: each key's type and allowed range.

CreateStream, the propagated create request and the journaled ``create_stream`` command are all
checked against this one table, so a stream never exists with a setting that every replica would
then fail to apply. The table also maps each setting to its CreateStreamRequest field, for the API
and for bascule's client. Durations are seconds (float); 0 means "the cluster default" (or, for min ISR,
``clustering.min.insync.replicas``), except for the retention limits, where a 0 given means no limit, as
in Liftbridge (an absent one is the cluster default).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from bascule.wire.names import CURSORS_STREAM, MAX_REPLICATION_FACTOR, RESERVED_STREAMS

_MAX_INT64 = (1 << 63) - 1
# Index points hold a segment position as uint32: a segment must stay below 4 GiB.
MAX_SEGMENT_BYTES = (1 << 32) - 1
MAX_DURATION = 100 * 365 * 24 * 3600.0  # seconds: anything longer is a mistake, not a policy
# A deduplication window remembers at most this many ids per partition (it may hold twice as
# many, 140-180 B each, before it sheds those that left it).
MAX_DEDUP_MESSAGES = 1_000_000
_NUMBER = (int, float)
_MS = 0.001  # seconds per millisecond: the API gives durations in ms


class Setting(NamedTuple):
    """One stream setting: the CreateStreamRequest field that carries it, the types and range of
    its value in the metadata, and how many of the metadata's units one API unit is (None for a
    field that is not a number)."""

    api_field: str | None
    types: tuple[type, ...]
    lowest: float | None
    highest: float | None
    api_unit: float | None = 1


SETTINGS: dict[str, Setting] = {
    "retention_max_bytes": Setting("retentionMaxBytes", (int,), 0, _MAX_INT64),
    "retention_max_messages": Setting("retentionMaxMessages", (int,), 0, _MAX_INT64),
    "retention_max_age": Setting("retentionMaxAge", _NUMBER, 0, MAX_DURATION, _MS),
    "cleaner_interval": Setting("cleanerInterval", _NUMBER, 0, MAX_DURATION, _MS),
    "segment_max_bytes": Setting("segmentMaxBytes", (int,), 0, MAX_SEGMENT_BYTES),
    "segment_max_age": Setting("segmentMaxAge", _NUMBER, 0, MAX_DURATION, _MS),
    "compact_max_goroutines": Setting("compactMaxGoroutines", (int,), 0, 1024),
    "compact_enabled": Setting("compactEnabled", (bool,), None, None, None),
    "auto_pause_time": Setting("autoPauseTime", _NUMBER, 0, MAX_DURATION, _MS),
    "auto_pause_disable_if_subscribers": Setting("autoPauseDisableIfSubscribers", (bool,), None, None, None),
    "min_isr": Setting("minIsr", (int,), 0, MAX_REPLICATION_FACTOR),
    "optimistic_concurrency_control": Setting("optimisticConcurrencyControl", (bool,), None, None, None),
    "encryption": Setting("encryption", (bool,), None, None, None),
    # bascule's own (CreateStreamRequest fields Liftbridge does not have); 0 turns deduplication off.
    "dedup_window": Setting("dedupWindow", _NUMBER, 0, MAX_DURATION, _MS),
    "dedup_max_messages": Setting("dedupMaxMessages", (int,), 0, MAX_DEDUP_MESSAGES),
    "resume_all": Setting(None, (bool,), None, None, None),  # set by a pause with resumeAll
}


def settings_from_request(request: Any) -> dict[str, Any]:
    """The settings a CreateStreamRequest sets (its nullable fields that are present), in the
    metadata's units."""
    settings: dict[str, Any] = {}
    for key, setting in SETTINGS.items():
        if setting.api_field is not None and request.HasField(setting.api_field):
            value = getattr(request, setting.api_field).value
            settings[key] = value if setting.api_unit is None else value * setting.api_unit
    return settings


def set_on_request(request: Any, settings: dict[str, Any]) -> None:
    """Put ``settings`` (metadata keys and units) on a CreateStreamRequest; ValueError for a key
    the API does not carry."""
    for key, value in settings.items():
        setting = SETTINGS.get(key)
        if setting is None or setting.api_field is None:
            raise ValueError(f"unknown stream setting {key!r}")
        field = getattr(request, setting.api_field)
        field.value = value if setting.api_unit is None else round(value / setting.api_unit)


@dataclass(frozen=True)
class StreamDefaults:
    """What a node gives the settings a stream leaves unset (its streams.* configuration,
    clustering.min.insync.replicas and cursors.stream.auto.pause.time)."""

    segment_max_bytes: int
    segment_max_age: float
    retention_max_bytes: int
    retention_max_messages: int
    retention_max_age: float
    cleaner_interval: float
    compact_enabled: bool
    auto_pause_time: float
    auto_pause_disable_if_subscribers: bool
    min_isr: int
    cursors_auto_pause_time: float
    concurrency_control: bool = False
    dedup_window: float = 0.0
    dedup_max_messages: int = 0


@dataclass(frozen=True)
class EffectiveSettings:
    """The settings a stream's partitions run with on a node: the stream's own, else the node's."""

    segment_max_bytes: int
    segment_max_age: float
    retention_max_bytes: int  # 0: no limit
    retention_max_messages: int  # 0: no limit
    retention_max_age: float  # 0: no limit
    cleaner_interval: float
    compacted: bool
    auto_pause_time: float  # 0: never
    auto_pause_unless_subscribed: bool
    min_isr: int
    concurrency_control: bool  # Liftbridge's optimistic concurrency control: appends check expected offsets
    dedup_window: float  # seconds; 0: no deduplication
    dedup_max_messages: int  # 0: no deduplication


def effective_settings(stream: str, settings: Mapping[str, Any], defaults: StreamDefaults) -> EffectiveSettings:
    """Liftbridge's rules: a 0 segment limit, cleaner interval or min ISR is the default, as an
    absent one, but a 0 retention limit is no limit. The cursors stream is always compacted (its
    records are the latest position of each cursor) and auto-paused by the server's setting, never
    while read, so that a changed setting takes effect at the next start. The server's internal
    streams never check expected offsets: their writers (cursors, the activity stream) name none,
    and a default of checking would refuse all but their first message."""
    cursors = stream == CURSORS_STREAM
    return EffectiveSettings(
        segment_max_bytes=settings.get("segment_max_bytes") or defaults.segment_max_bytes,
        segment_max_age=settings.get("segment_max_age") or defaults.segment_max_age,
        retention_max_bytes=settings.get("retention_max_bytes", defaults.retention_max_bytes),
        retention_max_messages=settings.get("retention_max_messages", defaults.retention_max_messages),
        retention_max_age=settings.get("retention_max_age", defaults.retention_max_age),
        cleaner_interval=settings.get("cleaner_interval") or defaults.cleaner_interval,
        compacted=cursors or bool(settings.get("compact_enabled", defaults.compact_enabled)),
        auto_pause_time=defaults.cursors_auto_pause_time if cursors else settings.get(
            "auto_pause_time", defaults.auto_pause_time),
        auto_pause_unless_subscribed=cursors or settings.get(
            "auto_pause_disable_if_subscribers", defaults.auto_pause_disable_if_subscribers),
        min_isr=settings.get("min_isr") or defaults.min_isr,
        concurrency_control=stream not in RESERVED_STREAMS and bool(
            settings.get("optimistic_concurrency_control", defaults.concurrency_control)),
        dedup_window=settings.get("dedup_window", defaults.dedup_window),
        dedup_max_messages=settings.get("dedup_max_messages", defaults.dedup_max_messages),
    )


def min_isr_error(stream: str, settings: Mapping[str, Any], replication_factor: int,
                  defaults: StreamDefaults) -> str | None:
    """Why a stream cannot have these settings with this replication factor, or None: a partition
    whose ISR can never reach its min ISR would never commit anything. A replication factor of -1
    (every broker) or 0 (the default) is not checked."""
    min_isr = effective_settings(stream, settings, defaults).min_isr
    if replication_factor <= 0 or min_isr <= replication_factor:
        return None
    origin = "" if settings.get("min_isr") else " (clustering.min.insync.replicas)"
    return f"min ISR {min_isr}{origin} exceeds the replication factor {replication_factor}"


def settings_error(settings: Any) -> str | None:
    """Why ``settings`` cannot be a stream's settings, or None."""
    if not isinstance(settings, dict):
        return f"settings must be a map, got {type(settings).__name__}"
    for key, value in settings.items():
        rule = SETTINGS.get(key) if isinstance(key, str) else None
        if rule is None:
            return f"unknown stream setting {key!r}"
        problem = _value_error(key, value, rule.types, rule.lowest, rule.highest)
        if problem:
            return problem
    return None


def _value_error(
    key: str, value: Any, types: tuple[type, ...], lowest: float | None, highest: float | None
) -> str | None:
    if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
        return f"setting {key}: expected {' or '.join(t.__name__ for t in types)}, got {value!r}"
    if lowest is not None and highest is not None and isinstance(value, _NUMBER) and not lowest <= value <= highest:
        return f"setting {key}: {value!r} is out of range [{lowest:g}, {highest:g}]"
    return None
