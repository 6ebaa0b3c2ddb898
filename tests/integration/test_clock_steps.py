"""Wall-clock steps on one node of a real 3-node cluster (issue 25): it keeps hearing and being heard.

Node 2 runs under libfaketime (Debian's faketime package; `make faketime` installs it), preloaded into
its process: the wall clock (CLOCK_REALTIME) it reads is shifted by the offset in a file the test
rewrites while it runs, as an NTP step or a VM resume shifts it, and CLOCK_MONOTONIC is left alone, as
a step leaves it. The node starts 7 minutes behind its peers, steps 15 minutes ahead, then an hour
back; a peer restarts and so does node 2, each a new incarnation its peers first see across the
disagreement. Acked writes keep succeeding, node 2 stays in the ISR, metadata requests it forwards are
served, and no node drops a sealed message (wire.seal compares no wall clocks between running
processes, and tolerates a day's disagreement on a first sighting).
"""

from __future__ import annotations

import asyncio
import re
import time
from datetime import datetime
from pathlib import Path

import pytest
from cluster_checks import ALL_NODES, FAST, check_live, converged, create_stream, restart, running_publisher, wait_for

from bascule.client import Client
from bascule.testing.clock import SteppedClock, stepped_clock_unavailable_reason
from bascule.testing.local import LocalCluster

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.cluster,
    pytest.mark.timeout(150),
    pytest.mark.skipif(stepped_clock_unavailable_reason() is not None, reason=str(stepped_clock_unavailable_reason())),
]

STEPPED = 2
LOG_TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")


def newest_logged_time(log: Path) -> float | None:
    """When the node wrote its newest log line, by its own wall clock (the log's local time)."""
    stamped = [line[:23] for line in log.read_text().splitlines() if LOG_TIME.match(line)]
    return datetime.strptime(stamped[-1], "%Y-%m-%d %H:%M:%S,%f").timestamp() if stamped else None


async def make_it_log(address: str) -> None:
    """Have the node write a log line now: at debug, it logs each connection that ends in an HTTP/2
    error (here, one that is not HTTP/2 at all)."""
    host, port = address.rsplit(":", 1)
    _, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"not HTTP/2\r\n\r\n" * 3)
    await writer.drain()
    writer.close()


async def step_clock(cluster: LocalCluster, clock: SteppedClock, offset_s: int) -> None:
    """Step node 2's wall clock to ``offset_s`` from ours, and wait until its log shows it."""
    await asyncio.to_thread(clock.step, offset_s)
    log = cluster.node(STEPPED).log_path

    async def stepped() -> bool:
        await make_it_log(cluster.node(STEPPED).address)
        logged = newest_logged_time(log)
        return logged is not None and abs(logged - time.time() - offset_s) < 3

    await wait_for(stepped, 15, f"node {STEPPED}'s clock to read {offset_s:+d} s", cluster)


async def create_through(cluster: LocalCluster, index: int, stream: str) -> None:
    """A metadata request the node forwards to the metadata leader over sealed NATS (unless it leads)."""
    async with Client(cluster.node(index).address) as client:
        await client.create_stream(stream, f"{stream}.in", replication_factor=3, min_isr=2)
    await wait_for(lambda: converged(cluster, stream, ALL_NODES), 15, f"{stream}: a leader and a full ISR", cluster)


async def test_a_node_whose_wall_clock_steps_keeps_replicating_and_serving_metadata(tmp_path) -> None:
    clock = SteppedClock(tmp_path / "node-2-clock", -420)
    cluster = LocalCluster(3, config=FAST, base_dir=tmp_path / "cluster")
    cluster.node(STEPPED).extra_env.update(clock.env())
    cluster.node(STEPPED).level = "debug"  # log lines often enough to read its clock from
    with cluster:
        await create_stream(cluster, "steps")  # node 2 in the ISR: heard 7 minutes behind
        await step_clock(cluster, clock, -420)
        await create_through(cluster, STEPPED, "probe-behind")
        async with running_publisher(cluster, "steps") as load:
            await load.wait_acks(5, 10)
            for offset_s, probe in ((900, "probe-ahead"), (-3600, "probe-hour-back")):
                await step_clock(cluster, clock, offset_s)
                await create_through(cluster, STEPPED, probe)
                await load.wait_acks(10, 10)
                await wait_for(lambda: converged(cluster, "steps", ALL_NODES), 15, "steps: a full ISR", cluster)
            for index in (0, STEPPED):  # new incarnations, first seen across an hour's disagreement
                cluster.kill(index)
                await restart(cluster, index)
                await load.wait_acks(10, 15)
                await wait_for(lambda: converged(cluster, "steps", ALL_NODES), 20, "steps: a full ISR", cluster)
            await step_clock(cluster, clock, -3600)
            await create_through(cluster, STEPPED, "probe-restarted")
        await check_live(cluster, "steps", load.acked)
        assert not load.conflicts, load.conflicts
        for node in cluster.nodes:
            dropped = [line for line in node.log_path.read_text().splitlines() if "dropped a message on" in line]
            assert not dropped, f"{node.server_id} dropped sealed messages: {dropped[:3]}"
