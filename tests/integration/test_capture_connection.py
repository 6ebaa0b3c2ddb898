"""The capture connection against a real nats-server: delivery, queue groups, reconnect."""

import asyncio

import nats
import pytest

from bascule.node.embedded_nats import EmbeddedNats
from bascule.node.nats_capture import CaptureConnection

pytestmark = pytest.mark.anyio


async def wait_for(predicate, timeout=5.0):
    for _ in range(int(timeout / 0.02)):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


async def test_delivers_payloads_subjects_replies_and_survives_a_server_restart(tmp_path):
    server = EmbeddedNats(port=0, log_dir=tmp_path)
    await server.start()
    capture = CaptureConnection([server.url], "test-capture")
    try:
        await capture.connect()
        got = []
        capture.subscribe("cap.>", "grp", got.extend)
        await capture.flush()
        nc = await nats.connect(server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
        await nc.publish("cap.a", b"plain", reply="inbox.1")
        await nc.publish("cap.b", b"with headers", headers={"X": "1"})
        for i in range(2000):
            await nc.publish("cap.c", b"m%d" % i)
        await nc.flush()
        await wait_for(lambda: len(got) == 2002)
        assert got[0] == ("cap.a", "inbox.1", b"plain")
        assert got[1] == ("cap.b", "", b"with headers")
        assert [p for _, _, p in got[2:]] == [b"m%d" % i for i in range(2000)]
        await server.stop()
        await server.start()
        await wait_for(lambda: nc.is_connected, 10)
        got.clear()
        for _ in range(50):  # resubscription races the publisher's reconnect: publish until seen
            await nc.publish("cap.after", b"again")
            await nc.flush()
            if got:
                break
            await asyncio.sleep(0.1)
        assert got and got[0] == ("cap.after", "", b"again")
        await nc.close()
    finally:
        await capture.close()
        await server.stop()


async def test_publish_many_sends_every_message_in_order(tmp_path):
    server = EmbeddedNats(port=0, log_dir=tmp_path)
    await server.start()
    capture = CaptureConnection([server.url], "test-capture")
    nc = None
    try:
        await capture.connect()
        nc = await nats.connect(server.url)
        got = []

        async def on_message(msg):
            got.append((msg.subject, msg.data))

        await nc.subscribe("acks.>", cb=on_message)
        await nc.flush()
        sent = [(f"acks.{i % 3}", b"\r\n payload %d" % i) for i in range(500)] + [("acks.empty", b"")]
        capture.publish_many(sent)
        await capture.flush()
        await wait_for(lambda: len(got) == len(sent))
        assert got == sent
    finally:
        if nc is not None:
            await nc.close()
        await capture.close()
        await server.stop()
