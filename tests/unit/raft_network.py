"""Metadata Raft members in one process, on a network the test delivers: the real pysyncobj code and
bascule's MetadataStore, with only the transport replaced by one FIFO queue per directed link (what a
TCP connection gives). A test decides what arrives, when, and what is lost with a crashed sender; no
clock drives anything, so elections and heartbeats happen when the test asks for them.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pysyncobj.pickle as pysyncobj_pickle
from pysyncobj import FAIL_REASON, SyncObjConf
from pysyncobj.transport import Transport

from bascule.metadata.raft import MetadataStore
from bascule.metadata.raft_fixes import REGULAR_COMMAND, SafeSyncObj
from bascule.wire.commands import RegisterBroker, encode_command

FAR = 1e6  # seconds: no election, heartbeat or step-down happens unless the test asks for it


HEAL_ROUNDS = 8  # more than any test's longest conflicting suffix: each round walks a refusal back one message
ENTRY_SIZE = 112  # bytes of one journaled register_broker of the tests


class Links(Transport):
    """Every message sent, queued per destination until the test delivers or drops it."""

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any) -> None:
        super().__init__(syncObj, selfNode, otherNodes)
        self.peers = {node.address: node for node in otherNodes}
        self.queued: dict[str, list[dict[str, Any]]] = {address: [] for address in self.peers}

    def send(self, node: Any, message: dict[str, Any]) -> bool:
        self.queued[node.address].append(pickle.loads(pickle.dumps(message)))  # a copy, as the wire makes
        return True


class Member:
    def __init__(self, address: str, others: list[str], dump_file: str | None, batch_bytes: int) -> None:
        self.address = address
        self.store = MetadataStore(lambda: None)
        self.raft = SafeSyncObj(address, others, _conf(dump_file, batch_bytes), consumers=[self.store],
                                transportClass=Links)
        self.links: Links = self.raft._SyncObj__transport
        for node in self.links.peers.values():
            self.links._onNodeConnected(node)
        self.acked: list[str] = []  # brokers whose registration this member's client was told committed

    def tick(self) -> None:
        self.raft.doTick(0)

    def propose(self, broker: str) -> None:
        def finished(_result: Any, reason: int) -> None:
            if reason == FAIL_REASON.SUCCESS:
                self.acked.append(broker)

        self.store.apply(registration(broker), callback=finished)
        self.tick()

    def journaled(self, broker: str) -> bytes:
        """The journal's form of proposing ``broker``: a call of MetadataStore.apply."""
        store = id(self.store)
        method = self.raft._methodToID[(store, self.raft._getFuncName((store, "apply")))]
        return bytes([REGULAR_COMMAND]) + pysyncobj_pickle.dumps((method, (registration(broker),)))

    def heartbeat(self) -> None:
        self.raft._SyncObj__newAppendEntriesTime = 0
        self.tick()

    def campaign(self) -> None:
        self.raft._SyncObj__raftElectionDeadline = 0
        self.tick()

    @property
    def log(self) -> list[tuple[int, int]]:
        """(index, term) of every entry in the journal."""
        journal = self.raft._SyncObj__raftLog
        return [(journal[i][1], journal[i][2]) for i in range(len(journal))]

    @property
    def brokers(self) -> list[str]:
        return sorted(self.store.state.brokers)


class Network:
    def __init__(self, count: int, dump_dir: Path | None = None, batch_bytes: int = ENTRY_SIZE + 1) -> None:
        addresses = [f"127.0.0.1:{1001 + i}" for i in range(count)]
        self.members = [
            Member(address, [a for a in addresses if a != address],
                   None if dump_dir is None else str(dump_dir / f"dump-{i}"), batch_bytes)
            for i, address in enumerate(addresses)
        ]

    def inject(self, source: Member, target: Member, message: dict[str, Any]) -> None:
        """``message`` as if ``source`` had sent it."""
        target.links._onMessageReceived(target.links.peers[source.address], message)
        target.tick()

    def deliver(self, source: Member, target: Member, count: int | None = None) -> None:
        """The first ``count`` (all if None) messages queued from source to target, in order."""
        queue = source.links.queued[target.address]
        for _ in range(len(queue) if count is None else count):
            target.links._onMessageReceived(target.links.peers[source.address], queue.pop(0))
        target.tick()

    def drop(self, source: Member, target: Member) -> None:
        source.links.queued[target.address].clear()

    def settle(self, *members: Member) -> None:
        """Deliver among ``members`` until none of them has anything to say to another."""
        while any(source.links.queued[target.address] for source in members for target in members
                  if source is not target):
            for source in members:
                for target in members:
                    if source is not target:
                        self.deliver(source, target)

    def heal(self) -> None:
        """Every link open again: drop what was held, then heartbeats and deliveries until the leaders'
        refusals have walked every follower back to where its log matches."""
        for source in self.members:
            for target in self.members:
                if source is not target:
                    self.drop(source, target)
        for _ in range(HEAL_ROUNDS):
            for member in self.members:
                if member.raft._isLeader():
                    member.heartbeat()
            self.settle(*self.members)

    def elect(self, candidate: Member, *voters: Member) -> None:
        term = candidate.raft.raftCurrentTerm
        candidate.campaign()
        for voter in voters:
            self.deliver(candidate, voter)
            self.deliver(voter, candidate)
        assert candidate.raft._isLeader() and candidate.raft.raftCurrentTerm > term


def registration(broker: str) -> bytes:
    return encode_command(RegisterBroker(id=broker, host="h", port=1, raft="r"))


def _conf(dump_file: str | None, batch_bytes: int) -> SyncObjConf:
    return SyncObjConf(
        autoTick=False,
        fullDumpFile=dump_file,
        useFork=False,
        dynamicMembershipChange=True,
        appendEntriesUseBatch=False,
        # By default two of the tests' commands per AppendEntries (one alone is under the batch size):
        # a resend takes several messages, as one of big commands does with bigger batches.
        appendEntriesBatchSizeBytes=batch_bytes,
        appendEntriesPeriod=FAR,
        raftMinTimeout=4 * FAR,
        raftMaxTimeout=5 * FAR,
        connectionTimeout=5 * FAR,
        leaderFallbackTimeout=10 * FAR,
    )
