"""Validation of the names users choose: streams (also directory names), NATS subjects and queue
groups, broker ids; and the limits of what one stream may ask for. Every entry point (gRPC, the
NATS subjects, the Raft commands, config) checks with these same rules."""

from __future__ import annotations

import re
from urllib.parse import quote

ACTIVITY_STREAM = "__activity"
CURSORS_STREAM = "__cursors"
RESERVED_STREAMS = frozenset({ACTIVITY_STREAM, CURSORS_STREAM})

_STREAM_NAME = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9_\-.]{0,248}")
_SUBJECT_SPECIALS = frozenset(".*>")

MAX_SUBJECT_LENGTH = 1024
MAX_GROUP_LENGTH = 255
MAX_BROKER_ID_LENGTH = 255
MAX_CONSUMER_ID_LENGTH = 255  # consumer group and consumer ids
MAX_GROUP_STREAMS = 1024  # streams one consumer of a group subscribes to
# Per stream: its CreateStream is one Raft entry (a few hundred KiB at this size) and one placement.
# What partitions cost at rest and in a failover does not depend on how they are grouped into
# streams (benchmarks/partitions.py); a stream of 4,096 RF=3 partitions has its full ISR on 3
# nodes in about 6 s.
MAX_PARTITIONS = 4096
MAX_REPLICATION_FACTOR = 64

INVALID_SUBJECT = "Subject is invalid"  # Liftbridge's words for any subject it refuses


def is_protocol_token(value: str) -> bool:
    """Whether ``value`` can go verbatim into a NATS protocol line (SUB, PUB): not empty, no
    whitespace or control characters (a CR or LF would end the line and start a command of the
    value's choosing, a space would shift the arguments)."""
    return bool(value) and value.isprintable() and " " not in value


def stream_name_error(name: str) -> str | None:
    """Why ``name`` cannot name a stream, or None when it can."""
    if not name:
        return "Name cannot be empty"  # Liftbridge's words, as the reserved and subject errors below
    if name in RESERVED_STREAMS:
        return "Stream is reserved"
    # Stream names become directory names and NATS subject tokens, so no separators or traversal.
    if not _STREAM_NAME.fullmatch(name) or ".." in name or name.endswith("."):
        return f"Invalid stream name {name!r}: use letters, digits, '_', '-' and '.'"
    return None


def subject_error(subject: str) -> str | None:
    """Why ``subject`` is not a NATS subject a stream can listen on, or None."""
    if not subject:
        return INVALID_SUBJECT
    if len(subject) > MAX_SUBJECT_LENGTH:
        return f"{INVALID_SUBJECT}: longer than {MAX_SUBJECT_LENGTH} characters"
    tokens = subject.split(".")
    for index, token in enumerate(tokens):
        if token == "*" or (token == ">" and index == len(tokens) - 1):
            continue
        if not is_protocol_token(token) or _SUBJECT_SPECIALS.intersection(token):
            return INVALID_SUBJECT
    return None


def publish_subject_error(subject: str) -> str | None:
    """Why a message cannot be published to ``subject`` (no wildcards there), or None."""
    problem = subject_error(subject)
    if problem is None and any(token in ("*", ">") for token in subject.split(".")):
        problem = f"Cannot publish to wildcard subject {subject!r}"
    return problem


def group_error(group: str) -> str | None:
    """Why ``group`` cannot be a NATS queue group, or None (empty means no group)."""
    if len(group) > MAX_GROUP_LENGTH:
        return f"Group longer than {MAX_GROUP_LENGTH} characters"
    if group and not is_protocol_token(group):
        return f"Invalid group {group!r}: no whitespace or control characters"
    return None


def consumer_group_id_error(group_id: str) -> str | None:
    """Why ``group_id`` cannot name a consumer group, or None."""
    return _consumer_id_error(group_id, "groupId")


def consumer_id_error(consumer_id: str) -> str | None:
    """Why ``consumer_id`` cannot name a consumer of a group, or None."""
    return _consumer_id_error(consumer_id, "consumerId")


def _consumer_id_error(value: str, what: str) -> str | None:
    if not value:
        return f"No {what} provided"  # Liftbridge's words
    # Kept in the metadata, logged and shown to clients: bounded, and no control characters.
    if len(value) > MAX_CONSUMER_ID_LENGTH:
        return f"{what} longer than {MAX_CONSUMER_ID_LENGTH} characters"
    if not value.isprintable():
        return f"Invalid {what} {value!r}: no control characters"
    return None


def broker_id_error(broker_id: str) -> str | None:
    """Why ``broker_id`` cannot name a broker (it becomes a NATS subject token), or None."""
    if not broker_id or len(broker_id) > MAX_BROKER_ID_LENGTH:
        return f"Broker id must have 1 to {MAX_BROKER_ID_LENGTH} characters"
    if not is_protocol_token(broker_id) or _SUBJECT_SPECIALS.intersection(broker_id):
        return f"Invalid broker id {broker_id!r}: no whitespace, control characters, '.', '*' or '>'"
    return None


def subject_matches(pattern: str, subject: str) -> bool:
    """Whether a NATS subscription to ``pattern`` (``*`` one token, a last ``>`` one or more)
    gets a message published to ``subject``."""
    wanted, tokens = pattern.split("."), subject.split(".")
    for index, token in enumerate(wanted):
        if token == ">":
            return len(tokens) > index
        if index >= len(tokens) or token not in ("*", tokens[index]):
            return False
    return len(wanted) == len(tokens)


def partition_subject(subject: str, partition: int) -> str:
    return subject if partition == 0 else f"{subject}.{partition}"


def directory_name(name: str) -> str:
    """``name`` as one safe directory name: whatever reached the metadata, it never names a
    path outside its parent (no separators, no "." or "..", no control characters)."""
    quoted = quote(name, safe="-_")
    return "%2E" + quoted[1:] if quoted.startswith(".") else quoted or "%00"
