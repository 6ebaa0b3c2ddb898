"""Metadata Raft commands: msgpack maps with an ``op`` and typed fields.

Commands are the only thing the Raft journal holds, so every field is checked in full (type,
range, names, subjects, groups, settings) on both sides: a proposer cannot journal a malformed
command, and a command that reaches the journal anyway (another version, a forged proposal) is
refused the same way on every node instead of raising inside the state machine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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


# op -> {field: check}; every field is required.
SCHEMAS: dict[str, dict[str, Check]] = {
    "register_broker": {
        "id": _BROKER, "host": _string(_any_string), "port": _integer(0, 65535), "raft": _string(_any_string),
    },
    "create_stream": {
        "name": _NAME,
        "subject": _string(subject_error),
        "group": _string(group_error),
        "created": _TIMESTAMP,
        "settings": settings_error,
        "replicas": _replica_sets,
    },
    "delete_stream": {"name": _NAME},
    "pause": {"name": _NAME, "partitions": _list_of(_PARTITION, MAX_PARTITIONS), "resume_all": _boolean,
              "at": _TIMESTAMP},
    "resume": {"name": _NAME, "partition": _PARTITION},
    "set_readonly": {"name": _NAME, "partitions": _list_of(_PARTITION, MAX_PARTITIONS), "readonly": _boolean,
                     "at": _TIMESTAMP},
    "change_leader": {"name": _NAME, "partition": _PARTITION, "leader": _BROKER, "leader_epoch": _EPOCH,
                      "isr": _ISR},
    "change_isr": {"name": _NAME, "partition": _PARTITION, "replica": _BROKER, "add": _boolean,
                   "leader": _BROKER, "leader_epoch": _EPOCH},
    "activity_published": {"id": _integer(0, _MAX_INT64)},
    "mark_unclean": {"name": _NAME, "partition": _PARTITION, "replica": _BROKER},
    # The coordinator is the metadata leader's choice, used when the join creates the group.
    "join_consumer_group": {**_GROUP_MEMBER, "streams": _group_streams, "coordinator": _BROKER},
    "leave_consumer_group": {**_GROUP_MEMBER, "expired": _boolean},
    "change_group_coordinator": {"group": _GROUP_ID, "coordinator": _BROKER, "previous": _BROKER, "epoch": _EPOCH},
}


# op -> {field: check} of fields that may be absent (journals written before they existed).
OPTIONAL: dict[str, dict[str, Check]] = {
    "register_broker": {"incarnation": _string(_any_string), "unclean": _boolean},
    "change_leader": {"epoch": _EPOCH},
    "change_isr": {"epoch": _EPOCH},
}


_POSITION = {"last_epoch": _integer(-1, _MAX_INT64), "log_end_offset": _integer(0, _MAX_INT64)}

# Requests that the metadata leader decides on before it proposes a command (forwarded over
# NATS by other nodes): request -> {argument: check}, every argument required.
REQUESTS: dict[str, dict[str, Check]] = {
    "create_stream": {
        "name": _NAME,  # the nodes create the internal streams this way; the API refuses them to users
        "subject": _string(subject_error),
        "group": _string(group_error),
        "replication_factor": _integer(-1, MAX_REPLICATION_FACTOR),
        "partitions": _integer(0, MAX_PARTITIONS),
        "settings": settings_error,
    },
    "report_leader": {
        "stream": _NAME, "partition": _PARTITION, "leader": _BROKER, "leader_epoch": _EPOCH,
        "reporter": _BROKER, **_POSITION,
    },
    "leader_returned": {
        "stream": _NAME, "partition": _PARTITION, "leader": _BROKER, "leader_epoch": _EPOCH, **_POSITION,
    },
    "join_consumer_group": {**_GROUP_MEMBER, "streams": _group_streams},
    "report_group_coordinator": {**_GROUP_MEMBER, "coordinator": _BROKER, "epoch": _EPOCH},
}


class CommandError(ValueError):
    """A command that does not match its schema."""


def encode_command(op: str, **fields: Any) -> bytes:
    command = {"op": op, **fields}
    validate(command)
    return msgpack.packb(command, use_bin_type=True)


def decode_command(data: bytes) -> dict[str, Any]:
    try:
        command = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise CommandError(f"undecodable command: {exc}") from exc
    validate(command)
    return command


def validate(command: Any) -> None:
    if not isinstance(command, dict):
        raise CommandError(f"command must be a map, got {type(command).__name__}")
    op = command.get("op")
    if not isinstance(op, str) or (schema := SCHEMAS.get(op)) is None:
        raise CommandError(f"unknown command op {op!r}")
    _check_fields(op, command, schema, OPTIONAL.get(op, {}))


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
