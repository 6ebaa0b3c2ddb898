"""The client's pure rules: go-liftbridge's partitioners, where calls go, which failures are retried,
where a broken subscription resumes, and the typed stream settings' request fields."""

from datetime import timedelta

import grpc
import pytest

from bascule.client import Metadata, PartitionInfo, RoundRobin, StreamInfo, StreamSettings, partition_by_key
from bascule.client.partitioners import choose_partition
from bascule.client.routing import (
    cursor_partition,
    next_broker,
    partition_address,
    resumed,
    subscription_complete,
    worth_retrying,
)
from bascule.wire.pb import api_pb2
from bascule.wire.settings import SETTINGS


def test_key_partitioner_is_go_liftbridges_crc32_ieee_of_the_key():
    # Go's crc32.ChecksumIEEE("hello") is 0x3610a686 (907060870); of "" it is 0.
    assert partition_by_key("s", b"hello", b"v", 1000) == 907060870 % 1000
    assert partition_by_key("s", None, b"v", 3) == partition_by_key("s", b"", b"v", 3) == 0
    assert partition_by_key("s", b"key", b"v", 0) == 0
    spread = {partition_by_key("s", b"key-%d" % i, b"", 3) for i in range(30)}
    assert spread == {0, 1, 2}


def test_round_robin_counts_per_stream():
    robin = RoundRobin()
    assert [robin("a", None, b"", 3) for _ in range(5)] == [0, 1, 2, 0, 1]
    assert [robin("b", None, b"", 2) for _ in range(3)] == [0, 1, 0]
    assert robin("c", None, b"", 0) == 0


def test_a_custom_partitioner_must_choose_an_existing_partition():
    assert choose_partition(lambda stream, key, value, count: count - 1, "s", None, b"", 4) == 3
    with pytest.raises(ValueError, match="partition 4"):
        choose_partition(lambda stream, key, value, count: count, "s", None, b"", 4)


def _metadata(leader="b1", isr=("b1", "b2")):
    partition = PartitionInfo(0, leader, ["b1", "b2", "b3"], list(isr), 0, 0, False, False)
    brokers = {"b1": "h:1", "b2": "h:2", "b3": "h:3"}
    return Metadata(brokers, {"s": StreamInfo("s", "s", {0: partition}), "gone": StreamInfo("gone", "", {}, False)})


def test_partition_calls_go_to_the_leader_or_an_isr_member():
    metadata = _metadata()
    assert partition_address(metadata, "s", 0) == "h:1"
    assert partition_address(metadata, "s", 0, read_isr_replica=True, choose=lambda a: a[-1]) == "h:2"
    assert partition_address(metadata, "s", 1) is None
    assert partition_address(metadata, "gone", 0) is None
    assert partition_address(metadata, "unknown", 0) is None
    assert partition_address(_metadata(leader=""), "s", 0) is None  # an election under way


def test_failover_goes_round_the_seeds_then_the_discovered_brokers():
    metadata = _metadata()
    assert next_broker("seed:1", ["seed:1", "seed:2"], None) == "seed:2"
    assert next_broker("seed:2", ["seed:1", "seed:2"], metadata) == "h:1"
    assert next_broker("h:3", ["seed:1"], metadata) == "seed:1"
    assert next_broker("only:1", ["only:1"], None) == "only:1"
    assert next_broker("forgotten:1", ["seed:1"], None) == "seed:1"


def test_what_is_retried_and_what_ends_a_subscription():
    assert worth_retrying(grpc.StatusCode.UNAVAILABLE, "anything")
    assert worth_retrying(grpc.StatusCode.FAILED_PRECONDITION, "Server not partition leader")
    assert worth_retrying(grpc.StatusCode.FAILED_PRECONDITION, "Server not cursor partition leader")
    assert not worth_retrying(grpc.StatusCode.FAILED_PRECONDITION, "Partition paused")
    assert not worth_retrying(grpc.StatusCode.NOT_FOUND, "Partition deleted")
    assert not worth_retrying(grpc.StatusCode.DEADLINE_EXCEEDED, "")  # a publish may have been stored
    assert subscription_complete(grpc.StatusCode.RESOURCE_EXHAUSTED, "Stop offset reached", False)
    assert subscription_complete(grpc.StatusCode.UNKNOWN, "EOF", True)
    assert not subscription_complete(grpc.StatusCode.UNKNOWN, "EOF", False)


def test_a_broken_subscription_resumes_after_the_last_offset_delivered_with_its_stop_kept():
    request = api_pb2.SubscribeRequest(stream="s", partition=2, startPosition=api_pb2.StartPosition.EARLIEST,
                                       stopPosition=api_pb2.StopPosition.STOP_OFFSET, stopOffset=99)
    assert resumed(request, None) is request
    again = resumed(request, 41)
    assert (again.startPosition, again.startOffset) == (api_pb2.StartPosition.OFFSET, 42)
    assert (again.stream, again.partition, again.stopOffset) == ("s", 2, 99)
    assert request.startPosition == api_pb2.StartPosition.EARLIEST  # the original is untouched


def test_cursor_partition_is_crc32_of_id_stream_partition():
    # Liftbridge's and go-liftbridge's rule: CRC-32 (IEEE) of "cursorId,stream,partition".
    import zlib

    assert cursor_partition("c", "s", 1, 7) == zlib.crc32(b"c,s,1") % 7
    assert cursor_partition("c", "s", 1, 0) == 0


def test_stream_settings_cover_every_setting_the_api_carries_in_its_units():
    api_settings = {key for key, setting in SETTINGS.items() if setting.api_field}
    assert set(StreamSettings.__dataclass_fields__) == api_settings
    request = api_pb2.CreateStreamRequest()
    StreamSettings(retention_max_age=timedelta(hours=1), segment_max_age=1.5, min_isr=2, compact_enabled=False,
                   retention_max_bytes=0).apply_to(request)
    assert request.retentionMaxAge.value == 3_600_000 and request.segmentMaxAge.value == 1500
    assert request.minIsr.value == 2 and request.HasField("compactEnabled") and not request.compactEnabled.value
    assert request.HasField("retentionMaxBytes") and request.retentionMaxBytes.value == 0  # 0 given: no limit
    assert not request.HasField("encryption") and not request.HasField("cleanerInterval")  # unset: the server's
