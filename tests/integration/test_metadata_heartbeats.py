"""The metadata heartbeats (bascule.metadata.heartbeats) on a real nats-server, three voters in one
process: each has its thread and connection, so a voter whose event loop is held (a failover of
thousands of partitions held a node's loop 2-5 s at a time: issue 32) keeps its standing, and one whose
loop is stuck past the limit goes silent and loses it, as does every voter that hears too few."""

from __future__ import annotations

import asyncio
import time

import nats
import pytest
from conftest import until

from bascule.metadata import heartbeats as heartbeats_module
from bascule.metadata.heartbeats import CONTACT_TIMEOUT, NatsHeartbeats
from bascule.natsio.sealed import SealedNats
from bascule.natsio.server import EmbeddedNats
from bascule.wire.seal import Sealer, derive_key
from bascule.wire.subjects import Subjects

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

VOTERS = ["a:1", "b:1", "c:1"]


class Raft:
    def __init__(self, address: str) -> None:
        self.address = address

    def members(self) -> list[str]:
        return VOTERS


async def voters(url: str) -> list[NatsHeartbeats]:
    async def connect() -> SealedNats:
        return SealedNats(await nats.connect(url), Sealer(derive_key("secret")))

    return [NatsHeartbeats(connect, Subjects("hb"), Raft(address), lambda: True) for address in VOTERS]


def hold_the_loop(seconds: float) -> None:
    """Keep the event loop from running for ``seconds``, as a node's work does in a failover."""
    time.sleep(seconds)


def standing(voter: NatsHeartbeats) -> bool:
    return voter.standing() > time.monotonic()




async def test_a_voter_whose_loop_is_held_keeps_its_standing(tmp_path):
    server = EmbeddedNats(port=0, log_dir=tmp_path)
    await server.start()
    group = await voters(server.url)
    loops = [asyncio.create_task(voter.run()) for voter in group]
    try:
        for voter in group:
            voter.start()
        await until(lambda: all(map(standing, group)))
        # The loop (which runs every voter's ``run``, as each node's runs its own) held well past the
        # contact timeout: the heartbeats go on from their threads meanwhile.
        hold_the_loop(CONTACT_TIMEOUT + 1.5)
        assert all(map(standing, group))
    finally:
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        await server.stop()


async def test_a_voter_whose_loop_is_stuck_past_the_limit_goes_silent(tmp_path, monkeypatch):
    monkeypatch.setattr(heartbeats_module, "LOOP_STALL_LIMIT", 1.0)
    server = EmbeddedNats(port=0, log_dir=tmp_path)
    await server.start()
    group = await voters(server.url)
    stuck, *others = group
    loops = [asyncio.create_task(voter.run()) for voter in others]  # stuck's ``run`` never runs
    try:
        for voter in group:
            voter.start()
        # Its loop last ran when it was made: past the limit it says nothing, and the others stop
        # counting it once the contact timeout has passed since they last heard it.
        await until(lambda: all(map(standing, others)))
        await until(lambda: not standing(stuck))
        assert all(map(standing, others))
    finally:
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        stuck._stop()
        await server.stop()
