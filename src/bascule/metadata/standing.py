"""Whether this node may lead the metadata Raft group, or stand for its election (pure; issue 25).

Raft runs on TCP links of its own, but the requests the metadata leader serves (ISR changes, failure reports,
forwarded API calls) come over NATS. A leader that Raft can reach but NATS cannot keeps its leadership and
answers none of them, which stalls every write that needs one. So a node stands (leads, or stands for
election) only while it is in two-way contact over NATS with a majority of the voters, itself included: it
heard a voter's heartbeat within the contact timeout, and that heartbeat said the voter heard this node.
A lone voter is a majority of one and always stands; a NATS outage that reaches every node leaves none
standing, and the group elects again once NATS is back.
"""

from __future__ import annotations

import math
from collections.abc import Collection


class NatsContact:
    """The voters (by Raft address) this node heard over NATS, and when; ``now`` is a monotonic clock reading.

    Only voters are kept, so the tables are as large as the Raft group.
    """

    def __init__(self, me: str, timeout: float) -> None:
        self.me = me
        self.timeout = timeout
        self._heard: dict[str, float] = {}  # voter -> when its last heartbeat came
        self._heard_us: dict[str, float] = {}  # voter -> when its last heartbeat naming this node came
        self._joined: dict[str, float] = {}  # node -> when this node admitted it to the group

    def joined(self, node: str, now: float) -> None:
        """``node`` asked to join the group over NATS and this node, the leader, answers it the same way:
        contact both ways, as a heartbeat naming this node would be. Without it, a lone leader that admits
        a second voter would stop standing until the newcomer's heartbeats come (a second or so: the
        newcomer starts them once answered), and lose its leadership, and the joins behind, for nothing."""
        self._joined[node] = now
        self._heard[node] = self._heard_us[node] = now

    def heartbeat(self, sender: str, heard: Collection[str], voters: Collection[str], now: float) -> None:
        """``sender``'s heartbeat came, naming the voters it heard (``heard``)."""
        self._joined = {node: when for node, when in self._joined.items() if now - when <= self.timeout}
        kept = set(voters) | self._joined.keys()  # a node admitted just now may not be a voter here yet
        for table in (self._heard, self._heard_us):
            for gone in table.keys() - kept:
                del table[gone]
        if sender == self.me or sender not in voters:
            return
        self._heard[sender] = now
        if self.me in heard:
            self._heard_us[sender] = now

    def heard(self, now: float) -> list[str]:
        """The voters heard within the timeout: what this node's own heartbeat names."""
        return sorted(voter for voter, when in self._heard.items() if now - when <= self.timeout)

    def standing_until(self, voters: Collection[str]) -> float:
        """Until when (a monotonic reading) this node may lead or stand, unless it hears more: +inf for a lone
        voter, -inf for a node that is no voter or hears too few."""
        if self.me not in voters:
            return -math.inf
        needed = len(voters) // 2  # the others that make a majority with this node
        if needed == 0:
            return math.inf
        contacts = sorted((self._heard_us[v] for v in voters if v in self._heard_us and v != self.me), reverse=True)
        if len(contacts) < needed:
            return -math.inf
        return contacts[needed - 1] + self.timeout


def loop_alive(seen: float, now: float, limit: float) -> bool:
    """Whether a node whose event loop last ran at ``seen`` (monotonic) still heartbeats at ``now``: its loop
    may run late, by a failover's load, but one that has not run for ``limit`` is stuck, and a node that
    serves nothing must not keep, or take, the metadata leadership."""
    return now - seen < limit
