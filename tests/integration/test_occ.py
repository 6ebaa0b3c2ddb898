"""Liftbridge's optimistic concurrency control on a real node: gufo-liftbridge for PublishAsync,
grpcio stubs where gufo has no way in (a unary Publish with a deadline, the stream option), and
plain NATS for envelopes."""

import asyncio

import grpc
import nats
import pytest
from conftest import running_node
from gufo.liftbridge.client import LiftbridgeClient
from gufo.liftbridge.types import AckPolicy

from bascule.client import Client
from bascule.wire import envelope
from bascule.wire.pb import api_pb2, api_pb2_grpc

pytestmark = pytest.mark.anyio

LEADER, ALL, NONE = api_pb2.AckPolicy.LEADER, api_pb2.AckPolicy.ALL, api_pb2.AckPolicy.NONE
INCORRECT_OFFSET = api_pb2.PublishAsyncError.Code.INCORRECT_OFFSET


async def create(address, name, subject=None, occ=True):
    request = api_pb2.CreateStreamRequest(name=name, subject=subject or name)
    if occ is not None:
        request.optimisticConcurrencyControl.value = occ
    async with grpc.aio.insecure_channel(address) as channel:
        await api_pb2_grpc.APIStub(channel).CreateStream(request, timeout=10)


async def stored(client, stream):
    return [m.value async for m in client.subscribe(stream, start="earliest", stop_latest=True)]


async def test_publish_is_appended_only_at_the_offset_it_expects(tmp_path):
    async with running_node(tmp_path) as (node, address), Client(address) as client:
        await client.wait_ready()
        await create(address, "occ")
        async with grpc.aio.insecure_channel(address) as channel:
            stub = api_pb2_grpc.APIStub(channel)

            async def publish(value, expected, policy=LEADER):
                request = api_pb2.PublishRequest(stream="occ", value=value, expectedOffset=expected, ackPolicy=policy)
                return await stub.Publish(request, timeout=10)

            assert (await publish(b"a", 0)).ack.offset == 0
            assert (await publish(b"b", -1, ALL)).ack.offset == 1  # -1: no expectation
            for garbage in (0, 1, 3, -2, 2**62, 2**63 - 1, -(2**63)):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await publish(b"refused", garbage)
                # Liftbridge's status for it: UNKNOWN, with its words.
                assert refused.value.code() == grpc.StatusCode.UNKNOWN, garbage
                assert refused.value.details() == "incorrect expected offset"
            assert (await publish(b"c", 2, ALL)).ack.offset == 2
            # Under concurrency control, a publish nobody acks is refused, as Liftbridge's are.
            with pytest.raises(grpc.aio.AioRpcError) as unacked:
                await publish(b"unacked", 3, NONE)
            assert unacked.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert unacked.value.details() == "stream with concurrency control must have AckPolicy set"
        assert await stored(client, "occ") == [b"a", b"b", b"c"]


async def test_publish_async_refusals_are_in_band_through_gufo(tmp_path):
    async with running_node(tmp_path) as (node, address), Client(address) as client:
        await client.wait_ready()
        await create(address, "occ")
        async with LiftbridgeClient([address]) as lb:
            requests = []
            for index, expected in enumerate([0, 0, 1, 5, -1, -7]):
                request = lb.get_publish_request(b"m%d" % index, stream="occ", correlation_id=str(index),
                                                 ack_policy=AckPolicy.LEADER)
                request.expectedOffset = expected
                requests.append(request)
            responses = {r.correlationId: r async for r in lb.publish_bulk(requests)}
        assert sorted(responses) == [str(index) for index in range(6)]
        offsets = {key: r.ack.offset for key, r in responses.items() if not r.HasField("asyncError")}
        assert offsets == {"0": 0, "2": 1, "4": 2}
        for key in ("1", "3", "5"):
            error = responses[key].asyncError
            assert (error.code, error.message) == (INCORRECT_OFFSET, "incorrect expected offset"), key
            assert responses[key].HasField("ack")  # the placeholder older clients read
        assert await stored(client, "occ") == [b"m0", b"m2", b"m4"]


async def test_publish_async_refusals_are_answered_whatever_the_ack_policy(tmp_path):
    """Liftbridge answers a PublishAsync request that fails its checks even when it asked for no
    ack: otherwise a client never learns that an ack-NONE publish was dropped."""
    async with running_node(tmp_path) as (node, address), Client(address) as client:
        await client.wait_ready()
        await create(address, "occ")
        requests = [
            api_pb2.PublishRequest(stream="occ", value=b"quiet", ackPolicy=NONE, correlationId="unacked"),
            api_pb2.PublishRequest(stream="nowhere", value=b"lost", ackPolicy=NONE, correlationId="missing"),
            api_pb2.PublishRequest(stream="occ", value=b"kept", ackPolicy=LEADER, correlationId="kept"),
        ]
        async with grpc.aio.insecure_channel(address) as channel:
            call = api_pb2_grpc.APIStub(channel).PublishAsync(iter(requests), timeout=10)
            responses = {response.correlationId: response async for response in call}
        assert sorted(responses) == ["kept", "missing", "unacked"]
        unacked, missing = responses["unacked"].asyncError, responses["missing"].asyncError
        assert (unacked.code, unacked.message) == (
            api_pb2.PublishAsyncError.Code.BAD_REQUEST, "stream with concurrency control must have AckPolicy set")
        assert missing.code == api_pb2.PublishAsyncError.Code.NOT_FOUND
        assert responses["kept"].ack.offset == 0
        assert await stored(client, "occ") == [b"kept"]


async def test_racing_publishers_expecting_the_same_offset_get_one_append(tmp_path):
    async with running_node(tmp_path) as (node, address), Client(address) as client:
        await client.wait_ready()
        await create(address, "race")
        channels = [grpc.aio.insecure_channel(address) for _ in range(8)]
        try:
            for expected in range(3):  # each round: every publisher expects the same next offset
                calls = [
                    api_pb2_grpc.APIStub(channel).Publish(api_pb2.PublishRequest(
                        stream="race", value=b"%d-%d" % (expected, index), expectedOffset=expected,
                        ackPolicy=LEADER), timeout=10)
                    for index, channel in enumerate(channels)
                ]
                outcomes = await asyncio.gather(*calls, return_exceptions=True)
                won = [outcome for outcome in outcomes if not isinstance(outcome, Exception)]
                lost = [outcome for outcome in outcomes if isinstance(outcome, Exception)]
                assert [response.ack.offset for response in won] == [expected]
                assert all(error.code() == grpc.StatusCode.UNKNOWN for error in lost)
        finally:
            for channel in channels:
                await channel.close()
        assert len(await stored(client, "race")) == 3


async def test_without_concurrency_control_expected_offsets_are_ignored(tmp_path):
    async with running_node(tmp_path) as (node, address), Client(address) as client:
        await client.wait_ready()
        await create(address, "off", occ=False)
        await create(address, "unset", occ=None)
        async with grpc.aio.insecure_channel(address) as channel:
            stub = api_pb2_grpc.APIStub(channel)
            for stream in ("off", "unset"):
                for expected in (5, 5, -9):
                    await stub.Publish(api_pb2.PublishRequest(stream=stream, value=b"x", expectedOffset=expected),
                                       timeout=10)
                await stub.Publish(api_pb2.PublishRequest(stream=stream, value=b"quiet", ackPolicy=NONE), timeout=10)
        for stream in ("off", "unset"):
            assert len(await stored(client, stream)) == 4, stream


async def test_envelopes_through_nats_carry_the_expectation_and_are_acked_with_the_error(tmp_path):
    """Publishes through the subject (a request naming an ackInbox, PublishToSubject, an envelope
    from a NATS client) are checked by the leader as they are captured, as Liftbridge's are."""
    async with running_node(tmp_path) as (node, address), Client(address) as client:
        await client.wait_ready()
        await create(address, "occ", subject="occ.subject")
        nc = await nats.connect(node._embedded.url)
        inbox = await nc.subscribe("my.inbox")

        async def ack():
            return envelope.decode_message((await inbox.next_msg(timeout=5)).data, envelope.MsgType.ACK, api_pb2.Ack)

        def publish_envelope(value, expected):
            message = api_pb2.Message(value=value, offset=expected, ackInbox="my.inbox", correlationId=value.decode(),
                                      ackPolicy=LEADER)
            return nc.publish("occ.subject", envelope.encode_message(message, envelope.MsgType.PUBLISH))

        try:
            await publish_envelope(b"n0", 0)
            assert (await ack()).offset == 0
            await publish_envelope(b"stale", 0)
            refusal = await ack()
            assert refusal.ackError == api_pb2.Ack.Error.INCORRECT_OFFSET and refusal.correlationId == "stale"
            await nc.publish("occ.subject", b"plain")  # expects offset 0, as Liftbridge reads it: refused
            await nc.flush()
            async with grpc.aio.insecure_channel(address) as channel:
                stub = api_pb2_grpc.APIStub(channel)
                response = await stub.Publish(api_pb2.PublishRequest(
                    stream="occ", value=b"via inbox", expectedOffset=1, ackInbox="my.inbox"), timeout=10)
                assert response.ack.offset == 1 and (await ack()).offset == 1
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.Publish(api_pb2.PublishRequest(
                        stream="occ", value=b"x", expectedOffset=1, ackInbox="my.inbox"), timeout=10)
                assert refused.value.code() == grpc.StatusCode.UNKNOWN
                assert (await ack()).ackError == api_pb2.Ack.Error.INCORRECT_OFFSET
                # PublishToSubject has no expectedOffset: its message expects 0, and its ack says so.
                response = await stub.PublishToSubject(api_pb2.PublishToSubjectRequest(
                    subject="occ.subject", value=b"to subject", ackPolicy=LEADER), timeout=10)
                assert response.ack.ackError == api_pb2.Ack.Error.INCORRECT_OFFSET
        finally:
            await nc.close()
        assert await stored(client, "occ") == [b"n0", b"via inbox"]


async def test_the_server_default_applies_to_streams_without_the_option_and_not_to_internal_ones(tmp_path):
    settings = {"streams.concurrency.control": True, "activity.stream.enabled": True}
    async with running_node(tmp_path, **settings) as (node, address), Client(address) as client:
        await client.wait_ready()
        await create(address, "default", occ=None)
        await create(address, "off", occ=False)
        async with grpc.aio.insecure_channel(address) as channel:
            stub = api_pb2_grpc.APIStub(channel)
            for stream, expected_refused in (("default", True), ("off", False)):
                await stub.Publish(api_pb2.PublishRequest(stream=stream, value=b"first"), timeout=10)
                try:
                    await stub.Publish(api_pb2.PublishRequest(stream=stream, value=b"expects 0"), timeout=10)
                    refused = False
                except grpc.aio.AioRpcError as error:
                    refused = error.code() == grpc.StatusCode.UNKNOWN
                assert refused == expected_refused, stream
            # The cursors stream takes every cursor write, though none names an offset.
            for offset in (3, 4):
                await stub.SetCursor(api_pb2.SetCursorRequest(stream="default", cursorId="c", offset=offset),
                                     timeout=10)
            fetched = await stub.FetchCursor(api_pb2.FetchCursorRequest(stream="default", cursorId="c"), timeout=10)
            assert fetched.offset == 4
        # The activity stream takes every event, though none names an offset.
        for _ in range(100):
            if not node.state.activity:
                break
            await asyncio.sleep(0.1)
        assert not node.state.activity  # every event published and marked so
        assert len(await stored(client, "__activity")) >= 2
