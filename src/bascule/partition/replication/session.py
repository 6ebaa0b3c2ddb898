"""Fetch sessions (pure): when a parked follower must fetch.

A follower that is caught up parks its partition in the fetch session to the partition's
leader node: one request per round carries every parked partition of that node pair (Kafka's
fetch sessions, KIP-227, in spirit), and the leader treats each item as the fetch it stands
for (the follower's position, for the ISR and the lease) without reading its log. Only the
items with news come back, and only their followers fetch on their own.
"""

from __future__ import annotations


def has_news(offset: int, follower_hw: int, leader_log_end: int, leader_hw: int, log_start: int) -> bool:
    """Whether a follower at log end ``offset`` with HW ``follower_hw`` has something to fetch:
    entries past its end, a log that starts past it (retention: it restarts there), or an HW it
    would take (the leader's, up to its own last offset)."""
    if offset < log_start or leader_log_end > offset:
        return True
    return min(leader_hw, offset - 1) > follower_hw
