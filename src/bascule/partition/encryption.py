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

import os
from collections.abc import Mapping, Sequence
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.keywrap import InvalidUnwrap, aes_key_unwrap_with_padding, aes_key_wrap_with_padding

from bascule.wire.entry import CorruptEntry, EntryWalk, Record, decode_entries, encode_entries, scan, stored_prefix
from bascule.wire.names import RESERVED_STREAMS

SETTING = "encryption"  # the stream setting (wire.settings), recorded when the stream is created
# Liftbridge's variable, and bascule's, which wins when both are set.
KEY_VARIABLES = (b"BASCULE_ENCRYPTION_KEY", b"LIFTBRIDGE_ENCRYPTION_KEY")
KEY_LENGTHS = (16, 24, 32)
DATA_KEY_LENGTH = 32
NONCE_LENGTH = 12
TAG_LENGTH = 16
# Random 96-bit nonces stay safe for 2**32 values per key (NIST SP 800-38D); a replica takes a new
# data key long before that. Readers need not know: every value names its own.
DATA_KEY_USES = 1 << 30
_OPENERS_KEPT = 64  # data keys met while reading: one per leader run, or per DATA_KEY_USES values


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

    def values(self) -> ValueCipher | Keyless:
        """A cipher for one replica's values (each replica its own data key)."""
        return Keyless(self.problem or "no master key") if self._key is None else ValueCipher(self._key)

    def __repr__(self) -> str:
        return "MasterKey(set)" if self._key is not None else f"MasterKey(missing: {self.problem})"


def precondition_failure(problem: str) -> str:
    """CreateStream's refusal of an encrypted stream on a node without a valid key, in Liftbridge's words."""
    return f"Failed on preconditions for stream's encryption handler: {problem}"


def stream_encrypted(stream: str, settings: Mapping[str, Any]) -> bool:
    """Whether a stream's values are sealed: as recorded when it was created (``encryption``), never
    for the server's internal streams."""
    return stream not in RESERVED_STREAMS and settings.get(SETTING) is True


class ValueCipher:
    """Seals values under this replica's data key, and opens any value sealed under the master key."""

    __slots__ = ("_master", "_sealer", "_head", "_uses", "_openers")

    def __init__(self, master_key: bytes) -> None:
        check_master_key(master_key)
        self._master = master_key
        self._sealer: AESGCM | None = None  # made at the first seal: followers never need one
        self._head = b""  # the wrapped data key and its length, the same in every value it seals
        self._uses = 0
        self._openers: dict[bytes, AESGCM] = {}  # wrapped data key -> its cipher

    problem = None  # a ValueCipher can seal and open

    def seal(self, value: bytes) -> bytes:
        if self._sealer is None or self._uses >= DATA_KEY_USES:
            self._new_data_key()
        assert self._sealer is not None
        self._uses += 1
        nonce = os.urandom(NONCE_LENGTH)
        return b"".join((self._head, nonce, self._sealer.encrypt(nonce, value, None)))

    def _new_data_key(self) -> None:
        data_key = AESGCM.generate_key(DATA_KEY_LENGTH * 8)
        wrapped = aes_key_wrap_with_padding(self._master, data_key)
        self._sealer, self._head, self._uses = AESGCM(data_key), bytes((len(wrapped),)) + wrapped, 0

    def open(self, sealed: bytes) -> bytes:
        """The value sealed in ``sealed``; DecryptionFailed if it is not one this master key opens."""
        if not sealed:
            raise DecryptionFailed("an empty stored value is no sealed value")
        wrapped_end = 1 + sealed[0]
        if len(sealed) < wrapped_end + NONCE_LENGTH + TAG_LENGTH:
            raise DecryptionFailed(f"a sealed value of {len(sealed)} bytes is too short for its layout")
        opener = self._opener(sealed[1:wrapped_end])
        nonce_end = wrapped_end + NONCE_LENGTH
        try:
            return opener.decrypt(sealed[wrapped_end:nonce_end], sealed[nonce_end:], None)
        except InvalidTag:
            raise DecryptionFailed("the value fails its authentication tag (damaged or forged)") from None

    def _opener(self, wrapped: bytes) -> AESGCM:
        opener = self._openers.get(wrapped)
        if opener is None:
            try:
                opener = AESGCM(aes_key_unwrap_with_padding(self._master, wrapped))
            except (InvalidUnwrap, ValueError):
                raise DecryptionFailed(
                    "its data key does not unwrap under this node's master key (sealed under another key, or damaged)"
                ) from None
            if len(self._openers) >= _OPENERS_KEPT:
                self._openers.clear()
            self._openers[wrapped] = opener
        return opener


class Keyless:
    """The values of an encrypted stream's partition on a node without a valid master key."""

    __slots__ = ("problem",)

    def __init__(self, problem: str) -> None:
        self.problem = problem

    def seal(self, value: bytes) -> bytes:
        raise EncryptionUnavailable(f"this node has no valid encryption key: {self.problem}")

    def open(self, sealed: bytes) -> bytes:
        raise EncryptionUnavailable(f"this node has no valid encryption key: {self.problem}")


Values = ValueCipher | Keyless


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
