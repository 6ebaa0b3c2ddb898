"""A metadata command bigger than pysyncobj's default AppendEntries batch (64 KiB), such as a
CreateStream of a few thousand partitions, on the real pysyncobj code (tests/unit/raft_network.py).

pysyncobj sends an entry bigger than a batch in pieces and tags as the last one the piece that
reaches the command's length, not the pickled entry's: an entry whose size falls in between
arrived cut, and the follower's every tick failed on it from then on (seen with 4,096 partitions).
bascule's batches (raft.APPEND_BATCH_BYTES) hold any command it proposes, so none is split.
"""

from __future__ import annotations

import pickle

import pysyncobj.pickle as pysyncobj_pickle
import pytest
from raft_network import Member, Network

from bascule.metadata.raft import APPEND_BATCH_BYTES, MAX_COMMAND_BYTES
from bascule.metadata.raft_fixes import REGULAR_COMMAND
from bascule.wire.commands import CreateStream, encode_command

PYSYNCOBJ_BATCH = 1 << 16  # pysyncobj's default appendEntriesBatchSizeBytes


def journaled(member: Member, command: bytes) -> bytes:
    store = id(member.store)
    method = member.raft._methodToID[(store, member.raft._getFuncName((store, "apply")))]
    return bytes([REGULAR_COMMAND]) + pysyncobj_pickle.dumps((method, (command,)))


def command_in_the_gap(member: Member) -> bytes:
    """A CreateStream whose journaled form ends just short of two pieces and whose pickled entry
    (with its index and term) does not: the piece tagged last is not the last one. Up to 1,024
    partitions on brokers with ids as long as a Kubernetes pod's DNS name."""
    brokers = [f"bascule-{i}-bascule-streaming-svc-cluster-local" for i in range(3)]

    def create(partitions: int, padding: int) -> bytes:
        return encode_command(CreateStream(
            name="big", subject="s" * padding, group="", created=1, settings={}, replicas=[brokers] * partitions,
        ))

    limit = 2 * PYSYNCOBJ_BATCH
    # The largest stream whose entry fits two pieces with a one-character subject; each character
    # more adds a byte (subjects of 32 to 255 characters share one msgpack length form).
    low, high = 800, 1024  # the entry of ``low`` partitions fits, of ``high`` not
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if len(journaled(member, create(middle, 40))) <= limit else (low, middle)
    partitions = low
    for padding in range(40, 256):
        command = create(partitions, padding)
        entry = journaled(member, command)
        if len(entry) <= limit < len(pickle.dumps((entry, 10**6, 10**3))):
            return command
    raise AssertionError("no stream puts the entry in the gap")


def propose_and_settle(net: Network, command: bytes) -> None:
    leader = net.members[0]
    net.elect(leader, *net.members[1:])
    net.settle(*net.members)
    leader.store.apply(command, callback=lambda *_: None)
    leader.tick()
    net.settle(*net.members)
    leader.heartbeat()
    net.settle(*net.members)


def test_with_pysyncobj_s_own_batches_such_an_entry_arrives_cut() -> None:
    net = Network(3, batch_bytes=PYSYNCOBJ_BATCH)
    with pytest.raises((pickle.UnpicklingError, UnicodeDecodeError, EOFError)):
        propose_and_settle(net, command_in_the_gap(net.members[0]))


def test_bascule_s_batches_carry_it_whole_to_every_member() -> None:
    assert APPEND_BATCH_BYTES >= MAX_COMMAND_BYTES
    net = Network(3, batch_bytes=APPEND_BATCH_BYTES)
    propose_and_settle(net, command_in_the_gap(net.members[0]))
    assert all("big" in member.store.state.streams for member in net.members)
