"""pysyncobj 0.3.17's SyncObj with the Raft rules it misses on AppendEntries (issue 25).

Two gaps let a command acknowledged as committed be lost, and a node keep a command the group never
committed (tests/unit/test_raft_stale_messages.py plays both):

- Its AppendEntries responses (``next_node_idx``) carry no term, and a leader takes any it receives while
  it leads (syncobj.py, ``__onMessageReceived``, the ``next_node_idx`` branch). A success answering an
  AppendEntries of one of its earlier leaderships, delayed on its way back, sets ``matchIndex`` for a log
  the follower may not share, and the commit count (``_onTick``) then counts a copy that does not exist.
  Here every response carries the term of the AppendEntries it answers, and a leader drops the others.
- A follower deletes every entry after ``prevLogIdx`` whenever it has any (the "truncating
  already-applied log entries" branch), including entries identical to the leader's that it already
  acknowledged: a repeated or delayed AppendEntries, which a leader sends after a stale refusal, takes
  them back from a member counted towards their commit. Here a follower cuts only from the first entry
  whose term differs (Raft's rule) and keeps a matching tail, and commits only what the message proved
  to match the leader's log, not its own log's end.

The commit count's own-term rule (Raft 5.4.2) is pysyncobj's already.

With these, a follower cuts an entry it applied only if a leader committed wrongly (an older node in the
group, a journal that lost data). The metadata state has no undo, so the consumer's state is then rebuilt
from the journal: the full dump, if the journal was compacted, and every entry up to the cut.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

import pysyncobj.pickle as pysyncobj_pickle
from pysyncobj import SyncObj

log = logging.getLogger(__name__)

Entry = tuple[bytes, int, int]  # command, Raft index, term
REGULAR_COMMAND = 0  # pysyncobj's _COMMAND_TYPE.REGULAR: a call of a replicated method


class RebuildableConsumer(Protocol):
    def rebuild(self, dump: bytes | None, commands: Sequence[bytes]) -> None:
        """Replace the state with ``dump`` (None: the empty state) and ``commands`` applied to it in order."""


class DivergedBeyondRepair(RuntimeError):
    """The entries to cut are already in the full dump: the state cannot be rebuilt from this journal."""


class SafeSyncObj(SyncObj):
    """SyncObj whose AppendEntries follow Raft (see the module's doc), for one rebuildable consumer with one
    replicated method, whose one argument is the command."""

    # -- leader --
    def _SyncObj__onMessageReceived(self, node: Any, message: dict[str, Any]) -> None:
        if message["type"] == "next_node_idx" and message.get("term") != self.raftCurrentTerm:
            return  # it answers another leadership's AppendEntries: what it says of the log is not of this one
        if message["type"] == "append_entries" and message["term"] >= self.raftCurrentTerm \
                and message.get("prevLogIdx") is not None:
            self._append(node, message)
            return
        super()._SyncObj__onMessageReceived(node, message)

    def _SyncObj__sendNextNodeIdx(self, node: Any, reset: bool = False, nextNodeIdx: int | None = None,
                                  success: bool = False) -> None:
        # Sent only while taking an AppendEntries, whose term is then this node's.
        if nextNodeIdx is None:
            nextNodeIdx = self._SyncObj__getCurrentLogIndex() + 1
        self._SyncObj__transport.send(node, {
            "type": "next_node_idx", "next_node_idx": nextNodeIdx, "reset": reset, "success": success,
            "term": self.raftCurrentTerm,
        })

    # -- follower --
    def _append(self, node: Any, message: dict[str, Any]) -> None:
        """Take an AppendEntries of entries, cutting the log only where it conflicts with them."""
        message = self._reassembled(message)
        prev_index, prev_term = message["prevLogIdx"], message["prevLogTerm"]
        if message.get("transmission") is not None or self._term_at(prev_index) != prev_term:
            super()._SyncObj__onMessageReceived(node, message)  # a part of a big entry, or a refusal
            return
        entries: list[Entry] = message.get("entries", [])
        held = next((i for i, entry in enumerate(entries) if self._term_at(entry[1]) != entry[2]), len(entries))
        verified = prev_index + len(entries)
        if held == len(entries):
            # Nothing to write or cut; what lies past this message is the leader's to confirm later.
            bookkeeping = {k: v for k, v in message.items() if k not in ("prevLogIdx", "entries")}
            bookkeeping["commit_index"] = min(message["commit_index"], verified)
            super()._SyncObj__onMessageReceived(node, bookkeeping)
            self._SyncObj__sendNextNodeIdx(node, nextNodeIdx=verified + 1, success=True)
            return
        base_index, base_term = entries[held - 1][1:] if held else (prev_index, prev_term)
        if base_index < self.raftLastApplied:
            log.critical("the Raft leader replaces entries from %d that this node applied (up to %d): "
                         "rebuilding the metadata state from the journal", base_index + 1, self.raftLastApplied)
            self._rebuild(base_index)
            # Its commit index covered entries the group never committed: the leader's replaces it.
            self._SyncObj__raftCommitIndex = base_index
        super()._SyncObj__onMessageReceived(
            node, {**message, "prevLogIdx": base_index, "prevLogTerm": base_term, "entries": entries[held:]})

    def _reassembled(self, message: dict[str, Any]) -> dict[str, Any]:
        """The last part of a big entry sent in parts, as a message of that entry."""
        if message.get("transmission") != "finish":
            return message
        received: bytes = getattr(self, "_SyncObj__recvTransmission")  # noqa: B009 - typed here, not in pysyncobj
        entry = pysyncobj_pickle.loads(received + message["data"])
        self._SyncObj__recvTransmission = ""
        plain = {k: v for k, v in message.items() if k not in ("transmission", "data")}
        return {**plain, "entries": [entry]}

    def _term_at(self, index: int) -> int | None:
        entries = self._SyncObj__getEntries(index, 1)
        return entries[0][2] if entries else None

    # -- rebuild --
    def _rebuild(self, last_index: int) -> None:
        """The consumer's state as of ``last_index``, from the full dump and the journal."""
        (consumer,) = self._SyncObj__consumers
        journal = self._SyncObj__raftLog
        dump_index, dump = 1, None
        if journal[0][1] > 1:  # compacted: the full dump holds the journal's prefix
            data, dumped_last, _dumped_prev, _cluster = self._SyncObj__serializer.deserialize()
            dump_index, dump = dumped_last[1], data[1]
        if dump_index > last_index:
            raise DivergedBeyondRepair(
                f"the Raft leader replaces entry {last_index + 1}, already in this node's full dump "
                f"(up to {dump_index}): stop the node and remove its raft directory to take the leader's")
        consumer.rebuild(dump, [_argument(entry[0]) for entry in journal
                                if dump_index < entry[1] <= last_index and entry[0][0] == REGULAR_COMMAND])
        self._SyncObj__raftLastApplied = last_index


def _argument(command: bytes) -> bytes:
    """The one argument of a journaled call of a replicated method."""
    call = pysyncobj_pickle.loads(command[1:])
    return call[1][0]
