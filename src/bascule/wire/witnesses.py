"""How many ISR followers must report a partition leader before the metadata leader replaces it.

One rule with two readers: the metadata leader's election (bascule.metadata.election), and a
partition leader's lease (bascule.partition.replication.lease), which must never outlast the moment
enough followers could have reported it.
"""

from __future__ import annotations

from collections.abc import Collection


def witness_quorum(isr: Collection[str], leader: str) -> int:
    """Distinct witnesses needed: a majority of the ISR without the leader (1 of 1, 2 of 2,
    2 of 3...). 0 followers gives 1, which no report can reach: such a leader's failure must be
    detected some other way (broker liveness)."""
    return reports_needed(len(frozenset(isr) - {leader}))


def reports_needed(followers: int) -> int:
    """Witness reports that replace a leader with ``followers`` ISR followers."""
    return followers // 2 + 1
