"""The maintenance's ISR requests (node.maintenance): a leader's request that this node's metadata
already refuses is settled here as the metadata leader would settle it, without asking it (issue 32: a
leader asks again every ISR check until its node's reconcile brings it the ISR it changed, and after a
SIGKILL at 10,000 partitions 37,000 such refusals each went through the metadata leader and into a
Raft command, which brought every node another reconcile)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from bascule.config import Config
from bascule.metadata.state import Partition
from bascule.node.maintenance import Maintenance
from bascule.partition.replication.leader import IsrOutcome, IsrRequest

KEY = ("s", 0)


class Replica:
    closed = False
    failed = None
    writes_failing = False
    stream, partition = KEY

    def __init__(self, requests: list[IsrRequest]) -> None:
        self.requests = requests
        self.done: list[tuple[IsrRequest, IsrOutcome]] = []

    def isr_requests(self) -> list[IsrRequest]:
        asked, self.requests = self.requests, []
        return asked

    def isr_request_done(self, request: IsrRequest, outcome: IsrOutcome) -> None:
        self.done.append((request, outcome))


def tend(partition: Partition, request: IsrRequest) -> tuple[Replica, list[str]]:
    replica = Replica([request])
    local = SimpleNamespace(replica=replica, endpoint=object())  # a leader: its endpoint serves
    partitions = SimpleNamespace(items=lambda: [(KEY, local)], unopened=lambda: [], schedule_reconcile=lambda: None)
    spawned: list[str] = []

    def spawn(work, name):
        work.close()
        spawned.append(name)

    raft = SimpleNamespace(state=SimpleNamespace(partition=lambda stream, pid: partition))
    metadata = SimpleNamespace(call=None, nc=SimpleNamespace(max_payload=1 << 20))
    maintenance = Maintenance(Config(), "a", raft, metadata, partitions, SimpleNamespace(spawn=spawn), None, None)
    asyncio.run(maintenance._tend_partitions())
    return replica, spawned


# The metadata after the leader's shrink of c committed: partition epoch 8, c out of the ISR.
SHRUNK = Partition("s", 0, replicas=("a", "b", "c"), leader="a", leader_epoch=3, epoch=8, isr=("a", "b"))


def test_a_request_made_on_a_partition_epoch_the_metadata_has_left_is_refused_here():
    again = IsrRequest("c", add=False, leader_epoch=3, partition_epoch=7)  # its reconcile has not come yet
    replica, spawned = tend(SHRUNK, again)
    assert spawned == [] and replica.done == [(again, IsrOutcome.REFUSED)]


def test_a_request_the_metadata_takes_goes_to_the_metadata_leader():
    shrink = IsrRequest("b", add=False, leader_epoch=3, partition_epoch=8)
    replica, spawned = tend(SHRUNK, shrink)
    assert spawned == ["change ISR"] and replica.done == []


def test_a_request_of_a_deposed_leader_or_a_gone_partition_is_refused_here():
    for partition in (None, Partition("s", 0, replicas=("a", "b", "c"), leader="b", leader_epoch=4, epoch=9,
                                      isr=("a", "b", "c"))):
        request = IsrRequest("c", add=True, leader_epoch=3, partition_epoch=8)
        replica, spawned = tend(partition, request)
        assert spawned == [] and replica.done == [(request, IsrOutcome.REFUSED)]
