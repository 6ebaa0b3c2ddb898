"""A stream's settings, typed: go-liftbridge's StreamOptions beyond name, subject, group, partitions
and replication factor. None leaves a setting to the server's default."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import timedelta

from bascule.wire.pb import api_pb2
from bascule.wire.settings import set_on_request

Duration = float | timedelta  # a float is seconds


@dataclass(frozen=True)
class StreamSettings:
    """Each field maps to the CreateStreamRequest field of the same name in camel case
    (``retention_max_age`` -> ``retentionMaxAge``); durations go to the server in milliseconds."""

    retention_max_bytes: int | None = None  # 0: no limit
    retention_max_messages: int | None = None  # 0: no limit
    retention_max_age: Duration | None = None  # 0: no limit
    cleaner_interval: Duration | None = None  # how often retention and compaction run
    segment_max_bytes: int | None = None
    segment_max_age: Duration | None = None  # when the active segment rolls, full or not
    compact_max_goroutines: int | None = None  # Liftbridge's; bascule compacts one partition at a time
    compact_enabled: bool | None = None  # keep only the newest message of each key
    auto_pause_time: Duration | None = None  # pause a partition idle this long (0: never)
    auto_pause_disable_if_subscribers: bool | None = None
    min_isr: int | None = None  # replicas that must have a message before an ack ALL
    optimistic_concurrency_control: bool | None = None  # publishes name the offset they expect
    encryption: bool | None = None  # values encrypted at rest with the server's key
    # bascule's own: publishes with a Nats-Msg-Id header seen within this window are stored once
    # (0 in either: deduplication off).
    dedup_window: Duration | None = None
    dedup_max_messages: int | None = None

    def apply_to(self, request: api_pb2.CreateStreamRequest) -> None:
        """Set the request's nullable fields for every setting given."""
        given = {
            key: value.total_seconds() if isinstance(value, timedelta) else value
            for key, value in asdict(self).items() if value is not None
        }
        set_on_request(request, given)
