"""A node's start when NATS is out of reach (issue 28): a bounded, logged retry that SIGTERM
interrupts, then a clear exit, as Liftbridge's "failed to connect to NATS"."""

from __future__ import annotations

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
