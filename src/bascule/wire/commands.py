"""Metadata Raft commands: msgpack maps with an ``op`` and typed fields.

Commands are the only thing the Raft journal holds, so the schema is checked on
both sides: a proposer cannot journal a malformed command, and a node replaying
a journal written by another version fails loudly instead of applying garbage.
"""

from __future__ import annotations

from typing import Any

import msgpack

_INT = (int,)
_STR = (str,)
_BOOL = (bool,)
_LIST = (list,)
_MAP = (dict,)

# op -> {field: accepted types}; every field is required.
SCHEMAS: dict[str, dict[str, tuple[type, ...]]] = {
    "register_broker": {"id": _STR, "host": _STR, "port": _INT, "raft": _STR},
    "create_stream": {
        "name": _STR,
        "subject": _STR,
        "group": _STR,
        "created": _INT,
        "settings": _MAP,
        "replicas": _LIST,
    },
    "delete_stream": {"name": _STR},
    "pause": {"name": _STR, "partitions": _LIST, "resume_all": _BOOL, "at": _INT},
    "resume": {"name": _STR, "partition": _INT},
    "set_readonly": {"name": _STR, "partitions": _LIST, "readonly": _BOOL, "at": _INT},
    "change_leader": {
        "name": _STR,
        "partition": _INT,
        "leader": _STR,
        "leader_epoch": _INT,
        "isr": _LIST,
    },
    "change_isr": {
        "name": _STR,
        "partition": _INT,
        "replica": _STR,
        "add": _BOOL,
        "leader": _STR,
        "leader_epoch": _INT,
    },
}


# op -> {field: accepted types} of fields that may be absent (journals written before they existed).
OPTIONAL: dict[str, dict[str, tuple[type, ...]]] = {
    "register_broker": {"incarnation": _STR},
    "change_leader": {"epoch": _INT},
    "change_isr": {"epoch": _INT},
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
    schema = SCHEMAS.get(op) if isinstance(op, str) else None
    if schema is None:
        raise CommandError(f"unknown command op {op!r}")
    optional = OPTIONAL.get(op, {})
    for field, types in [*schema.items(), *((f, t) for f, t in optional.items() if f in command)]:
        value = command.get(field)
        if not isinstance(value, types) or (types is _INT and isinstance(value, bool)):
            raise CommandError(f"{op}.{field}: expected {types[0].__name__}, got {value!r}")
    extra = set(command) - set(schema) - set(optional) - {"op"}
    if extra:
        raise CommandError(f"{op}: unexpected fields {sorted(extra)}")
