"""The Raft port against a stranger without the password (issue 27): an announced message of 2 GiB,
a first message longer than a key exchange, and a silent connection are all closed at once, with
little read; the group goes on committing."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct

import pytest

from bascule.metadata.raft import MetadataRaft
from bascule.metadata.raft_port import ACCEPT_BACKLOG, FIRST_MESSAGE_LIMIT, UNIDENTIFIED_LIMIT
from bascule.testing.ports import free_port
from bascule.wire.commands import RegisterBroker

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@contextlib.asynccontextmanager
async def single_member(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    raft = MetadataRaft(address, [], tmp_path, "the password", lambda: None)
    try:
        await raft.watch.until(lambda: raft.is_leader and raft.ready, 10)
        assert raft.is_leader
        yield raft, address
    finally:
        raft.close()


async def closed_within(address: str, payload: bytes, seconds: float) -> int:
    """Send ``payload``, then count what can still be sent until the node closes the connection."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    sent = 0
    try:
        writer.write(payload)
        async with asyncio.timeout(seconds):
            while True:
                try:
                    writer.write(b"\0" * (64 << 10))
                    await writer.drain()
                    sent += 64 << 10
                except (ConnectionError, OSError):
                    return sent
                if reader.at_eof() or await _closed(reader):
                    return sent
    finally:
        writer.close()


async def _closed(reader: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1), 0.01) == b""
    except TimeoutError:
        return False
    except ConnectionError:
        return True


async def test_a_stranger_cannot_make_the_raft_port_buffer_or_hold_connections(tmp_path) -> None:
    async with single_member(tmp_path) as (raft, address):
        huge = struct.pack("i", (1 << 31) - 1)
        assert await closed_within(address, huge, 5.0) < 16 << 20
        too_long_a_first = struct.pack("i", FIRST_MESSAGE_LIMIT + 1)
        assert await closed_within(address, too_long_a_first, 5.0) < 16 << 20
        host, port = address.rsplit(":", 1)
        silent = socket.create_connection((host, int(port)))
        try:
            silent.settimeout(5.0)
            assert silent.recv(1) == b""  # closed after the connection timeout, never having spoken
        finally:
            silent.close()
        await raft.propose(RegisterBroker(id="a", host="h", port=1, raft="r", incarnation="i", unclean=False))
        assert "a" in raft.state.brokers


async def test_a_stranger_opening_connections_as_fast_as_it_can_holds_at_most_the_limit(tmp_path) -> None:
    async with single_member(tmp_path) as (raft, address):
        host, port = address.rsplit(":", 1)
        transport = raft._sync._SyncObj__transport
        # A burst within the backlog (pysyncobj's 5 would drop most of it: connects retried seconds later),
        # and twice the limit of silent connections.
        burst = 2 * UNIDENTIFIED_LIMIT - 8
        assert burst < ACCEPT_BACKLOG
        strangers = [socket.create_connection((host, int(port)), timeout=3.0) for _ in range(burst)]
        try:
            await asyncio.sleep(0.3)
            assert len(transport._unknownConnections) <= UNIDENTIFIED_LIMIT
            closed = 0
            for stranger in strangers:
                stranger.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    closed += stranger.recv(1) == b""
            assert closed >= burst - UNIDENTIFIED_LIMIT  # the oldest made room for the newest
            await raft.propose(RegisterBroker(id="a", host="h", port=1, raft="r", incarnation="i", unclean=False))
            assert "a" in raft.state.brokers
        finally:
            for stranger in strangers:
                stranger.close()
