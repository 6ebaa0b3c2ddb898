"""Replica placement: which brokers hold each new partition, and which leads it.

Fewest-partitions-first keeps replicas spread evenly; the leader is the chosen
replica leading the fewest partitions, so leadership spreads too. Ties break on
the broker id, so the same inputs always give the same placement.
"""

from __future__ import annotations


class PlacementError(ValueError):
    pass


def replica_count(replication_factor: int, broker_count: int) -> int:
    if replication_factor == -1:
        return broker_count
    if replication_factor == 0:
        return 1
    if replication_factor < -1:
        raise PlacementError(f"Invalid replicationFactor {replication_factor}")  # Liftbridge's words, as below
    if replication_factor > broker_count:
        raise PlacementError(f"Invalid replicationFactor {replication_factor}, cluster size {broker_count}")
    return replication_factor


def place(
    brokers: list[str],
    replicas_per_broker: dict[str, int],
    leaders_per_broker: dict[str, int],
    replication_factor: int,
    partitions: int,
) -> list[list[str]]:
    """Replica lists, leader first, one per partition."""
    if not brokers:
        raise PlacementError("no brokers available")
    count = replica_count(replication_factor, len(brokers))
    load = {b: replicas_per_broker.get(b, 0) for b in brokers}
    leading = {b: leaders_per_broker.get(b, 0) for b in brokers}
    placements = []
    for _ in range(partitions):
        chosen = sorted(brokers, key=lambda b: (load[b], b))[:count]
        leader = min(chosen, key=lambda b: (leading[b], load[b], b))
        for b in chosen:
            load[b] += 1
        leading[leader] += 1
        placements.append([leader] + [b for b in chosen if b != leader])
    return placements
