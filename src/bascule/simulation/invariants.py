"""What must hold at every moment of a simulated run, checked as it runs (Jepsen's checks, continuous).

- No acknowledged entry is lost or moved: once acked at an offset, no replica ever holds another
  value there below its HW, and at the end the leader holds it there.
- One value per offset below the HW, on every replica, for the whole run.
- A leader's HW never goes down while it leads one leader epoch.
- At most one leadership acknowledges each offset.
- A value written with a message id (the writer retries failed writes with the same one) is stored
  once: deduplication holds across leader changes and every fault.

An entry may be lost without breaking these only to power cuts: when every copy of it in the ISR was
lost to one (its holders lost power before they synced it; ``forget_lost``), it is exempt, and the
offset may take another value. (Without fsync, an ack means the entry is in the ISR's memory.)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

Key = tuple[str, int]  # (stream, partition)
Reader = Callable[[int, int], Iterable[tuple[int, bytes]]]  # (start, count) -> (offset, value) pairs


class Violation(AssertionError):
    """An invariant broke: the run failed."""


@dataclass(frozen=True)
class Ack:
    value: bytes
    node: str
    leader_epoch: int
    at: float


class Invariants:
    def __init__(self, now: Callable[[], float]) -> None:
        self.now = now
        self.acked: dict[Key, dict[int, Ack]] = {}
        self.committed: dict[Key, dict[int, bytes]] = {}  # a value seen below some replica's HW
        self.exempt: dict[Key, set[int]] = {}  # offsets whose every copy a power cut took
        self.exempt_acks = 0  # acks among them
        self._checked_to: dict[tuple[str, Key], int] = {}  # per replica incarnation: checked below this
        self._leader_hw: dict[tuple[str, Key], tuple[int, int]] = {}  # (leader epoch, HW) per replica
        self.with_ids: set[bytes] = set()  # values written with a message id (themselves): stored once

    def ack(self, key: Key, offset: int, value: bytes, node: str, leader_epoch: int) -> None:
        acks = self.acked.setdefault(key, {})
        earlier = acks.get(offset)
        if earlier is not None and earlier.value == value:
            return  # a retry with the same message id, acked with its first copy's offset
        if earlier is not None:
            raise Violation(f"{_name(key)} offset {offset} acked twice: by {earlier.node} in leader epoch "
                            f"{earlier.leader_epoch} ({earlier.value!r}) and by {node} in {leader_epoch} ({value!r})")
        committed = self.committed.get(key, {}).get(offset)
        if committed is not None and committed != value:
            raise Violation(f"{_name(key)} offset {offset} acked as {value!r} by {node} (leader epoch "
                            f"{leader_epoch}), but {committed!r} is committed there")
        acks[offset] = Ack(value, node, leader_epoch, self.now())

    def observe(
        self, replica_name: str, key: Key, hw: int, leading_epoch: int | None, read: Reader,
    ) -> None:
        """A replica's state now: its HW, the epoch it leads (None: it does not), and ``read(start,
        count)``, its (offset, value) pairs from ``start``. ``replica_name`` names one incarnation."""
        where = (replica_name, key)
        if leading_epoch is not None:
            epoch, earlier = self._leader_hw.get(where, (leading_epoch, -1))
            if epoch == leading_epoch and hw < earlier:
                raise Violation(f"{_name(key)}: the HW of leader {replica_name} went down from {earlier} to {hw} "
                                f"in leader epoch {leading_epoch}")
            self._leader_hw[where] = (leading_epoch, hw)
        start = min(self._checked_to.get(where, 0), hw + 1)
        if hw >= start:
            for offset, value in read(start, hw - start + 1):
                self._committed_value(key, offset, value, replica_name)
        self._checked_to[where] = hw + 1

    def _committed_value(self, key: Key, offset: int, value: bytes, replica_name: str) -> None:
        if offset in self.exempt.get(key, ()):
            # Lost once: replicas out of the ISR may still hold the old value until they truncate,
            # the ISR a new one. Only the end (``final``) says what each must hold there.
            return
        committed = self.committed.setdefault(key, {})
        known = committed.setdefault(offset, value)
        if known != value:
            raise Violation(f"{_name(key)} offset {offset}: {replica_name} holds {value!r} below its HW, "
                            f"{known!r} was committed there")
        ack = self.acked.get(key, {}).get(offset)
        if ack is not None and ack.value != value:
            raise Violation(f"{_name(key)} offset {offset}: {replica_name} holds {value!r} below its HW, but "
                            f"{ack.value!r} was acked there by {ack.node} (leader epoch {ack.leader_epoch})")

    def forget_lost(self, key: Key, held: Callable[[int, bytes], bool]) -> list[int]:
        """After a power cut: the committed offsets no ISR member holds any more (``held(offset,
        value)`` is False) become exempt; returns them."""
        lost = [offset for offset, value in self.committed.get(key, {}).items() if not held(offset, value)]
        lost += [offset for offset, ack in self.acked.get(key, {}).items()
                 if offset not in self.committed.get(key, {}) and not held(offset, ack.value)]
        for offset in lost:
            self.committed.get(key, {}).pop(offset, None)
            self.exempt.setdefault(key, set()).add(offset)
            ack = self.acked.get(key, {}).pop(offset, None)
            if ack is not None:
                self.exempt_acks += 1
        if not lost:
            return []
        # A replica's record of what it had checked no longer holds for the offsets forgotten.
        for where in [w for w in self._checked_to if w[1] == key]:
            self._checked_to[where] = min([self._checked_to[where], *lost])
        return sorted(lost)

    def final(self, key: Key, read: Reader, end: int, replicas: dict[str, Reader]) -> None:
        """At the end, every acked entry not exempt is in the leader's log (``read``, ending at
        ``end``), and each of ``replicas`` holds exactly that log."""
        acks = self.acked.get(key, {})
        held = dict(read(0, end))
        for name, read_replica in replicas.items():
            theirs = dict(read_replica(0, end))
            if theirs != held:
                differ = sorted(o for o in held.keys() | theirs.keys() if held.get(o) != theirs.get(o))
                raise Violation(f"{_name(key)}: {name}'s log differs from the leader's at offsets {differ[:10]}")
        copies = Counter(value for value in held.values() if value in self.with_ids)
        twice = sorted(value for value, count in copies.items() if count > 1)
        if twice:
            offsets = sorted(offset for offset, value in held.items() if value == twice[0])
            raise Violation(f"{_name(key)}: {len(twice)} values written with message ids are stored more than once, "
                            f"{twice[0]!r} at offsets {offsets}")
        for offset, ack in sorted(acks.items()):
            if held.get(offset) != ack.value:
                found = "nothing" if offset not in held else repr(held[offset])
                raise Violation(f"{_name(key)} offset {offset}: acked {ack.value!r} (by {ack.node}, leader epoch "
                                f"{ack.leader_epoch}, at {ack.at:.3f}) is lost: the leader holds {found} there")


def _name(key: Key) -> str:
    return f"{key[0]}/{key[1]}"
