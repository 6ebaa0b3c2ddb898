"""bascule.api.admin's Partitions: whether each stream is compacted, and the metadata-only answer
that asks no replica (the metadata and the replicas' reports are stand-ins: no node, no NATS)."""

import asyncio
from dataclasses import replace
from types import SimpleNamespace

from bascule.api.admin import Admin
from bascule.config import Config
from bascule.metadata.state import Partition, Stream
from bascule.wire.pb import admin_pb2


def stream(name: str, **settings) -> Stream:
    partition = Partition(name, 0, replicas=("a",), leader="a", isr=("a",))
    return Stream(name, name, "", 0, settings, {0: partition})


class Queries:
    def __init__(self) -> None:
        self.asked = 0

    async def gather_replica_states(self, timeout):
        self.asked += 1
        return {"a": {f"{name}/0": (10, 9, 1, 4, 600) for name in ("on", "off", "unset")}}


def partitions(compact_enabled: bool, metadata_only: bool) -> tuple[list[admin_pb2.PartitionStatus], int]:
    response, asked = answer(compact_enabled, metadata_only)
    return list(response.partitions), asked


def answer(compact_enabled: bool, metadata_only: bool) -> tuple[admin_pb2.PartitionsResponse, int]:
    streams = [stream("on", compact_enabled=True), stream("off", compact_enabled=False), stream("unset")]
    state = SimpleNamespace(streams={s.name: s for s in streams})
    defaults = replace(Config().stream_defaults, compact_enabled=compact_enabled)
    cluster = SimpleNamespace(state=state, stream_defaults=defaults)
    queries = Queries()
    request = admin_pb2.PartitionsRequest(metadataOnly=metadata_only)
    return asyncio.run(Admin(cluster, queries).Partitions(request, None)), queries.asked


def test_partitions_say_which_streams_are_compacted():
    for default in (False, True):
        statuses, asked = partitions(default, metadata_only=False)
        assert {p.stream: p.compacted for p in statuses} == {"off": False, "on": True, "unset": default}
        assert asked == 1 and all(p.highWatermark == 9 and len(p.replicaStatus) == 1 for p in statuses)


def test_metadata_only_asks_no_replica_and_still_says_which_streams_are_compacted():
    statuses, asked = partitions(True, metadata_only=True)
    assert asked == 0
    assert {p.stream: p.compacted for p in statuses} == {"off": False, "on": True, "unset": True}
    assert all(p.highWatermark == -1 and not p.replicaStatus and p.leader == "a" for p in statuses)


def test_partitions_give_the_leaders_log_extent_and_each_streams_settings():
    response, _ = answer(False, metadata_only=False)
    first = response.partitions[0]
    assert (first.oldestOffset, first.newestOffset, first.messages, first.sizeBytes) == (4, 9, 6, 600)
    assert (first.replicaStatus[0].oldestOffset, first.replicaStatus[0].sizeBytes) == (4, 600)
    settings = {s.name: s.settings for s in response.streams}
    assert [s.name for s in response.streams] == ["off", "on", "unset"]
    assert (settings["on"].compactEnabled, settings["off"].compactEnabled) == (True, False)
    defaults = Config().stream_defaults
    assert settings["unset"].retentionMaxAge == round(defaults.retention_max_age * 1000)
    assert settings["unset"].segmentMaxBytes == defaults.segment_max_bytes


def test_an_unanswered_leader_leaves_the_log_extent_unknown():
    statuses, _ = partitions(False, metadata_only=True)
    assert all((p.oldestOffset, p.newestOffset, p.messages, p.sizeBytes) == (-1, -1, -1, -1) for p in statuses)
