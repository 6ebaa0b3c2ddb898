"""One in-process node with embedded NATS, driven by gufo-liftbridge, nats-py and bascule's client."""

import asyncio
import base64
import contextlib
import json
import logging
import os
import re
import sys

import grpc
import msgpack
import nats
import pytest
from conftest import not_private, running_node
from gufo.liftbridge.client import LiftbridgeClient
from gufo.liftbridge.error import ErrorNotFound
from gufo.liftbridge.types import StartPosition

from bascule.client import BasculeError, Client
from bascule.natsio.sealed import SealedNats
from bascule.node import identity
from bascule.node.node import InsecureRaft
from bascule.wire import envelope
from bascule.wire.names import MAX_PARTITIONS
from bascule.wire.pb import api_pb2, api_pb2_grpc
from bascule.wire.seal import Sealer, derive_key

pytestmark = pytest.mark.anyio


async def collect(iterator, count, timeout=10):
    out = []

    async def take():
        async for item in iterator:
            out.append(item)
            if len(out) >= count:
                return

    await asyncio.wait_for(take(), timeout)
    return out


async def test_gufo_liftbridge_end_to_end(tmp_path):
    async with running_node(tmp_path) as (node, address):
        await Client(address).wait_ready()
        async with LiftbridgeClient([address]) as lb:
            await lb.create_stream("events", subject="events.in", partitions=1, wait_for_stream=True)
            meta = await lb.get_metadata()
            assert [s.name for s in meta.metadata if s.name == "events"] == ["events"]
            assert meta.brokers[0].port == node.api_port
            for i in range(5):
                await lb.publish(f"m{i}".encode(), stream="events", key=b"k", headers={"h": str(i).encode()})
            await asyncio.sleep(0.2)
            got = await collect(lb.subscribe("events", start_position=StartPosition.EARLIEST), 5)
            assert [m.value for m in got] == [b"m0", b"m1", b"m2", b"m3", b"m4"]
            assert [m.offset for m in got] == [0, 1, 2, 3, 4]
            assert got[2].headers["h"] == b"2" and got[2].key == b"k"
            from_offset = await collect(lb.subscribe("events", start_offset=3), 2)
            assert [m.offset for m in from_offset] == [3, 4]
            await lb.set_cursor(stream="events", partition=0, cursor_id="c1", offset=3)
            # gufo stores offset + 1 (the next offset to read) and returns what is stored.
            assert await lb.get_cursor(stream="events", partition=0, cursor_id="c1") == 4
            assert await lb.get_cursor(stream="events", partition=0, cursor_id="never") == -1
            with pytest.raises(ErrorNotFound):
                await lb.delete_stream("no-such-stream")
            await lb.delete_stream("events")
            meta = await lb.get_metadata()
            assert "events" not in [s.name for s in meta.metadata]


@pytest.mark.parametrize("sync", ["never", "always"])
async def test_plain_nats_publishes_are_captured_with_subject_headers(tmp_path, sync):
    async with running_node(tmp_path, **{"streams.sync": sync}) as (node, address):
        async with Client(address) as client:
            await client.wait_ready()
            await client.create_stream("plain", "plain.sub", partitions=2)
            nc = await nats.connect(node._embedded.url)
            for i in range(100):
                await nc.publish("plain.sub", f"v{i}".encode(), reply="r.x")
                await nc.publish("plain.sub.1", f"w{i}".encode())
            await nc.flush()
            await nc.close()
            p0 = await collect(client.subscribe("plain", 0, start="earliest"), 100)
            p1 = await collect(client.subscribe("plain", 1, start="earliest"), 100)
            assert [m.value for m in p0] == [f"v{i}".encode() for i in range(100)]
            assert [m.value for m in p1] == [f"w{i}".encode() for i in range(100)]
            assert p0[0].subject == "plain.sub" and p0[0].headers["reply"] == b"r.x"
            assert [m.offset for m in p1] == list(range(100))


async def test_a_stream_of_the_most_partitions_takes_writes_on_its_last(tmp_path):
    """4,096 partitions (wire.names.MAX_PARTITIONS): created, its last partition written and read."""
    async with running_node(tmp_path) as (node, address):
        async with Client(address, timeout=60) as client:
            await client.wait_ready()
            await client.create_stream("wide", "wide", partitions=MAX_PARTITIONS)
            last = MAX_PARTITIONS - 1
            assert (await client.publish("wide", b"last", partition=last, ack_policy="all")).offset == 0
            [message] = await collect(client.subscribe("wide", last, start="earliest"), 1)
            assert message.value == b"last"
            with pytest.raises(BasculeError):
                await client.create_stream("wider", "wider", partitions=MAX_PARTITIONS + 1)


async def test_envelope_publish_gets_ack_on_its_inbox(tmp_path):
    async with running_node(tmp_path) as (node, address):
        async with Client(address) as client:
            await client.wait_ready()
            await client.create_stream("env", "env.sub")
            nc = await nats.connect(node._embedded.url)
            acks = []

            async def on_ack(msg):
                acks.append(msg)

            sub = await nc.subscribe("acks.>", cb=on_ack)
            for policy in (api_pb2.AckPolicy.LEADER, api_pb2.AckPolicy.ALL, api_pb2.AckPolicy.NONE):
                message = api_pb2.Message(value=b"x", key=b"k", ackInbox=f"acks.{policy}", correlationId=f"c{policy}",
                                          ackPolicy=policy)
                await nc.publish("env.sub", envelope.encode_message(message, envelope.MsgType.PUBLISH))
            await nc.publish("env.sub", b"\xb9\x0e\x43\xb4garbage")
            await nc.flush()
            for _ in range(50):
                if len(acks) >= 2:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)
            decoded = sorted((envelope.decode_message(m.data, envelope.MsgType.ACK, api_pb2.Ack) for m in acks),
                             key=lambda a: a.offset)
            assert [(a.offset, a.correlationId, a.stream) for a in decoded] == [(0, "c0", "env"), (1, "c1", "env")]
            await sub.unsubscribe()
            await nc.close()
            stored = await collect(client.subscribe("env", start="earliest"), 4)
            assert stored[3].value == b"\xb9\x0e\x43\xb4garbage"


async def test_api_errors_match_liftbridge(tmp_path):
    async with running_node(tmp_path) as (node, address):
        async with Client(address) as client:
            await client.wait_ready()
            await client.create_stream("dup", "dup")
            for bad, code in [(("dup", "dup"), grpc.StatusCode.ALREADY_EXISTS),
                              (("", "x"), grpc.StatusCode.INVALID_ARGUMENT),
                              (("__cursors", "x"), grpc.StatusCode.INVALID_ARGUMENT),
                              (("ok", "bad subject"), grpc.StatusCode.INVALID_ARGUMENT),
                              (("../etc", "x"), grpc.StatusCode.INVALID_ARGUMENT)]:
                with pytest.raises(BasculeError) as failure:
                    await client.create_stream(*bad)
                assert failure.value.code == code, bad
            with pytest.raises(BasculeError) as failure:
                await client.create_stream("big", "big", replication_factor=3)
            assert failure.value.code == grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(BasculeError, match="min ISR 2 exceeds the replication factor 1") as failure:
                await client.create_stream("strict", "strict", replication_factor=1, min_isr=2)
            assert failure.value.code == grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(BasculeError) as failure:
                await collect(client.subscribe("nope"), 1)
            assert failure.value.code == grpc.StatusCode.NOT_FOUND
            await client.publish("dup", b"first", ack_policy="all")
            assert [m.offset for m in await collect(client.subscribe("dup", offset=-3), 1)] == [0]  # from the oldest
            metadata = await client.fetch_metadata("nope")
            assert not metadata.streams["nope"].exists


async def test_publish_ack_policies_and_stop_positions(tmp_path):
    async with running_node(tmp_path) as (node, address):
        async with Client(address) as client:
            await client.wait_ready()
            await client.create_stream("acks", "acks")
            leader = await client.publish("acks", b"a", ack_policy="leader")
            everyone = await client.publish("acks", b"b", ack_policy="all", correlation_id="x")
            assert (leader.offset, everyone.offset, everyone.correlation_id) == (0, 1, "x")
            assert await client.publish("acks", b"c", ack_policy="none") is None
            acks = await client.publish_many("acks", [b"d%d" % i for i in range(200)], ack_policy="all")
            assert [a.offset for a in acks] == list(range(3, 203))
            latest = [m.offset async for m in client.subscribe("acks", start="earliest", stop_latest=True)]
            assert latest == list(range(203))
            upto = [m.offset async for m in client.subscribe("acks", offset=10, stop_offset=12)]
            assert upto == [10, 11, 12]
            partition = await client.fetch_partition_metadata("acks")
            assert (partition.high_watermark, partition.newest_offset) == (202, 202)


async def test_pause_and_readonly(tmp_path):
    async with running_node(tmp_path) as (node, address):
        async with Client(address) as client:
            await client.wait_ready()
            await client.create_stream("ro", "ro")
            await client.publish("ro", b"1")
            await client.set_stream_readonly("ro")
            with pytest.raises(BasculeError) as failure:
                await client.publish("ro", b"2")
            assert failure.value.code == grpc.StatusCode.FAILED_PRECONDITION
            # A readonly partition's subscription ends after its last message.
            assert [m.value async for m in client.subscribe("ro", start="earliest")] == [b"1"]
            await client.create_stream("pz", "pz")
            await client.pause_stream("pz")
            assert (await client.fetch_metadata("pz")).streams["pz"].partitions[0].paused
            ack = await client.publish("pz", b"resumes")
            assert ack.offset == 0
            assert not (await client.fetch_metadata("pz")).streams["pz"].partitions[0].paused
        # Liftbridge's event times, as its clients read them from the partition's metadata
        async with grpc.aio.insecure_channel(address) as channel:
            stub = api_pb2_grpc.APIStub(channel)
            ro, pz = [
                (await stub.FetchPartitionMetadata(
                    api_pb2.FetchPartitionMetadataRequest(stream=name, partition=0), timeout=5)).metadata
                for name in ("ro", "pz")
            ]
        assert 0 < ro.messagesReceivedTimestamps.firstTimestamp <= ro.readonlyTimestamps.firstTimestamp
        assert (ro.pauseTimestamps.firstTimestamp, pz.readonlyTimestamps.firstTimestamp) == (0, 0)
        assert 0 < pz.pauseTimestamps.firstTimestamp < pz.pauseTimestamps.latestTimestamp  # paused, resumed
        assert pz.pauseTimestamps.latestTimestamp <= pz.messagesReceivedTimestamps.latestTimestamp


async def test_publish_async_answers_every_request_in_its_own_way(tmp_path):
    async with running_node(tmp_path) as (node, address):
        async with Client(address) as client:
            await client.wait_ready()
            for name in ("ok", "ro", "pz"):
                await client.create_stream(name, name)
            await client.set_stream_readonly("ro")
            await client.pause_stream("pz")
            ALL, NONE = api_pb2.AckPolicy.ALL, api_pb2.AckPolicy.NONE
            requests = [
                api_pb2.PublishRequest(stream="ok", value=b"a", correlationId="1", ackPolicy=ALL),
                api_pb2.PublishRequest(stream="nope", value=b"x", correlationId="2", ackPolicy=ALL),
                api_pb2.PublishRequest(stream="ok", value=b"quiet", correlationId="3", ackPolicy=NONE),
                api_pb2.PublishRequest(stream="ro", value=b"x", correlationId="4", ackPolicy=ALL),
                api_pb2.PublishRequest(stream="pz", value=b"resumes", correlationId="5", ackPolicy=ALL),
                api_pb2.PublishRequest(stream="ok", value=b"b", correlationId="6", ackPolicy=api_pb2.AckPolicy.LEADER),
                api_pb2.PublishRequest(
                    stream="ok", value=b"x" * (node.publishing.max_message_bytes + 1), correlationId="7"
                ),
            ]

            async def stream():
                for request in requests:
                    yield request

            channel = grpc.aio.insecure_channel(address)
            responses = {r.correlationId: r async for r in api_pb2_grpc.APIStub(channel).PublishAsync(stream())}
            await channel.close()
            assert sorted(responses) == ["1", "2", "4", "5", "6", "7"]  # the stream ends after the last answer
            assert (responses["1"].ack.offset, responses["6"].ack.offset) == (0, 2)
            assert responses["1"].ack.ackPolicy == ALL and responses["1"].ack.stream == "ok"
            assert responses["5"].ack.offset == 0 and responses["5"].ack.stream == "pz"
            codes = {key: api_pb2.PublishAsyncError.Code.Name(responses[key].asyncError.code) for key in "247"}
            assert codes == {"2": "NOT_FOUND", "4": "READONLY", "7": "BAD_REQUEST"}
            # Each error also carries an empty Ack, as Liftbridge's do: older clients read it unchecked.
            assert all(responses[key].HasField("ack") and not responses[key].ack.correlationId for key in "247")
            values = [m.value async for m in client.subscribe("ok", start="earliest", stop_latest=True)]
            assert values == [b"a", b"quiet", b"b"]


async def test_publish_async_to_a_paused_partition_stores_the_requests_in_order(tmp_path):
    """The first request resumes the partition; those that arrive meanwhile wait behind it (they
    used to race it to the log: [14, 15, 0, 1, ...])."""
    async with running_node(tmp_path) as (node, address):
        async with Client(address) as client:
            await client.wait_ready()
            await client.create_stream("pz", "pz")
            await client.pause_stream("pz")
            values = [b"m-%03d" % i for i in range(300)]

            async def stream():
                for i, value in enumerate(values):
                    yield api_pb2.PublishRequest(stream="pz", value=value, correlationId=str(i),
                                                 ackPolicy=api_pb2.AckPolicy.LEADER)

            channel = grpc.aio.insecure_channel(address)
            responses = [r async for r in api_pb2_grpc.APIStub(channel).PublishAsync(stream())]
            await channel.close()
            assert sorted((int(r.correlationId), r.ack.offset) for r in responses) == [(i, i) for i in range(300)]
            stored = [m.value async for m in client.subscribe("pz", start="earliest", stop_latest=True)]
            assert stored == values


async def test_subscribe_with_resume_wakes_a_paused_partition(tmp_path):
    async with running_node(tmp_path) as (node, address):
        async with Client(address) as client:
            await client.wait_ready()
            await client.create_stream("nap", "nap")
            await client.publish_many("nap", [b"a", b"b"], ack_policy="all")
            await client.pause_stream("nap")
            channel = grpc.aio.insecure_channel(address)
            stub = api_pb2_grpc.APIStub(channel)
            request = api_pb2.SubscribeRequest(stream="nap", startPosition=api_pb2.StartPosition.EARLIEST,
                                               stopPosition=api_pb2.StopPosition.STOP_LATEST, resume=True)
            got = []
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                async for message in stub.Subscribe(request, timeout=10):
                    got.append(message.value)
            await channel.close()
            assert ended.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # the stop offset, not "paused"
            assert got == [b"", b"a", b"b"]  # the handshake, then the messages
            assert not (await client.fetch_metadata("nap")).streams["nap"].partitions[0].paused


async def test_an_explicit_zero_retention_limit_is_no_limit(tmp_path):
    """As in Liftbridge: a stream created with retentionMaxMessages 0 keeps everything; one that
    does not set it gets the cluster's limit."""
    settings = {"streams.retention.max.messages": 5, "streams.segment.max.bytes": 200,
                "streams.cleaner.interval": "100ms"}
    async with running_node(tmp_path, **settings) as (node, address):
        async with Client(address) as client:
            await client.wait_ready()
            await client.create_stream("limited", "limited")
            await client.create_stream("unlimited", "unlimited", retention_max_messages=0)
            for name in ("limited", "unlimited"):
                await client.publish_many(name, [b"message-%02d" % i for i in range(20)], ack_policy="all")
            await asyncio.sleep(0.5)  # a few cleaner passes

            async def oldest(name: str) -> int:
                return [m.offset async for m in client.subscribe(name, start="earliest", stop_latest=True)][0]

            assert await oldest("limited") > 0
            assert await oldest("unlimited") == 0


async def test_a_streams_own_cleaner_interval_decides_when_its_retention_runs(tmp_path):
    """Liftbridge's cleanerInterval: a stream that sets it is cleaned that often, whatever the
    server's streams.cleaner.interval (an hour here); 0 means the server's."""
    settings = {"streams.retention.max.messages": 5, "streams.segment.max.bytes": 200,
                "streams.cleaner.interval": "1h"}
    async with running_node(tmp_path, **settings) as (node, address):
        async with Client(address) as client:
            await client.wait_ready()
            await client.create_stream("quick", "quick", cleaner_interval=0.2)
            await client.create_stream("default", "default", cleaner_interval=0)
            for name in ("quick", "default"):
                await client.publish_many(name, [b"message-%02d" % i for i in range(20)], ack_policy="all")

            async def oldest(name: str) -> int:
                return [m.offset async for m in client.subscribe(name, start="earliest", stop_latest=True)][0]

            deadline = asyncio.get_running_loop().time() + 10
            while await oldest("quick") == 0:
                assert asyncio.get_running_loop().time() < deadline, "the stream's cleaner never ran"
                await asyncio.sleep(0.2)
            assert await oldest("default") == 0


async def test_publish_async_keeps_each_partitions_order_across_interleaved_and_mixed_requests(tmp_path):
    """One PublishAsync call, requests to two partitions interleaved, some with headers (which take
    the general path) and some refused: every partition stores its own in the order sent, each
    request is answered once, and a refusal takes nothing else with it."""
    async with running_node(tmp_path) as (node, address), Client(address) as client:
        await client.wait_ready()
        await client.create_stream("mixed", "mixed", partitions=2)
        requests = []
        for i in range(300):
            partition = (i // 3) % 2  # runs of three
            headers = {"n": b"%d" % i} if i % 7 == 0 else {}
            stream = "nowhere" if i % 50 == 49 else "mixed"
            requests.append(api_pb2.PublishRequest(stream=stream, partition=partition, value=b"%d" % i,
                                                   headers=headers, correlationId=str(i),
                                                   ackPolicy=api_pb2.AckPolicy.ALL))
        async with grpc.aio.insecure_channel(address) as channel:
            call = api_pb2_grpc.APIStub(channel).PublishAsync(iter(requests), timeout=20)
            responses = [response async for response in call]
        assert sorted(int(r.correlationId) for r in responses) == list(range(300))
        refused = {int(r.correlationId) for r in responses if r.HasField("asyncError")}
        assert refused == {i for i in range(300) if i % 50 == 49}
        for partition in (0, 1):
            stored = [m async for m in client.subscribe("mixed", partition, start="earliest", stop_latest=True)]
            sent = [i for i in range(300) if (i // 3) % 2 == partition and i not in refused]
            assert [int(m.value) for m in stored] == sent
            assert [m.offset for m in stored] == list(range(len(sent)))
            assert all((m.headers.get("n") == b"%d" % int(m.value)) == (int(m.value) % 7 == 0) for m in stored)


async def test_reverse_subscribe_reads_newest_to_oldest_as_liftbridge(tmp_path):
    """liftbridge-api v2's SubscribeRequest.reverse: the committed messages from the start position
    down to the oldest, newest first, the same Messages a forward read gets; then UNKNOWN "EOF", as
    Liftbridge's reverse reader ends. A stop at the start ends after that one message; an empty
    partition is refused as Liftbridge refuses it."""
    Start, Stop = api_pb2.StartPosition, api_pb2.StopPosition
    async with running_node(tmp_path) as (node, address), Client(address) as client:
        await client.wait_ready()
        await client.create_stream("back", "back")
        await client.create_stream("empty", "empty")
        await client.publish_many("back", [b"m%d" % i for i in range(300)], ack_policy="all")
        async with grpc.aio.insecure_channel(address) as channel:
            stub = api_pb2_grpc.APIStub(channel)

            async def read(**fields):
                call = stub.Subscribe(api_pb2.SubscribeRequest(**fields), timeout=10)
                messages = []
                with contextlib.suppress(grpc.aio.AioRpcError):  # its status is looked at below
                    async for message in call:
                        messages.append(message)
                return messages[1:], await call.code(), await call.details()  # after the handshake

            forwards, _, _ = await read(stream="back", startPosition=Start.EARLIEST, stopPosition=Stop.STOP_LATEST)
            assert [m.value for m in forwards] == [b"m%d" % i for i in range(300)]
            latest = await read(stream="back", startPosition=Start.LATEST, reverse=True)
            assert latest == (forwards[::-1], grpc.StatusCode.UNKNOWN, "EOF")
            assert (await read(stream="back", reverse=True))[0] == forwards[::-1]  # new only: from the HW
            from_offset, _, _ = await read(stream="back", startPosition=Start.OFFSET, startOffset=130, reverse=True)
            assert [m.offset for m in from_offset] == list(range(130, -1, -1))
            stopped = await read(stream="back", startPosition=Start.OFFSET, startOffset=7, reverse=True,
                                 stopPosition=Stop.STOP_OFFSET, stopOffset=7)
            assert ([m.offset for m in stopped[0]], stopped[1]) == ([7], grpc.StatusCode.RESOURCE_EXHAUSTED)
            empty = await read(stream="empty", startPosition=Start.EARLIEST, reverse=True)
            assert (empty[0], empty[1]) == ([], grpc.StatusCode.INTERNAL)
        backwards = [m.offset async for m in client.subscribe("back", offset=9, reverse=True)]
        assert backwards == list(range(9, -1, -1))  # bascule's client ends at Liftbridge's "EOF"
        done = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bascule.cli", "subscribe", "-s", "back", "-a", address, "-o", "3", "--reverse",
            "--json",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(done.communicate(), 30)
        assert done.returncode == 0, err
        values = [base64.b64decode(json.loads(line)["value"]) for line in out.decode().splitlines()]
        assert values == [b"m3", b"m2", b"m1", b"m0"]


async def test_the_cli_creates_compacted_streams_and_refuses_encryption_without_a_key(tmp_path, monkeypatch):
    monkeypatch.delenv("LIFTBRIDGE_ENCRYPTION_KEY", raising=False)
    monkeypatch.delenv("BASCULE_ENCRYPTION_KEY", raising=False)
    async with running_node(tmp_path) as (node, address), Client(address) as client:
        await client.wait_ready()

        async def cli(*args):
            done = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bascule.cli", "create", "-a", address, *args,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(done.communicate(), 30)
            return done.returncode, err.decode()

        assert (await cli("-s", "kv", "--compact"))[0] == 0
        assert (await cli("-s", "plain"))[0] == 0
        compacted = {p["stream"]: p["compacted"] for p in await client.partitions(metadata_only=True)}
        assert (compacted["kv"], compacted["plain"]) == (True, False)
        code, err = await cli("-s", "secret", "--encryption")
        assert code != 0 and "encryption" in err
        assert "secret" not in (await client.fetch_metadata()).streams


async def test_a_publish_reaches_every_stream_on_its_subject_and_its_ack_inbox(tmp_path):
    """As Liftbridge's, a Publish goes through the stream's NATS subject when another stream captures
    it too (both store it), and an ackInbox the request names gets the ack (Publish and
    PublishToSubject alike); a wildcard or malformed ackInbox is refused."""
    async with running_node(tmp_path) as (node, address):
        async with Client(address) as client:
            await client.wait_ready()
            await client.create_stream("first", "shared")
            await client.create_stream("second", "shared")
            await client.create_stream("alone", "alone")
            nc = await nats.connect(node._embedded.url)
            inbox = await nc.subscribe("my.inbox")
            channel = grpc.aio.insecure_channel(address)
            stub = api_pb2_grpc.APIStub(channel)
            ALL = api_pb2.AckPolicy.ALL
            try:
                response = await stub.Publish(api_pb2.PublishRequest(stream="first", value=b"both", ackPolicy=ALL),
                                              timeout=10)
                assert response.ack.stream == "first" and response.ack.offset == 0
                # Both streams ack it; each publish is answered by the stream it named.
                response = await stub.Publish(api_pb2.PublishRequest(stream="second", value=b"too", ackPolicy=ALL),
                                              timeout=10)
                assert response.ack.stream == "second" and response.ack.offset == 1
                response = await stub.Publish(api_pb2.PublishRequest(
                    stream="alone", value=b"acked there", ackPolicy=ALL, ackInbox="my.inbox"), timeout=10)
                assert response.ack.offset == 0
                sent_ack = envelope.decode_message((await inbox.next_msg(timeout=5)).data, envelope.MsgType.ACK,
                                                   api_pb2.Ack)
                assert (sent_ack.stream, sent_ack.offset) == ("alone", 0)
                response = await stub.PublishToSubject(api_pb2.PublishToSubjectRequest(
                    subject="alone", value=b"to subject", ackPolicy=ALL, ackInbox="my.inbox"), timeout=10)
                assert response.ack.offset == 1
                assert envelope.decode_message((await inbox.next_msg(timeout=5)).data, envelope.MsgType.ACK,
                                               api_pb2.Ack).offset == 1
                for bad in ("my.*", "my inbox", "my..inbox"):
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await stub.Publish(api_pb2.PublishRequest(stream="alone", value=b"x", ackInbox=bad), timeout=5)
                    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, bad
            finally:
                await channel.close()
                await nc.close()
            for name in ("first", "second"):
                got = [m.value async for m in client.subscribe(name, start="earliest", stop_latest=True)]
                assert got == [b"both", b"too"], name
            alone = [m.value async for m in client.subscribe("alone", start="earliest", stop_latest=True)]
            assert alone == [b"acked there", b"to subject"]


async def test_restart_keeps_streams_and_messages(tmp_path):
    async with running_node(tmp_path) as (node, address):
        async with Client(address) as client:
            await client.wait_ready()
            await client.create_stream("keep", "keep", partitions=2)
            await client.publish_many("keep", [b"x%d" % i for i in range(50)], ack_policy="all")
    async with running_node(tmp_path) as (node, address):
        async with Client(address) as client:
            await client.wait_ready()
            for _ in range(50):
                if node.partitions.get("keep", 0):
                    break
                await asyncio.sleep(0.05)
            got = [m.value async for m in client.subscribe("keep", start="earliest", stop_latest=True)]
            assert got == [b"x%d" % i for i in range(50)]
            ack = await client.publish("keep", b"after")
            assert ack.offset == 50


async def test_a_clean_stop_is_recorded_and_a_lone_node_leads_again_after_an_unclean_one(tmp_path):
    """A graceful stop leaves the clean-shutdown marker, which the next start takes; without it
    (a crash), the node's ISR memberships are marked unclean, and as the whole ISR it still leads."""
    async with running_node(tmp_path) as (node, address):
        async with Client(address) as client:
            await client.wait_ready()
            await client.create_stream("marked", "marked")
            await client.publish("marked", b"before", ack_policy="all")
    marker = tmp_path / identity.CLEAN_SHUTDOWN
    assert marker.exists()
    marker.unlink()  # as if the process had died
    async with running_node(tmp_path) as (node, address):
        assert not marker.exists()
        async with Client(address) as client:
            await client.wait_ready()
            ack = await client.publish("marked", b"after", ack_policy="all")
            assert ack.offset == 1
        partition = node.state.partition("marked", 0)
        assert (partition.leader, partition.unclean) == (node.server_id, ())
    assert marker.exists()


async def test_oversize_publish_is_refused_and_node_keeps_serving(tmp_path):
    async with running_node(tmp_path) as (node, address):
        async with Client(address) as client:
            await client.wait_ready()
            await client.create_stream("big", "big")
            with pytest.raises(BasculeError) as failure:
                await client.publish("big", b"x" * (node.publishing.max_message_bytes + 1))
            assert failure.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert "exceeds the limit" in failure.value.message
            assert (await client.publish("big", b"small")).offset == 0


async def test_flipped_byte_in_segment_is_never_served(tmp_path):
    async with running_node(tmp_path) as (node, address):
        async with Client(address) as client:
            await client.wait_ready()
            await client.create_stream("rot", "rot")
            await client.publish_many("rot", [b"payload-%03d" % i for i in range(100)], ack_policy="all")
    [stream_dir] = (tmp_path / "streams").glob("rot@*")
    segment = next((stream_dir / "0").glob("*.log"))
    data = bytearray(segment.read_bytes())
    position = data.find(b"payload-040")
    data[position + 8] ^= 0x01
    segment.write_bytes(bytes(data))
    async with running_node(tmp_path) as (node, address):
        async with Client(address) as client:
            await client.wait_ready()
            served = []
            with pytest.raises(BasculeError) as failure:
                async for m in client.subscribe("rot", start="earliest", stop_latest=True):
                    served.append(m.value)
            assert failure.value.code == grpc.StatusCode.DATA_LOSS
            assert all(v == b"payload-%03d" % i for i, v in enumerate(served)) and len(served) <= 40
            after = [m.value async for m in client.subscribe("rot", offset=41, stop_latest=True)]
            assert after == [b"payload-%03d" % i for i in range(41, 100)]
            assert (await client.publish("rot", b"more")).offset == 100


async def test_garbage_on_internal_subjects_is_dropped_and_node_keeps_serving(tmp_path):
    async with running_node(tmp_path) as (node, address):
        async with Client(address) as client:
            await client.wait_ready()
            await client.create_stream("g", "g")
            nc = await nats.connect(node._embedded.url)
            ns = node.config.clustering.namespace
            junk = [b"", b"\x00" * 3, b"\xb9\x0e\x43\xb4\x00\x08\x00\x02garbage", b"\xb9\x0e\x43\xb4\x00\x08\x00\x99",
                    envelope.encode(envelope.MsgType.PROPAGATED_REQUEST, b"\xc1\xc1")]
            subjects = [f"{ns}.g.0.replicate", f"{ns}.g.0.offset", f"{ns}.notify.{node.server_id}",
                        f"{ns}.raft.metadata.propagate", f"{ns}.raft.metadata.join", f"{ns}.admin.status"]
            for subject in subjects:
                for payload in junk:
                    try:
                        await nc.request(subject, payload, timeout=0.2)
                    except Exception:
                        pass  # silence is the expected answer to garbage
            await nc.close()
            assert (await client.publish("g", b"still here", ack_policy="all")).offset == 0
            assert (await client.fetch_metadata("g")).streams["g"].exists


async def test_batch_path_matches_liftbridge_subscribe_and_honours_stop_positions(tmp_path):
    from bascule.client import _subscribe_messages

    async with running_node(tmp_path) as (node, address):
        async with Client(address) as client:
            await client.wait_ready()
            await client.create_stream("b", "b")
            await client.publish_many("b", [b"v%d" % i for i in range(3000)], ack_policy="all")
            batch = [m async for m in client.subscribe("b", offset=10, stop_offset=2500)]
            assert [m.offset for m in batch] == list(range(10, 2501))
            stub = await client._leader_stub("b", 0)
            request = api_pb2.SubscribeRequest(stream="b", startPosition=api_pb2.StartPosition.OFFSET, startOffset=10,
                                               stopPosition=api_pb2.StopPosition.STOP_OFFSET, stopOffset=2500)
            single = []
            with pytest.raises(grpc.aio.AioRpcError):
                async for m in _subscribe_messages(stub, request):
                    single.append(m)
            assert single == batch
            cutoff = batch[1000].timestamp
            request = api_pb2.SubscribeRequest(stream="b", startPosition=api_pb2.StartPosition.EARLIEST,
                                               stopPosition=api_pb2.StopPosition.STOP_TIMESTAMP, stopTimestamp=cutoff)
            by_time = []
            async for m in _batches(stub, request):
                by_time.append(m)
            assert by_time and by_time[-1].timestamp <= cutoff and all(m.timestamp <= cutoff for m in by_time)
            assert len(by_time) >= 1011


async def _batches(stub, request):
    from bascule.client import _subscribe_batches

    try:
        async for message in _subscribe_batches(stub, request):
            yield message
    except grpc.aio.AioRpcError as exc:
        assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_idle_partitions_auto_pause_and_publishing_resumes_them(tmp_path):
    async with running_node(tmp_path) as (node, address):
        async with Client(address) as client:
            await client.wait_ready()
            await client.create_stream("quiet", "quiet")
            stub = await client._leader_stub("quiet", 0)
            request = api_pb2.CreateStreamRequest(name="sleepy", subject="sleepy")
            request.autoPauseTime.value = 1500  # ms
            await stub.CreateStream(request)
            await client.publish("sleepy", b"1")
            for _ in range(60):
                if (await client.fetch_metadata("sleepy")).streams["sleepy"].partitions[0].paused:
                    break
                await asyncio.sleep(0.1)
            assert (await client.fetch_metadata("sleepy")).streams["sleepy"].partitions[0].paused
            assert not (await client.fetch_metadata("quiet")).streams["quiet"].partitions[0].paused
            assert (await client.publish("sleepy", b"2")).offset == 1
            assert not (await client.fetch_metadata("sleepy")).streams["sleepy"].partitions[0].paused


async def test_a_stop_before_the_start_ends_a_batch_read_at_once_and_is_invalid_for_subscribe(tmp_path):
    async with running_node(tmp_path) as (node, address):
        async with Client(address) as client:
            await client.wait_ready()
            await client.create_stream("past", "past")
            await client.publish_many("past", [b"a", b"b", b"c"], ack_policy="all")
            got = await asyncio.wait_for(collect_all(client.subscribe("past", offset=2, stop_offset=1)), 5)
            assert got == []
            latest = await collect_all(client.subscribe("past", start="latest", stop_latest=True))
            assert [m.offset for m in latest] == [2]
        # Liftbridge's Subscribe refuses such a range, as gufo-liftbridge and go-liftbridge see it.
        async with grpc.aio.insecure_channel(address) as channel:
            stub = api_pb2_grpc.APIStub(channel)
            for stop in (
                {"stopPosition": api_pb2.StopPosition.STOP_OFFSET, "stopOffset": 1},
                {"stopPosition": api_pb2.StopPosition.STOP_LATEST},  # NEW_ONLY starts past the newest
            ):
                at_two = {"startPosition": api_pb2.StartPosition.OFFSET, "startOffset": 2}
                start = at_two if "stopOffset" in stop else {}
                request = api_pb2.SubscribeRequest(stream="past", **start, **stop)
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    async for _ in stub.Subscribe(request, timeout=5):
                        pass
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert refused.value.details().startswith("Stop offset is before start offset: ")


async def collect_all(iterator):
    return [item async for item in iterator]


def _propagated_request(op: str, args) -> bytes:
    return envelope.encode(envelope.MsgType.PROPAGATED_REQUEST, msgpack.packb({"op": op, "args": args}))


async def _propagate(internal: SealedNats, ns: str, op: str, args) -> object:
    reply = await internal.request(f"{ns}.raft.metadata.propagate", _propagated_request(op, args), timeout=5)
    return msgpack.unpackb(envelope.decode(reply.data)[1], raw=False)["error"]


def _sealed(nc, node) -> SealedNats:
    """A NATS connection that seals with the node's cluster key, as the other nodes do."""
    return SealedNats(nc, Sealer(derive_key(identity.cluster_secret(node.config.clustering, node.data_dir))))


async def test_metadata_requests_without_the_cluster_key_are_dropped(tmp_path):
    """A well-formed metadata command from a NATS client without the cluster key (a delete, a
    leader change, a join) gets no answer and changes nothing."""
    async with running_node(tmp_path) as (node, address):
        async with Client(address) as client:
            await client.wait_ready()
            await client.create_stream("kept", "kept")
            nc = await nats.connect(node._embedded.url)
            ns = node.config.clustering.namespace
            stranger = SealedNats(nc, Sealer(derive_key("a guess")))
            members_before = node.raft.members()
            forged = [
                (f"{ns}.raft.metadata.propagate", _propagated_request("delete_stream", {"name": "kept"})),
                (f"{ns}.raft.metadata.join", envelope.encode(envelope.MsgType.RAFT_JOIN_REQUEST,
                                                             msgpack.packb({"raft": "127.0.0.1:1"}))),
            ]
            for subject, request in forged:
                for send in (nc.request, stranger.request):
                    with pytest.raises(nats.errors.TimeoutError):
                        await send(subject, request, timeout=0.5)
            await nc.close()
            assert (await client.fetch_metadata("kept")).streams["kept"].exists
            assert node.raft.members() == members_before
            assert (await client.publish("kept", b"ok", ack_policy="all")).offset == 0


async def test_well_formed_hostile_metadata_requests_are_refused_and_the_cluster_keeps_working(tmp_path):
    """A NATS client with the cluster key (a node of the cluster, or one that stole the key) can
    send the metadata leader requests: valid msgpack with hostile values is refused with
    INVALID_ARGUMENT, never proposed, never applied; Raft is not wedged and no
    directory appears outside the data dir."""
    async with running_node(tmp_path) as (node, address):
        async with Client(address) as client:
            await client.wait_ready()
            await client.create_stream("h", "h")
            nc = await nats.connect(node._embedded.url)
            internal = _sealed(nc, node)
            ns = node.config.clustering.namespace
            outside = tmp_path.parent / "x-escaped"
            hostile = [
                ("pause", {"name": "h", "partitions": [[0]], "resume_all": False, "at": 1}),
                ("create_stream", {"name": "../../x-escaped", "subject": "x", "group": "", "replication_factor": 1,
                                   "partitions": 1, "settings": {}}),
                ("create_stream", {"name": str(outside), "subject": "x", "group": "", "replication_factor": 1,
                                   "partitions": 1, "settings": {}}),
                ("create_stream", {"name": "big", "subject": "big", "group": "", "replication_factor": 1,
                                   "partitions": 2 ** 31, "settings": {}}),
                ("create_stream", {"name": "crlf", "subject": "crlf", "group": "q\r\nPUB x 1\r\n",
                                   "replication_factor": 1, "partitions": 1, "settings": {}}),
                ("create_stream", {"name": "neg", "subject": "neg", "group": "", "replication_factor": 1,
                                   "partitions": 1, "settings": {"segment_max_bytes": -5}}),
                ("create_stream", {"name": "forged", "subject": "f", "group": "", "created": 1, "settings": {},
                                   "replicas": [[node.server_id]]}),
                ("change_leader", {"name": "h", "partition": 0, "leader": node.server_id, "leader_epoch": -1,
                                   "isr": {"a": 1}}),
                ("report_leader", {"stream": "h", "partition": "0", "leader": node.server_id, "leader_epoch": 0,
                                   "reporter": "x"}),
                ("no_such_op", {}),
            ]
            for op, args in hostile:
                error = await _propagate(internal, ns, op, args)
                assert error and error[0] == "INVALID_ARGUMENT", (op, error)
            await nc.close()
            assert not outside.exists() and not (tmp_path.parent / "x").exists()
            names = set((await client.fetch_metadata()).streams)
            assert not names & {"big", "crlf", "neg", "forged"}
            # Raft still commits: create, publish and read as before.
            await client.create_stream("after", "after")
            assert (await client.publish("after", b"ok", ack_policy="all")).offset == 0
            assert (await client.publish("h", b"still", ack_policy="all")).offset == 0


async def test_the_metadata_leader_refuses_a_min_isr_above_the_replication_factor_from_any_node(tmp_path):
    """The rule is the metadata leader's: a create_stream request sent straight to it (as another
    node forwards one) is refused as the API's is, and no stream appears."""
    async with running_node(tmp_path) as (node, address):
        async with Client(address) as client:
            await client.wait_ready()
            nc = await nats.connect(node._embedded.url)
            internal = _sealed(nc, node)
            request = {"name": "strict", "subject": "strict", "group": "", "replication_factor": 1, "partitions": 1,
                       "settings": {"min_isr": 2}}
            error = await _propagate(internal, node.config.clustering.namespace, "create_stream", request)
            await nc.close()
            assert error == ["INVALID_ARGUMENT", "min ISR 2 exceeds the replication factor 1"]
            assert not (await client.fetch_metadata("strict")).streams["strict"].exists


async def test_out_of_range_stream_requests_get_invalid_argument_naming_the_limit(tmp_path):
    async with running_node(tmp_path) as (node, address):
        async with Client(address) as client:
            await client.wait_ready()
            stub = client._stub()
            bad = [
                api_pb2.CreateStreamRequest(name="p", subject="p", partitions=100_000),
                api_pb2.CreateStreamRequest(name="g", subject="g", group="a\r\nb"),
                api_pb2.CreateStreamRequest(name="s", subject="s", segmentMaxBytes=api_pb2.NullableInt64(value=-1)),
                api_pb2.CreateStreamRequest(name="r", subject="r", retentionMaxAge=api_pb2.NullableInt64(value=-10)),
                api_pb2.CreateStreamRequest(name="m", subject="m", minIsr=api_pb2.NullableInt32(value=-1)),
                api_pb2.CreateStreamRequest(name="x" * 300, subject="x"),
                api_pb2.CreateStreamRequest(name="l", subject="l." * 600 + "l"),
            ]
            for request in bad:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.CreateStream(request, timeout=10)
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, request
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.CreateStream(api_pb2.CreateStreamRequest(name="p", subject="p", partitions=100_000))
            assert "4096" in refused.value.details()
            await client.create_stream("ok", "ok")
            assert (await client.publish("ok", b"fine", ack_policy="all")).offset == 0


async def test_publish_async_answers_every_request_and_a_bad_record_fails_alone(tmp_path):
    async with running_node(tmp_path) as (node, address):
        async with Client(address) as client:
            await client.wait_ready()
            await client.create_stream("pa", "pa")
            stub = client._stub()
            too_many = {f"h{i}": b"" for i in range(65534)}
            requests = [
                api_pb2.PublishRequest(stream="pa", value=b"a", correlationId="1", ackPolicy=api_pb2.AckPolicy.ALL),
                api_pb2.PublishRequest(stream="pa", value=b"b", correlationId="2", ackPolicy=api_pb2.AckPolicy.ALL,
                                       headers=too_many),
                api_pb2.PublishRequest(stream="pa", value=b"c", correlationId="3", ackPolicy=api_pb2.AckPolicy.ALL),
                api_pb2.PublishRequest(stream="nope", value=b"d", correlationId="4", ackPolicy=api_pb2.AckPolicy.ALL),
                api_pb2.PublishRequest(stream="pa", partition=7, value=b"e", correlationId="5",
                                       ackPolicy=api_pb2.AckPolicy.ALL),
            ]

            async def send():
                for request in requests:
                    yield request

            responses = {r.correlationId: r async for r in stub.PublishAsync(send(), timeout=30)}
            assert sorted(responses) == ["1", "2", "3", "4", "5"]
            assert responses["1"].ack.offset == 0 and responses["3"].ack.offset == 1
            assert responses["2"].asyncError.code == api_pb2.PublishAsyncError.Code.BAD_REQUEST
            assert "headers" in responses["2"].asyncError.message
            assert responses["4"].asyncError.code == api_pb2.PublishAsyncError.Code.NOT_FOUND
            assert responses["5"].asyncError.code == api_pb2.PublishAsyncError.Code.NOT_FOUND
            values = [m.value async for m in client.subscribe("pa", offset=0, stop_latest=True)]
            assert values == [b"a", b"c"]


async def test_everything_the_node_keeps_is_private(tmp_path, permissive_umask, caplog):
    """Under umask 000, a data dir made 0755 beforehand: it is closed to others at start, and every
    directory and file the node makes in it (identity, Raft, streams, segments, checkpoints, the
    embedded nats-server's log, pid, lock and ports files) is 0700 or 0600."""
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o755)
    harness_files = {"nats.conf"}  # written by running_node, not by the node
    with caplog.at_level(logging.WARNING, logger="bascule.durable"):
        async with running_node(data_dir, **{"streams.sync": "always"}) as (node, address):
            async with Client(address) as client:
                await client.wait_ready()
                await client.create_stream("private", "private", partitions=2)
                for i in range(20):
                    await client.publish("private", f"m{i}".encode(), ack_policy="all", partition=i % 2)
                await client.set_cursor("private", 0, "reader", 3)
            made = files_in(data_dir)
            assert {"server-id", "raft-address", "raft/journal", "raft/journal.meta", "nats-server.log",
                    "nats-server.pid", "nats-server.lock"} <= made
            assert any(name.startswith("nats-server-ports/") for name in made)  # nats-server's own file
            assert any(name.startswith("streams/private@") and name.endswith(".index") for name in made)
            exposed = {path: mode for path, mode in not_private(data_dir).items() if path not in harness_files}
            assert exposed == {}
    assert f"{data_dir} was open to other users (mode 0755): now 0700" in caplog.text
    made = files_in(data_dir)  # with the checkpoints written at close
    assert any(name.endswith("/replication-offset-checkpoint") for name in made)
    assert any(name.endswith("/leader-epoch-checkpoint") for name in made)
    exposed = {path: mode for path, mode in not_private(data_dir).items() if path not in harness_files}
    assert exposed == {}


async def test_a_raft_address_kept_in_the_data_dir_needs_a_password_beyond_loopback(tmp_path):
    """The configuration (127.0.0.1:0) passed its check, but the address chosen at an earlier start is
    not loopback: the node refuses to run Raft there without a password."""
    (tmp_path / "raft-address").write_text("10.99.99.99:9393\n")
    with pytest.raises(ExceptionGroup) as raised:
        async with running_node(tmp_path):
            pass
    assert raised.group_contains(InsecureRaft, match="10.99.99.99:9393 is not a loopback address")
    assert not (tmp_path / "raft").exists()


def files_in(root) -> set[str]:
    return {os.path.relpath(os.path.join(d, name), root) for d, _, files in os.walk(root) for name in files}


async def test_publish_async_keeps_a_calls_order_and_acks_on_the_call_whatever_inbox_a_request_names(tmp_path):
    """As Liftbridge's PublishAsync: a request's ackInbox is not where its ack goes (the call's own
    inbox, `<ns>.ack.<token>`, is what every ack names), so a request naming one takes the same way
    as the others and keeps its place: an ack-NONE publish then one naming an inbox are stored in
    that order, every time."""
    async with running_node(tmp_path) as (node, address):
        async with Client(address) as client:
            await client.wait_ready()
            await client.create_stream("ordered", "ordered")
        nc = await nats.connect(node._embedded.url)
        named = await nc.subscribe("my.inbox")
        NONE, LEADER = api_pb2.AckPolicy.NONE, api_pb2.AckPolicy.LEADER

        async def requests():
            for round_ in range(50):
                yield api_pb2.PublishRequest(stream="ordered", value=b"none-%d" % round_, ackPolicy=NONE)
                yield api_pb2.PublishRequest(stream="ordered", value=b"cid-%d" % round_, ackPolicy=LEADER,
                                             ackInbox="my.inbox", correlationId=f"c{round_}")

        try:
            async with grpc.aio.insecure_channel(address) as channel:
                acks = [r.ack async for r in api_pb2_grpc.APIStub(channel).PublishAsync(requests(), timeout=10)]
            assert [ack.correlationId for ack in acks] == [f"c{round_}" for round_ in range(50)]
            inboxes = {ack.ackInbox for ack in acks}
            assert len(inboxes) == 1 and re.fullmatch(r"liftbridge-default\.ack\.[0-9a-f]{22}", inboxes.pop())
            with pytest.raises(nats.errors.TimeoutError):
                await named.next_msg(timeout=0.5)  # nothing went to the inbox the requests named
        finally:
            await nc.close()
        async with Client(address) as client:
            stored = [m.value async for m in client.subscribe("ordered", start="earliest", stop_latest=True)]
        assert stored == [value for round_ in range(50) for value in (b"none-%d" % round_, b"cid-%d" % round_)]
