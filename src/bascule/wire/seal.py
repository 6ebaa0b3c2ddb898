"""Proof of the cluster's key on every node-to-node NATS message, sans I/O.

Anyone who can reach the NATS server could otherwise run metadata commands, join the Raft group,
fence a partition leader with a huge leader epoch or answer a follower's fetch with forged
entries. Every internal message therefore travels sealed:

    0-15  tag        BLAKE2b keyed with the cluster key, 16 bytes, over the subject and bytes 16..
    16-23 time (ms)  uint64, the sender's wall clock
    24-31 nonce      uint64, unique per sender
    32..  payload

A receiver drops (and counts) a message whose tag does not verify, whose time is outside the
replay window around its own clock, or whose tag it has already accepted within the window.
Binding the subject stops a message sealed for one partition (or one node's notify subject)
from being replayed onto another. Not encryption: NATS-level permissions keep the namespace
private where that matters (docs/operations.md).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from collections import deque
from dataclasses import dataclass, field
from enum import Enum

TAG_SIZE = 16
_STAMP = struct.Struct(">QQ")
SEAL_SIZE = TAG_SIZE + _STAMP.size
KEY_SIZE = 32
REPLAY_WINDOW_MS = 10_000  # node clocks (NTP) agree far better; a replay is refused for twice this long
_KEY_PERSON = b"bascule-nats"  # BLAKE2b personalization: a key derived here is for nothing else


class Rejection(Enum):
    """Why a sealed message was dropped."""

    MALFORMED = "malformed"
    BAD_TAG = "bad tag"
    STALE = "outside the replay window"
    REPLAYED = "replayed"


def derive_key(secret: str) -> bytes:
    """The sealing key of a cluster whose shared secret is ``secret`` (its Raft password): one
    secret to configure, and a key that is not the password pysyncobj uses."""
    return hashlib.blake2b(secret.encode(), digest_size=KEY_SIZE, person=_KEY_PERSON).digest()


def _tag(key: bytes, subject: str, sealed_rest: bytes | memoryview) -> bytes:
    mac = _mac(key, subject)
    mac.update(sealed_rest)
    return mac.digest()


def _mac(key: bytes, subject: str) -> hashlib.blake2b:
    mac = hashlib.blake2b(key=key, digest_size=TAG_SIZE)
    mac.update(subject.encode())
    mac.update(b"\x00")  # a subject never holds NUL: subject and body cannot run into each other
    return mac


@dataclass
class Sealer:
    """Seals what this node sends and opens what it receives, with one cluster key."""

    key: bytes
    window_ms: int = REPLAY_WINDOW_MS
    _nonce: int = field(default_factory=lambda: int.from_bytes(os.urandom(8), "big") >> 1)
    _accepted: dict[bytes, int] = field(default_factory=dict)  # tag -> time, within the window
    _expiry: deque[tuple[int, bytes]] = field(default_factory=deque)  # (time accepted, tag), oldest first
    rejected: dict[Rejection, int] = field(default_factory=lambda: dict.fromkeys(Rejection, 0))

    def __post_init__(self) -> None:
        if len(self.key) < 16:
            raise ValueError("a sealing key has at least 16 bytes")

    def seal(self, subject: str, payload: bytes, now_ms: int) -> bytes:
        self._nonce = (self._nonce + 1) & 0xFFFF_FFFF_FFFF_FFFF
        stamp = _STAMP.pack(now_ms, self._nonce)
        mac = _mac(self.key, subject)
        mac.update(stamp)
        mac.update(payload)
        return b"".join((mac.digest(), stamp, payload))  # one copy of a payload that may be large

    def open(self, subject: str, data: bytes, now_ms: int) -> bytes | Rejection:
        """The payload of a message sealed for ``subject`` with this key, or why it is refused."""
        if len(data) < SEAL_SIZE:
            return self._reject(Rejection.MALFORMED)
        view = memoryview(data)
        tag = bytes(view[:TAG_SIZE])
        if not hmac.compare_digest(tag, _tag(self.key, subject, view[TAG_SIZE:])):
            return self._reject(Rejection.BAD_TAG)
        sent_ms, _ = _STAMP.unpack_from(data, TAG_SIZE)
        if abs(sent_ms - now_ms) > self.window_ms:
            return self._reject(Rejection.STALE)
        self._forget_older_than(now_ms - 2 * self.window_ms)
        if tag in self._accepted:
            return self._reject(Rejection.REPLAYED)
        self._accepted[tag] = now_ms
        self._expiry.append((now_ms, tag))
        return data[SEAL_SIZE:]

    def _forget_older_than(self, time_ms: int) -> None:
        """A tag accepted at ``t`` carried a time >= t - window, so a replay of it is stale after
        t + 2 windows at the latest (clocks move forward here; a jump back keeps tags longer)."""
        expiry, accepted = self._expiry, self._accepted
        while expiry and expiry[0][0] < time_ms:
            _, tag = expiry.popleft()
            accepted.pop(tag, None)

    def _reject(self, why: Rejection) -> Rejection:
        self.rejected[why] += 1
        return why
