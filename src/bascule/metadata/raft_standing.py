"""pysyncobj 0.3.17 made to give up its leadership, and stand for no election, while this node lacks standing
(``metadata.standing``: two-way NATS contact with a majority of the voters).

pysyncobj has no such switch, so a tick callback (it runs on pysyncobj's tick thread, after the tick's election
check) does what its own leader fallback does (``_onTick``: the state set to follower, no known leader) and keeps
the election deadline a full Raft timeout ahead, so that the next ticks start no election from here. A leader
that steps down first asks the most caught-up connected follower to stand at once (pysyncobj's
``transferLeadership``, Raft's TimeoutNow), which saves the others their election timeout; if that follower has no
standing either it declines the same way, and the group elects again when NATS lets a node stand.

The verdict crosses threads as one float, the monotonic reading until which this node stands, written by the event
loop and read here: a loop that stops hearing heartbeats (stalled, or cut off) lets it run out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from pysyncobj import SyncObj
from pysyncobj.monotonic import monotonic
from pysyncobj.syncobj import _RAFT_STATE

log = logging.getLogger(__name__)


def stand_only_while(sync: SyncObj, standing_until: Callable[[], float]) -> None:
    """From now on, ``sync`` leads and stands for election only until ``standing_until()`` (monotonic seconds)."""

    def hold_back() -> None:
        if monotonic() < standing_until():
            return
        state = sync._SyncObj__raftState
        if state == _RAFT_STATE.LEADER:
            log.warning("giving up the metadata leadership: not in contact with a majority of the voters over NATS")
            sync.transferLeadership()
        if state != _RAFT_STATE.FOLLOWER:
            sync._SyncObj__setState(_RAFT_STATE.FOLLOWER)
            sync._SyncObj__raftLeader = None
        sync._SyncObj__raftElectionDeadline = monotonic() + sync.conf.raftMaxTimeout

    sync.addOnTickCallback(hold_back)
