"""Metadata levels: which metadata commands a version of bascule knows, stated by each broker as it
registers, and the level the cluster runs at (Kafka's metadata.version and feature levels, KIP-584
and KIP-778). Pure.

A voter that does not know a journaled command refuses it, alone of the voters (``apply_command``),
and its metadata departs from theirs until it runs a version that knows it and replays the journal.
So the metadata leader journals a command of some level only while every voter states that level.
Levels are cumulative: a version knows the commands of every level up to its own.

- 0: every version up to d5f2fb0, which state none: the single-partition commands.
- 1 (``BATCHES``): ``ChangeLeaders`` and ``ChangeIsrs``.

The level travels inside the registration's incarnation, ``<process id>+L<level>``. An earlier version
refuses a registration with a field it does not know, both as a request (as the metadata leader: the
broker would never register) and as a journaled command (as a voter: it would miss the broker's new
incarnation and the unclean marks its registration makes), while an incarnation is a string it only
compares with others. So an earlier metadata leader registers a broker of a later version, every
voter applies the registration alike, a restart states the level of the version that starts, and an
old journal or dump reads as before: its incarnations state level 0.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from bascule.metadata.state import Broker

BATCHES = 1
LEVEL = BATCHES  # this version's
_MARK = "+L"


def incarnation(process: str, level: int = LEVEL) -> str:
    """The incarnation a process registers: its own id (new at every start), stating ``level``."""
    return f"{process}{_MARK}{level}"


def stated_level(registered: str) -> int:
    """The level a registered incarnation states: 0 when it states none (an earlier version's)."""
    _, mark, level = registered.rpartition(_MARK)
    return int(level) if mark and level.isascii() and level.isdigit() else 0


def cluster_level(voters: Collection[str], brokers: Iterable[Broker]) -> int:
    """The level the cluster runs at, for the metadata leader to journal by: the lowest that a voter
    (a Raft address) supports, and at most this version's. A voter supports the lowest level that a
    broker registered at its address states (its latest registration, unless a broker of another id
    registered there too); a voter that no broker registered at (it joined, and has not registered yet)
    supports level 0."""
    supported: dict[str, int] = {}
    for broker in brokers:
        level = stated_level(broker.incarnation)
        supported[broker.raft] = min(level, supported.get(broker.raft, level))
    return min([LEVEL, *(supported.get(voter, 0) for voter in voters)])
