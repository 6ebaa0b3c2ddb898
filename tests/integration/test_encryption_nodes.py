"""Encryption at rest on real nodes (embedded or real nats-server): values sealed on disk, read back in
plaintext through Liftbridge's Subscribe (grpcio, gufo-liftbridge) and bascule's SubscribeBatches
(its client); refusals without a key; a 3-node cluster failing over to a new leader."""

import asyncio
from pathlib import Path

import grpc
import nats
import pytest
from cluster_checks import FAST, converged, leader_index, new_leader, partition_dir, read_node, restart, wait_for
from conftest import running_node
from gufo.liftbridge.client import LiftbridgeClient
from gufo.liftbridge.types import StartPosition

from bascule.client import BasculeError, Client
from bascule.testing.local import LocalCluster
from bascule.wire import envelope
from bascule.wire.pb import api_pb2, api_pb2_grpc

pytestmark = pytest.mark.anyio

KEY = "0123456789abcdef0123456789abcdef"  # 32 bytes: AES-256
OTHER_KEY = "fedcba9876543210"  # 16 bytes: AES-128
ALL = api_pb2.AckPolicy.ALL
CLEANER = {"streams.cleaner.interval": "200ms"}


def segments(data_dir: Path, stream: str) -> bytes:
    paths = list((data_dir / "streams").glob(f"{stream}@*/*/*.log"))
    assert paths, f"no segment of {stream} in {data_dir}"
    return b"".join(path.read_bytes() for path in paths)


async def subscribed(address: str, stream: str) -> list[api_pb2.Message]:
    """Liftbridge's Subscribe through grpcio, from the earliest message to the newest."""
    request = api_pb2.SubscribeRequest(
        stream=stream, startPosition=api_pb2.StartPosition.EARLIEST, stopPosition=api_pb2.StopPosition.STOP_LATEST,
    )
    messages = []
    async with grpc.aio.insecure_channel(address) as channel:
        call = api_pb2_grpc.APIStub(channel).Subscribe(request, timeout=10)
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            async for message in call:
                messages.append(message)
        assert ended.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, ended.value.details()
    return messages[1:]  # after the handshake


async def subscribe_error(address: str, stream: str) -> grpc.aio.AioRpcError:
    request = api_pb2.SubscribeRequest(stream=stream, startPosition=api_pb2.StartPosition.EARLIEST)
    async with grpc.aio.insecure_channel(address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            async for _ in api_pb2_grpc.APIStub(channel).Subscribe(request, timeout=10):
                pass
    return failed.value


async def batches(client: Client, stream: str) -> list[tuple[int, bytes | None, bytes]]:
    """bascule's client: SubscribeBatches."""
    return [(m.offset, m.key, m.value) async for m in client.subscribe(stream, start="earliest", stop_latest=True)]


async def publish_everywhere(node, client: Client, stream: str, subject: str) -> list[bytes]:
    """Through gRPC Publish and PublishAsync, plain NATS and a NATS envelope; the values in offset order."""
    values = [b"secret-publish"]
    ack = await client.publish(stream, values[0], key=b"key-0", headers={"h": b"header-0"}, ack_policy="all")
    assert ack.offset == 0
    more = [b"secret-async-%d" % i for i in range(5)]
    assert [a.offset for a in await client.publish_many(stream, more, ack_policy="all")] == [1, 2, 3, 4, 5]
    nc = await nats.connect(node._embedded.url)
    try:
        inbox = await nc.subscribe(f"acks.{stream}")
        await nc.publish(subject, b"secret-nats-plain")
        message = api_pb2.Message(value=b"secret-nats-envelope", ackInbox=f"acks.{stream}", correlationId="e",
                                  ackPolicy=ALL)
        await nc.publish(subject, envelope.encode_message(message, envelope.MsgType.PUBLISH))
        ack = envelope.decode_message((await inbox.next_msg(timeout=5)).data, envelope.MsgType.ACK, api_pb2.Ack)
        assert (ack.ackError, ack.offset, ack.correlationId) == (api_pb2.Ack.Error.OK, 7, "e")
    finally:
        await nc.close()
    return values + more + [b"secret-nats-plain", b"secret-nats-envelope"]


async def test_an_encrypted_stream_is_sealed_on_disk_and_every_reader_gets_plaintext(tmp_path, monkeypatch):
    monkeypatch.setenv("LIFTBRIDGE_ENCRYPTION_KEY", KEY)
    async with running_node(tmp_path) as (node, address), Client(address) as client:
        await client.wait_ready()
        await client.create_stream("sealed", "sealed.in", encryption=True)
        await client.create_stream("open", "open.in")
        values = await publish_everywhere(node, client, "sealed", "sealed.in")
        await client.publish_many("open", [b"open-%d" % i for i in range(3)], ack_policy="all")

        messages = await subscribed(address, "sealed")
        assert [(m.offset, m.value) for m in messages] == list(enumerate(values))
        assert (messages[0].key, messages[0].headers["h"], messages[0].subject) == (b"key-0", b"header-0", "sealed.in")
        assert await batches(client, "sealed") == [(0, b"key-0", values[0])] + [
            (offset, None, value) for offset, value in enumerate(values) if offset
        ]
        async with LiftbridgeClient([address]) as lb:
            got = []
            async for message in lb.subscribe("sealed", start_position=StartPosition.EARLIEST):
                got.append(message.value)
                if len(got) == len(values):
                    break
            assert got == values
            # The cursors stream, internal, is never encrypted: cursors work as they did.
            await lb.set_cursor(stream="sealed", partition=0, cursor_id="c", offset=3)
            assert await lb.get_cursor(stream="sealed", partition=0, cursor_id="c") == 4
        assert [m.value for m in await subscribed(address, "open")] == [b"open-0", b"open-1", b"open-2"]

        sealed_files, open_files = segments(tmp_path, "sealed"), segments(tmp_path, "open")
        assert not [value for value in values if value in sealed_files]
        assert b"key-0" in sealed_files and b"header-0" in sealed_files  # as Liftbridge: values only
        assert all(b"open-%d" % i in open_files for i in range(3))
        assert b"sealed" in segments(tmp_path, "__cursors")  # a cursor's stream name, stored as it always was


async def test_without_a_key_an_encrypted_stream_cannot_be_created_and_plain_ones_are_unchanged(tmp_path, monkeypatch):
    monkeypatch.delenv("LIFTBRIDGE_ENCRYPTION_KEY", raising=False)
    monkeypatch.setenv("BASCULE_ENCRYPTION_KEY", "too short")
    async with running_node(tmp_path) as (node, address), Client(address) as client:
        await client.wait_ready()
        async with grpc.aio.insecure_channel(address) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await api_pb2_grpc.APIStub(channel).CreateStream(api_pb2.CreateStreamRequest(
                    name="sealed", subject="sealed", encryption=api_pb2.NullableBool(value=True)), timeout=10)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert refused.value.details() == ("Failed on preconditions for stream's encryption handler: "
                                           "BASCULE_ENCRYPTION_KEY: the master key must be 16, 24 or 32 bytes, got 9")
        assert not (await client.fetch_metadata("sealed")).streams["sealed"].exists
        await client.create_stream("open", "open.in", encryption=False)
        await client.create_stream("default", "default.in")
        for stream in ("open", "default"):
            await client.publish(stream, b"visible", ack_policy="all")
            assert await batches(client, stream) == [(0, None, b"visible")]
            assert b"visible" in segments(tmp_path, stream)


async def test_streams_encryption_is_the_default_decided_when_a_stream_is_created(tmp_path, monkeypatch):
    monkeypatch.setenv("LIFTBRIDGE_ENCRYPTION_KEY", KEY)
    async with running_node(tmp_path, **{"streams.encryption": True}) as (node, address), Client(address) as client:
        await client.wait_ready()
        await client.create_stream("by-default", "by-default.in")
        await client.create_stream("opted-out", "opted-out.in", encryption=False)
        for stream in ("by-default", "opted-out"):
            await client.publish(stream, b"value-of-" + stream.encode(), ack_policy="all")
            assert await batches(client, stream) == [(0, None, b"value-of-" + stream.encode())]
        assert node.state.streams["by-default"].settings["encryption"] is True
        assert b"value-of-by-default" not in segments(tmp_path, "by-default")
        assert b"value-of-opted-out" in segments(tmp_path, "opted-out")
    monkeypatch.delenv("LIFTBRIDGE_ENCRYPTION_KEY")
    async with running_node(tmp_path, **{"streams.encryption": True}) as (node, address), Client(address) as client:
        await client.wait_ready()
        with pytest.raises(BasculeError, match="Failed on preconditions for stream's encryption handler: "
                                               "LIFTBRIDGE_ENCRYPTION_KEY is not set") as refused:
            await client.create_stream("no-key", "no-key.in")
        assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
        await client.create_stream("opted-out-too", "opted-out-too.in", encryption=False)


async def test_a_node_without_the_key_or_with_another_refuses_an_encrypted_streams_writes_and_reads(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("LIFTBRIDGE_ENCRYPTION_KEY", KEY)
    async with running_node(tmp_path) as (node, address), Client(address) as client:
        await client.wait_ready()
        await client.create_stream("sealed", "sealed.in", encryption=True)
        await client.publish_many("sealed", [b"written-with-the-key"], ack_policy="all")

    monkeypatch.delenv("LIFTBRIDGE_ENCRYPTION_KEY")
    async with running_node(tmp_path) as (node, address), Client(address) as client:
        await client.wait_ready()
        await wait_for(lambda: _leads(node, "sealed"), 10, "the partition led again")
        failed = await subscribe_error(address, "sealed")
        assert failed.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert failed.details() == ("Partition is encrypted and this server has no valid key: "
                                    "LIFTBRIDGE_ENCRYPTION_KEY is not set")
        with pytest.raises(BasculeError) as refused:  # bascule's client reads through SubscribeBatches
            await batches(client, "sealed")
        assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION

        async with grpc.aio.insecure_channel(address) as channel:
            stub = api_pb2_grpc.APIStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as publish_refused:
                await stub.Publish(api_pb2.PublishRequest(stream="sealed", value=b"never-stored", ackPolicy=ALL),
                                   timeout=10)
            assert publish_refused.value.code() == grpc.StatusCode.INTERNAL  # Liftbridge's code for it
            assert publish_refused.value.details().startswith("encryption failed on partition")

            async def requests():
                yield api_pb2.PublishRequest(stream="sealed", value=b"never-stored", correlationId="1", ackPolicy=ALL)

            (response,) = [r async for r in stub.PublishAsync(requests())]
            assert response.asyncError.code == api_pb2.PublishAsyncError.Code.ENCRYPTION_FAILED
            assert response.correlationId == "1"

        nc = await nats.connect(node._embedded.url)
        try:
            inbox = await nc.subscribe("acks.sealed")
            message = api_pb2.Message(value=b"never-stored", ackInbox="acks.sealed", correlationId="n", ackPolicy=ALL)
            await nc.publish("sealed.in", envelope.encode_message(message, envelope.MsgType.PUBLISH))
            await nc.publish("sealed.in", b"never-stored-plain")
            ack = envelope.decode_message((await inbox.next_msg(timeout=5)).data, envelope.MsgType.ACK, api_pb2.Ack)
            assert (ack.ackError, ack.correlationId) == (api_pb2.Ack.Error.ENCRYPTION, "n")
            await nc.flush()
        finally:
            await nc.close()
        await asyncio.sleep(0.2)
        assert node.partitions.get("sealed", 0).replica.log.next_offset == 1  # nothing appended
        assert b"never-stored" not in segments(tmp_path, "sealed")

    monkeypatch.setenv("LIFTBRIDGE_ENCRYPTION_KEY", OTHER_KEY)
    async with running_node(tmp_path) as (node, address), Client(address) as client:
        await client.wait_ready()
        await wait_for(lambda: _leads(node, "sealed"), 10, "the partition led again")
        failed = await subscribe_error(address, "sealed")
        assert failed.code() == grpc.StatusCode.DATA_LOSS
        assert failed.details().startswith("encrypted value does not decrypt at offset 0: its data key does not")
        assert (await client.publish("sealed", b"new-key-value", ack_policy="all")).offset == 1  # the node serves on


async def _leads(node, stream: str) -> bool:
    local = node.partitions.get(stream, 0)
    return local is not None and local.replica.is_leader


async def test_a_compacted_encrypted_stream_reads_back_in_plaintext_across_its_gaps(tmp_path, monkeypatch):
    monkeypatch.setenv("LIFTBRIDGE_ENCRYPTION_KEY", KEY)
    async with running_node(tmp_path, **CLEANER) as (node, address), Client(address) as client:
        await client.wait_ready()
        await client.create_stream("kv", "kv", compact_enabled=True, encryption=True, segment_max_bytes=400)
        latest: dict[bytes, tuple[int, bytes]] = {}
        for round_number in range(12):
            for key in (b"a", b"b", b"c"):
                value = b"secret-" + key + str(round_number).encode()
                latest[key] = ((await client.publish("kv", value, key=key, ack_policy="all")).offset, value)
        ends = [(await client.publish("kv", b"secret-end", ack_policy="all")).offset for _ in range(3)]
        expected = sorted([(offset, key, value) for key, (offset, value) in latest.items()]
                          + [(offset, None, b"secret-end") for offset in ends])

        async def compacted():
            return await batches(client, "kv") == expected

        await wait_for(compacted, 20, "the stream compacted")
        assert [(m.offset, m.key or None, m.value) for m in await subscribed(address, "kv")] == expected
        from_a_gap = [(m.offset, m.value) async for m in client.subscribe("kv", offset=1, stop_latest=True)]
        assert from_a_gap == [(o, v) for o, _, v in expected if o >= 1]
        assert b"secret-" not in segments(tmp_path, "kv")


@pytest.mark.cluster
@pytest.mark.timeout(120)
async def test_a_new_leader_with_the_same_key_reads_what_the_old_one_sealed():
    values = [b"replicated-secret-%d" % i for i in range(20)]
    with LocalCluster(3, config=FAST, env={"LIFTBRIDGE_ENCRYPTION_KEY": KEY}) as cluster:
        async with Client(cluster.brokers[0]) as client:
            await client.create_stream("sealed", "sealed.in", replication_factor=3, min_isr=2, encryption=True)
        await wait_for(lambda: converged(cluster, "sealed", [0, 1, 2]), 15, "a leader and a full ISR", cluster)
        old = await leader_index(cluster, "sealed")
        async with Client(cluster.node(old).address) as client:
            acks = await client.publish_many("sealed", values, ack_policy="all")
        assert [ack.offset for ack in acks] == list(range(20))
        followers = [index for index in range(3) if index != old]
        for index in followers:  # a follower reads (readISRReplica) what its leader sealed
            address = cluster.node(index).address
            await wait_for(lambda address=address: _reads(address, values), 15, "the follower holding it all", cluster)

        cluster.kill(old)
        leader = await new_leader(cluster, "sealed", followers, cluster.node(old).server_id)
        leader_address = cluster.node(leader).address
        assert [m.value for m in await read_node(leader_address, "sealed", isr_replica=False)] == values
        await wait_for(lambda: converged(cluster, "sealed", followers), 15, "the ISR without the old leader", cluster)
        async with Client(leader_address) as client:
            more = [b"sealed-by-the-new-leader-%d" % i for i in range(3)]
            assert [ack.offset for ack in await client.publish_many("sealed", more, ack_policy="all")] == [20, 21, 22]
            assert [value for _, _, value in await batches(client, "sealed")] == values + more

        await restart(cluster, old)
        old_address = cluster.node(old).address
        await wait_for(lambda: _reads(old_address, values + more), 20, "the old leader caught up", cluster)
        for index in range(3):
            files = b"".join(path.read_bytes() for path in partition_dir(cluster, index, "sealed").glob("*.log"))
            assert len(files) > 23 * 69 and b"secret" not in files and b"sealed-by" not in files


async def _reads(address: str, values: list[bytes]) -> bool:
    return [m.value for m in await read_node(address, "sealed")] == values
