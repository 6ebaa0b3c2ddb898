"""The metadata Raft group, modelled at its interface: one linearizable log of commands, with a
leader that moves.

What is real: the commands (encoded and decoded as the journal holds them), the state machine that
applies them (``apply_command``), and everything the nodes do with the result. What is modelled:
Raft itself. A command a member proposes while it leads is committed at once (one log, one order)
if a majority of the voters is up and connected, then reaches each member after its own delay; a
member cut off from the group learns nothing until it is reconnected. A leader cut off, crashed or
left without a majority loses its leadership, which another connected member holding the whole log
takes after an election delay, once a majority is up and connected. A proposal's outcome can be
lost after it committed (the proposer then hears ``NoMetadataLeader``), as a real leader's can when
it steps down before answering.
Not modelled: journal loss, membership changes (every node is a voter from the start).
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Callable
from typing import Any

from bascule.metadata.raft import MetadataError, NoMetadataLeader
from bascule.metadata.replicated import apply_command
from bascule.metadata.state import MetadataState
from bascule.metadata.watch import MetadataWatch
from bascule.wire.commands import Command, decode_command, encode_command


class MetadataLog:
    def __init__(
        self, voters: list[str], random_source: random.Random, trace: Callable[[str], None],
        apply_delay: tuple[float, float], election_delay: tuple[float, float], lost_answer: float,
    ) -> None:
        self.voters = voters
        self.random = random_source
        self.trace = trace
        self.apply_delay = apply_delay
        self.election_delay = election_delay
        self.lost_answer = lost_answer  # the chance that a committed proposal's answer is lost
        self.states = [MetadataState()]  # the state after each prefix of the log
        self.term = 0
        self.leader: str | None = None
        self.members: dict[str, MetadataMember] = {}
        self.cut_off: set[str] = set()
        self._election: asyncio.TimerHandle | None = None

    @property
    def commit_index(self) -> int:
        return len(self.states) - 1

    @property
    def state(self) -> MetadataState:
        return self.states[-1]

    def join(self, node: str, on_change: Callable[[], None]) -> MetadataMember:
        """A (re)started member: it replays the log from the start, as pysyncobj replays its journal."""
        member = self.members[node] = MetadataMember(self, node, on_change)
        self._deliver(member, self.commit_index)
        if self.leader is None:
            self._schedule_election()
        return member

    def leave(self, node: str) -> None:
        """The member crashed or stopped."""
        member = self.members.pop(node, None)
        if member is not None:
            member.alive = False
        if self.leader == node or not self.has_majority():
            self._lose_leader()

    def cut(self, node: str) -> None:
        """Cut ``node`` off from the group: it hears of no commit, and leads no more."""
        self.cut_off.add(node)
        if self.leader == node or not self.has_majority():
            self._lose_leader()

    def has_majority(self) -> bool:
        """Whether a majority of the voters is up and connected."""
        connected = [node for node in self.members if node not in self.cut_off]
        return 2 * len(connected) > len(self.voters)

    def reconnect(self) -> None:
        self.cut_off.clear()
        for member in self.members.values():
            self._deliver(member, self.commit_index)
        if self.leader is None:
            self._schedule_election()

    def move_leader(self, to: str | None = None) -> None:
        """The leader steps down (a timeout), or hands over to ``to`` (pysyncobj's transferLeadership)."""
        if to is not None and self.leader != to and to in self.members and to not in self.cut_off:
            self.leader = to
            self.term += 1
            self.trace(f"metadata leader {to} (term {self.term}, handed over)")
            self._notify_all()
        elif to is None and self.leader is not None:
            self._lose_leader()

    def _lose_leader(self) -> None:
        if self.leader is None:
            return
        self.trace(f"metadata leader {self.leader} lost (term {self.term})")
        self.leader = None
        self._notify_all()
        self._schedule_election()

    def _schedule_election(self) -> None:
        if self._election is None:
            delay = self.random.uniform(*self.election_delay)
            self._election = asyncio.get_running_loop().call_later(delay, self._elect)

    def _elect(self) -> None:
        self._election = None
        # A candidate must hold the whole log (Raft's election restriction), and be reachable.
        candidates = sorted(
            node for node, member in self.members.items()
            if node not in self.cut_off and member.applied == self.commit_index
        )
        if not candidates or not self.has_majority():
            self._schedule_election()  # they are catching up, or a majority is not there yet
            return
        self.leader = self.random.choice(candidates)
        self.term += 1
        self.trace(f"metadata leader {self.leader} (term {self.term})")
        self._notify_all()

    def _notify_all(self) -> None:
        for member in self.members.values():
            member.watch.notify()

    def commit(self, command: bytes) -> int:
        if not self.has_majority():
            self._lose_leader()
            raise NoMetadataLeader("no majority of the metadata voters is up and connected")
        state, refusal = apply_command(self.state, command)
        self.states.append(state)
        decoded = decode_command(command)
        if refusal is None and decoded.OP not in ("activity_published",):
            self.trace(f"metadata #{self.commit_index}: {_summary(decoded)}")
        for member in self.members.values():
            self._deliver(member, self.commit_index)
        if refusal is not None:
            raise MetadataError(*refusal)
        return self.commit_index

    def _deliver(self, member: MetadataMember, index: int) -> None:
        if member.node in self.cut_off:
            return
        delay = self.random.uniform(*self.apply_delay)
        asyncio.get_running_loop().call_later(delay, member.catch_up, index)


class MetadataMember:
    """One node's member of the group: a ``ReplicatedMetadata``."""

    def __init__(self, log: MetadataLog, node: str, on_change: Callable[[], None]) -> None:
        self.log = log
        self.node = node
        self.alive = True
        self.applied = 0
        self._ready_at = log.commit_index  # what was committed when it started
        self._on_change = on_change
        self.watch = MetadataWatch()

    def catch_up(self, index: int) -> None:
        if not self.alive or index <= self.applied or self.node in self.log.cut_off:
            return
        self.applied = index
        self._on_change()
        self.watch.notify()

    @property
    def state(self) -> MetadataState:
        return self.log.states[self.applied]

    @property
    def ready(self) -> bool:
        return self.applied >= self._ready_at

    @property
    def is_leader(self) -> bool:
        return self.alive and self.log.leader == self.node

    @property
    def term(self) -> int:
        return self.log.term

    @property
    def leader(self) -> str | None:
        return None if self.node in self.log.cut_off else self.log.leader

    async def propose(self, proposal: Command) -> None:
        if not self.is_leader:
            raise NoMetadataLeader(f"{self.node} does not lead the metadata")
        index = self.log.commit(encode_command(proposal))
        if self.log.random.random() < self.log.lost_answer:
            raise NoMetadataLeader("the answer to a committed proposal was lost")
        # Raft's leader answers once it applied the command itself.
        await self.watch.until(lambda: self.applied >= index or not self.is_leader, None)
        if self.applied < index:
            raise NoMetadataLeader(f"{self.node} lost the metadata leadership before applying its proposal")

    def quorum(self) -> dict[str, Any]:
        voters = [
            {"address": node, "match_index": member.applied, "connected": node not in self.log.cut_off,
             "leader": node == self.log.leader}
            for node, member in sorted(self.log.members.items())
        ]
        return {"leader": self.leader or "", "term": self.term, "commit_index": self.log.commit_index,
                "voters": voters}

    def members(self) -> list[str]:
        """Every voter, as a Raft group's members are, whether or not it is up (the metadata leader
        counts a voter that is down at the level it last registered with)."""
        return list(self.log.voters)

    async def add_voter(self, address: str, wait: float) -> bool | None:
        return True


def _summary(command: Command) -> str:
    fields = {f.name: getattr(command, f.name) for f in dataclasses.fields(command)
              if f.name not in ("settings", "created")}
    return f"{command.OP} {fields}"
