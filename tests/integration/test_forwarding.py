"""Publishes that reach a node which does not lead the partition are forwarded to its leader
(node.forwarding) and answered as the leader answers its own: real nodes on loopback, grpcio clients."""

from __future__ import annotations

import asyncio
import gc
import itertools
import re
from collections.abc import AsyncIterator, Iterator

import grpc
import nats
import pytest
from cluster_checks import create_stream, leader_index, new_leader

from bascule.natsio.sealed import SealedNats
from bascule.testing.local import LocalCluster
from bascule.wire.dedup import MESSAGE_ID_HEADER
from bascule.wire.forwarding import ErrorKind, decode_reply, encode_entry, encode_header, forward_subject
from bascule.wire.pb import api_pb2, api_pb2_grpc
from bascule.wire.seal import Sealer, derive_key

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def no_grpc_objects_outlive_their_loop() -> Iterator[None]:
    """grpc.aio hands events to the loop its oldest live object was made on: one a test left to the
    cycle collector would point the next test's calls at a closed loop ("Event loop is closed")."""
    yield
    gc.collect()

LEADER, ALL, NONE = api_pb2.AckPolicy.LEADER, api_pb2.AckPolicy.ALL, api_pb2.AckPolicy.NONE
SECRET = "the forwarding tests' secret"
NAMESPACE = "fwd"
# What an ack says that depends on when and where it was made, not on the path it took.
VARYING = ("offset", "correlationId", "receptionTimestamp", "commitTimestamp", "ackInbox")
ACK_INBOX = re.compile(r"fwd\.ack\.[0-9a-f]{22}")  # Liftbridge's form (the namespace is "fwd"), new each call


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(3, base_dir=tmp_path_factory.mktemp("forwarding"), namespace=NAMESPACE,
                      env={"BASCULE_RAFT_PASSWORD": SECRET}) as started:
        yield started


_names = itertools.count()


async def new_stream(cluster: LocalCluster, occ: bool = False) -> tuple[str, str, str]:
    """A stream of three replicas; its name, its leader's address and a follower's."""
    name = f"fwd{next(_names)}"
    if occ:
        request = api_pb2.CreateStreamRequest(name=name, subject=f"{name}.in", replicationFactor=3)
        request.optimisticConcurrencyControl.value = True
        async with grpc.aio.insecure_channel(cluster.brokers[0]) as channel:
            await api_pb2_grpc.APIStub(channel).CreateStream(request, timeout=10)
        await leader_index(cluster, name)
    else:
        await create_stream(cluster, name)
    leader = await leader_index(cluster, name)
    return name, cluster.node(leader).address, cluster.node((leader + 1) % 3).address


async def publish(address: str, request: api_pb2.PublishRequest) -> api_pb2.PublishResponse:
    async with grpc.aio.insecure_channel(address) as channel:
        return await api_pb2_grpc.APIStub(channel).Publish(request, timeout=10)


async def publish_async(address: str, requests: list[api_pb2.PublishRequest], answers: int,
                        timeout: float = 30) -> list[api_pb2.PublishResponse]:
    """Send ``requests`` in one PublishAsync call, read ``answers`` responses."""
    async def sent() -> AsyncIterator[api_pb2.PublishRequest]:
        for request in requests:
            yield request
        await asyncio.sleep(timeout)  # the call stays open while the answers come

    responses = []
    async with grpc.aio.insecure_channel(address) as channel:
        call = api_pb2_grpc.APIStub(channel).PublishAsync(sent())
        async with asyncio.timeout(timeout):
            async for response in call:
                responses.append(response)
                if len(responses) == answers:
                    break
        call.cancel()
    return responses


async def stored(address: str, stream: str, count: int) -> list[api_pb2.Message]:
    request = api_pb2.SubscribeRequest(stream=stream, startPosition=api_pb2.StartPosition.EARLIEST)
    messages = []
    async with grpc.aio.insecure_channel(address) as channel:
        async with asyncio.timeout(20):
            async for message in api_pb2_grpc.APIStub(channel).Subscribe(request):
                if message.value or message.offset or message.headers:  # the first is the subscription's start
                    messages.append(message)
                if len(messages) == count:
                    break
    return messages


def fields(ack: api_pb2.Ack) -> dict[str, object]:
    shown = {descriptor.name: value for descriptor, value in ack.ListFields()}
    return {name: value for name, value in shown.items() if name not in VARYING}


def request(stream: str, value: bytes, policy: int, correlation_id: str = "", **more: object) -> api_pb2.PublishRequest:
    return api_pb2.PublishRequest(stream=stream, value=value, ackPolicy=policy, correlationId=correlation_id, **more)


async def test_a_forwarded_publish_is_acked_and_stored_as_a_direct_one(cluster: LocalCluster) -> None:
    stream, leader, follower = await new_stream(cluster)
    expected_offset = 0
    for policy in (LEADER, ALL):
        for address, path in ((leader, "direct"), (follower, "forwarded")):
            response = await publish(address, request(stream, path.encode(), policy, f"{path}-{policy}", key=b"k",
                                                      headers={"h": path.encode()}))
            assert response.correlationId == f"{path}-{policy}"
            assert response.ack.offset == expected_offset and response.ack.correlationId == f"{path}-{policy}"
            assert ACK_INBOX.fullmatch(response.ack.ackInbox), response.ack.ackInbox
            if path == "direct":
                direct = fields(response.ack)
            else:
                assert fields(response.ack) == direct
            expected_offset += 1
    for address in (leader, follower):  # ack NONE: an empty response, the message stored
        assert await publish(address, request(stream, b"none", NONE)) == api_pb2.PublishResponse()
    messages = await stored(leader, stream, 6)
    assert [m.value for m in messages] == [b"direct", b"forwarded"] * 2 + [b"none"] * 2
    for direct_message, forwarded_message in zip(messages[0::2], messages[1::2], strict=True):
        assert direct_message.key == forwarded_message.key
        assert direct_message.subject == forwarded_message.subject == f"{stream}.in"
        assert {**forwarded_message.headers, "h": b""} == {**direct_message.headers, "h": b""}


async def test_a_forwarded_publish_async_burst_is_acked_as_a_direct_one(cluster: LocalCluster) -> None:
    stream, leader, follower = await new_stream(cluster)
    count = 3000
    policies = [(LEADER, ALL, NONE)[i % 3] for i in range(count)]
    answers: dict[str, list[api_pb2.PublishResponse]] = {}
    for address, path in ((leader, "d"), (follower, "f")):
        requests = [request(stream, f"{path}{i}".encode(), policy, f"{path}{i}" if policy != NONE else "")
                    for i, policy in enumerate(policies)]
        answers[path] = await publish_async(address, requests, sum(p != NONE for p in policies))
    for path in ("d", "f"):
        assert not [r for r in answers[path] if r.HasField("asyncError")], path
        assert sorted(r.correlationId for r in answers[path]) == sorted(
            f"{path}{i}" for i, p in enumerate(policies) if p != NONE)
    direct = {r.correlationId[1:]: fields(r.ack) for r in answers["d"]}
    assert {r.correlationId[1:]: fields(r.ack) for r in answers["f"]} == direct
    offsets = {r.ack.offset: r.correlationId for path in ("d", "f") for r in answers[path]}
    assert len(offsets) == len(answers["d"]) * 2  # no offset acked twice
    messages = await stored(leader, stream, 2 * count)
    assert {m.offset: m.value.decode() for m in messages if m.offset in offsets} == offsets
    assert sorted(m.value for m in messages) == sorted(f"{p}{i}".encode() for p in "df" for i in range(count))


async def test_publish_async_message_ids_are_kept_whichever_way_a_request_goes(cluster: LocalCluster) -> None:
    """A request whose one header is its id has it taken out before it is decoded (api.publish): it
    is stored with it appended here, forwarded, or held while its partition resumes; a copy of an id
    is acked with the first one's offset and not stored again."""
    stream, leader, follower = await new_stream(cluster)

    def requests(path: str) -> list[api_pb2.PublishRequest]:
        headers: list[dict[str, bytes]] = [
            {MESSAGE_ID_HEADER: f"{path}-a".encode()}, {}, {MESSAGE_ID_HEADER: f"{path}-b".encode(), "h": b"v"},
            {MESSAGE_ID_HEADER: f"{path}-a".encode()},  # a copy of the first
        ]
        return [request(stream, f"{path}{i}".encode(), ALL, f"{path}{i}", headers=h) for i, h in enumerate(headers)]

    offsets: dict[str, int] = {}
    for address, path in ((leader, "d"), (follower, "f"), (leader, "p")):
        if path == "p":  # paused: the first request resumes it, the others wait behind it
            async with grpc.aio.insecure_channel(leader) as channel:
                await api_pb2_grpc.APIStub(channel).PauseStream(api_pb2.PauseStreamRequest(name=stream), timeout=10)
        answers = await publish_async(address, requests(path), 4)
        assert not [r for r in answers if r.HasField("asyncError")], path
        offsets.update({r.correlationId: r.ack.offset for r in answers})
        assert offsets[f"{path}3"] == offsets[f"{path}0"]
    messages = await stored(leader, stream, 9)
    assert sorted(m.value for m in messages) == sorted(f"{path}{i}".encode() for path in "dfp" for i in range(3))
    for message in messages:
        path, i = message.value.decode()
        assert message.offset == offsets[message.value.decode()]
        assert message.headers.get(MESSAGE_ID_HEADER) == {"0": f"{path}-a".encode(), "1": None,
                                                         "2": f"{path}-b".encode()}[i]
        assert message.headers.get("h") == (b"v" if i == "2" else None)
        assert message.headers["subject"] == f"{stream}.in".encode()


async def test_forwarded_expected_offsets_are_checked_as_direct_ones(cluster: LocalCluster) -> None:
    stream, leader, follower = await new_stream(cluster, occ=True)
    assert (await publish(follower, request(stream, b"a", LEADER, expectedOffset=0))).ack.offset == 0
    assert (await publish(leader, request(stream, b"b", ALL, expectedOffset=1))).ack.offset == 1
    for address in (leader, follower):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await publish(address, request(stream, b"late", LEADER, expectedOffset=1))
        assert (refused.value.code(), refused.value.details()) == (grpc.StatusCode.UNKNOWN, "incorrect expected offset")
        with pytest.raises(grpc.aio.AioRpcError) as unacked:
            await publish(address, request(stream, b"unacked", NONE, expectedOffset=2))
        assert unacked.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert unacked.value.details() == "stream with concurrency control must have AckPolicy set"
    burst = [request(stream, b"c", ALL, "c", expectedOffset=2),
             request(stream, b"again", ALL, "again", expectedOffset=2),
             request(stream, b"d", LEADER, "d", expectedOffset=3)]
    responses = {r.correlationId: r for r in await publish_async(follower, burst, 3)}
    assert (responses["c"].ack.offset, responses["d"].ack.offset) == (2, 3)
    assert responses["again"].asyncError.code == api_pb2.PublishAsyncError.Code.INCORRECT_OFFSET
    assert responses["again"].asyncError.message == "incorrect expected offset"
    assert [m.value for m in await stored(leader, stream, 4)] == [b"a", b"b", b"c", b"d"]


async def test_a_burst_through_a_follower_across_a_leader_change_is_acked_truly(cluster: LocalCluster) -> None:
    """Every publish is answered once; whatever is acked is in the log at its acked offset."""
    stream, leader, follower = await new_stream(cluster)
    old_leader = cluster.node(await leader_index(cluster, stream))
    count, answered = 6000, []

    async def paced() -> AsyncIterator[api_pb2.PublishRequest]:
        for i in range(count):
            yield request(stream, f"m{i}".encode(), ALL, f"m{i}")
            if i % 100 == 99:
                await asyncio.sleep(0.02)
        await asyncio.sleep(60)

    async def burst() -> None:
        async with grpc.aio.insecure_channel(follower) as channel:
            call = api_pb2_grpc.APIStub(channel).PublishAsync(paced())
            async for response in call:
                answered.append(response)
                if len(answered) == count:
                    break
            call.cancel()

    publishing = asyncio.create_task(burst())
    await asyncio.sleep(0.3)
    before_the_change = len(answered)
    await asyncio.to_thread(old_leader.restart)  # a graceful stop hands the partition to another node
    assert 0 < before_the_change < count
    async with asyncio.timeout(60):
        await publishing
    acked = {r.ack.offset: r.correlationId for r in answered if not r.HasField("asyncError")}
    assert len(answered) == count and len({r.correlationId for r in answered}) == count
    assert len(acked) == len([r for r in answered if not r.HasField("asyncError")])  # no offset acked twice
    assert len(acked) > count // 2, [r.asyncError.message for r in answered if r.HasField("asyncError")][:5]
    now_leading = await new_leader(cluster, stream, [0, 1, 2], old_leader.server_id, timeout=20)
    messages = await stored(cluster.node(now_leading).address, stream, max(acked) + 1)
    assert {m.offset: m.value.decode() for m in messages if m.offset in acked} == acked


async def test_a_publish_forwarded_to_a_leader_that_stops_answering_fails_once_another_leads(
        cluster: LocalCluster) -> None:
    """A leader frozen (SIGSTOP, as one SIGKILLed with the burst in hand) never answers a forwarded
    publish: the follower that forwarded it tells its client UNAVAILABLE once the metadata names
    another leader, not after FORWARD_TIMEOUT (30 s), and the client's retry is acked by the new one."""
    stream, _, follower = await new_stream(cluster)
    old = await leader_index(cluster, stream)
    await publish(follower, request(stream, b"before", ALL))
    cluster.pause(old)
    try:
        started = asyncio.get_running_loop().time()
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await publish(follower, request(stream, b"unanswered", ALL))
        elapsed = asyncio.get_running_loop().time() - started
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE, failed.value.details()
        assert elapsed < 8, f"told after {elapsed:.1f} s"
        ack = (await publish(follower, request(stream, b"retried", ALL))).ack
        assert ack.ackPolicy == ALL and ack.offset >= 1
    finally:
        cluster.resume(old)


async def test_a_garbled_forwarded_burst_is_refused_and_the_leader_keeps_serving(cluster: LocalCluster) -> None:
    stream, leader, follower = await new_stream(cluster)
    leader_id = next(node.server_id for node in cluster.nodes if node.address == leader)
    subject = forward_subject(NAMESPACE, leader_id)
    good = encode_header(stream, 0, 1) + encode_entry(LEADER, -1, b"ok", b"", b"ok", None)
    nc = await nats.connect(cluster.nats_url)
    try:
        peer = SealedNats(nc, Sealer(derive_key(SECRET)))
        for garbage in (b"", b"\x01", good[:-1], good + b"tail", b"\x09" + good[1:], bytes(range(256))):
            reply = await peer.request(subject, garbage, timeout=10)
            (part,) = decode_reply(reply.data, 1)
            assert part.error is ErrorKind.MALFORMED and part.message, garbage
        elsewhere = encode_header("no-such-stream", 0, 1) + good[len(encode_header(stream, 0, 1)):]
        reply = await peer.request(subject, elsewhere, timeout=10)
        assert decode_reply(reply.data, 1)[0].error is ErrorKind.NOT_LEADER
        (acked,) = decode_reply((await peer.request(subject, good, timeout=10)).data, 1)
        assert acked.error is None and acked.indices == [0]
        response = api_pb2.PublishResponse.FromString(acked.framed[5:])
        assert (response.correlationId, response.ack.offset, response.ack.stream) == ("ok", 0, stream)
    finally:
        await nc.close()
    assert (await publish(follower, request(stream, b"after", LEADER))).ack.offset == 1
