"""Liftbridge's encryption at rest: message values sealed by the leader as it appends them, opened
for readers; keys and headers stay as they are (compaction reads the keys).

A sealed value, as Liftbridge lays it out: one byte giving the length N of the wrapped data key, the
data key wrapped under the master key (AES key wrap with padding, RFC 5649: N is 40 for the 32-byte
data key), a 12-byte nonce, then the value under AES-256-GCM with its 16-byte tag. Each replica makes
its own random data key when it first seals something, so a value carries everything but the master
key that opens it: followers store what the leader wrote, and any node with the same master key reads
what any other wrote.

Sans I/O: values, entries and the environment's key in, values and entries out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from bascule.wire.entry import CorruptEntry, EntryWalk, Record, decode_entries, encode_entries, scan, stored_prefix
from bascule.wire.names import RESERVED_STREAMS

SETTING = "encryption"  # the stream setting (wire.settings), recorded when the stream is created
# Liftbridge's variable, and bascule's, which wins when both are set.
KEY_VARIABLES = (b"BASCULE_ENCRYPTION_KEY", b"LIFTBRIDGE_ENCRYPTION_KEY")
KEY_LENGTHS = (16, 24, 32)
DATA_KEY_LENGTH = 32
NONCE_LENGTH = 12
TAG_LENGTH = 16


class EncryptionUnavailable(Exception):
    """An encrypted stream's partition on a node without a valid master key: it can store and
    replicate what others sealed, but neither seal nor open a value."""


class DecryptionFailed(Exception):
    """A stored value that does not open: sealed under another master key, damaged or forged."""


class InvalidMasterKey(ValueError):
    pass


def check_master_key(key: bytes) -> None:
    if len(key) not in KEY_LENGTHS:
        raise InvalidMasterKey(f"the master key must be 16, 24 or 32 bytes, got {len(key)}")


class MasterKey:
    """This node's master key, from the environment, or why it has none. The key never shows in a repr."""

    def __init__(self, key: bytes | None, problem: str | None = None) -> None:
        self._key = key
        self.problem = problem if key is None else None

    @classmethod
    def from_environment(cls, environ: Mapping[bytes, bytes]) -> MasterKey:
        """``BASCULE_ENCRYPTION_KEY`` when set and not empty, else ``LIFTBRIDGE_ENCRYPTION_KEY``: its raw
        bytes (as Liftbridge takes them), which must be an AES key's length."""
        for name in KEY_VARIABLES:
            key = environ.get(name)
            if key:
                try:
                    check_master_key(key)
                except InvalidMasterKey as exc:
                    return cls(None, f"{name.decode()}: {exc}")
                return cls(key)
        return cls(None, f"{KEY_VARIABLES[1].decode()} is not set")

    def values(self) -> Values:
        """A cipher for one replica's values (each replica its own data key)."""
        if self._key is None:
            return Keyless(self.problem or "no master key")
        # Imported here: cryptography (6.7 MiB resident, 15-25 ms to import) only on a node that seals.
        from bascule.partition.value_cipher import ValueCipher

        return ValueCipher(self._key)

    def __repr__(self) -> str:
        return "MasterKey(set)" if self._key is not None else f"MasterKey(missing: {self.problem})"


def precondition_failure(problem: str) -> str:
    """CreateStream's refusal of an encrypted stream on a node without a valid key, in Liftbridge's words."""
    return f"Failed on preconditions for stream's encryption handler: {problem}"


def stream_encrypted(stream: str, settings: Mapping[str, Any]) -> bool:
    """Whether a stream's values are sealed: as recorded when it was created (``encryption``), never
    for the server's internal streams."""
    return stream not in RESERVED_STREAMS and settings.get(SETTING) is True


class Keyless:
    """The values of an encrypted stream's partition on a node without a valid master key."""

    __slots__ = ("problem",)

    def __init__(self, problem: str) -> None:
        self.problem = problem

    def seal(self, value: bytes) -> bytes:
        raise EncryptionUnavailable(f"this node has no valid encryption key: {self.problem}")

    def open(self, sealed: bytes) -> bytes:
        raise EncryptionUnavailable(f"this node has no valid encryption key: {self.problem}")


class Values(Protocol):
    """What a replica seals and opens its values with: a ValueCipher, or Keyless."""

    @property
    def problem(self) -> str | None: ...  # why it cannot seal nor open, or None

    def seal(self, value: bytes) -> bytes: ...

    def open(self, sealed: bytes) -> bytes: ...


def sealed_records(values: Values, records: Sequence[Record]) -> list[Record]:
    """``records`` with their values sealed (new records: the callers' stay as they were)."""
    seal = values.seal
    return [Record(seal(r.value), r.key, r.headers, r.timestamp, r.header_block) for r in records]


def opening(values: Values, then: EntryWalk) -> EntryWalk:
    """A reader's walk over an encrypted log: the intact stored entries, their values opened and
    the entries encoded again (same offsets, timestamps, leader epochs, gaps), then walked by
    ``then`` (``stored_prefix``: the entries; Subscribe's encoder: its Messages). The entries before
    one whose value does not open are read; a read that starts at it raises DecryptionFailed."""

    def walk(buf: bytes, first_offset: int, max_entries: int, check_crc: bool) -> tuple[
            int, int, CorruptEntry | None, bytes]:
        length, reach, error, stored = stored_prefix(buf, first_offset, max_entries, check_crc)
        opened: list[bytes] = []
        for offset, _, _, start, end in scan(stored, check_crc=False):
            try:
                opened.append(_opened_entry(values, stored[start:end]))
            except (CorruptEntry, DecryptionFailed) as exc:
                if not opened and isinstance(exc, DecryptionFailed):
                    raise DecryptionFailed(f"offset {offset}: {exc}") from None
                # Stop before it, as the other walks stop before an entry they do not pass.
                length, reach = start, offset - first_offset
                error = exc if isinstance(exc, CorruptEntry) else None
                break
        if not opened:
            return length, reach, error, b""
        return length, reach, error, then(b"".join(opened), first_offset, max_entries, False)[3]

    return walk


def _opened_entry(values: Values, stored: bytes) -> bytes:
    (entry,) = decode_entries(stored, check_crc=False)
    record = Record(values.open(entry.value), entry.key, entry.headers, entry.timestamp)
    return encode_entries(entry.offset, entry.leader_epoch, [record], entry.timestamp)[0]
