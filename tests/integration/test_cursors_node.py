"""Cursors on a real node, as Liftbridge keeps them: protobuf Cursor records in the compacted,
auto-paused ``__cursors`` stream on ``<namespace>.cursors``; through gufo-liftbridge and bascule's
client, across compaction and restarts, and from the 8-byte records earlier bascule wrote."""

import asyncio

import grpc
import pytest
from conftest import running_node
from gufo.liftbridge.client import LiftbridgeClient

from bascule.client import BasculeError, Client
from bascule.partition.log import CommitLog, Record
from bascule.wire.names import CURSORS_STREAM
from bascule.wire.pb import internal_pb2

pytestmark = pytest.mark.anyio

SETTINGS = {"streams.cleaner.interval": "200ms", "streams.segment.max.bytes": 1024}


async def fetched_cursor(client: Client, cursor_id: str) -> int:
    """The cursor, once the cursor partition has its leader again after a start."""
    for _ in range(100):
        try:
            return await client.fetch_cursor("events", 0, cursor_id)
        except BasculeError as error:
            if error.code != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            await asyncio.sleep(0.1)
    raise AssertionError("the cursor partition has no leader")


async def cursor_records(client: Client) -> list:
    return [m async for m in client.subscribe(CURSORS_STREAM, start="earliest", stop_latest=True)]


async def test_cursors_are_compacted_protobuf_records_and_survive_restarts(tmp_path):
    async with running_node(tmp_path, **SETTINGS) as (node, address), Client(address) as client:
        await client.wait_ready()
        cursors = node.state.streams[CURSORS_STREAM]
        assert cursors.subject == "liftbridge-default.cursors"
        assert cursors.settings["compact_enabled"] and cursors.settings["auto_pause_disable_if_subscribers"]
        assert cursors.settings["auto_pause_time"] == 60.0  # Liftbridge's default
        await client.create_stream("events", "events")
        async with LiftbridgeClient([address]) as lb:
            for offset in range(40):
                await lb.set_cursor(stream="events", partition=0, cursor_id="reader", offset=offset)
                await lb.set_cursor(stream="events", partition=0, cursor_id="other", offset=offset * 2)
            # gufo stores offset + 1 (the next offset to read) and returns what is stored
            assert await lb.get_cursor(stream="events", partition=0, cursor_id="reader") == 40
        records = await cursor_records(client)
        record = internal_pb2.Cursor.FromString(records[-1].value)
        assert (record.stream, record.partition, record.cursorId, record.offset) == ("events", 0, "other", 79)
        assert records[-1].key == b"other,events,0"
        for _ in range(100):  # the cleaner compacts the cursors stream
            if len(records := await cursor_records(client)) < 80:
                break
            await asyncio.sleep(0.2)
        assert len(records) < 80 and records[-1].offset == 79  # offsets kept

        with pytest.raises(BasculeError) as refused:
            await client.delete_stream(CURSORS_STREAM)
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT

    async with running_node(tmp_path, **SETTINGS) as (node, address), Client(address) as client:
        await client.wait_ready()
        assert await fetched_cursor(client, "reader") == 40
        assert await fetched_cursor(client, "other") == 79
        await client.set_cursor("events", 0, "reader", 100)
        assert await client.fetch_cursor("events", 0, "reader") == 100
        await client.delete_stream("events")  # the cursors stream is Liftbridge's own: it stays
        assert CURSORS_STREAM in node.state.streams


async def test_an_idle_cursor_partition_is_paused_and_a_cursor_write_wakes_it(tmp_path):
    async with running_node(tmp_path, **{"cursors.stream.auto.pause.time": "300ms"}) as (node, address), \
            Client(address) as client:
        await client.wait_ready()
        await client.create_stream("events", "events")
        await client.set_cursor("events", 0, "reader", 1)
        for _ in range(100):
            if node.state.partition(CURSORS_STREAM, 0).paused:
                break
            await asyncio.sleep(0.1)
        assert node.state.partition(CURSORS_STREAM, 0).paused
        assert await client.fetch_cursor("events", 0, "reader") == 1
        await client.set_cursor("events", 0, "reader", 2)
        assert not node.state.partition(CURSORS_STREAM, 0).paused
        assert await client.fetch_cursor("events", 0, "reader") == 2


async def test_cursors_that_earlier_bascule_stored_as_8_bytes_are_still_read(tmp_path):
    """A node upgraded in place: its cursor partition holds the old records, and new ones follow."""
    async with running_node(tmp_path) as (node, address), Client(address) as client:
        await client.wait_ready()
        await client.create_stream("events", "events")
        await client.set_cursor("events", 0, "fresh", 5)
    [directory] = (tmp_path / "streams").glob("__cursors@*/0")
    with CommitLog.open(directory) as log:  # what the earlier version wrote, as it wrote it
        epoch = log.epochs.latest_epoch
        log.append([Record((7).to_bytes(8, "big"), key=b"old,events,0"),
                    Record((-1).to_bytes(8, "big", signed=True), key=b"gone,events,0")], epoch)
        log.high_watermark = log.newest_offset
    async with running_node(tmp_path) as (node, address), Client(address) as client:
        await client.wait_ready()
        assert await fetched_cursor(client, "old") == 7
        async with LiftbridgeClient([address]) as lb:
            assert await lb.get_cursor(stream="events", partition=0, cursor_id="old") == 7
        assert await client.fetch_cursor("events", 0, "gone") == -1
        assert await client.fetch_cursor("events", 0, "fresh") == 5
        await client.set_cursor("events", 0, "old", 8)
        assert await client.fetch_cursor("events", 0, "old") == 8
        stored = await cursor_records(client)
        assert [m.key for m in stored][-1] == b"old,events,0"
        assert internal_pb2.Cursor.FromString(stored[-1].value).offset == 8
