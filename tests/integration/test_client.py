"""bascule's client against real nodes: partitioners and acks with their partition, typed settings,
publish to a subject, a list of brokers with a dead one first, consumer groups (one node, in process);
and on three processes, a subscription and a publisher that outlive the partition leader's death
(no message lost, none twice) and calls that fail over to a live broker."""

import asyncio
import contextlib

import pytest
from cluster_checks import FAST
from conftest import running_node, until

from bascule.client import BasculeError, Client, RoundRobin, StreamSettings, partition_by_key
from bascule.testing.local import LocalCluster
from bascule.testing.ports import free_port

pytestmark = pytest.mark.anyio


async def test_partitioners_route_each_message_and_its_ack_names_the_partition(tmp_path):
    async with running_node(tmp_path) as (node, address), Client(address) as client:
        await client.wait_ready()
        await client.create_stream("parts", "parts", partitions=3)
        keyed = [await client.publish("parts", b"v", key=b"key-%d" % i, partitioner=partition_by_key)
                 for i in range(9)]
        assert [ack.partition for ack in keyed] == [partition_by_key("parts", b"key-%d" % i, b"", 3) for i in range(9)]
        robin = RoundRobin()
        assert [(await client.publish("parts", b"r", partitioner=robin)).partition for _ in range(4)] == [0, 1, 2, 0]
        assert (await client.publish("parts", b"x", partition=2, partitioner=robin)).partition == 2  # named wins
        assert (await client.publish("parts", b"plain")).partition == 0  # go-liftbridge's default
        for partition in range(3):
            stored = [m async for m in client.subscribe("parts", partition, start="earliest", stop_latest=True)]
            acked = [a.offset for a in keyed + [] if a.partition == partition]
            assert [m.offset for m in stored if m.key] == acked
        batch = await client.publish_many("parts", [b"a", b"b", b"c"], keys=[b"1", b"2", b"3"],
                                          partitioner=partition_by_key)
        assert [a.partition for a in batch] == [partition_by_key("parts", k, b"", 3) for k in (b"1", b"2", b"3")]
        assert [a.correlation_id for a in batch] == ["0", "1", "2"]


async def test_typed_settings_reach_the_stream_and_publish_to_subject_is_captured(tmp_path):
    async with running_node(tmp_path) as (node, address), Client(address) as client:
        await client.wait_ready()
        settings = StreamSettings(retention_max_messages=100, segment_max_age=30.0, min_isr=1, compact_enabled=True)
        await client.create_stream("typed", "typed.in", settings=settings)
        stored = node.state.streams["typed"].settings
        assert (stored["retention_max_messages"], stored["segment_max_age"]) == (100, 30.0)
        assert stored["compact_enabled"] is True and "encryption" not in stored
        with pytest.raises(TypeError):
            await client.create_stream("bad", "bad", no_such_setting=1)
        ack = await client.publish_to_subject("typed.in", b"over NATS", key=b"k", ack_policy="all")
        assert ack is not None and (ack.stream, ack.offset, ack.partition) == ("typed", 0, None)
        (message,) = [m async for m in client.subscribe("typed", start="earliest", stop_latest=True)]
        assert (message.value, message.key, message.subject) == (b"over NATS", b"k", "typed.in")


async def test_a_dead_broker_first_in_the_list_is_passed_over(tmp_path):
    dead = f"127.0.0.1:{free_port('127.0.0.1')}"
    async with running_node(tmp_path) as (node, address), Client([dead, address], timeout=10) as client:
        await client.wait_ready()
        await client.create_stream("s", "s")
        assert client.address == address
        assert (await client.publish("s", b"1", ack_policy="all")).offset == 0
    with pytest.raises(ValueError):
        Client([])


async def test_consumer_group_members_share_the_partitions_and_follow_the_epoch(tmp_path):
    settings = {"groups.consumer.timeout": "2s", "groups.coordinator.timeout": "4s"}
    async with running_node(tmp_path, **settings) as (node, address), Client(address) as client:
        await client.wait_ready()
        await client.create_stream("orders", "orders", partitions=2)
        for i in range(6):
            await client.publish("orders", b"early-%d" % i, partition=i % 2)
        received: dict[str, list] = {"a": [], "b": []}

        async def consume(consumer):
            async for message in consumer.messages(["orders"]):
                received[consumer.consumer_id].append((message.partition, message.offset, message.value))

        first = client.consumer("g", consumer_id="a", auto_offset="earliest", checkpoint_interval=0.2,
                                fetch_interval=0.2)
        reading_a = asyncio.create_task(consume(first))
        await until(lambda: len(received["a"]) == 6)
        assert first.assignments == {"orders": [0, 1]}
        await first.checkpoint()
        assert await client.fetch_cursor("orders", 0, "__group:g") == 2  # three messages each

        second = client.consumer("g", consumer_id="b", checkpoint_interval=0.2, fetch_interval=0.2)
        reading_b = asyncio.create_task(consume(second))
        # The first member learns the new epoch and gives up one partition.
        await until(lambda: len(first.assignments.get("orders", [])) == 1 and second.assignments)
        assert first.epoch == second.epoch
        assert sorted(first.assignments["orders"] + second.assignments["orders"]) == [0, 1]
        for i in range(6):
            await client.publish("orders", b"late-%d" % i, partition=i % 2)
        await until(lambda: sum(v.startswith(b"late") for _, _, v in received["a"] + received["b"]) >= 6)
        for member, partition in (("a", first.assignments["orders"][0]), ("b", second.assignments["orders"][0])):
            late = [v for p, _, v in received[member] if v.startswith(b"late")]
            assert late == [b"late-%d" % i for i in range(6) if i % 2 == partition], (member, received)
        for task in (reading_a, reading_b):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await second.close()
        assert "b" not in node.state.groups["g"].members
        await first.close()




@pytest.mark.cluster
async def test_a_subscription_and_a_publisher_outlive_the_leaders_death_without_gaps_or_duplicates():
    with LocalCluster(3, config=FAST) as cluster:
        async with Client(cluster.brokers, timeout=20) as client:
            await client.wait_ready()
            await client.create_stream("failover", "failover", replication_factor=3, min_isr=2)
            received: list[int] = []

            async def read():
                async for message in client.subscribe("failover", start="earliest", resubscribe_wait=30):
                    received.append(int(message.value))

            reading = asyncio.create_task(read())
            for i in range(50):
                await client.publish("failover", b"%d" % i, ack_policy="all")
            await until(lambda: len(received) == 50)
            leader = (await client.fetch_metadata("failover")).streams["failover"].partitions[0].leader
            killed = cluster.server_ids.index(leader)
            client.address = cluster.node(killed).address  # the next non-partition call starts at the dead node
            cluster.kill(killed)
            for i in range(50, 100):
                await client.publish("failover", b"%d" % i, ack_policy="all")
            await until(lambda: len(received) == 100, timeout=30)
            assert not reading.done(), reading
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading
            assert received == list(range(100))
            after = (await client.fetch_metadata("failover")).streams["failover"].partitions[0]
            assert after.leader != leader and client.address != cluster.node(killed).address
            with pytest.raises(BasculeError):  # no resubscribe wait: a dead stream fails at once
                async for _ in client.subscribe("nope", resubscribe_wait=0):
                    pass


@pytest.mark.cluster
async def test_a_consumer_follows_its_group_to_a_new_coordinator_when_the_old_one_dies():
    config = {**FAST, "groups.consumer.timeout": "20s", "groups.coordinator.timeout": "2s",
              "cursors.stream.partitions": 1, "cursors.stream.replication.factor": 3}
    with LocalCluster(3, config=config) as cluster:
        async with Client(cluster.brokers, timeout=20) as client:
            await client.wait_ready()
            await client.create_stream("work", "work", replication_factor=3, min_isr=2)
            received: list[int] = []
            member = client.consumer("crew", auto_offset="earliest", fetch_interval=0.3)

            async def consume():
                async for message in member.messages(["work"]):
                    received.append(int(message.value))

            consuming = asyncio.create_task(consume())
            for i in range(20):
                await client.publish("work", b"%d" % i, ack_policy="all")
            await until(lambda: len(received) == 20 or consuming.done())
            assert not consuming.done(), consuming
            coordinator, epoch = member.coordinator, member.epoch
            cluster.kill(cluster.server_ids.index(coordinator))
            for i in range(20, 40):
                await client.publish("work", b"%d" % i, ack_policy="all")
            await until(lambda: len(received) == 40 and member.coordinator != coordinator, timeout=40)
            assert not consuming.done(), consuming
            consuming.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await consuming
            assert received == list(range(40)) and member.epoch > epoch
