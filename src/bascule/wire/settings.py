"""A stream's settings as the metadata keeps them: each key's type and allowed range.

CreateStream, the propagated create request and the journaled ``create_stream`` command are all
checked against this one table, so a stream never exists with a setting that every replica would
then fail to apply. Durations are seconds (float); 0 means "the cluster default" (or, for min ISR,
``clustering.min.insync.replicas``).
"""

from __future__ import annotations

from typing import Any

from bascule.wire.names import MAX_REPLICATION_FACTOR

_MAX_INT64 = (1 << 63) - 1
# Index points hold a segment position as uint32: a segment must stay below 4 GiB.
MAX_SEGMENT_BYTES = (1 << 32) - 1
MAX_DURATION = 100 * 365 * 24 * 3600.0  # seconds: anything longer is a mistake, not a policy
_NUMBER = (int, float)

# key -> (accepted types, lowest, highest); booleans have no range.
SETTINGS: dict[str, tuple[tuple[type, ...], float | None, float | None]] = {
    "retention_max_bytes": ((int,), 0, _MAX_INT64),
    "retention_max_messages": ((int,), 0, _MAX_INT64),
    "retention_max_age": (_NUMBER, 0, MAX_DURATION),
    "cleaner_interval": (_NUMBER, 0, MAX_DURATION),
    "segment_max_bytes": ((int,), 0, MAX_SEGMENT_BYTES),
    "segment_max_age": (_NUMBER, 0, MAX_DURATION),
    "compact_max_goroutines": ((int,), 0, 1024),
    "compact_enabled": ((bool,), None, None),
    "auto_pause_time": (_NUMBER, 0, MAX_DURATION),
    "auto_pause_disable_if_subscribers": ((bool,), None, None),
    "min_isr": ((int,), 0, MAX_REPLICATION_FACTOR),
    "optimistic_concurrency_control": ((bool,), None, None),
    "encryption": ((bool,), None, None),
    "resume_all": ((bool,), None, None),  # set by a pause with resumeAll
}


def settings_error(settings: Any) -> str | None:
    """Why ``settings`` cannot be a stream's settings, or None."""
    if not isinstance(settings, dict):
        return f"settings must be a map, got {type(settings).__name__}"
    for key, value in settings.items():
        rule = SETTINGS.get(key) if isinstance(key, str) else None
        if rule is None:
            return f"unknown stream setting {key!r}"
        problem = _value_error(key, value, *rule)
        if problem:
            return problem
    return None


def _value_error(
    key: str, value: Any, types: tuple[type, ...], lowest: float | None, highest: float | None
) -> str | None:
    if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
        return f"setting {key}: expected {' or '.join(t.__name__ for t in types)}, got {value!r}"
    if lowest is not None and highest is not None and not lowest <= value <= highest:
        return f"setting {key}: {value!r} is out of range [{lowest:g}, {highest:g}]"
    return None
