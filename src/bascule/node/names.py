"""Validation of the names users choose: streams (also directory names) and NATS subjects."""

from __future__ import annotations

import re
from urllib.parse import quote

RESERVED_STREAMS = frozenset({"__activity", "__cursors"})
CURSORS_STREAM = "__cursors"

_STREAM_NAME = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9_\-.]{0,248}")
_SUBJECT_TOKEN = re.compile(r"[^\s.*>]+")


def stream_name_error(name: str) -> str | None:
    """Why ``name`` cannot name a stream, or None when it can."""
    if not name:
        return "No stream name provided"
    if name in RESERVED_STREAMS:
        return f"Stream name {name!r} is reserved"
    # Stream names become directory names and NATS subject tokens, so no separators or traversal.
    if not _STREAM_NAME.fullmatch(name) or ".." in name or name.endswith("."):
        return f"Invalid stream name {name!r}: use letters, digits, '_', '-' and '.'"
    return None


def subject_error(subject: str) -> str | None:
    """Why ``subject`` is not a NATS subject a stream can listen on, or None."""
    if not subject:
        return "No subject provided"
    tokens = subject.split(".")
    for index, token in enumerate(tokens):
        if token == "*" or (token == ">" and index == len(tokens) - 1):
            continue
        if not _SUBJECT_TOKEN.fullmatch(token):
            return f"Invalid subject {subject!r}"
    return None


def partition_subject(subject: str, partition: int) -> str:
    return subject if partition == 0 else f"{subject}.{partition}"


def directory_name(name: str) -> str:
    """``name`` as one safe directory name: whatever reached the metadata, it never names a
    path outside its parent (no separators, no "." or "..", no control characters)."""
    quoted = quote(name, safe="-_")
    return "%2E" + quoted[1:] if quoted.startswith(".") else quoted or "%00"
