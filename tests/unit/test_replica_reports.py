"""Replica reports (node.admin): a request may name the partitions it wants, and each broker then
reports those only (issue 32: elections and CreateStream's wait had every broker report every one of
its replicas, thousands of them, at each election and every 20 ms of a wait)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import msgpack
import pytest

from bascule.node.admin import AdminQueries
from bascule.testing.bus import MemoryBus
from bascule.wire.subjects import Subjects

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(10)]

SUBJECTS = Subjects("bascule")
PARTITIONS = 1000


class Replica:
    """What a report reads of a replica; ``reads`` counts the reports it went into."""

    closed = False
    failed = None
    high_watermark = 4
    oldest_offset = 0

    def __init__(self) -> None:
        self.reads = 0
        self.log = SimpleNamespace(size_bytes=100)

    def position(self) -> tuple[int, int]:
        self.reads += 1
        return 1, 5


class Partitions:
    def __init__(self) -> None:
        self.local = {("s", p): SimpleNamespace(replica=Replica(), started=True) for p in range(PARTITIONS)}

    def registered(self) -> bool:
        return True

    def items(self):
        return list(self.local.items())

    def get(self, stream: str, partition: int):
        return self.local.get((stream, partition))


async def brokers(bus: MemoryBus) -> dict[str, tuple[AdminQueries, Partitions]]:
    state = SimpleNamespace(brokers={"a": None, "b": None})
    found = {}
    for name in state.brokers:
        partitions = Partitions()
        queries = AdminQueries(name, bus.node(name), SUBJECTS, SimpleNamespace(state=state), partitions)
        await queries.start()
        found[name] = (queries, partitions)
    return found


async def test_a_request_naming_partitions_is_answered_with_those_only():
    bus = MemoryBus(seed=1)
    nodes = await brokers(bus)
    asking, _ = nodes["a"]
    reports = await asking.gather_replica_reports(1.0, {"a", "b"}, ["s/7", "s/999", "s/5000", "other/1"])
    assert reports == {broker: {"s/7": (5, 4, 1), "s/999": (5, 4, 1)} for broker in ("a", "b")}
    # Only the two named replicas were read on each broker, not its thousand.
    assert sum(local.replica.reads for _, partitions in nodes.values() for local in partitions.local.values()) == 4


async def test_a_request_naming_none_is_answered_with_every_replica_as_before():
    bus = MemoryBus(seed=1)
    nodes = await brokers(bus)
    reports = await nodes["a"][0].gather_replica_reports(1.0, {"a", "b"})
    assert {broker: len(report) for broker, report in reports.items()} == {"a": PARTITIONS, "b": PARTITIONS}
    # An earlier version's request: no body.
    inbox, answers = bus.node("c").new_inbox(), []

    async def take(msg) -> None:
        answers.append(msgpack.unpackb(msg.data, raw=False))

    await bus.node("c").subscribe(inbox, take)
    await bus.node("c").publish(SUBJECTS.admin_replicas, b"", reply=inbox)
    await asyncio.sleep(0.05)
    assert sorted(len(answer["replicas"]) for answer in answers) == [PARTITIONS, PARTITIONS]


async def test_a_malformed_request_is_dropped():
    bus = MemoryBus(seed=1)
    await brokers(bus)
    for garbage in (b"\xc1", msgpack.packb({"partitions": [1, 2]}), msgpack.packb([b"x"])):
        with pytest.raises(TimeoutError):
            await bus.node("c").request(SUBJECTS.admin_replicas, garbage, timeout=0.05)
