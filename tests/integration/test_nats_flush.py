"""bascule.natsio.flush against a real nats-server that answers a PING late (stopped a moment with
SIGSTOP): the flush gives up in time, and the late PONG leaves nats-py's read loop running. nats-py 2.16
times its own flush out by cancelling a future it keeps in its queue of PINGs; the late PONG then
raised in its read loop, which ended, and the node read nothing more until the server dropped it as a
slow consumer 10 s later (issue 32)."""

import asyncio
import os
import signal

import nats
import pytest
from nats.errors import FlushTimeoutError

from bascule.natsio.flush import flush
from bascule.natsio.server import EmbeddedNats

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


async def test_a_late_pong_after_a_flush_gave_up_leaves_the_connection_read(tmp_path):
    server = EmbeddedNats(port=0, log_dir=tmp_path)
    await server.start()
    nc = await nats.connect(server.url)
    try:
        got: list[bytes] = []

        async def take(msg) -> None:
            got.append(msg.data)

        await nc.subscribe("after", cb=take)
        await flush(nc)
        pid = server._process.pid  # type: ignore[union-attr]
        os.kill(pid, signal.SIGSTOP)
        await asyncio.sleep(0.05)  # stopped for sure
        try:
            with pytest.raises(FlushTimeoutError):
                await flush(nc, timeout=0.3)
        finally:
            os.kill(pid, signal.SIGCONT)
        await asyncio.sleep(0.3)  # the late PONG comes
        assert not nc._reading_task.done(), "nats-py's read loop ended on the late PONG"
        await nc.publish("after", b"still read")
        await flush(nc, timeout=5)
        for _ in range(100):
            if got:
                break
            await asyncio.sleep(0.02)
        assert got == [b"still read"]
    finally:
        await nc.close()
        await server.stop()
