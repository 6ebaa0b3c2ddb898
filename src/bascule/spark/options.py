"""The options of the bascule Spark data source: parsed and checked once, on the driver.

Everything here is pure (no Spark, no network), picklable, and raises `BasculeSparkError` with a
message naming the option for anything it cannot use.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import overload

from bascule.spark.errors import BasculeSparkError
from bascule.wire.policies import ACK_POLICIES

EARLIEST = -2  # in offset JSON, as in Spark's Kafka source
LATEST = -1

ACK_POLICY_NAMES = tuple(sorted(ACK_POLICIES))
PARTITIONERS = ("key", "roundrobin")
TIMESTAMP_STRATEGIES = ("error", "latest")

READ_OPTIONS = {
    "brokers", "stream", "subscribe", "streampattern", "subscribepattern", "assign",
    "startingoffsets", "endingoffsets",
    "startingtimestamp", "startingoffsetsbytimestamp", "startingoffsetsbytimestampstrategy",
    "endingtimestamp", "endingoffsetsbytimestamp",
    "maxmessagespertrigger", "maxoffsetspertrigger", "minmessagespertrigger", "minoffsetspertrigger",
    "maxtriggerdelay", "minpartitions", "maxrecordsperpartition",
    "failondataloss", "readisrreplica", "polltimeoutms", "requesttimeoutms", "maxbatchrows", "includeheaders",
    "tlsca", "tlscert", "tlskey",
}
STREAMING_ONLY = {
    "maxmessagespertrigger", "maxoffsetspertrigger", "minmessagespertrigger", "minoffsetspertrigger", "maxtriggerdelay",
}
WRITE_OPTIONS = {"brokers", "stream", "ackpolicy", "partitioner", "writebatchsize", "messageids", "requesttimeoutms",
                 "tlsca", "tlscert", "tlskey"}
# Spark's own options, which reach a streaming sink along with the user's.
SPARK_OPTIONS = {"checkpointlocation", "queryname"}
CANONICAL = {
    name.lower(): name
    for name in (
        "brokers stream subscribe streamPattern subscribePattern assign startingOffsets endingOffsets "
        "startingTimestamp startingOffsetsByTimestamp startingOffsetsByTimestampStrategy endingTimestamp "
        "endingOffsetsByTimestamp maxMessagesPerTrigger maxOffsetsPerTrigger minMessagesPerTrigger "
        "minOffsetsPerTrigger maxTriggerDelay minPartitions maxRecordsPerPartition failOnDataLoss "
        "readISRReplica pollTimeoutMs requestTimeoutMs maxBatchRows includeHeaders ackPolicy partitioner "
        "writeBatchSize messageIds tlsCa tlsCert tlsKey"
    ).split()
}
# Options of Spark's Kafka source and sink that mean nothing to bascule, and what to do instead.
_RETRIED = "leave it out: metadata calls are retried on every broker, each within 'requestTimeoutMs'"
INSTEAD_OF_KAFKAS = {
    "kafka.bootstrap.servers": "use 'brokers' (host:port gRPC addresses of bascule nodes)",
    "topic": "use 'stream'",
    "groupidprefix": "leave it out: a query's offsets live in Spark's checkpoint, not in a consumer group",
    "kafkaconsumer.polltimeoutms": "use 'pollTimeoutMs'",
    "fetchoffset.numretries": _RETRIED,
    "fetchoffset.retryintervalms": _RETRIED,
}
KAFKA_CLIENT_PREFIX = "kafka."
NO_PATH = "load() and save() take no path here: name the stream with the option 'stream'"
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000  # Kafka's 15m


# ---- offsets specifications ----------------------------------------------------------------------


@dataclass(frozen=True)
class OffsetSpec:
    """Where reading starts or ends: `kind` is "earliest", "latest", "offsets" (JSON, -2/-1 allowed
    per partition), "timestamp" (one time for every partition) or "timestamps" (per partition, ms)."""

    kind: str
    offsets: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    timestamp_ms: int | None = None

    @property
    def streams(self) -> set[str]:
        return set(self.offsets)


def parse_offset_spec(option: str, text: str, *, allow_earliest: bool = True, allow_latest: bool = True) -> OffsetSpec:
    word = text.strip().lower()
    if word in ("earliest", "latest"):
        if (word == "earliest" and not allow_earliest) or (word == "latest" and not allow_latest):
            raise BasculeSparkError(f"{option} cannot be '{word}' here")
        return OffsetSpec(word)
    offsets = _per_partition_json(option, text, "offset")
    for stream, partitions in offsets.items():
        for partition, offset in partitions.items():
            if offset < EARLIEST:
                raise BasculeSparkError(
                    f"{option}: offset {offset} for {stream}/{partition} is invalid "
                    "(use an offset >= 0, -2 for earliest or -1 for latest)"
                )
            if offset == EARLIEST and not allow_earliest:
                raise BasculeSparkError(f"{option}: -2 (earliest) is not allowed here ({stream}/{partition})")
            if offset == LATEST and not allow_latest:
                raise BasculeSparkError(f"{option}: -1 (latest) is not allowed here ({stream}/{partition})")
    return OffsetSpec("offsets", offsets)


def parse_timestamps_spec(option: str, text: str) -> OffsetSpec:
    offsets = _per_partition_json(option, text, "timestamp")
    for stream, partitions in offsets.items():
        for partition, ms in partitions.items():
            if ms < 0:
                raise BasculeSparkError(f"{option}: timestamp {ms} for {stream}/{partition} is negative")
    return OffsetSpec("timestamps", offsets)


def _per_partition_json(option: str, text: str, what: str) -> dict[str, dict[int, int]]:
    example = '{"orders": {"0": 12, "1": -2}}' if what == "offset" else '{"orders": {"0": 1700000000000}}'
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise BasculeSparkError(
            f"{option} must be 'earliest', 'latest' or JSON such as {example}; cannot parse {text!r}: {exc}"
            if what == "offset"
            else f"{option} must be JSON such as {example}; cannot parse {text!r}: {exc}"
        ) from None
    if not isinstance(value, dict) or not value:
        raise BasculeSparkError(f"{option} must be a JSON object of streams, such as {example}; got {text!r}")
    result: dict[str, dict[int, int]] = {}
    for stream, partitions in value.items():
        if not isinstance(partitions, dict):
            raise BasculeSparkError(
                f"{option}: the value for stream {stream!r} must be an object of partition -> {what}, "
                f"such as {example}"
            )
        result[stream] = {}
        for partition, number in partitions.items():
            try:
                partition_id = int(partition)
            except (TypeError, ValueError):
                raise BasculeSparkError(
                    f"{option}: partition {partition!r} of stream {stream!r} is not a number"
                ) from None
            if partition_id < 0:
                raise BasculeSparkError(f"{option}: partition {partition_id} of stream {stream!r} is negative")
            if isinstance(number, bool) or not isinstance(number, int):
                raise BasculeSparkError(
                    f"{option}: the {what} for {stream}/{partition} must be an integer, got {number!r}"
                )
            result[stream][partition_id] = number
    return result


# ---- stream selection ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """Which partitions to read: named streams, a regex over stream names, or explicit partitions."""

    streams: tuple[str, ...] = ()
    pattern: str | None = None
    assign: Mapping[str, tuple[int, ...]] | None = None

    def describe(self) -> str:
        if self.pattern is not None:
            return f"streamPattern {self.pattern!r}"
        if self.assign is not None:
            return f"assign {dict(self.assign)}"
        return f"stream {','.join(self.streams)}"

    def matches(self, name: str) -> bool:
        if self.pattern is not None:
            # Internal streams (__cursors) only when named, as Kafka excludes internal topics.
            return not name.startswith("__") and re.fullmatch(self.pattern, name) is not None
        if self.assign is not None:
            return name in self.assign
        return name in self.streams


# Kafka's names for the same choices.
SELECTION_ALIASES = {"subscribe": "stream", "subscribepattern": "streampattern"}


def _selection(options: Mapping[str, str]) -> Selection:
    given = [
        name for name in ("stream", "subscribe", "streampattern", "subscribepattern", "assign")
        if options.get(name, "").strip()
    ]
    if len(given) != 1:
        named = ", ".join(CANONICAL[name] for name in given) or "none"
        raise BasculeSparkError(
            f"give exactly one of the options 'stream' (a name or comma list; Kafka's 'subscribe' is the same), "
            f"'streamPattern' (a regex; or 'subscribePattern') or 'assign' (JSON {{\"stream\": [0, 1]}}); "
            f"got {named}"
        )
    if given[0] in SELECTION_ALIASES:
        options = {**options, SELECTION_ALIASES[given[0]]: options[given[0]]}
        given = [SELECTION_ALIASES[given[0]]]
    if given[0] == "stream":
        streams = tuple(dict.fromkeys(s.strip() for s in options["stream"].split(",") if s.strip()))
        return Selection(streams=streams)
    if given[0] == "streampattern":
        pattern = options["streampattern"].strip()
        try:
            re.compile(pattern)
        except re.error as exc:
            raise BasculeSparkError(f"streamPattern {pattern!r} is not a valid regular expression: {exc}") from None
        return Selection(pattern=pattern)
    text = options["assign"]
    try:
        value = json.loads(text)
        if not isinstance(value, dict) or not value:
            raise ValueError("not a non-empty object")
        assign = {}
        for stream, partitions in value.items():
            if not isinstance(partitions, list) or not all(
                isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in partitions
            ):
                raise ValueError(f"the partitions of {stream!r} must be a list of partition numbers")
            assign[stream] = tuple(sorted(set(partitions)))
    except ValueError as exc:
        raise BasculeSparkError(
            f'assign must be JSON such as {{"orders": [0, 1]}}; cannot use {text!r}: {exc}'
        ) from None
    return Selection(assign=assign)


# ---- parsing helpers -----------------------------------------------------------------------------


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): "" if v is None else str(v) for k, v in dict(options).items()}


def _check_names(options: Mapping[str, str], known: set[str], other: set[str], other_kind: str) -> None:
    """Every option must be one of `known` (or Spark's); `other` holds those of `other_kind`
    (reads or writes), named as such when given to the wrong one."""
    for name in options:
        if name not in known and name not in SPARK_OPTIONS:
            raise BasculeSparkError(_unknown(name, known, other, other_kind))


def _unknown(name: str, known: set[str], other: set[str], other_kind: str) -> str:
    if name in ("path", "paths"):
        return NO_PATH
    if name in INSTEAD_OF_KAFKAS:
        return f"option {name!r} of Spark's Kafka connector has no meaning for bascule: {INSTEAD_OF_KAFKAS[name]}"
    if name.startswith(KAFKA_CLIENT_PREFIX):
        return (
            f"option {name!r} configures Kafka's client, which bascule does not use: the brokers are 'brokers', "
            "the TLS files 'tlsCa', 'tlsCert', 'tlsKey', the deadline of each call 'requestTimeoutMs'"
        )
    if name in other:
        return f"{CANONICAL[name]} is an option of {other_kind} only"
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.8)
    if close:
        return f"unknown option {name!r}; did you mean {CANONICAL.get(close[0], close[0])!r}?"
    return f"unknown option {name!r} (docs/spark.md lists the options)"


def _aliased_int(options: Mapping[str, str], name: str, alias: str) -> int | None:
    """An integer option that Kafka's name `alias` may give instead, but not both."""
    if options.get(name, "").strip() and options.get(alias, "").strip():
        raise BasculeSparkError(f"{CANONICAL[name]} and {CANONICAL[alias]} are the same option: give one")
    return _int(options, name if options.get(name, "").strip() else alias, None, 1)


_DURATION = re.compile(r"(\d+)\s*(us|ms|s|m|min|h|d)?")
_MS_PER_UNIT = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def _duration_ms(options: Mapping[str, str], name: str, default: int) -> int:
    """A time as Spark writes them (Kafka's maxTriggerDelay): "15m", "30s", "500ms"; a bare number is ms."""
    text = options.get(name, "").strip().lower()
    if not text:
        return default
    match = _DURATION.fullmatch(text)
    if match is None:
        raise BasculeSparkError(f"{CANONICAL[name]} must be a time such as '15m', '30s' or '500ms', got {text!r}")
    return int(int(match[1]) * _MS_PER_UNIT[match[2] or "ms"])


@overload
def _int(options: Mapping[str, str], name: str, default: int, minimum: int) -> int: ...
@overload
def _int(options: Mapping[str, str], name: str, default: None, minimum: int) -> int | None: ...
def _int(options: Mapping[str, str], name: str, default: int | None, minimum: int) -> int | None:
    text = options.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise BasculeSparkError(f"{CANONICAL[name]} must be an integer, got {text!r}") from None
    if value < minimum:
        raise BasculeSparkError(f"{CANONICAL[name]} must be >= {minimum}, got {value}")
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    text = options.get(name, "").strip().lower()
    if not text:
        return default
    if text in ("true", "false"):
        return text == "true"
    raise BasculeSparkError(f"{CANONICAL[name]} must be 'true' or 'false', got {options[name]!r}")


def _choice(options: Mapping[str, str], name: str, choices: tuple[str, ...], default: str) -> str:
    text = options.get(name, "").strip().lower()
    if not text:
        return default
    if text not in choices:
        raise BasculeSparkError(f"{CANONICAL[name]} must be one of {', '.join(choices)}; got {options[name]!r}")
    return text


def _brokers(options: Mapping[str, str]) -> tuple[str, ...]:
    brokers = tuple(b.strip() for b in options.get("brokers", "").split(",") if b.strip())
    if not brokers:
        raise BasculeSparkError("the option 'brokers' is required: a comma list of host:port gRPC addresses")
    for broker in brokers:
        host, _, port = broker.rpartition(":")
        if not host or not port.isdigit():
            raise BasculeSparkError(f"brokers: {broker!r} is not host:port")
    return brokers


@dataclass(frozen=True)
class TlsFiles:
    """TLS to the brokers: PEM files on every machine that runs a task (the driver and the
    executors): the CA of the brokers' certificates, and a client certificate and key for brokers
    that require one."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None


def _tls(options: Mapping[str, str]) -> TlsFiles | None:
    ca, cert, key = (options.get(name, "").strip() or None for name in ("tlsca", "tlscert", "tlskey"))
    if bool(cert) != bool(key):
        raise BasculeSparkError("tlsCert and tlsKey go together: a client certificate needs its key")
    return TlsFiles(ca, cert, key) if ca or cert else None


# ---- read options --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReadOptions:
    brokers: tuple[str, ...]
    selection: Selection
    starting: OffsetSpec
    ending: OffsetSpec
    timestamp_strategy: str = "error"
    max_messages_per_trigger: int | None = None
    min_messages_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    fail_on_data_loss: bool = True
    read_isr_replica: bool = False
    poll_timeout_ms: int = 120_000
    request_timeout_ms: int = 30_000
    max_batch_rows: int = 10_000
    include_headers: bool = True
    tls: TlsFiles | None = None

    @property
    def request_timeout(self) -> float:
        return self.request_timeout_ms / 1000


def parse_read_options(raw: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    options = _lower(raw)
    _check_names(options, READ_OPTIONS, WRITE_OPTIONS, "writes")
    if not streaming:
        _refuse_streaming_only(options)
    brokers = _brokers(options)
    selection = _selection(options)
    starting = _starting(options, streaming)
    ending = _ending(options, streaming)
    _check_selected(starting, "starting offsets", selection)
    _check_selected(ending, "ending offsets", selection)
    min_per_trigger = _aliased_int(options, "minmessagespertrigger", "minoffsetspertrigger")
    if min_per_trigger is None and options.get("maxtriggerdelay", "").strip():
        raise BasculeSparkError("maxTriggerDelay bounds the wait for minOffsetsPerTrigger, which is not set")
    return ReadOptions(
        brokers=brokers,
        selection=selection,
        starting=starting,
        ending=ending,
        timestamp_strategy=_choice(options, "startingoffsetsbytimestampstrategy", TIMESTAMP_STRATEGIES, "error"),
        max_messages_per_trigger=_aliased_int(options, "maxmessagespertrigger", "maxoffsetspertrigger"),
        min_messages_per_trigger=min_per_trigger,
        max_trigger_delay_ms=_duration_ms(options, "maxtriggerdelay", DEFAULT_MAX_TRIGGER_DELAY_MS),
        min_partitions=_int(options, "minpartitions", None, 1),
        max_records_per_partition=_int(options, "maxrecordsperpartition", None, 1),
        fail_on_data_loss=_bool(options, "failondataloss", True),
        read_isr_replica=_bool(options, "readisrreplica", False),
        poll_timeout_ms=_int(options, "polltimeoutms", 120_000, 1),
        request_timeout_ms=_int(options, "requesttimeoutms", 30_000, 1),
        max_batch_rows=_int(options, "maxbatchrows", 10_000, 1),
        include_headers=includes_headers(options),
        tls=_tls(options),
    )


def includes_headers(raw: Mapping[str, str]) -> bool:
    """Whether a read has the `headers` column: Kafka's `includeHeaders`, but true unless set."""
    return _bool(_lower(raw), "includeheaders", True)


def _refuse_streaming_only(options: Mapping[str, str]) -> None:
    for name in sorted(STREAMING_ONLY):
        if options.get(name, "").strip():
            raise BasculeSparkError(f"{CANONICAL[name]} is for streaming queries only; a batch query reads its range")


def _starting(options: Mapping[str, str], streaming: bool) -> OffsetSpec:
    if options.get("startingtimestamp", "").strip():
        return _at_time(options, "startingtimestamp")
    if options.get("startingoffsetsbytimestamp", "").strip():
        return parse_timestamps_spec("startingOffsetsByTimestamp", options["startingoffsetsbytimestamp"])
    if options.get("startingoffsets", "").strip():
        # As in Spark's Kafka source: a batch query cannot start at latest.
        return parse_offset_spec("startingOffsets", options["startingoffsets"], allow_latest=streaming)
    return OffsetSpec("latest" if streaming else "earliest")


def _ending(options: Mapping[str, str], streaming: bool) -> OffsetSpec:
    given = [n for n in ("endingoffsets", "endingtimestamp", "endingoffsetsbytimestamp") if options.get(n, "").strip()]
    if streaming and given:
        raise BasculeSparkError(f"{CANONICAL[given[0]]} is for batch queries only; a streaming query has no end")
    if options.get("endingtimestamp", "").strip():
        return _at_time(options, "endingtimestamp")
    if options.get("endingoffsetsbytimestamp", "").strip():
        return parse_timestamps_spec("endingOffsetsByTimestamp", options["endingoffsetsbytimestamp"])
    if options.get("endingoffsets", "").strip():
        return parse_offset_spec("endingOffsets", options["endingoffsets"], allow_earliest=False)
    return OffsetSpec("latest")


def _at_time(options: Mapping[str, str], name: str) -> OffsetSpec:
    text = options[name].strip()
    if not text.isdigit():
        raise BasculeSparkError(f"{CANONICAL[name]} must be milliseconds since the epoch, got {text!r}")
    return OffsetSpec("timestamp", timestamp_ms=int(text))


def _check_selected(spec: OffsetSpec, name: str, selection: Selection) -> None:
    """Streams and partitions a spec names must be ones the selection reads."""
    for stream in spec.streams:
        if selection.assign is not None and stream in selection.assign:
            missing = set(spec.offsets[stream]) - set(selection.assign[stream])
            if missing:
                raise BasculeSparkError(
                    f"{name} name partitions {sorted(missing)} of {stream!r}, which assign does not"
                )
        elif not selection.matches(stream):
            raise BasculeSparkError(f"{name} name stream {stream!r}, which {selection.describe()} does not select")


# ---- write options -------------------------------------------------------------------------------


@dataclass(frozen=True)
class WriteOptions:
    brokers: tuple[str, ...]
    stream: str | None
    ack_policy: str = "all"
    partitioner: str = "key"
    write_batch_size: int = 1000
    message_ids: bool = True  # each row's id, so that a retry's copy is stored once (`ids`)
    request_timeout_ms: int = 30_000
    tls: TlsFiles | None = None

    @property
    def request_timeout(self) -> float:
        return self.request_timeout_ms / 1000


def parse_write_options(raw: Mapping[str, str]) -> WriteOptions:
    options = _lower(raw)
    _check_names(options, WRITE_OPTIONS, READ_OPTIONS, "reads")
    stream = options.get("stream", "").strip() or None
    if stream is not None and "," in stream:
        raise BasculeSparkError(f"the sink writes to one stream per row; 'stream' names several: {stream!r}")
    return WriteOptions(
        brokers=_brokers(options),
        stream=stream,
        ack_policy=_choice(options, "ackpolicy", ACK_POLICY_NAMES, "all"),
        partitioner=_choice(options, "partitioner", PARTITIONERS, "key"),
        write_batch_size=_int(options, "writebatchsize", 1000, 1),
        message_ids=_bool(options, "messageids", True),
        request_timeout_ms=_int(options, "requesttimeoutms", 30_000, 1),
        tls=_tls(options),
    )
