"""Liftbridge's consumer groups, as pure rules: the group value the metadata keeps, the balanced
partition assignment, the choice of a coordinator, and the witness rule that moves a group to a
new coordinator once enough of its members report the old one.

Nothing here reads a clock or does I/O: times are arguments, so the rules are tested alone.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

# Liftbridge's words: its clients show them, and some match on them.
GROUP_NOT_FOUND = "consumer group does not exist"
ALREADY_MEMBER = "consumer is already a member of the consumer group"
NOT_MEMBER = "consumer is not a member of the consumer group"
NOT_COORDINATOR = "broker is not the consumer group coordinator"
EPOCH_DIFFERS = "client-provided group epoch differs from broker group epoch"
NOT_ASSIGNED = "Consumer is not currently assigned this partition"

# stream -> assigned partition ids, ascending
Assignment = dict[str, tuple[int, ...]]


@dataclass(frozen=True)
class ConsumerGroup:
    id: str
    coordinator: str  # the broker that serves the group's assignments and watches its members
    # Bumps on every change of the coordinator or of the assignments (Liftbridge: the Raft index of
    # the change; bascule: the metadata version), so a consumer holding an older one is stale.
    epoch: int
    members: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # consumer -> streams, sorted


def assignments(group: ConsumerGroup, partition_counts: Mapping[str, int]) -> dict[str, Assignment]:
    """Every member's partitions: each stream's partitions spread over the members subscribed to
    it, each partition to the member with the fewest assigned so far (over all streams, ties to the
    smaller consumer id), streams taken in name order. A pure function of the group and the
    streams' sizes, so every node computes the same assignment for the same epoch.

    Liftbridge balances the same way but incrementally, so its result also depends on the order
    in which the members joined; any node here agrees without that history."""
    result: dict[str, Assignment] = {consumer: {} for consumer in group.members}
    counts = dict.fromkeys(group.members, 0)
    subscribers: dict[str, list[str]] = {}
    for consumer, streams in group.members.items():
        for stream in streams:
            subscribers.setdefault(stream, []).append(consumer)
    for stream in sorted(subscribers):
        given: dict[str, list[int]] = {}
        for partition in range(partition_counts.get(stream, 0)):
            consumer = min(subscribers[stream], key=lambda c: (counts[c], c))
            given.setdefault(consumer, []).append(partition)
            counts[consumer] += 1
        for consumer, partitions in given.items():
            result[consumer][stream] = tuple(partitions)
    return result


def choose_coordinator(groups: Iterable[ConsumerGroup], candidates: Collection[str]) -> str | None:
    """The candidate coordinating the fewest groups (ties to the smaller id), None without any."""
    load = dict.fromkeys(candidates, 0)
    for group in groups:
        if group.coordinator in load:
            load[group.coordinator] += 1
    return min(load, key=lambda broker: (load[broker], broker), default=None)


@dataclass
class _Reports:
    coordinator: str
    epoch: int
    witnesses: set[str]
    last: float


class CoordinatorReports:
    """Liftbridge's coordinator failover: members report the coordinator they cannot reach; once
    more than half of the group's members reported the same coordinator and epoch, each within the
    timeout of the previous report, the group moves. Reports of another coordinator or epoch start
    over; reports older than the timeout are forgotten."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._reports: dict[str, _Reports] = {}

    def report(self, group: ConsumerGroup, consumer: str, now: float) -> bool:
        """Count ``consumer``'s report against ``group``'s current coordinator; True when the group
        should move now (its reports are then forgotten)."""
        found = self._reports.get(group.id)
        if found is None or (found.coordinator, found.epoch) != (group.coordinator, group.epoch) \
                or now - found.last > self.timeout:
            found = self._reports[group.id] = _Reports(group.coordinator, group.epoch, set(), now)
        found.witnesses.add(consumer)
        found.last = now
        if len(found.witnesses) > len(group.members) // 2:
            del self._reports[group.id]
            return True
        return False

    def forget(self, group_id: str) -> None:
        self._reports.pop(group_id, None)


def subscription_error(
    group: ConsumerGroup | None, consumer: str, epoch: int, assigned: Assignment, stream: str, partition: int,
) -> str | None:
    """Why ``consumer`` of ``group`` may not read ``stream``/``partition`` with ``epoch``, or None.

    bascule's fencing, beyond Liftbridge (which only lets a newer epoch displace the group's reader
    of the partition): the consumer must be a member, hold the group's current epoch, and have the
    partition among its assignments, so a consumer that missed a rebalance cannot start reading."""
    if group is None:
        return GROUP_NOT_FOUND
    if consumer not in group.members:
        return NOT_MEMBER
    if epoch != group.epoch or partition not in assigned.get(stream, ()):
        return NOT_ASSIGNED
    return None
