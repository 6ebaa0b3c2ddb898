"""What the message paths count for the metrics endpoint, without a network: the log's appends and
fsyncs, a replica's ISR changes and followers' fetches, the capture path's drops, and the gRPC
calls' counts and histograms as exposed."""

import random
import threading
import time

import pytest
from conftest import until
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bascule.h2grpc import Status
from bascule.metrics import GRPC_BUCKETS, GrpcCalls
from bascule.node.capture import DROP_REASONS, CapturePath, drop_reason
from bascule.node.partitions import LocalPartition
from bascule.partition.log import CommitLog
from bascule.partition.log.fsync_times import FSYNC_BUCKETS, DurationHistogram, fsync_seconds
from bascule.partition.replica import NotLeader, PartitionClosed, PartitionReplica, ReplicaFailed, SyncPolicy
from bascule.wire import envelope
from bascule.wire.entry import Record, scan
from bascule.wire.pb import api_pb2

pytestmark = pytest.mark.anyio
# How the tests lead: a leader timeout of 10 s (what followers wait before reporting it).
LEADING = dict(min_isr=1, max_lag_time=10.0, leader_timeout=10.0)


def replica_of(tmp_path, name="p") -> PartitionReplica:
    return PartitionReplica("s", 0, CommitLog.open(tmp_path / name), SyncPolicy(), time.monotonic)




# ---- the fsync histogram ------------------------------------------------------------------------


def test_durations_land_in_the_first_bucket_whose_bound_they_do_not_exceed():
    histogram = DurationHistogram((0.001, 0.01, 0.1))
    for seconds in (0.0, 0.001, 0.0011, 0.05, 0.1, 0.2, 30.0):
        histogram.observe(seconds)
    counts, total = histogram.snapshot()
    assert counts == [2, 1, 2, 2]
    assert total == pytest.approx(30.3521)


def test_observations_from_many_threads_are_all_counted():
    histogram = DurationHistogram(FSYNC_BUCKETS)
    draws = [[random.Random(seed).expovariate(100) for _ in range(2000)] for seed in range(8)]
    threads = [threading.Thread(target=lambda d=d: [histogram.observe(s) for s in d]) for d in draws]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    counts, total = histogram.snapshot()
    assert sum(counts) == 16_000
    assert total == pytest.approx(sum(map(sum, draws)))


def test_a_sync_with_something_to_write_is_one_fsync_observation(tmp_path):
    with CommitLog.open(tmp_path / "p") as log:
        log.sync()  # the new segment and its directory
        before = sum(fsync_seconds.snapshot()[0])
        log.sync()
        assert sum(fsync_seconds.snapshot()[0]) == before  # nothing to sync: no fsync
        log.append([Record(b"a"), Record(b"b")], 0)
        log.sync()
        assert sum(fsync_seconds.snapshot()[0]) == before + 1


# ---- the log's and the replica's counters -------------------------------------------------------


async def test_appends_as_leader_and_as_follower_are_counted_in_entries_and_stored_bytes(tmp_path):
    leader, follower = replica_of(tmp_path, "leader"), replica_of(tmp_path, "follower")
    try:
        leader.become_leader("me", 0, 0, ("me", "F"), ("me",), **LEADING)
        leader.submit([Record(b"a"), Record(b"bb", key=b"k")])
        leader.submit([Record(b"ccc", headers={"h": b"v"})])
        await until(lambda: leader.log.next_offset == 3)
        stored = leader.log.read_raw(0, 1 << 20)
        assert (leader.log.appended_entries, leader.log.appended_bytes) == (3, len(stored))
        follower.become_follower("me", 0)
        follower.append_replicated(stored, list(scan(stored)))
        assert (follower.log.appended_entries, follower.log.appended_bytes) == (3, len(stored))
        follower.append_replicated(b"", [])
        assert follower.log.appended_entries == 3
        with pytest.raises(ValueError):
            follower.append_replicated(stored, list(scan(stored)))  # does not continue the log
        assert (follower.log.appended_entries, follower.log.appended_bytes) == (3, len(stored))
    finally:
        leader.close()
        follower.close()


async def test_followers_are_counted_the_messages_their_next_fetch_moves_past(tmp_path):
    replica = replica_of(tmp_path)
    try:
        replica.become_leader("me", 0, 0, ("me", "F", "G"), ("me", "F", "G"), **LEADING)
        replica.submit([Record(b"x")] * 5)
        await until(lambda: replica.log.next_offset == 5)
        assert replica.serve_fetch("F", 0, 0, 1 << 20)
        assert replica.messages_to_followers == 0  # sent, not yet known to have arrived
        replica.serve_fetch("F", 0, 0, 1 << 20)  # asked again: the answer was lost
        assert replica.messages_to_followers == 0
        replica.serve_fetch("F", 5, 0, 1 << 20)
        replica.serve_fetch("G", 3, 0, 1 << 20)
        replica.serve_fetch("G", 5, 0, 1 << 20)
        assert replica.messages_to_followers == 7
        for stranger, epoch in [("me", 0), ("nobody", 0), ("G", 1), ("F", 7)]:
            replica.serve_fetch(stranger, 9, epoch, 1 << 20)
        assert replica.messages_to_followers == 7
        replica.become_follower("G", 1)
        replica.become_leader("me", 2, 2, ("me", "F", "G"), ("me", "F", "G"), **LEADING)
        replica.serve_fetch("F", 5, 2, 1 << 20)  # a new leadership: its first fetch is no progress
        assert replica.messages_to_followers == 7
    finally:
        replica.close()


async def test_isr_members_lost_and_gained_while_leading_are_counted(tmp_path):
    replica = replica_of(tmp_path)
    replicas = ("me", "F", "G")
    try:
        replica.become_leader("me", 1, 1, replicas, replicas, **LEADING)
        replica.become_leader("me", 1, 2, replicas, ("me", "F"), **LEADING)
        replica.become_leader("me", 1, 3, replicas, ("me",), **LEADING)
        replica.become_leader("me", 1, 2, replicas, replicas, **LEADING)  # an older view
        assert (replica.isr_shrinks, replica.isr_expansions) == (2, 0)
        replica.become_leader("me", 1, 4, replicas, ("me", "G"), **LEADING)
        replica.become_leader("me", 1, 4, replicas, ("me", "G"), **LEADING)  # no change
        assert (replica.isr_shrinks, replica.isr_expansions) == (2, 1)
        replica.become_leader("me", 2, 5, replicas, ("me",), **LEADING)  # a new epoch's ISR
        assert (replica.isr_shrinks, replica.isr_expansions) == (2, 1)
    finally:
        replica.close()


# ---- the capture path's drops -------------------------------------------------------------------


class NoConnection:
    def publish_many(self, messages):
        raise AssertionError("nothing here asks for an ack")


def deliveries(*payloads: bytes) -> list[tuple[str, str, bytes]]:
    return [("s.in", "", payload) for payload in payloads]


def publish_envelope(headers: dict[str, bytes]) -> bytes:
    return envelope.encode_message(api_pb2.Message(value=b"v", headers=headers), envelope.MsgType.PUBLISH)


def test_each_refusal_has_its_reason():
    assert [drop_reason(error) for error in (
        NotLeader("x"), PartitionClosed("x"), ReplicaFailed("x"), ValueError("header name too long"), OSError(28, "x"),
    )] == ["not_leader", "closed", "failed", "invalid", "write_error"]
    assert set(DROP_REASONS) == {"not_leader", "closed", "failed", "invalid", "write_error"}


async def test_captured_bursts_given_up_on_are_counted_by_reason(tmp_path):
    replica = replica_of(tmp_path)
    capture = CapturePath(NoConnection(), on_not_leader=lambda: None)
    on_messages = capture._handler(LocalPartition(replica, "s.in", ""))
    try:
        on_messages(deliveries(b"a", b"b"))  # not leading
        assert capture.dropped == {**dict.fromkeys(DROP_REASONS, 0), "not_leader": 2}
        replica.become_leader("me", 0, 0, ("me",), ("me",), **LEADING)
        on_messages(deliveries(b"c", b"d", b"e"))
        await until(lambda: replica.log.next_offset == 3)
        # A header name an entry cannot hold fails its burst, whatever else is in it.
        on_messages(deliveries(b"f", publish_envelope({"n" * 70_000: b"v"})))
        on_messages(deliveries(b"g"))
        await until(lambda: replica.log.next_offset == 4)
        assert capture.dropped["invalid"] == 2
        replica.stop()
        on_messages(deliveries(b"h"))
        assert capture.dropped == {**dict.fromkeys(DROP_REASONS, 0), "not_leader": 2, "invalid": 2, "closed": 1}
    finally:
        replica.close()


async def test_garbage_captured_is_stored_not_dropped(tmp_path):
    """Plain publishers never lose a message to parsing: garbage, envelope-like or not, is stored."""
    replica = replica_of(tmp_path)
    capture = CapturePath(NoConnection(), on_not_leader=lambda: None)
    on_messages = capture._handler(LocalPartition(replica, "s.in", ""))
    rng = random.Random(11)
    garbage = [bytes(rng.randrange(256) for _ in range(rng.randrange(64))) for _ in range(50)]
    garbage += [envelope.MAGIC + payload for payload in garbage[:20]]
    try:
        replica.become_leader("me", 0, 0, ("me",), ("me",), **LEADING)
        for start in range(0, len(garbage), 7):
            on_messages(deliveries(*garbage[start:start + 7]))
        await until(lambda: replica.log.next_offset == len(garbage))
        assert capture.dropped == dict.fromkeys(DROP_REASONS, 0)
        assert replica.log.appended_entries == len(garbage)
    finally:
        replica.close()


# ---- gRPC calls, as exposed ---------------------------------------------------------------------


def exposed(calls: GrpcCalls) -> dict[tuple[str, frozenset], float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(calls)
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for sample in family.samples
    }


def test_grpc_calls_are_exposed_by_method_code_and_outcome_with_a_latency_histogram():
    calls = GrpcCalls()
    publish, subscribe = "/proto.API/Publish", "/proto.API/Subscribe"
    for seconds in (0.0002, 0.0005, 0.003, 0.003):
        calls.observe(publish, Status.OK, seconds, False)
    calls.observe(publish, Status.NOT_FOUND, 0.04, False)
    calls.observe(subscribe, Status.CANCELLED, 7200.0, False)
    calls.observe(subscribe, Status.UNKNOWN, 0.01, True)
    calls.observe(subscribe, Status.UNKNOWN, 0.01, False)
    samples = exposed(calls)
    requests = {" ".join(dict(labels)[label] for label in ("method", "code", "outcome")): value
                for (name, labels), value in samples.items() if name == "bascule_grpc_requests_total"}
    assert requests == {
        f"{publish} OK ok": 4, f"{publish} NOT_FOUND error": 1, f"{subscribe} CANCELLED error": 1,
        f"{subscribe} UNKNOWN end": 1, f"{subscribe} UNKNOWN error": 1,
    }

    def bucket(method, bound):
        return samples[("bascule_grpc_request_duration_seconds_bucket",
                        frozenset({"method": method, "le": bound}.items()))]

    assert [bucket(publish, bound) for bound in ("0.0005", "0.001", "0.005", "0.05", "+Inf")] == [2, 2, 4, 5, 5]
    assert bucket(subscribe, str(GRPC_BUCKETS[-1])) == 2 and bucket(subscribe, "+Inf") == 3
    assert samples[("bascule_grpc_request_duration_seconds_count", frozenset({"method": publish}.items()))] == 5
    assert samples[("bascule_grpc_request_duration_seconds_sum", frozenset({"method": publish}.items()))] == (
        pytest.approx(0.0467)
    )
