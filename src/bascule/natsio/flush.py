"""A flush that waits for everything sent on a nats-py connection, not just for a PONG.

nats-py's own ``flush()`` (2.16) writes its PING straight to the socket, ahead of the commands
still in its pending buffer, so the PONG can come back before those commands (publishes, SUBs)
reach the server. A publisher that exits after such a flush loses its tail; a subscriber that
announces itself ready may not be subscribed yet.

So a flush first waits until the commands pending at its call have gone to the socket, then
PINGs. It waits for nats-py's flusher to take that buffer (a list nats-py replaces with a new one
each time it writes one out), not for the buffer to be empty: on a connection that is never idle
(a node with thousands of partitions, in a failover) something new is always pending, and a flush
that waited for an empty buffer gave up after its timeout, failing the partition bring-up that
asked for it and holding up the reconcile's other bring-ups meanwhile (issue 32).

Nor does nats-py time out its own PING here (``_pong``): nats-py 2.16 cancels a flush's future
when it times out but leaves it in its queue of PINGs awaiting a PONG, and when that PONG comes
after all, setting the cancelled future raises in its read loop, which ends it. The connection is
then read no more: every reply and heartbeat is lost until the server drops the node as a slow
consumer 10 s later, and the node reconnects and subscribes to everything again (seen in issue
32's storms: "nats: encountered error ... InvalidStateError", then "Slow Consumer Detected").
"""

from __future__ import annotations

import asyncio

from nats.aio.client import Client as NATS
from nats.errors import FlushTimeoutError

BUFFER_POLL = 0.001  # the first wait for the flusher, doubled after each up to MAX_BUFFER_POLL
MAX_BUFFER_POLL = 0.016
# How long a PING a flush gave up on waits for its PONG: past any server's answer on a live
# connection (a reconnect forgets it without harm, nats-py's queue of PINGs starts anew then).
UNANSWERED_PING_WAIT = 600.0
# The PINGs of flushes that gave up, each awaiting its PONG (kept so that they are not collected
# midway). Bound: one per such flush, each for at most UNANSWERED_PING_WAIT.
_unanswered: set[asyncio.Task[None]] = set()


async def flush(nc: NATS, timeout: float = 10.0) -> None:
    """Return once the server has processed every command sent on ``nc`` before this call."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    pause = BUFFER_POLL
    pending_at_call = getattr(nc, "_pending", None)
    while _still_pending(nc, pending_at_call) and nc.is_connected:
        if loop.time() > deadline:
            raise TimeoutError("nats-py's pending buffer did not go to the socket")
        await asyncio.sleep(pause)
        pause = min(2 * pause, MAX_BUFFER_POLL)
    await _pong(nc, max(deadline - loop.time(), 0.001))


async def _pong(nc: NATS, timeout: float) -> None:
    """A PING and its PONG, waited for ``timeout`` at most; a PING given up on is left to nats-py
    until its PONG comes, never timed out by nats-py meanwhile (see above)."""
    # nats-py annotates the timeout int, but hands it to asyncio.wait_for: a float works as one.
    ping = asyncio.ensure_future(nc.flush(timeout=UNANSWERED_PING_WAIT))  # type: ignore[arg-type]
    try:
        done, _ = await asyncio.wait({ping}, timeout=timeout)
    finally:
        if not ping.done():
            _unanswered.add(ping)
            ping.add_done_callback(_forget)
    if not done:
        raise FlushTimeoutError
    ping.result()


def _forget(ping: asyncio.Task[None]) -> None:
    _unanswered.discard(ping)
    if not ping.cancelled():
        ping.exception()  # retrieved: a connection closed meanwhile is no news


def _still_pending(nc: NATS, pending_at_call: object) -> bool:
    """Whether commands pending when the flush began are still in nats-py's buffer: its flusher
    hands the whole buffer to the socket at once, and a PING written after that follows them.
    Without the buffer's identity (another nats-py), until the buffer is empty."""
    if pending_at_call is None:
        return nc.pending_data_size > 0
    return getattr(nc, "_pending", None) is pending_at_call and nc.pending_data_size > 0
