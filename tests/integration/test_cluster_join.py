"""A cluster formed as the README's one-machine snippet forms it (issue 29): a seed and two nodes that join
through NATS, all started at once. The joiners used to take about 8 s after the seed served (a lone seed that
admitted the first joiner stopped leading until the newcomer's NATS heartbeats came, and the second join,
asked meanwhile, waited 5 s for an answer that never came); now all three are brokers within a few seconds,
and the seed never gives up its leadership."""

from __future__ import annotations

import secrets
import time

import pytest

from bascule.testing.local import LocalNatsServer, LocalNode
from bascule.testing.readiness import wait_for_brokers

pytestmark = [pytest.mark.timeout(120)]


def test_two_nodes_joining_a_fresh_seed_at_once_are_brokers_within_seconds(tmp_path):
    nats = LocalNatsServer(tmp_path / "nats.log")
    env = {"BASCULE_RAFT_PASSWORD": secrets.token_urlsafe(24)}
    seed = LocalNode(tmp_path / "a", server_id="a", nats_servers=nats.url, raft_bootstrap_seed=True, env=env)
    joiners = [LocalNode(tmp_path / name, server_id=name, nats_servers=nats.url, env=env) for name in "bc"]
    nodes = [seed, *joiners]
    try:
        nats.start()
        for node in nodes:
            node.start(wait=False)
        seed.wait_ready(timeout=30)
        serving = time.monotonic()
        last = wait_for_brokers(seed.address, {"a", "b", "c"}, 30, lambda: None)
        took = time.monotonic() - serving
        assert last is None, f"not every node joined within 30 s: {last}\n{seed.log_tail()}"
        assert took < 4.0, f"the joiners were brokers {took:.1f} s after the seed served\n{seed.log_tail()}"
        assert "giving up the metadata leadership" not in seed.log_tail(200), seed.log_tail(200)
    finally:
        for node in nodes:
            node.kill()
        nats.kill()
