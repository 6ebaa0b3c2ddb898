"""A node's start when NATS is out of reach (issue 28): a bounded, logged retry that SIGTERM
interrupts, then a clear exit, as Liftbridge's "failed to connect to NATS"."""

from __future__ import annotations

import asyncio
import time

import pytest

from bascule.testing.local import LocalNode
from bascule.testing.ports import free_port

pytestmark = [pytest.mark.timeout(60)]


def exited_within(node: LocalNode, seconds: float) -> float:
    """The seconds the node's process took to exit (failing the test beyond ``seconds``)."""
    started = time.monotonic()
    while node.running:
        assert time.monotonic() - started < seconds, f"still running after {seconds} s:\n{node.log_tail()}"
        time.sleep(0.05)
    return time.monotonic() - started


def test_a_node_that_cannot_reach_nats_gives_up_after_the_connect_timeout_naming_the_servers(tmp_path):
    nowhere = f"nats://127.0.0.1:{free_port()}"
    node = LocalNode(tmp_path / "node", nats_servers=nowhere, raft_bootstrap_seed=True,
                     config={"nats.connect.timeout": "3s"})
    try:
        node.start(wait=False)
        exited_within(node, 15)
        assert node.returncode == 1
        log = node.log_tail(20)
        assert f"cannot reach NATS at {nowhere} after 3 s" in log and "nats.connect.timeout" in log, log
        assert log.count("cannot reach NATS yet") <= 2, log  # told now and then, not at each attempt
        assert "ERROR" not in log, log
    finally:
        node.kill()


def test_sigterm_stops_a_node_waiting_for_nats(tmp_path):
    node = LocalNode(tmp_path / "node", nats_servers=f"nats://127.0.0.1:{free_port()}", raft_bootstrap_seed=True,
                     config={"nats.connect.timeout": "60s"})
    try:
        node.start(wait=False)
        time.sleep(2.0)
        assert node.running
        started = time.monotonic()
        node.stop(grace=5.0)  # SIGTERM, and SIGKILL after 5 s
        assert node.returncode == 0 and time.monotonic() - started < 5.0
        assert "stopped while starting" in node.log_tail(20)
    finally:
        node.kill()


def test_nodes_stopped_together_with_their_nats_exit_cleanly(tmp_path):
    """systemd or compose stops everything at once: NATS going away while a node closes its connection
    (replication traffic still queued) is no failure of the node's stop. Three tries: it failed most
    stops before nats-py's ConnectionResetError on close was taken for what it is."""
    from bascule.testing import LocalCluster

    for attempt in range(3):
        cluster = LocalCluster(3, base_dir=tmp_path / f"try{attempt}").start()
        try:
            asyncio.run(_replicated_stream(cluster.brokers))
            time.sleep(0.5)
            for process in [cluster.nats, *cluster.nodes]:
                process._terminate()
            for node in cluster.nodes:
                node._finish_stop(time.monotonic() + 10)
                assert node.returncode == 0, node.log_tail(300)  # with the slow stop's report of where it hung
        finally:
            cluster.kill_all()


async def _replicated_stream(brokers: list[str], replication_factor: int = 3) -> None:
    from bascule.client import Client

    async with Client(brokers) as client:
        await client.create_stream("orders", "orders.in", replication_factor=replication_factor)


def test_a_nats_outage_and_a_stop_after_it_are_told_as_warnings_now_and_then(tmp_path):
    """nats-py reports every reconnect attempt, twice a second: an outage of a few seconds was a screen of
    ERROR lines, and so was every stop where NATS went first."""
    from bascule.testing import LocalCluster

    cluster = LocalCluster(1, base_dir=tmp_path / "cluster").start()
    try:
        cluster.restart_nats(down_time=4.0)
        asyncio.run(_replicated_stream(cluster.brokers, replication_factor=1))  # serving again
        cluster.nats.stop()
        node = cluster.nodes[0]
        node.stop(grace=10)
        log = node.log_tail(200)
        assert node.returncode == 0, log
        assert "ERROR" not in log, log
        assert 1 <= log.count("NATS connection lost or not yet back") <= 3, log
    finally:
        cluster.kill_all()
