"""Liftbridge's consumer groups on one in-process node, through the gRPC API as go-liftbridge
drives it: join, fetch assignments (the heartbeat), subscribe as a member, leave, expiry."""

import asyncio
import time

import grpc
import pytest
from conftest import running_node, until

from bascule.client import Client
from bascule.wire.pb import api_pb2, api_pb2_grpc

pytestmark = pytest.mark.anyio

GROUP_SETTINGS = {"groups.consumer.timeout": "1s", "groups.coordinator.timeout": "2s"}


async def join(api, consumer, streams=("orders",), group="g"):
    return await api.JoinConsumerGroup(
        api_pb2.JoinConsumerGroupRequest(groupId=group, consumerId=consumer, streams=list(streams)), timeout=10
    )


async def fetch(api, consumer, epoch, group="g"):
    return await api.FetchConsumerGroupAssignments(
        api_pb2.FetchConsumerGroupAssignmentsRequest(groupId=group, consumerId=consumer, epoch=epoch), timeout=5
    )


def partitions_of(response):
    return {a.stream: list(a.partitions) for a in response.assignments}


async def refused(call) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


async def subscribe_handshake(api, partition, consumer, epoch, group="g"):
    """The first message of a member's subscription (the handshake), or the refusal it got."""
    call = api.Subscribe(api_pb2.SubscribeRequest(
        stream="orders", partition=partition,
        consumer=api_pb2.Consumer(groupId=group, consumerId=consumer, groupEpoch=epoch),
    ), timeout=5)
    try:
        async for _ in call:
            return None
    except grpc.aio.AioRpcError as exc:
        return exc
    finally:
        call.cancel()


async def a_newer_reader_displaces_the_older(api, partition, consumer, epoch):
    """Liftbridge: one member of a group reads a partition at a time; the same or a newer epoch takes
    over, and the displaced subscription ends."""
    request = api_pb2.SubscribeRequest(
        stream="orders", partition=partition,
        consumer=api_pb2.Consumer(groupId="g", consumerId=consumer, groupEpoch=epoch),
    )
    older = api.Subscribe(request, timeout=10)
    await older.read()  # the handshake
    newer = api.Subscribe(request, timeout=10)
    await newer.read()
    try:
        assert await asyncio.wait_for(older.read(), 5) is grpc.aio.EOF
        assert await older.code() == grpc.StatusCode.OK
    finally:
        older.cancel()
        newer.cancel()




async def test_consumer_group_lifecycle_on_one_node(tmp_path):
    async with running_node(tmp_path, **GROUP_SETTINGS) as (node, address):
        await Client(address).wait_ready()
        async with grpc.aio.insecure_channel(address) as channel:
            api = api_pb2_grpc.APIStub(channel)
            await api.CreateStream(api_pb2.CreateStreamRequest(subject="orders", name="orders", partitions=2))

            first = await join(api, "c1")
            assert first.coordinator == node.server_id and first.epoch > 0
            assert (first.consumerTimeout, first.coordinatorTimeout) == (1_000_000_000, 2_000_000_000)
            second = await join(api, "c2")
            assert second.coordinator == node.server_id and second.epoch > first.epoch
            assert (await refused(join(api, "c2"))).code() == grpc.StatusCode.FAILED_PRECONDITION
            assert (await refused(join(api, "c3", ["missing"]))).code() == grpc.StatusCode.FAILED_PRECONDITION

            # The first member's epoch is stale: Liftbridge refuses it until the member learns the new one.
            stale = await refused(fetch(api, "c1", first.epoch))
            assert stale.code() == grpc.StatusCode.FAILED_PRECONDITION and "epoch" in stale.details()
            epoch = second.epoch
            got1, got2 = await fetch(api, "c1", epoch), await fetch(api, "c2", epoch)
            assert got1.epoch == got2.epoch == epoch
            p1, p2 = partitions_of(got1)["orders"], partitions_of(got2)["orders"]
            assert sorted(p1 + p2) == [0, 1] and len(p1) == len(p2) == 1

            # Subscribing as a member: the assigned partition at the current epoch only.
            assert await subscribe_handshake(api, p1[0], "c1", epoch) is None
            await a_newer_reader_displaces_the_older(api, p1[0], "c1", epoch)
            assert (await subscribe_handshake(api, p1[0], "c1", first.epoch)).code() == \
                grpc.StatusCode.FAILED_PRECONDITION
            assert (await subscribe_handshake(api, p2[0], "c1", epoch)).code() == grpc.StatusCode.FAILED_PRECONDITION
            no_consumer = await subscribe_handshake(api, 0, "", epoch)
            assert no_consumer.code() == grpc.StatusCode.INVALID_ARGUMENT

            metadata = await api.FetchMetadata(api_pb2.FetchMetadataRequest(groups=["g", "nope"]))
            found = {g.groupId: g for g in metadata.groupMetadata}
            assert (found["g"].coordinator, found["g"].epoch, found["g"].error) == (node.server_id, epoch, 0)
            assert found["nope"].error == api_pb2.ConsumerGroupMetadata.Error.UNKNOWN_GROUP

            leave = api_pb2.LeaveConsumerGroupRequest(groupId="g", consumerId="c2")
            await api.LeaveConsumerGroup(leave)
            left = await refused(api.LeaveConsumerGroup(leave))
            assert left.code() == grpc.StatusCode.FAILED_PRECONDITION
            epoch = node.state.groups["g"].epoch
            assert partitions_of(await fetch(api, "c1", epoch)) == {"orders": [0, 1]}

            empty = await refused(fetch(api, "", epoch))
            assert (empty.code(), empty.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "No consumerId provided")
            assert (await refused(fetch(api, "c1", 0, group="nope"))).code() == grpc.StatusCode.NOT_FOUND


async def test_silent_members_expire_and_fetching_ones_stay(tmp_path):
    async with running_node(tmp_path, **GROUP_SETTINGS) as (node, address):
        await Client(address).wait_ready()
        async with grpc.aio.insecure_channel(address) as channel:
            api = api_pb2_grpc.APIStub(channel)
            await api.CreateStream(api_pb2.CreateStreamRequest(subject="orders", name="orders", partitions=2))
            await join(api, "alive")
            await join(api, "silent")

            async def heartbeat():
                while True:
                    await fetch(api, "alive", node.state.groups["g"].epoch)
                    await asyncio.sleep(0.2)

            beating = asyncio.create_task(heartbeat())
            try:
                await until(lambda: "silent" not in node.state.groups["g"].members, timeout=8)
                await asyncio.sleep(1.5)  # beyond the consumer timeout: the fetching member stays
                assert set(node.state.groups["g"].members) == {"alive"}
            finally:
                beating.cancel()
            assert partitions_of(await fetch(api, "alive", node.state.groups["g"].epoch)) == {"orders": [0, 1]}
            await until(lambda: "g" not in node.state.groups, timeout=8)  # the last member expires with its group


async def test_only_the_coordinator_serves_assignments(tmp_path):
    async with running_node(tmp_path, **GROUP_SETTINGS) as (node, address):
        await Client(address).wait_ready()
        async with grpc.aio.insecure_channel(address) as channel:
            api = api_pb2_grpc.APIStub(channel)
            await api.CreateStream(api_pb2.CreateStreamRequest(subject="orders", name="orders", partitions=1))
            joined = await join(api, "c1")
            await node.call("change_group_coordinator", group="g", coordinator="elsewhere", previous=node.server_id,
                            epoch=joined.epoch)
            group = node.state.groups["g"]
            wrong = await refused(fetch(api, "c1", group.epoch))
            assert (wrong.code(), wrong.details()) == (
                grpc.StatusCode.FAILED_PRECONDITION, "broker is not the consumer group coordinator")
            mismatch = await refused(api.ReportConsumerGroupCoordinator(api_pb2.ReportConsumerGroupCoordinatorRequest(
                groupId="g", consumerId="c1", coordinator=node.server_id, epoch=joined.epoch)))
            assert mismatch.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "generation mismatch" in mismatch.details()

            # Its only member reports the unreachable coordinator: the group moves to a live broker.
            await api.ReportConsumerGroupCoordinator(api_pb2.ReportConsumerGroupCoordinatorRequest(
                groupId="g", consumerId="c1", coordinator="elsewhere", epoch=group.epoch))
            moved = node.state.groups["g"]
            assert moved.coordinator == node.server_id and moved.epoch > group.epoch
            assert partitions_of(await fetch(api, "c1", moved.epoch)) == {"orders": [0]}


def test_a_killed_coordinator_is_replaced_when_the_members_report_it():
    from bascule.testing import LocalCluster

    config = {"groups.consumer.timeout": "20s", "groups.coordinator.timeout": "5s"}
    with LocalCluster(3, config=config) as cluster:
        first = cluster.node(0).address
        with grpc.insecure_channel(first) as channel:
            api = api_pb2_grpc.APIStub(channel)
            api.CreateStream(api_pb2.CreateStreamRequest(
                subject="orders", name="orders", partitions=2, replicationFactor=3), timeout=10)
            for consumer in ("c1", "c2"):
                joined = api.JoinConsumerGroup(api_pb2.JoinConsumerGroupRequest(
                    groupId="g", consumerId=consumer, streams=["orders"]), timeout=10)
        coordinator, epoch = joined.coordinator, joined.epoch
        cluster.kill(cluster.server_ids.index(coordinator))
        survivor = next(n.address for n in cluster.nodes if n.server_id != coordinator)
        with grpc.insecure_channel(survivor) as channel:
            api = api_pb2_grpc.APIStub(channel)
            deadline = time.monotonic() + 60
            while True:
                assert time.monotonic() < deadline, "the group never moved"
                (group,) = api.FetchMetadata(api_pb2.FetchMetadataRequest(groups=["g"]), timeout=5).groupMetadata
                if group.coordinator != coordinator:
                    break
                for consumer in ("c1", "c2"):  # as go-liftbridge's members do when their coordinator fails
                    try:
                        api.ReportConsumerGroupCoordinator(api_pb2.ReportConsumerGroupCoordinatorRequest(
                            groupId="g", consumerId=consumer, coordinator=coordinator, epoch=epoch), timeout=10)
                    except grpc.RpcError as exc:
                        # No metadata leader while Raft elects another; or the group just moved.
                        assert exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION), exc
                time.sleep(0.5)
            assert group.epoch > epoch
            successor = next(n.address for n in cluster.nodes if n.server_id == group.coordinator)
        with grpc.insecure_channel(successor) as channel:
            api = api_pb2_grpc.APIStub(channel)
            assigned = []
            for consumer in ("c1", "c2"):
                response = api.FetchConsumerGroupAssignments(api_pb2.FetchConsumerGroupAssignmentsRequest(
                    groupId="g", consumerId=consumer, epoch=group.epoch), timeout=5)
                assert response.epoch == group.epoch
                assigned += [p for a in response.assignments for p in a.partitions]
            assert sorted(assigned) == [0, 1]
