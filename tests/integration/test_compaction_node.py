"""Log compaction on a real node (embedded NATS, its own cleaner job): a stream with Liftbridge's
``compactEnabled``, read through gufo-liftbridge (Liftbridge's Subscribe) and bascule's client."""

import asyncio

import grpc
import pytest
from conftest import running_node
from gufo.liftbridge.client import LiftbridgeClient

from bascule.client import Client
from bascule.wire.pb import api_pb2, api_pb2_grpc

pytestmark = pytest.mark.anyio

ALL = api_pb2.AckPolicy.ALL
CLEANER = {"streams.cleaner.interval": "200ms"}


async def create(address: str, name: str, compact: bool | None) -> None:
    request = api_pb2.CreateStreamRequest(name=name, subject=name, segmentMaxBytes=api_pb2.NullableInt64(value=300))
    if compact is not None:
        request.compactEnabled.value = compact
    async with grpc.aio.insecure_channel(address) as channel:
        await api_pb2_grpc.APIStub(channel).CreateStream(request, timeout=10)


async def publish_rounds(address: str, stream: str, rounds: int) -> tuple[dict[bytes, tuple[int, bytes]], list[int]]:
    """Three keys ``rounds`` times each, then three messages without a key (the last in the active
    segment, which compaction leaves alone): the latest (offset, value) of each key, and the
    offsets of the keyless ones."""
    latest: dict[bytes, tuple[int, bytes]] = {}
    keyless = []
    async with grpc.aio.insecure_channel(address) as channel:
        stub = api_pb2_grpc.APIStub(channel)
        for round_number in range(rounds):
            for key in (b"a", b"b", b"c"):
                value = key + str(round_number).encode()
                request = api_pb2.PublishRequest(stream=stream, key=key, value=value, ackPolicy=ALL)
                latest[key] = ((await stub.Publish(request, timeout=10)).ack.offset, value)
        for _ in range(3):
            request = api_pb2.PublishRequest(stream=stream, value=b"end", ackPolicy=ALL)
            keyless.append((await stub.Publish(request, timeout=10)).ack.offset)
    return latest, keyless


async def stored(client: Client, stream: str, offset: int | None = None) -> list[tuple[int, bytes, bytes]]:
    start = {"offset": offset} if offset is not None else {"start": "earliest"}
    return [(m.offset, m.key or b"", m.value) async for m in client.subscribe(stream, stop_latest=True, **start)]


async def until_compacted(client: Client, stream: str, expected: list, timeout: float = 20.0) -> list:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        got = await stored(client, stream)
        if got == expected or loop.time() > deadline:
            return got
        await asyncio.sleep(0.2)


async def test_a_compacted_stream_keeps_the_latest_message_of_each_key_at_its_offset(tmp_path):
    async with running_node(tmp_path, **CLEANER) as (node, address), Client(address) as client:
        await client.wait_ready()
        await create(address, "kv", compact=True)
        await create(address, "plain", compact=None)
        latest, keyless = await publish_rounds(address, "kv", rounds=12)
        await publish_rounds(address, "plain", rounds=12)
        expected = sorted([(offset, key, value) for key, (offset, value) in latest.items()]
                          + [(offset, b"", b"end") for offset in keyless])
        assert await until_compacted(client, "kv", expected) == expected
        assert len(await stored(client, "plain")) == 39  # compaction is off for streams that do not ask for it

        # Liftbridge's Subscribe, from an offset compacted away: from the next message there is
        async with LiftbridgeClient([address]) as lb:
            messages = []
            async for message in lb.subscribe("kv", start_offset=1):
                messages.append((message.offset, message.key or b"", message.value))
                if len(messages) == len(expected):
                    break
        assert messages == expected
        # a stop offset compacted away ends the subscription there, though no message is at it
        assert expected[0][0] > 5
        assert [m async for m in client.subscribe("kv", offset=0, stop_offset=5)] == []

    # after a restart: the same messages at the same offsets, and new ones after them
    async with running_node(tmp_path, **CLEANER) as (node, address), Client(address) as client:
        await client.wait_ready()
        assert await stored(client, "kv") == expected
        again, _ = await publish_rounds(address, "kv", rounds=4)
        assert min(offset for offset, _ in again.values()) > expected[-1][0]


async def test_the_server_default_turns_compaction_on_for_streams_that_do_not_say(tmp_path):
    async with running_node(tmp_path, **CLEANER, **{"streams.compact.enabled": True}) as (node, address), \
            Client(address) as client:
        await client.wait_ready()
        await create(address, "default", compact=None)
        await create(address, "off", compact=False)
        latest, keyless = await publish_rounds(address, "default", rounds=8)
        await publish_rounds(address, "off", rounds=8)
        expected = sorted([(offset, key, value) for key, (offset, value) in latest.items()]
                          + [(offset, b"", b"end") for offset in keyless])
        assert await until_compacted(client, "default", expected) == expected
        assert len(await stored(client, "off")) == 27
