"""A one-node metadata group leads as soon as it starts: its own vote is the majority, so waiting out an
election timeout (0.5 to 1 s) would only delay every single-node start and restart."""

import time

import pytest

from bascule.metadata.raft import MetadataRaft, raft_conf
from bascule.testing.ports import free_port
from bascule.wire.commands import RegisterBroker

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


async def _leads_after(address: str, data_dir) -> tuple[MetadataRaft, float]:
    started = time.monotonic()
    raft = MetadataRaft(address, [], data_dir, "the password", lambda: None)
    await raft.watch.until(lambda: raft.is_leader and raft.ready, 10)
    return raft, time.monotonic() - started


async def test_a_sole_voter_leads_without_waiting_out_an_election_timeout(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    shortest_timeout = raft_conf(tmp_path / "conf", address, None).raftMinTimeout
    raft, first = await _leads_after(address, tmp_path)
    try:
        await raft.propose(RegisterBroker(id="a", host="h", port=1, raft=address, incarnation="i", unclean=False))
    finally:
        raft.close()
    raft, again = await _leads_after(address, tmp_path)
    try:
        assert "a" in raft.state.brokers, "the journal was replayed before it led"
    finally:
        raft.close()
    assert first < shortest_timeout and again < shortest_timeout, (first, again)



async def test_a_sole_voter_commits_each_command_without_waiting_for_its_next_tick(tmp_path):
    """pysyncobj commits a sole voter's entry on the tick after the one that appended it, and nothing
    but a timeout (autoTickPeriod) starts that tick: ten commands one after the other took a second."""
    address = f"127.0.0.1:{free_port()}"
    tick = raft_conf(tmp_path / "conf", address, None).autoTickPeriod
    raft, _ = await _leads_after(address, tmp_path)
    try:
        started = time.monotonic()
        for n in range(10):
            await raft.propose(RegisterBroker(id=f"b{n}", host="h", port=1, raft=address, incarnation="i",
                                              unclean=False))
        took = time.monotonic() - started
    finally:
        raft.close()
    assert took < 10 * tick / 2, took


async def test_a_restarted_sole_voter_leads_before_a_tick_period(tmp_path):
    """pysyncobj's tick thread slept a fixed 0.1 s (autoTickPeriod here) before its first tick, so a
    restarted node replayed its journal, elected itself and registered no sooner (104-129 ms after
    MetadataRaft returned; 2-44 ms without the sleep, on a loaded machine)."""
    address = f"127.0.0.1:{free_port()}"
    tick = raft_conf(tmp_path / "conf", address, None).autoTickPeriod
    raft, _ = await _leads_after(address, tmp_path)
    try:
        await raft.propose(RegisterBroker(id="a", host="h", port=1, raft=address, incarnation="i", unclean=False))
    finally:
        raft.close()
    raft = MetadataRaft(address, [], tmp_path, "the password", lambda: None)
    built = time.monotonic()
    try:
        await raft.watch.until(lambda: raft.is_leader and raft.ready, 10)
        took = time.monotonic() - built
        assert "a" in raft.state.brokers
    finally:
        raft.close()
    assert took < tick, took
