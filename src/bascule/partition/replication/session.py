"""Fetch sessions (pure): what a round carries, when the leader's view of a session holds, and when a
parked follower must fetch.

A follower that is caught up parks its partition in a session to the partition's leader node, as the
item of one of the session's slots (``wire.sessions.MAX_ITEMS`` of them). Every idle wait one round
of each session goes to the leader node, which treats every item it holds for the session as the
fetch that item stands for (the follower's position, for the ISR and the lease) without reading its
log, and answers with the slots that must fetch on their own (``has_news``, or a partition it does
not lead in that epoch). Rounds are incremental, as Kafka's fetch sessions (KIP-227): round 0 carries
every item, a later round only the slots set or emptied since the round before, and the leader keeps
the session's items in between.

What the leader may infer from a round. It counts each item it holds as a fetch the follower made at
that position as it sent the round: a stale item would keep a follower in the ISR, or renew the
leader's lease, on a position that follower no longer stands at. So the leader's view after it takes
a round must be exactly what was parked when the follower sent that round, whatever the network
lost, repeated, delayed or reordered:
- the follower sends round n of a session only once round n-1 was answered, each (session, round
  number) once, with the changes since round n-1's items (``SessionRounds``);
- the leader takes round 0 only of a session it does not hold, and round n only right after round
  n-1 (so it holds exactly round n-1's items, which the changes are relative to); it refuses any
  other round, and nothing it holds changes (``HeldSessions``);
- a round unanswered or refused ends the session for its follower: its items fetch on their own,
  and the next round is round 0 of a new session id, so that no late copy of a round of the old
  session can ever be taken in the new one.
By induction the leader's view after round n is round n's items: an item a round omits stayed
parked, unchanged, since round n-1, so it stood at that position as the round was sent. As with any
fetch, a round that arrives late tells where its follower stood when it sent it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

from bascule.wire.sessions import MAX_ITEMS, ParkedItem, SessionRound, item_size

# A leader node holds at most this many sessions of one follower node, and of all together, dropping
# the least recently used beyond: at most 4,096 items each, so at most 1,048,576 items in all. A
# follower node opens at most MAX_SESSIONS_PER_FOLLOWER sessions to one leader node (65,536 parked
# partitions); a partition that finds them all full waits on its own, as before sessions.
MAX_SESSIONS_PER_FOLLOWER = 16
MAX_SESSIONS = 256


def has_news(offset: int, follower_hw: int, leader_log_end: int, leader_hw: int, log_start: int) -> bool:
    """Whether a follower at log end ``offset`` with HW ``follower_hw`` has something to fetch:
    entries past its end, a log that starts past it (retention: it restarts there), or an HW it
    would take (the leader's, up to its own last offset)."""
    if offset < log_start or leader_log_end > offset:
        return True
    return min(leader_hw, offset - 1) > follower_hw


class SessionRounds:
    """The follower's side of one session: the items parked in its slots, and what its next round
    must carry."""

    def __init__(self, follower: str, session: int, max_bytes: int) -> None:
        self.follower = follower
        self.session = session
        self.number = 0  # the next round's
        self.max_bytes = max_bytes  # what the items of a round may take (``wire.sessions.item_size``)
        self._parked: dict[int, ParkedItem] = {}
        self._bytes = 0
        self._free = list(range(MAX_ITEMS - 1, -1, -1))  # the lowest free slot last
        self._held: dict[int, ParkedItem] = {}  # what the leader holds: the items of the last round answered
        self._changed: set[int] = set()  # slots set or emptied since the last round was sent
        self._sent: SessionRound | None = None  # on its way

    @property
    def parked(self) -> Mapping[int, ParkedItem]:
        return self._parked

    def fits(self, item: ParkedItem) -> bool:
        """Whether a slot is free for ``item``, and the bytes of a round leave it room."""
        return bool(self._free) and self._bytes + item_size(item.stream) <= self.max_bytes

    def park(self, item: ParkedItem) -> int:
        """The slot ``item`` now holds (it must ``fit``)."""
        if not self.fits(item):
            raise ValueError(f"no room for {item.stream}/{item.partition} in session {self.session}")
        slot = self._free.pop()
        self._parked[slot] = item
        self._bytes += item_size(item.stream)
        self._changed.add(slot)
        return slot

    def unpark(self, slot: int) -> None:
        item = self._parked.pop(slot)
        self._bytes -= item_size(item.stream)
        self._free.append(slot)
        self._changed.add(slot)

    def next_round(self, leader_time: float) -> SessionRound | None:
        """The round to send now, echoing ``leader_time``; None when there is nothing to say (no item
        parked, and the leader holds none). One round at a time: the next once this one is answered
        or the session ended."""
        if self._sent is not None:
            raise RuntimeError("a round of this session is on its way")
        if not self._parked and not self._held:
            return None
        parked, held = self._parked, self._held
        upserts = [(slot, parked[slot]) for slot in self._changed if slot in parked and held.get(slot) != parked[slot]]
        removals = [slot for slot in self._changed if slot not in parked and slot in held]
        self._changed = set()
        self._sent = SessionRound(self.follower, self.session, self.number, leader_time, upserts, removals)
        return self._sent

    def answered(self, news: list[int]) -> None:
        """The leader took the round on its way, and names ``news``, slots of that round's items.
        ValueError when a slot of ``news`` held no item: the answer is not this round's (the session
        then ends, as for no answer)."""
        sent = self._sent
        if sent is None:
            raise RuntimeError("no round of this session is on its way")
        self._sent = None
        for slot in sent.removals:
            del self._held[slot]
        self._held.update(sent.upserts)
        self.number += 1
        if any(slot not in self._held for slot in news):
            raise ValueError(f"an answer names slots that round {sent.number} did not hold")

    def end(self, new_session: int) -> None:
        """The round on its way went unanswered, or was refused: the leader may hold anything of
        this session, or nothing. Start again under ``new_session``, with a full round."""
        self.session = new_session
        self.number = 0
        self._held = {}
        self._sent = None
        self._changed = set(self._parked)


@dataclass
class _Held:
    number: int  # of the last round taken
    items: dict[int, ParkedItem] = field(default_factory=dict)


class HeldSessions:
    """The leader node's side: the sessions of the follower nodes, each with its items as of the last
    round taken, at most ``MAX_SESSIONS_PER_FOLLOWER`` of one follower node and ``MAX_SESSIONS`` in
    all (the least recently used dropped beyond: their followers' next rounds are refused and they
    start again)."""

    def __init__(self, max_sessions: int = MAX_SESSIONS, max_per_follower: int = MAX_SESSIONS_PER_FOLLOWER) -> None:
        self.max_sessions = max_sessions
        self.max_per_follower = max_per_follower
        self._sessions: OrderedDict[tuple[str, int], _Held] = OrderedDict()  # least recently used first
        self._per_follower: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def take(self, round_: SessionRound) -> Mapping[int, ParkedItem] | None:
        """The session's items once ``round_`` is taken (every one of them stands for a fetch as the
        round was sent), or None when it is refused: a round 0 of a session held already, or a later
        round that does not follow the last one taken, or that empties a slot the session does not
        fill. A refused round changes nothing."""
        key = (round_.follower, round_.session)
        held = self._sessions.get(key)
        if round_.number == 0:
            if held is not None or round_.removals:
                return None
            held = self._open(key)
        elif held is None or held.number != round_.number - 1 or not held.items.keys() >= set(round_.removals):
            return None
        for slot in round_.removals:
            del held.items[slot]
        held.items.update(round_.upserts)
        held.number = round_.number
        self._sessions.move_to_end(key)
        return held.items

    def _open(self, key: tuple[str, int]) -> _Held:
        follower = key[0]
        if self._per_follower.get(follower, 0) >= self.max_per_follower:
            self._drop(next(k for k in self._sessions if k[0] == follower))
        if len(self._sessions) >= self.max_sessions:
            self._drop(next(iter(self._sessions)))
        self._per_follower[follower] = self._per_follower.get(follower, 0) + 1
        held = self._sessions[key] = _Held(0)
        return held

    def _drop(self, key: tuple[str, int]) -> None:
        del self._sessions[key]
        left = self._per_follower[key[0]] - 1
        if left:
            self._per_follower[key[0]] = left
        else:
            del self._per_follower[key[0]]
