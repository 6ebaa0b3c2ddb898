"""Liftbridge's activity stream on a real node: every stream change, in order, on ``__activity``."""

from __future__ import annotations

import asyncio

import pytest
from conftest import running_node

from bascule.client import Client
from bascule.wire.pb import api_pb2

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

Op = api_pb2.ActivityStreamOp


async def activity(client: Client) -> list[api_pb2.ActivityStreamEvent]:
    messages = [m async for m in client.subscribe("__activity", start="earliest", stop_latest=True)]
    return [api_pb2.ActivityStreamEvent.FromString(m.value) for m in messages]


async def test_stream_changes_are_published_in_order_once_enabled(tmp_path):
    async with running_node(tmp_path, **{"activity.stream.enabled": True}) as (node, address):
        async with Client(address) as client:
            await client.wait_ready()
            await client.create_stream("orders", "orders", partitions=2)
            await client.pause_stream("orders", partitions=[1])
            await client.publish("orders", b"wakes it", partition=1, ack_policy="all")  # resumes partition 1
            await client.set_stream_readonly("orders")
            await client.delete_stream("orders")
            wanted = [Op.CREATE_STREAM, Op.PAUSE_STREAM, Op.RESUME_STREAM, Op.SET_STREAM_READONLY, Op.DELETE_STREAM]
            events: list[api_pb2.ActivityStreamEvent] = []
            for _ in range(100):
                once = {e.id: e for e in await activity(client) if _stream_of(e) == "orders"}
                events = list(once.values())
                if len(events) == len(wanted):
                    break
                await asyncio.sleep(0.1)
            assert [e.op for e in events] == wanted
            assert list(events[0].createStreamOp.partitions) == [0, 1]
            assert list(events[1].pauseStreamOp.partitions) == [1]
            assert events[3].setStreamReadonlyOp.readonly
            # At least once, in order: a publish whose ack timed out may be stored twice.
            ids = [e.id for e in await activity(client)]
            assert ids == sorted(ids)
            for _ in range(50):
                if not node.state.activity:
                    break
                await asyncio.sleep(0.1)
            assert not node.state.activity  # every event published and marked so


async def test_the_activity_stream_is_off_by_default(tmp_path):
    async with running_node(tmp_path) as (node, address):
        async with Client(address) as client:
            await client.wait_ready()
            await client.create_stream("quiet", "quiet")
            assert "__activity" not in (await client.fetch_metadata()).streams


def _stream_of(event: api_pb2.ActivityStreamEvent) -> str:
    """The stream an event is about: in the body its op names."""
    bodies = {Op.CREATE_STREAM: event.createStreamOp, Op.DELETE_STREAM: event.deleteStreamOp,
              Op.PAUSE_STREAM: event.pauseStreamOp, Op.RESUME_STREAM: event.resumeStreamOp,
              Op.SET_STREAM_READONLY: event.setStreamReadonlyOp}
    return bodies[event.op].stream
