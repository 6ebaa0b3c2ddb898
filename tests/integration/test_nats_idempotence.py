"""Plain NATS publishers and deduplication (issue 31), on a real node with its embedded nats-server:
a publisher whose connection is cut mid-stream reconnects (through a TCP proxy that resets it) and
sends again every message it could not be sure of, each with the Nats-Msg-Id it first carried, as
JetStream publishers do; the stream holds each message once. Liftbridge envelopes on the subject
carry the id in their own headers, deduplicated alike; messages without ids are stored every time."""

from __future__ import annotations

import asyncio
from collections import Counter

import nats
import pytest
from cluster_checks import wait_for
from conftest import running_node

from bascule.client import Client
from bascule.testing.ports import free_port
from bascule.testing.routes import RouteProxy
from bascule.wire import envelope
from bascule.wire.dedup import MESSAGE_ID_HEADER
from bascule.wire.pb import api_pb2

pytestmark = pytest.mark.anyio
COUNT = 2000


async def stored_values(client: Client, stream: str) -> list[bytes]:
    return [message.value async for message in client.subscribe(stream, 0, start="earliest", stop_latest=True)]


async def until_stored(client: Client, stream: str, count: int) -> list[bytes]:
    values: list[bytes] = []

    async def enough() -> bool:
        values[:] = await stored_values(client, stream)
        return len(values) >= count

    await wait_for(enough, 20, f"{count} messages stored in {stream}")
    return values


async def test_a_publisher_resending_after_a_reconnect_stores_each_message_once(tmp_path):
    async with running_node(tmp_path) as (node, address), Client(address) as client:
        await client.wait_ready()
        await client.create_stream("orders", "orders")
        upstream = int(node._embedded.url.rsplit(":", 1)[1])
        proxy = RouteProxy(free_port(), upstream)
        await proxy.start()
        reconnected = asyncio.Event()

        async def on_reconnect() -> None:
            reconnected.set()

        nc = await nats.connect(proxy.url, reconnect_time_wait=0.1, max_reconnect_attempts=-1,
                                reconnected_cb=on_reconnect)
        try:
            for number in range(COUNT):
                await nc.publish("orders", b"order %d" % number, headers={MESSAGE_ID_HEADER: f"order-{number}"})
                if number % 100 == 99 and number < COUNT // 2:
                    await nc.flush()  # the first half surely reached the server
                if number == COUNT // 2 + 100:
                    proxy.reset()  # what is in flight may or may not have reached the server
                    proxy.heal()
            await reconnected.wait()
            # Not sure what the cut lost: send everything again, with the same ids.
            for number in range(COUNT):
                await nc.publish("orders", b"order %d" % number, headers={MESSAGE_ID_HEADER: f"order-{number}"})
            await nc.flush()
            values = await until_stored(client, "orders", COUNT)
            await asyncio.sleep(0.5)  # nothing more comes
            values = await stored_values(client, "orders")
            assert sorted(values) == sorted(b"order %d" % number for number in range(COUNT))
            # The second pass was recognised as copies (counted), not lost on the way.
            assert node.partitions.get("orders", 0).replica.duplicates >= COUNT // 2
        finally:
            await nc.close()
            await proxy.close()


async def test_envelopes_carry_the_id_in_their_own_headers_and_plain_messages_are_stored_every_time(tmp_path):
    async with running_node(tmp_path) as (node, address), Client(address) as client:
        await client.wait_ready()
        await client.create_stream("mixed", "mixed")
        nc = await nats.connect(node._embedded.url)
        try:
            enveloped = envelope.encode_message(
                api_pb2.Message(value=b"enveloped", headers={MESSAGE_ID_HEADER: b"e-1"}), envelope.MsgType.PUBLISH)
            for _ in range(3):
                await nc.publish("mixed", enveloped)
                await nc.publish("mixed", b"plain")  # no id: stored each time
                await nc.publish("mixed", b"with id", headers={MESSAGE_ID_HEADER: "n-1"})
            # The envelope's own header wins over the NATS one.
            await nc.publish("mixed", enveloped, headers={MESSAGE_ID_HEADER: "other"})
            await nc.flush()
            values = await until_stored(client, "mixed", 5)
            await asyncio.sleep(0.5)
            values = await stored_values(client, "mixed")
            assert Counter(values) == {b"enveloped": 1, b"plain": 3, b"with id": 1}
        finally:
            await nc.close()
