"""Controlled shutdown, as Kafka's: before a node stops, each partition it leads moves to its best
ISR member, so that writers fail over at once instead of after the leader timeout, and it leaves
the ISRs of the partitions it follows, so that their leaders commit without waiting for it.

The successor is chosen by the election rule (``metadata.election.choose_leader``) from the
positions the other replicas report, and this node leaves the ISR with the change: the new leader
does not wait for a replica that is about to go. What this leader appended that the successor
lacks was never acknowledged with ack ALL (it was not committed), so nothing acked that way is lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Any, Protocol

from bascule.metadata.election import Candidate, choose_leader, isr_after_leader_change
from bascule.metadata.raft import MetadataError, NoMetadataLeader
from bascule.metadata.state import MetadataState, Partition

log = logging.getLogger(__name__)

ReplicaReports = dict[str, dict[str, tuple[int, int, int]]]  # broker -> "stream/partition" -> report
Call = Callable[..., Awaitable[None]]


class GatherReports(Protocol):
    """The reports of the brokers ``expected`` that answer within ``timeout``, of the ``partitions``
    named ("stream/partition"; None: every replica), as ``AdminQueries.gather_replica_reports``."""

    def __call__(
        self, timeout: float, expected: set[str], partitions: Collection[str] | None = None,
    ) -> Awaitable[ReplicaReports]: ...


def partitions_to_hand_off(state: MetadataState, server_id: str) -> list[Partition]:
    """The partitions this node leads that another ISR member could take over."""
    return [
        partition
        for stream in state.streams.values()
        for partition in stream.partitions.values()
        if partition.leader == server_id and len(partition.isr) > 1
    ]


def partitions_to_leave(state: MetadataState, server_id: str) -> list[Partition]:
    """The partitions this node follows in the ISR: it leaves their ISRs, so that their leaders
    do not hold ack-ALL writes for it until the lag time runs out."""
    return [
        partition
        for stream in state.streams.values()
        for partition in stream.partitions.values()
        if partition.leader != server_id and server_id in partition.isr
    ]


def successor(partition: Partition, server_id: str, reports: ReplicaReports) -> str | None:
    """The ISR member to lead ``partition`` next, by the election rule; None when no other ISR
    member reported the partition."""
    key = f"{partition.stream}/{partition.id}"
    candidates = [
        Candidate(broker, report[key][2], report[key][0])
        for broker, report in reports.items() if key in report
    ]
    return choose_leader(candidates, partition.isr, exclude={server_id}, unclean=partition.unclean)


async def hand_off_leaderships(
    server_id: str, state: Callable[[], MetadataState], call: Call, gather: GatherReports, timeout: float,
) -> int:
    """Move every partition this node leads to a successor and leave the ISRs of those it follows,
    within ``timeout``; how many partitions moved."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    await _leave_isrs(server_id, partitions_to_leave(state(), server_id), call, deadline)
    led = partitions_to_hand_off(state(), server_id)
    if not led:
        return 0
    others = {member for partition in led for member in partition.isr if member != server_id}
    names = [f"{partition.stream}/{partition.id}" for partition in led]
    reports = await gather(max(0.1, min(1.0, deadline - loop.time())), others, names)
    moved = 0
    for partition in led:
        remaining = deadline - loop.time()
        if remaining > 0 and await move_leadership(partition, server_id, reports, call, remaining):
            moved += 1
    log.info("handed %d of %d partitions to other ISR members before stopping", moved, len(led))
    return moved


async def move_leadership(
    partition: Partition, server_id: str, reports: ReplicaReports, call: Call, timeout: float,
) -> str | None:
    """Make the successor of this node (by ``reports``) lead ``partition``, this node leaving
    the ISR with the change; the successor, or None when there is none or the change failed."""
    chosen = successor(partition, server_id, reports)
    if chosen is None:
        return None
    change: dict[str, Any] = {
        "name": partition.stream, "partition": partition.id, "leader": chosen,
        "leader_epoch": partition.leader_epoch, "epoch": partition.epoch,
        "isr": sorted(isr_after_leader_change(partition.isr, server_id, chosen)),
    }
    try:
        await asyncio.wait_for(call("change_leader", **change), timeout)
    except (MetadataError, NoMetadataLeader, TimeoutError) as exc:
        log.warning("%s/%s stays led here: %r", partition.stream, partition.id, exc)
        return None
    return chosen


async def _leave_isrs(server_id: str, followed: list[Partition], call: Call, deadline: float) -> None:
    loop = asyncio.get_running_loop()
    for partition in followed:
        remaining = deadline - loop.time()
        if remaining <= 0:
            return
        try:
            await asyncio.wait_for(call(
                "change_isr", name=partition.stream, partition=partition.id, replica=server_id, add=False,
                leader=partition.leader, leader_epoch=partition.leader_epoch, epoch=partition.epoch,
            ), remaining)
        except (MetadataError, NoMetadataLeader, TimeoutError) as exc:
            log.info("%s/%s: this node stays in the ISR until it stops: %r", partition.stream, partition.id, exc)
