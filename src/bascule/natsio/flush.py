"""A flush that waits for everything sent on a nats-py connection, not just for a PONG.

nats-py's own ``flush()`` (2.16) writes its PING straight to the socket, ahead of the commands
still in its pending buffer, so the PONG can come back before those commands (publishes, SUBs)
reach the server. A publisher that exits after such a flush loses its tail; a subscriber that
announces itself ready may not be subscribed yet.
"""

from __future__ import annotations

import asyncio

from nats.aio.client import Client as NATS

BUFFER_POLL = 0.001


async def flush(nc: NATS, timeout: float = 10.0) -> None:
    """Return once the server has processed every command sent on ``nc`` before this call."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    # The flusher task hands the whole buffer to the socket at once: after that, a PING follows it.
    while nc.pending_data_size and nc.is_connected:
        if loop.time() > deadline:
            raise TimeoutError("nats-py's pending buffer did not empty")
        await asyncio.sleep(BUFFER_POLL)
    # nats-py annotates the timeout int, but hands it to asyncio.wait_for: a float works as one.
    await nc.flush(timeout=max(deadline - loop.time(), 0.001))  # type: ignore[arg-type]
