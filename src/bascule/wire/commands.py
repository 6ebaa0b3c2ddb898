"""Metadata Raft commands: a frozen dataclass per command, journaled as a msgpack map of its ``op``
and fields.

Commands are the only thing the Raft journal holds, so every field is checked in full (type,
range, names, subjects, groups, settings) on both sides: a proposer cannot journal a malformed
command, and a command that reaches the journal anyway (another version, a forged proposal) is
refused the same way on every node instead of raising inside the state machine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import msgpack

from bascule.wire.names import (
    MAX_GROUP_STREAMS,
    MAX_PARTITIONS,
    MAX_REPLICATION_FACTOR,
    RESERVED_STREAMS,
    broker_id_error,
    consumer_group_id_error,
    consumer_id_error,
    group_error,
    stream_name_error,
    subject_error,
)
from bascule.wire.settings import settings_error

_MAX_INT64 = (1 << 63) - 1

# A field's check: None when the value is acceptable, else why not.
Check = Callable[[Any], "str | None"]


def _integer(lowest: int, highest: int) -> Check:
    def check(value: Any) -> str | None:
        if not isinstance(value, int) or isinstance(value, bool):
            return f"expected int, got {value!r}"
        return None if lowest <= value <= highest else f"{value} is out of range [{lowest}, {highest}]"

    return check


def _boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else f"expected bool, got {value!r}"


def _string(rule: Callable[[str], str | None]) -> Check:
    def check(value: Any) -> str | None:
        return rule(value) if isinstance(value, str) else f"expected str, got {value!r}"

    return check


def _any_string(value: str) -> str | None:
    return None if len(value) <= 4096 else "longer than 4096 characters"


def _list_of(item: Check, most: int, distinct: bool = False) -> Check:
    def check(value: Any) -> str | None:
        if not isinstance(value, list):
            return f"expected list, got {value!r}"
        if len(value) > most:
            return f"more than {most} items"
        for element in value:
            problem = item(element)
            if problem:
                return f"item {element!r}: {problem}"
        if distinct and len(set(value)) != len(value):
            return "items repeat"
        return None

    return check


def _stream_name(name: str) -> str | None:
    # Names journaled by any version (the reserved internal streams included) keep applying.
    return None if name in RESERVED_STREAMS else stream_name_error(name)


_NAME = _string(_stream_name)
_BROKER = _string(broker_id_error)
_PARTITION = _integer(0, MAX_PARTITIONS - 1)
_EPOCH = _integer(0, _MAX_INT64)
_TIMESTAMP = _integer(0, _MAX_INT64)
_ISR = _list_of(_BROKER, MAX_REPLICATION_FACTOR, distinct=True)
_GROUP_ID = _string(consumer_group_id_error)
_CONSUMER_ID = _string(consumer_id_error)


def _group_streams(value: Any) -> str | None:
    problem = _list_of(_NAME, MAX_GROUP_STREAMS, distinct=True)(value)
    return problem if problem or value else "No streams provided"


_GROUP_MEMBER = {"group": _GROUP_ID, "consumer": _CONSUMER_ID}
_REPLICAS = _list_of(_list_of(_BROKER, MAX_REPLICATION_FACTOR, distinct=True), MAX_PARTITIONS)


def _replica_sets(value: Any) -> str | None:
    problem = _REPLICAS(value)
    if problem is None and (not value or not all(value)):
        problem = "every partition needs at least one replica"
    return problem


def _record(schema: dict[str, Check]) -> Check:
    """A map with exactly ``schema``'s fields, each passing its check."""

    def check(value: Any) -> str | None:
        if not isinstance(value, dict):
            return f"expected map, got {value!r}"
        for field, field_check in schema.items():
            if field not in value:
                return f"{field}: missing"
            problem = field_check(value[field])
            if problem:
                return f"{field}: {problem}"
        extra = set(value) - set(schema)
        return f"unexpected fields {sorted(map(str, extra))}" if extra else None

    return check


# The most items one batched command or request carries (a node's reports, the metadata leader's
# elections): a batch of more is sent as several. Far below what fills a NATS message
# (1 MiB by default) for the longest names (items of under 600 bytes); the senders also cut
# batches at the transport's max_payload.
MAX_BATCH_ITEMS = 1024


def _batch_of(item: Check, key: tuple[str, ...]) -> Check:
    """A non-empty list of at most MAX_BATCH_ITEMS ``item``s, no two with the same ``key`` fields
    (one partition once)."""
    items = _list_of(item, MAX_BATCH_ITEMS)

    def check(value: Any) -> str | None:
        problem = items(value)
        if problem:
            return problem
        if not value:
            return "no items"
        keys = [tuple(element[k] for k in key) for element in value]
        return "partitions repeat" if len(set(keys)) != len(keys) else None

    return check


_CHECK = "check"
_OPTIONAL = "optional"


def _required(check: Check) -> Any:
    return dataclasses.field(metadata={_CHECK: check})


def _optional(check: Check) -> Any:
    """A field that journals written before it existed lack: None when absent, and then left out of
    the encoding, so that an old command encodes again as it was journaled."""
    return dataclasses.field(default=None, metadata={_CHECK: check, _OPTIONAL: True})


# One class per command. Fields are in the order the proposers have always put them, so that a
# command encodes to the bytes earlier versions journaled.
@dataclass(frozen=True, kw_only=True)
class RegisterBroker:
    OP: ClassVar[str] = "register_broker"
    id: str = _required(_BROKER)
    host: str = _required(_string(_any_string))
    port: int = _required(_integer(0, 65535))
    raft: str = _required(_string(_any_string))
    incarnation: str | None = _optional(_string(_any_string))
    unclean: bool | None = _optional(_boolean)


@dataclass(frozen=True, kw_only=True)
class CreateStream:
    OP: ClassVar[str] = "create_stream"
    name: str = _required(_NAME)
    subject: str = _required(_string(subject_error))
    group: str = _required(_string(group_error))
    created: int = _required(_TIMESTAMP)
    settings: dict[str, Any] = _required(settings_error)
    replicas: list[list[str]] = _required(_replica_sets)


@dataclass(frozen=True, kw_only=True)
class DeleteStream:
    OP: ClassVar[str] = "delete_stream"
    name: str = _required(_NAME)


@dataclass(frozen=True, kw_only=True)
class Pause:
    OP: ClassVar[str] = "pause"
    name: str = _required(_NAME)
    partitions: list[int] = _required(_list_of(_PARTITION, MAX_PARTITIONS))
    resume_all: bool = _required(_boolean)
    at: int = _required(_TIMESTAMP)


@dataclass(frozen=True, kw_only=True)
class Resume:
    OP: ClassVar[str] = "resume"
    name: str = _required(_NAME)
    partition: int = _required(_PARTITION)


@dataclass(frozen=True, kw_only=True)
class SetReadonly:
    OP: ClassVar[str] = "set_readonly"
    name: str = _required(_NAME)
    partitions: list[int] = _required(_list_of(_PARTITION, MAX_PARTITIONS))
    readonly: bool = _required(_boolean)
    at: int = _required(_TIMESTAMP)


@dataclass(frozen=True, kw_only=True)
class ChangeLeader:
    OP: ClassVar[str] = "change_leader"
    name: str = _required(_NAME)
    partition: int = _required(_PARTITION)
    leader: str = _required(_BROKER)
    leader_epoch: int = _required(_EPOCH)
    epoch: int | None = _optional(_EPOCH)
    isr: list[str] = _required(_ISR)


# A ChangeLeader's fields, every one required (no journal has a batch without partition epochs).
_LEADER_CHANGE = {
    "name": _NAME, "partition": _PARTITION, "leader": _BROKER, "leader_epoch": _EPOCH, "epoch": _EPOCH, "isr": _ISR,
}


@dataclass(frozen=True, kw_only=True)
class ChangeLeaders:
    """Several elections in one command (a failed node's partitions): each item has a ChangeLeader's
    fields and applies on exactly its conditions; an item whose conditions no longer hold is a no-op,
    the others apply."""

    OP: ClassVar[str] = "change_leaders"
    items: list[dict[str, Any]] = _required(_batch_of(_record(_LEADER_CHANGE), ("name", "partition")))

    def changes(self) -> list[ChangeLeader]:
        return [ChangeLeader(**item) for item in self.items]


@dataclass(frozen=True, kw_only=True)
class ChangeIsr:
    OP: ClassVar[str] = "change_isr"
    name: str = _required(_NAME)
    partition: int = _required(_PARTITION)
    replica: str = _required(_BROKER)
    add: bool = _required(_boolean)
    leader: str = _required(_BROKER)
    leader_epoch: int = _required(_EPOCH)
    epoch: int | None = _optional(_EPOCH)


# A ChangeIsr's fields, every one required (no journal has a batch without partition epochs).
_ISR_CHANGE = {
    "name": _NAME, "partition": _PARTITION, "replica": _BROKER, "add": _boolean, "leader": _BROKER,
    "leader_epoch": _EPOCH, "epoch": _EPOCH,
}


@dataclass(frozen=True, kw_only=True)
class ChangeIsrs:
    """Several ISR changes in one command (a leader's, of its partitions): each item has a ChangeIsr's
    fields and applies on exactly its conditions; an item refused changes nothing, the others apply,
    and the command's result names the refused items (``metadata.state.ITEMS_REFUSED``)."""

    OP: ClassVar[str] = "change_isrs"
    items: list[dict[str, Any]] = _required(_batch_of(_record(_ISR_CHANGE), ("name", "partition", "replica")))

    def changes(self) -> list[ChangeIsr]:
        return [ChangeIsr(**item) for item in self.items]


@dataclass(frozen=True, kw_only=True)
class ActivityPublished:
    OP: ClassVar[str] = "activity_published"
    id: int = _required(_integer(0, _MAX_INT64))


@dataclass(frozen=True, kw_only=True)
class MarkUnclean:
    OP: ClassVar[str] = "mark_unclean"
    name: str = _required(_NAME)
    partition: int = _required(_PARTITION)
    replica: str = _required(_BROKER)


@dataclass(frozen=True, kw_only=True)
class JoinConsumerGroup:
    OP: ClassVar[str] = "join_consumer_group"
    group: str = _required(_GROUP_ID)
    consumer: str = _required(_CONSUMER_ID)
    streams: list[str] = _required(_group_streams)
    # The metadata leader's choice, used when the join creates the group.
    coordinator: str = _required(_BROKER)


@dataclass(frozen=True, kw_only=True)
class LeaveConsumerGroup:
    OP: ClassVar[str] = "leave_consumer_group"
    group: str = _required(_GROUP_ID)
    consumer: str = _required(_CONSUMER_ID)
    expired: bool = _required(_boolean)


@dataclass(frozen=True, kw_only=True)
class ChangeGroupCoordinator:
    OP: ClassVar[str] = "change_group_coordinator"
    group: str = _required(_GROUP_ID)
    coordinator: str = _required(_BROKER)
    previous: str = _required(_BROKER)
    epoch: int = _required(_EPOCH)


Command = (
    RegisterBroker | CreateStream | DeleteStream | Pause | Resume | SetReadonly | ChangeLeader | ChangeIsr
    | ActivityPublished | MarkUnclean | JoinConsumerGroup | LeaveConsumerGroup | ChangeGroupCoordinator
    | ChangeLeaders | ChangeIsrs
)

COMMANDS: dict[str, type[Command]] = {
    kind.OP: kind for kind in (
        RegisterBroker, CreateStream, DeleteStream, Pause, Resume, SetReadonly, ChangeLeader, ChangeIsr,
        ActivityPublished, MarkUnclean, JoinConsumerGroup, LeaveConsumerGroup, ChangeGroupCoordinator,
        ChangeLeaders, ChangeIsrs,
    )
}


def _checks(kind: type[Command], optional: bool) -> dict[str, Check]:
    return {
        f.name: f.metadata[_CHECK] for f in dataclasses.fields(kind) if f.metadata.get(_OPTIONAL, False) == optional
    }


# op -> {field: check} of the fields every command has, and of those it may lack.
SCHEMAS: dict[str, dict[str, Check]] = {op: _checks(kind, optional=False) for op, kind in COMMANDS.items()}
OPTIONAL: dict[str, dict[str, Check]] = {op: _checks(kind, optional=True) for op, kind in COMMANDS.items()}


_POSITION = {"last_epoch": _integer(-1, _MAX_INT64), "log_end_offset": _integer(0, _MAX_INT64)}

_REPORT_LEADER = {
    "stream": _NAME, "partition": _PARTITION, "leader": _BROKER, "leader_epoch": _EPOCH, "reporter": _BROKER,
}
_LEADER_RETURNED = {
    "stream": _NAME, "partition": _PARTITION, "leader": _BROKER, "leader_epoch": _EPOCH, **_POSITION,
}

# Requests that the metadata leader decides on before it proposes a command (forwarded over
# NATS by other nodes): request -> {argument: check}, every argument required. The plural ones
# are a node's batches (bascule.node.reports): items of the singular one, one partition once.
REQUESTS: dict[str, dict[str, Check]] = {
    "create_stream": {
        "name": _NAME,  # the nodes create the internal streams this way; the API refuses them to users
        "subject": _string(subject_error),
        "group": _string(group_error),
        "replication_factor": _integer(-1, MAX_REPLICATION_FACTOR),
        "partitions": _integer(0, MAX_PARTITIONS),
        "settings": settings_error,
    },
    "report_leader": _REPORT_LEADER,
    "report_leaders": {"items": _batch_of(_record(_REPORT_LEADER), ("stream", "partition"))},
    "leader_returned": _LEADER_RETURNED,
    "leaders_returned": {"items": _batch_of(_record(_LEADER_RETURNED), ("stream", "partition"))},
    # A leader's ISR changes, proposed as one ChangeIsrs command; each item has its own outcome.
    "change_isrs": {"items": _batch_of(_record(_ISR_CHANGE), ("name", "partition", "replica"))},
    "join_consumer_group": {**_GROUP_MEMBER, "streams": _group_streams},
    "report_group_coordinator": {**_GROUP_MEMBER, "coordinator": _BROKER, "epoch": _EPOCH},
}


class CommandError(ValueError):
    """A command that does not match its schema."""


def encode_command(command: Command) -> bytes:
    """The command's msgpack map: its ``op``, then its fields in order, absent optional ones left out."""
    fields_given = {f.name: getattr(command, f.name) for f in dataclasses.fields(command)}
    wire = {"op": command.OP, **{name: value for name, value in fields_given.items() if value is not None}}
    validate(wire)
    return msgpack.packb(wire, use_bin_type=True)


def decode_command(data: bytes) -> Command:
    try:
        wire = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise CommandError(f"undecodable command: {exc}") from exc
    return command_from_map(wire)


def command_from_map(wire: Any) -> Command:
    """The typed command of a wire map (``op`` and fields), checked in full."""
    validate(wire)
    return COMMANDS[wire["op"]](**{name: value for name, value in wire.items() if name != "op"})


def validate(command: Any) -> None:
    if not isinstance(command, dict):
        raise CommandError(f"command must be a map, got {type(command).__name__}")
    op = command.get("op")
    if not isinstance(op, str) or (schema := SCHEMAS.get(op)) is None:
        raise CommandError(f"unknown command op {op!r}")
    _check_fields(op, command, schema, OPTIONAL[op])


def validate_request(op: Any, args: Any) -> None:
    """Check a request for the metadata leader: one of REQUESTS, or a command proposed as it is."""
    if not isinstance(args, dict):
        raise CommandError(f"request arguments must be a map, got {type(args).__name__}")
    schema = REQUESTS.get(op) if isinstance(op, str) else None
    if schema is None:
        validate({**args, "op": op})
        return
    _check_fields(op, args, schema, {})


def _check_fields(op: str, fields: dict[Any, Any], schema: dict[str, Check], optional: dict[str, Check]) -> None:
    for field, check in [*schema.items(), *((f, c) for f, c in optional.items() if f in fields)]:
        if field not in fields:
            raise CommandError(f"{op}.{field}: missing")
        problem = check(fields[field])
        if problem:
            raise CommandError(f"{op}.{field}: {problem}")
    extra = set(fields) - set(schema) - set(optional) - {"op"}
    if extra:
        raise CommandError(f"{op}: unexpected fields {sorted(map(str, extra))}")
