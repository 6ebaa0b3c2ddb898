"""The cipher of an encrypted stream's values under a master key (the layout is in
``bascule.partition.encryption``), kept apart so that only a node that seals or opens a value loads
cryptography."""

from __future__ import annotations

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.keywrap import InvalidUnwrap, aes_key_unwrap_with_padding, aes_key_wrap_with_padding

from bascule.partition.encryption import (
    DATA_KEY_LENGTH,
    NONCE_LENGTH,
    TAG_LENGTH,
    DecryptionFailed,
    check_master_key,
)

# Random 96-bit nonces stay safe for 2**32 values per key (NIST SP 800-38D); a replica takes a new
# data key long before that. Readers need not know: every value names its own.
DATA_KEY_USES = 1 << 30
_OPENERS_KEPT = 64  # data keys met while reading: one per leader run, or per DATA_KEY_USES values


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
