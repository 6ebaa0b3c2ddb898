"""Proof of the cluster's key on every node-to-node NATS message, once, sans I/O.

Anyone who can reach the NATS server could otherwise run metadata commands, join the Raft group,
fence a partition leader with a huge leader epoch or answer a follower's fetch with forged
entries. Every internal message therefore travels sealed:

    0-15  tag          BLAKE2b keyed with the cluster key, 16 bytes, over the subject and bytes 16..
    16-23 incarnation  random, drawn by each sending process (again when its sequence runs out)
    24-27 sequence     uint32, 1, 2, 3... within the incarnation
    28-31 time (s)     uint32, the sender's wall clock, only for a receiver that does not know it yet
    32..  payload

A receiver drops (and counts) a message whose tag does not verify before it reads anything else,
then refuses replays with a sliding window per sender incarnation (RFC 4303's anti-replay window,
WireGuard's counter window): the highest sequence number accepted and which of the `WINDOW` below
it were seen. Out-of-order delivery within the window is accepted once (a node's messages reach
another on several subscriptions, each handled in turn, and replies on inboxes); a number seen, or
below the window, is refused. The window is wide because a message can wait behind a slow handler
of its subscription (a metadata request behind a Raft commit) while the sender's sequence runs on;
one that waits longer than `WINDOW` of its sender's messages is dropped as too late.

No wall clock is compared once a receiver knows an incarnation, so a clock step on either side, of
any size, changes nothing between running processes. The time counts only at an incarnation's
first sighting: a receiver that has never heard it (the sender, or the receiver itself, just
started, or the receiver forgot it) accepts it only within `FIRST_SIGHTING_S` (a day: a clock off
by hours, as one whose hardware clock keeps local time or a VM resumed from a long pause, still
joins) of its own clock. A new incarnation is the one thing a wall clock can cost: a node that
starts while its clock is more than a day from a peer's is not heard by that peer (nor hears it)
until one of the clocks is corrected.

Replays that remain possible, and why they are acceptable:

- A receiver with no memory of an incarnation (it restarted, or evicted the incarnation as the
  least recently heard of `MAX_INCARNATIONS`) accepts, once each, captured messages of it sealed
  within a day of its clock that are not `WINDOW` below the newest it has accepted. Until a live
  sender's next message arrives, a quick replayer can so play back that incarnation's day in
  order; once it has arrived, only the `WINDOW` messages before it. A dead incarnation's (a sender
  that restarted) last day of messages stays open that way, once per restart of the receiver. The
  old seal bound this by 10 s of wall-clock time instead, at the price of deafness to clock steps.
  Replaying needs read and write access to the cluster's namespace on NATS, which NATS
  permissions keep from everyone but the nodes (docs/operations.md), and a replay still only
  reaches the subject it was sealed for.
- Nothing else: a replay to the same receiver is seen in or below its window, one on another
  subject breaks the tag (replies go to per-request inboxes, so a replayed reply answers nothing).

Every table is bounded and only authentic messages reach it: `MAX_INCARNATIONS` windows of
`WINDOW` bytes (8 MiB at most; a node holds one per peer process it heard). A sender with the
key that draws incarnations without end evicts others, which are then first sightings again:
it weakens replay protection for the evicted, never their delivery. Not encryption: NATS-level
permissions keep the namespace private where that matters (docs/operations.md).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from collections import OrderedDict
from dataclasses import dataclass, field
from enum import Enum

TAG_SIZE = 16
_STAMP = struct.Struct(">8sII")
SEAL_SIZE = TAG_SIZE + _STAMP.size
KEY_SIZE = 32
WINDOW = 1 << 16  # sequence numbers a message may trail its sender's newest and still be accepted
_WINDOW_MASK = WINDOW - 1
_UNSEEN = bytes(WINDOW)
MAX_INCARNATIONS = 128  # windows a receiver keeps: far more than a cluster's live processes
FIRST_SIGHTING_S = 24 * 3600
_LAST_SEQUENCE = 0xFFFF_FFFF
_LAST_TIME_S = 0xFFFF_FFFF
_KEY_PERSON = b"bascule-nats"  # BLAKE2b personalization: a key derived here is for nothing else


class Rejection(Enum):
    """Why a sealed message was dropped."""

    MALFORMED = "malformed"
    BAD_TAG = "bad tag"
    UNTIMELY = "from a sender incarnation not heard before, sealed over a day from this node's clock"
    BEHIND_WINDOW = "older than the sender's replay window"
    REPLAYED = "replayed"


def derive_key(secret: str) -> bytes:
    """The sealing key of a cluster whose shared secret is ``secret`` (its Raft password): one
    secret to configure, and a key that is not the password pysyncobj uses."""
    return hashlib.blake2b(secret.encode(), digest_size=KEY_SIZE, person=_KEY_PERSON).digest()


def _mac(key: bytes, subject: str) -> hashlib.blake2b:
    mac = hashlib.blake2b(key=key, digest_size=TAG_SIZE)
    mac.update(subject.encode())
    mac.update(b"\x00")  # a subject never holds NUL: subject and body cannot run into each other
    return mac


def _new_incarnation() -> bytes:
    return os.urandom(8)


class _Window:
    """The sequence numbers of one sender incarnation seen so far: the highest, and a ring of
    `WINDOW` slots where slot ``n % WINDOW`` says whether ``n`` was seen, for ``n`` up to
    `WINDOW` below the highest."""

    __slots__ = ("highest", "seen")

    def __init__(self, sequence: int) -> None:
        self.highest = sequence
        self.seen = bytearray(WINDOW)
        self.seen[sequence & _WINDOW_MASK] = 1

    def accept(self, sequence: int) -> Rejection | None:
        """Record ``sequence`` as seen, or say why it cannot be accepted."""
        highest, seen = self.highest, self.seen
        if sequence > highest:
            self._forget_between(highest, sequence)
            seen[sequence & _WINDOW_MASK] = 1
            self.highest = sequence
            return None
        if sequence <= highest - WINDOW:
            return Rejection.BEHIND_WINDOW
        slot = sequence & _WINDOW_MASK
        if seen[slot]:
            return Rejection.REPLAYED
        seen[slot] = 1
        return None

    def _forget_between(self, highest: int, sequence: int) -> None:
        """Clear the slots of the numbers after ``highest`` and before ``sequence``: they held
        numbers that now fall below the window."""
        gap = sequence - highest - 1
        if gap >= WINDOW:
            self.seen[:] = _UNSEEN
        elif gap:
            start, stop = (highest + 1) & _WINDOW_MASK, sequence & _WINDOW_MASK
            if start < stop:
                self.seen[start:stop] = _UNSEEN[:gap]
            else:
                self.seen[start:] = _UNSEEN[: WINDOW - start]
                self.seen[:stop] = _UNSEEN[:stop]


@dataclass
class Sealer:
    """Seals what this process sends and opens what it receives, with one cluster key."""

    key: bytes
    _incarnation: bytes = field(default_factory=_new_incarnation)
    _sequence: int = 0
    # By incarnation, the least recently heard first.
    _windows: OrderedDict[bytes, _Window] = field(default_factory=OrderedDict)
    rejected: dict[Rejection, int] = field(default_factory=lambda: dict.fromkeys(Rejection, 0))

    def __post_init__(self) -> None:
        if len(self.key) < 16:
            raise ValueError("a sealing key has at least 16 bytes")

    def seal(self, subject: str, payload: bytes, now_s: int) -> bytes:
        if self._sequence == _LAST_SEQUENCE:
            self._incarnation, self._sequence = _new_incarnation(), 0
        self._sequence += 1
        stamp = _STAMP.pack(self._incarnation, self._sequence, min(max(now_s, 0), _LAST_TIME_S))
        mac = _mac(self.key, subject)
        mac.update(stamp)
        mac.update(payload)
        return b"".join((mac.digest(), stamp, payload))  # one copy of a payload that may be large

    def open(self, subject: str, data: bytes, now_s: int) -> bytes | Rejection:
        """The payload of a message sealed for ``subject`` with this key, or why it is refused."""
        if len(data) < SEAL_SIZE:
            return self._reject(Rejection.MALFORMED)
        view = memoryview(data)
        mac = _mac(self.key, subject)
        mac.update(view[TAG_SIZE:])
        if not hmac.compare_digest(view[:TAG_SIZE], mac.digest()):
            return self._reject(Rejection.BAD_TAG)
        incarnation, sequence, sent_s = _STAMP.unpack_from(data, TAG_SIZE)
        window = self._windows.get(incarnation)
        if window is None:
            if abs(sent_s - now_s) > FIRST_SIGHTING_S:
                return self._reject(Rejection.UNTIMELY)
            self._remember(incarnation, _Window(sequence))
        else:
            refused = window.accept(sequence)
            if refused is not None:
                return self._reject(refused)
            self._windows.move_to_end(incarnation)
        return data[SEAL_SIZE:]

    def _remember(self, incarnation: bytes, window: _Window) -> None:
        self._windows[incarnation] = window
        if len(self._windows) > MAX_INCARNATIONS:
            self._windows.popitem(last=False)

    def _reject(self, why: Rejection) -> Rejection:
        self.rejected[why] += 1
        return why
