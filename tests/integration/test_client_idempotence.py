"""bascule's client publishes idempotently (issue 31), against a real node: every message gets an id
of its own in its Nats-Msg-Id header, a caller's id is kept and idempotence turns off; and a
publish whose ack is lost (a TCP proxy between client and node holds the node's answers, then
cuts the connection once the message is stored) is retried with the id it first carried, to the
partition it first went to, by publish, publish_many (PublishAsync) and publish_to_subject alike."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from conftest import running_node

from bascule.client import MESSAGE_ID_HEADER, Client, Message, RoundRobin
from bascule.testing.ports import free_port
from bascule.testing.routes import Direction, RouteProxy

pytestmark = pytest.mark.anyio

LoseAnswers = Callable[[Awaitable[Any], int], Awaitable[Any]]


async def stored(client: Client, stream: str, partitions: int = 1) -> list[Message]:
    return [message for partition in range(partitions)
            async for message in client.subscribe(stream, partition, start="earliest", stop_latest=True)]


def message_id(message: Message) -> bytes | None:
    return message.headers.get(MESSAGE_ID_HEADER)


async def test_each_message_gets_an_id_of_its_own_unless_it_has_one_or_idempotence_is_off(tmp_path):
    async with running_node(tmp_path) as (node, address), Client(address) as client:
        await client.wait_ready()
        await client.create_stream("ids", "ids")
        await client.publish("ids", b"one")
        await client.publish_many("ids", [b"two", b"three"])
        await client.publish_to_subject("ids", b"four")
        await client.publish("ids", b"own", headers={MESSAGE_ID_HEADER: b"order-7", "h": b"v"})
        await client.publish_many("ids", [b"own many", b"plain"], headers=[{MESSAGE_ID_HEADER: b"order-8"}, None])
        await client.publish("ids", b"off", idempotent=False)
        await client.publish_many("ids", [b"off many"], idempotent=False)
        await client.publish_to_subject("ids", b"off subject", idempotent=False)
        async with Client(address, idempotent=False) as plain:
            await plain.publish("ids", b"client off")
            await plain.publish("ids", b"call on", idempotent=True)
        ids = {message.value: message_id(message) for message in await stored(client, "ids")}
        generated = [ids[value] for value in (b"one", b"two", b"three", b"four", b"plain", b"call on")]
        assert len(set(generated)) == len(generated)
        assert all(value is not None and len(value) == 22 for value in generated)  # 16 random bytes, base64url
        assert (ids[b"own"], ids[b"own many"]) == (b"order-7", b"order-8")
        assert [ids[v] for v in (b"off", b"off many", b"off subject", b"client off")] == [None] * 4


@contextlib.asynccontextmanager
async def proxied(client: Client, node, address: str, stream: str) -> AsyncIterator[tuple[str, LoseAnswers]]:
    """Sends the client's partition calls through a proxy to the node; yields the proxy's address
    and ``lose_answers(publish, count)``: ``publish`` awaited while the node's answers are held,
    until it stored ``count`` more messages; then the proxy resets the connection (the client sees
    UNAVAILABLE, and retries) and lets new ones through. The node advertises its own address, so
    the client's cache of broker addresses is pointed at the proxy; a call on ``stream`` opens the
    connection first (a new one would wait for the node's first answer, and fail before sending)."""
    proxy = RouteProxy(free_port(), int(address.rsplit(":", 1)[1]))
    proxy_address = f"127.0.0.1:{proxy.port}"
    await proxy.start()
    await client.fetch_metadata()
    client._metadata = dataclasses.replace(client._metadata, brokers={node.server_id: proxy_address})
    await client.fetch_partition_metadata(stream)

    async def lose_answers(publish: Awaitable[Any], count: int) -> Any:
        async with Client(address) as direct:
            before = sum(await newest_offsets(direct))
            proxy.hold(Direction.DOWNSTREAM)
            publishing = asyncio.ensure_future(publish)
            deadline = time.monotonic() + 10
            while sum(await newest_offsets(direct)) - before < count:
                assert time.monotonic() < deadline and not publishing.done(), "the node did not store the messages"
                await asyncio.sleep(0.01)
        proxy.reset()
        proxy.heal()
        return await publishing

    try:
        yield proxy_address, lose_answers
    finally:
        await proxy.close()


async def newest_offsets(client: Client) -> list[int]:
    metadata = await client.fetch_metadata()
    return [p.newest_offset for s in metadata.streams.values() for p in s.partitions.values()]


def copies_by_value(messages: list[Message]) -> dict[bytes, list[Message]]:
    copies = defaultdict(list)
    for message in messages:
        copies[message.value].append(message)
    return copies


async def test_a_publish_whose_ack_is_lost_is_retried_with_its_id_to_the_partition_it_chose(tmp_path):
    async with running_node(tmp_path) as (node, address), Client(address, timeout=5) as client:
        await client.wait_ready()
        await client.create_stream("lost", "lost", partitions=3)
        robin = RoundRobin()
        assert (await client.publish("lost", b"first", partitioner=robin)).partition == 0
        async with proxied(client, node, address, "lost") as (_, lose_answers):
            ack = await lose_answers(client.publish("lost", b"retried", partitioner=robin), 1)
        assert ack is not None and ack.partition == 1  # the retry did not ask the partitioner again
        assert (await client.publish("lost", b"next", partitioner=robin)).partition == 2
        copies = copies_by_value(await stored(client, "lost", 3))[b"retried"]
        assert {(m.partition, message_id(m)) for m in copies} == {(1, message_id(copies[0]))}
        assert message_id(copies[0]) is not None and ack.offset in [m.offset for m in copies]


async def test_a_batch_whose_acks_are_lost_is_retried_with_its_ids_to_the_partitions_it_chose(tmp_path):
    async with running_node(tmp_path) as (node, address), Client(address, timeout=5) as client:
        await client.wait_ready()
        await client.create_stream("batch", "batch", partitions=3)
        values = [b"m%d" % i for i in range(6)]
        robin = RoundRobin()
        async with proxied(client, node, address, "batch") as (_, lose_answers):
            batch = client.publish_many("batch", values, partitioner=robin, ack_policy="all")
            acks = await lose_answers(batch, len(values))
        assert [ack.partition for ack in acks] == [0, 1, 2, 0, 1, 2]
        assert (await client.publish("batch", b"next", partitioner=robin)).partition == 0  # six choices, not twelve
        copies = copies_by_value(await stored(client, "batch", 3))
        for value, ack in zip(values, acks):
            ids = {(m.partition, message_id(m)) for m in copies[value]}
            assert ids == {(ack.partition, message_id(copies[value][0]))}, value
            assert ack.offset in [m.offset for m in copies[value]]
        assert len({message_id(copies[value][0]) for value in values}) == len(values)


async def test_a_publish_to_a_subject_whose_ack_is_lost_is_retried_with_its_id(tmp_path):
    async with running_node(tmp_path) as (node, address), Client(address, timeout=5) as client:
        await client.wait_ready()
        await client.create_stream("captured", "captured.in")
        async with proxied(client, node, address, "captured") as (proxy_address, lose_answers):
            client.address = proxy_address  # where calls that need no partition leader go
            ack = await lose_answers(client.publish_to_subject("captured.in", b"retried"), 1)
        copies = await stored(client, "captured")
        assert ack is not None and {message_id(m) for m in copies} == {message_id(copies[0])}
        assert message_id(copies[0]) is not None and ack.offset in [m.offset for m in copies]
