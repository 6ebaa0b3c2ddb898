"""bascule's client publishes idempotently (issue 31), against a real node: every message gets an id
of its own in its Nats-Msg-Id header, a caller's id is kept and idempotence turns off; a publish
whose ack is lost (a TCP proxy between client and node holds the node's answers, then cuts the
connection once the message is stored) is retried with the id it first carried, to the partition
it first went to, by publish, publish_many (PublishAsync) and publish_to_subject alike, and the
leader stores it once. On three processes, ack-ALL messages whose leader is SIGKILLed after it
wrote and replicated them, before their acks, are each stored once."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import pytest
from cluster_checks import ALL_NODES, FAST, create_stream, leader_index, views, wait_for
from conftest import running_node

from bascule.client import MESSAGE_ID_HEADER, Client, Message, RoundRobin
from bascule.testing.local import LocalCluster
from bascule.testing.ports import free_port
from bascule.testing.routes import Direction, RouteProxy

pytestmark = pytest.mark.anyio


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
async def proxy_before(client: Client, server_id: str, address: str, stream: str) -> AsyncIterator[RouteProxy]:
    """A proxy that carries the client's partition calls to broker ``server_id`` (at ``address``),
    which a test may hold (``hold(Direction.DOWNSTREAM)``: the broker's answers wait) and cut (`cut`).
    Brokers advertise their own addresses, so the client's cache of them is pointed at the proxy; a
    call on ``stream`` opens the connection first (a new one would wait for the broker's first
    answer, and fail before sending)."""
    proxy = RouteProxy(free_port(), int(address.rsplit(":", 1)[1]))
    await proxy.start()
    await client.fetch_metadata()
    brokers = {**client._metadata.brokers, server_id: f"127.0.0.1:{proxy.port}"}
    client._metadata = dataclasses.replace(client._metadata, brokers=brokers)
    await client.fetch_partition_metadata(stream)
    try:
        yield proxy
    finally:
        await proxy.close()


def cut(proxy: RouteProxy) -> None:
    """Reset the proxy's connections (the client's calls on them fail with UNAVAILABLE, and are
    retried) and let new ones through."""
    proxy.reset()
    proxy.heal()


async def answer_lost(proxy: RouteProxy, address: str, publish: Awaitable[Any], count: int) -> Any:
    """``publish`` awaited while the proxy holds the node's answers, until the node (at ``address``)
    stored ``count`` more messages; then the proxy is cut."""
    async with Client(address) as direct:
        before = sum(await newest_offsets(direct))
        proxy.hold(Direction.DOWNSTREAM)
        publishing = asyncio.ensure_future(publish)
        deadline = time.monotonic() + 10
        while sum(await newest_offsets(direct)) - before < count:
            assert time.monotonic() < deadline and not publishing.done(), "the node did not store the messages"
            await asyncio.sleep(0.01)
    cut(proxy)
    return await publishing


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
        async with proxy_before(client, node.server_id, address, "lost") as proxy:
            ack = await answer_lost(proxy, address, client.publish("lost", b"retried", partitioner=robin), 1)
        assert ack is not None and ack.partition == 1  # the retry did not ask the partitioner again
        assert (await client.publish("lost", b"next", partitioner=robin)).partition == 2
        (copy,) = copies_by_value(await stored(client, "lost", 3))[b"retried"]  # the retry, stored once
        assert (copy.partition, copy.offset) == (1, ack.offset) and message_id(copy) is not None


async def test_a_batch_whose_acks_are_lost_is_retried_with_its_ids_to_the_partitions_it_chose(tmp_path):
    async with running_node(tmp_path) as (node, address), Client(address, timeout=5) as client:
        await client.wait_ready()
        await client.create_stream("batch", "batch", partitions=3)
        values = [b"m%d" % i for i in range(6)]
        robin = RoundRobin()
        async with proxy_before(client, node.server_id, address, "batch") as proxy:
            batch = client.publish_many("batch", values, partitioner=robin, ack_policy="all")
            acks = await answer_lost(proxy, address, batch, len(values))
        assert [ack.partition for ack in acks] == [0, 1, 2, 0, 1, 2]
        assert (await client.publish("batch", b"next", partitioner=robin)).partition == 0  # six choices, not twelve
        copies = copies_by_value(await stored(client, "batch", 3))
        for value, ack in zip(values, acks):
            (copy,) = copies[value]
            assert (copy.partition, copy.offset) == (ack.partition, ack.offset), value
        assert len({message_id(copies[value][0]) for value in values} - {None}) == len(values)


async def test_a_publish_to_a_subject_whose_ack_is_lost_is_retried_with_its_id(tmp_path):
    async with running_node(tmp_path) as (node, address), Client(address, timeout=5) as client:
        await client.wait_ready()
        await client.create_stream("captured", "captured.in")
        async with proxy_before(client, node.server_id, address, "captured") as proxy:
            client.address = f"127.0.0.1:{proxy.port}"  # where calls that need no partition leader go
            ack = await answer_lost(proxy, address, client.publish_to_subject("captured.in", b"retried"), 1)
        # Captured from NATS, the retry is checked against the leader's window as any publish is.
        (copy,) = await stored(client, "captured")
        assert ack is not None and ack.offset == copy.offset and message_id(copy) is not None


@pytest.mark.cluster
@pytest.mark.timeout(90)
async def test_messages_whose_leader_is_killed_before_their_acks_are_stored_once():
    """Publishers (single publishes and PublishAsync batches, ack ALL) reach the partition leader
    through a proxy. Mid-run the leader's answers are held until both followers hold every message
    sent, then the leader is SIGKILLed: each message in flight was written and replicated, but not
    acked, and its retry reaches the new leader, whose window (rebuilt from its log) knows its id."""
    with LocalCluster(3, config=FAST) as cluster:
        await create_stream(cluster, "once")
        leader = await leader_index(cluster, "once")
        followers = [i for i in ALL_NODES if i != leader]
        async with Client(cluster.brokers, timeout=20) as client, proxy_before(
            client, cluster.node(leader).server_id, cluster.node(leader).address, "once",
        ) as proxy:
            sent, acked = 0, {}

            async def publish_one_by_one(worker: int) -> None:
                nonlocal sent
                for i in range(40):
                    value = b"single-%d-%d" % (worker, i)
                    sent += 1
                    acked[value] = (await client.publish("once", value, ack_policy="all")).offset

            async def publish_batches(worker: int) -> None:
                nonlocal sent
                for i in range(8):
                    values = [b"batch-%d-%d-%d" % (worker, i, j) for j in range(5)]
                    sent += len(values)
                    acks = await client.publish_many("once", values, ack_policy="all")
                    acked.update((value, ack.offset) for value, ack in zip(values, acks))

            publishers = [asyncio.ensure_future(publish_one_by_one(w)) for w in range(6)]
            publishers += [asyncio.ensure_future(publish_batches(w)) for w in range(2)]

            async def acks_enough() -> bool:
                return len(acked) >= 100

            async def replicated_unacked() -> bool:
                logs = [view.partition.newest_offset + 1 for view in await views(cluster, "once", followers)]
                return len(logs) == 2 and min(logs) == sent > len(acked)

            await wait_for(acks_enough, 20, "100 acks", cluster, interval=0.01)
            proxy.hold(Direction.DOWNSTREAM)
            await wait_for(replicated_unacked, 10, "every message sent on both followers", cluster, interval=0.01)
            unacked = sent - len(acked)
            cluster.kill(leader)
            cut(proxy)
            await asyncio.gather(*publishers)
            messages = await stored(client, "once")
        assert unacked >= 6 and len(acked) == 6 * 40 + 2 * 8 * 5
        assert all(count == 1 for count in Counter(map(message_id, messages)).values())
        assert None not in map(message_id, messages)
        assert {m.value: m.offset for m in messages} == acked and len(messages) == len(acked)
