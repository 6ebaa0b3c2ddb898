"""A partition leader's lease: until when no other replica can have been elected in its place.

A LEADER-policy ack names the offset a message got in this leader's log. Should a new leader have
been elected meanwhile (this one was paused, or cut off from its followers and the metadata, but
not from the publisher), the new leader may commit other messages at that offset, and the ack
would be a lie. Fencing by epoch (a follower's request of a newer epoch) stops such a leader only
once that request reaches it; a client's request may reach it first.

The metadata leader replaces a partition leader only when a quorum of its ISR followers reported
it (``witness_quorum``), and a follower reports only after hearing nothing from it for the leader
timeout. Each follower's fetch echoes the leader's clock reading carried by the newest response it
took (``heard``): it cannot report before that reading plus the leader timeout. So no election can
happen before enough of them could have reported; a write acked before then is acked by the only
leader there is.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping

from bascule.wire.witnesses import reports_needed

# The lease ends this fraction of a leader timeout after a follower's echoed reading: room for
# clocks that run at slightly different rates on the leader and its followers.
LEASE_FRACTION = 0.9


def lease_expiry(
    heard: Mapping[str, float | None],
    leader: str,
    isr: Collection[str],
    *,
    joining: Collection[str] = (),
    leaving: Collection[str] = (),
    leader_timeout: float,
) -> float:
    """The leader clock reading at which the metadata leader could first hold enough reports to
    replace ``leader``: ``math.inf`` when no report can ever count (no followers), ``-math.inf``
    when it could now.

    ``heard``: each follower's echoed reading (None or absent: it proved nothing yet). ``isr``: the
    ISR as this leader knows it; ``joining``: replicas whose expansion may have committed unseen;
    ``leaving``: members whose removal may have. The metadata may hold any ISR between those, and
    the lease holds for the worst of them: for each size, the one whose members heard the least.
    """
    known = {rid for rid in isr if rid != leader}
    maybe = {rid for rid in joining if rid not in known and rid != leader}
    maybe.update(rid for rid in leaving if rid in known)
    certain = sorted(_reading(heard, rid) for rid in known if rid not in maybe)
    optional = sorted(_reading(heard, rid) for rid in maybe)
    earliest = math.inf
    for extra in range(len(optional) + 1):
        followers = sorted(certain + optional[:extra]) if extra else certain
        if followers:
            earliest = min(earliest, followers[reports_needed(len(followers)) - 1])
    return earliest + LEASE_FRACTION * leader_timeout


def _reading(heard: Mapping[str, float | None], replica_id: str) -> float:
    reading = heard.get(replica_id)
    return -math.inf if reading is None else reading
