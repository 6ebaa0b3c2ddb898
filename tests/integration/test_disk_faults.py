"""Disk faults on a real 3-node cluster (issue 25): a partition leader whose disk fills up, or whose
fsyncs fail, hands leadership to another ISR member within about a leader timeout, and comes back as
a follower without a restart once its disk works again. The faults are the power-cut disk's
(``LocalCluster.disk_faults``), limited to the partition logs (``/streams``), as a separate log
directory would be.

The checks are those of test_cluster_faults.py: every message acked under ALL is readable at its
offset, offsets are contiguous, and the replicas agree.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from cluster_checks import (
    ALL_NODES,
    FAST,
    check_live,
    converged,
    create_stream,
    leader_index,
    new_leader,
    running_publisher,
    wait_for,
)

from bascule.testing.local import LocalCluster
from bascule.testing.powercut import fuse_unavailable_reason

pytestmark = [pytest.mark.anyio, pytest.mark.cluster, pytest.mark.timeout(120)]

LOGS = "/streams"


@pytest.fixture
def needs_fuse() -> None:
    reason = fuse_unavailable_reason()
    if reason is not None:
        pytest.skip(f"disk faults need a FUSE mount: {reason}")


@pytest.mark.parametrize(("sync", "fault"), [("never", {"full": True}), ("always", {"fsync_error": True})],
                         ids=["full disk", "failing fsync"])
async def test_a_leader_whose_disk_fails_hands_over_and_returns_once_it_works(needs_fuse, sync, fault) -> None:
    config = {**FAST, "streams.sync": sync}
    with LocalCluster(3, config=config, power_cuts=True) as cluster:
        await create_stream(cluster, "disk")
        async with running_publisher(cluster, "disk", batch=10) as load:
            await load.wait_acks(5, 10)
            leader = await leader_index(cluster, "disk")
            await asyncio.to_thread(cluster.disk_faults, leader, prefix=LOGS, **fault)
            faulted_at = time.monotonic()
            await new_leader(cluster, "disk", ALL_NODES, cluster.node(leader).server_id, timeout=15)
            moved_after = time.monotonic() - faulted_at
            await load.wait_acks(10, 15)
            await asyncio.to_thread(cluster.disk_faults, leader)
            await wait_for(lambda: converged(cluster, "disk", ALL_NODES), 30,
                           f"{cluster.node(leader).server_id} to rejoin the ISR once its disk works", cluster)
            await load.wait_acks(5, 10)
        print(f"{sync}, {fault}: leadership moved {moved_after:.1f} s after the fault; {len(load.acked)} acked, "
              f"{load.failures} failed batches {dict(load.errors)}")
        assert not load.conflicts, load.conflicts[:5]
        await check_live(cluster, "disk", load.acked)

