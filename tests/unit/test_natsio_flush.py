"""bascule.natsio.flush on a busy connection: it waits for what was pending at its call to reach the
socket, not for a buffer that never empties (issue 32: a node's one internal connection in a failover of
thousands of partitions always had something new pending, and every flush timed out)."""

from __future__ import annotations

import asyncio

import pytest

from bascule.natsio.flush import flush

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(10)]


class BusyClient:
    """nats-py's buffer as the flush sees it: a flusher that writes the pending list out every few ms
    and replaces it, while publishers add to the new one at once; ``written`` is what reached the socket."""

    is_connected = True

    def __init__(self) -> None:
        self._pending: list[bytes] = [b"SUB a 1\r\n"]
        self.written: list[bytes] = []
        self.pinged_after: list[bytes] | None = None

    @property
    def pending_data_size(self) -> int:
        return sum(map(len, self._pending))

    async def run(self) -> None:
        while True:
            await asyncio.sleep(0.003)
            self.written += self._pending
            self._pending = [b"PUB more 0\r\n\r\n"]  # the connection is never idle

    async def flush(self, timeout: float) -> None:
        self.pinged_after = list(self.written)


async def test_a_flush_on_a_connection_that_is_never_idle_returns_once_its_commands_went_out():
    client = BusyClient()
    flusher = asyncio.create_task(client.run())
    try:
        await flush(client, timeout=1.0)  # type: ignore[arg-type]
    finally:
        flusher.cancel()
    assert client.pinged_after is not None and b"SUB a 1\r\n" in client.pinged_after


async def test_a_flush_waits_while_its_commands_are_still_pending():
    client = BusyClient()  # no flusher runs: the SUB never goes out
    with pytest.raises(TimeoutError):
        await flush(client, timeout=0.05)  # type: ignore[arg-type]
    assert client.pinged_after is None
