"""What the client hands back: messages, acks, metadata and errors, built from the API's protobufs."""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc

from bascule.wire.pb import api_pb2


class BasculeError(Exception):
    """A failed call: ``code`` is the gRPC status code, ``message`` the server's reason."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code, self.message = code, message


@dataclass(slots=True)
class Message:  # not frozen: built once per message read, and frozen dataclasses build slowly
    stream: str
    partition: int
    offset: int
    timestamp: int  # ns since the epoch
    key: bytes | None
    value: bytes
    subject: str
    headers: dict[str, bytes]


@dataclass(frozen=True)
class Ack:
    """A message's acknowledgement. ``partition`` is the partition the client published to (the
    API's Ack does not carry it): None for `Client.publish_to_subject`, where the server routes."""

    stream: str
    partition_subject: str
    offset: int
    correlation_id: str
    partition: int | None = None
    message_subject: str = ""
    ack_inbox: str = ""
    reception_timestamp: int = 0  # ns since the epoch
    commit_timestamp: int = 0


@dataclass(frozen=True)
class PartitionInfo:
    id: int
    leader: str
    replicas: list[str]
    isr: list[str]
    high_watermark: int
    newest_offset: int
    paused: bool
    readonly: bool


@dataclass(frozen=True)
class StreamInfo:
    name: str
    subject: str
    partitions: dict[int, PartitionInfo]
    exists: bool = True


@dataclass(frozen=True)
class GroupInfo:
    """A consumer group as the metadata knows it: its coordinator (a broker id) and epoch."""

    group_id: str
    coordinator: str
    epoch: int
    exists: bool = True


@dataclass(frozen=True)
class Metadata:
    brokers: dict[str, str]  # id -> host:port
    streams: dict[str, StreamInfo] = field(default_factory=dict)
    groups: dict[str, GroupInfo] = field(default_factory=dict)


def metadata_from(response: api_pb2.FetchMetadataResponse) -> Metadata:
    brokers = {b.id: f"{b.host}:{b.port}" for b in response.brokers}
    streams = {}
    for s in response.streamMetadata:
        partitions = {pid: partition_info(p) for pid, p in s.partitions.items()}
        exists = s.error != api_pb2.StreamMetadata.Error.UNKNOWN_STREAM
        streams[s.name] = StreamInfo(s.name, s.subject, partitions, exists)
    unknown_group = api_pb2.ConsumerGroupMetadata.Error.UNKNOWN_GROUP
    groups = {
        g.groupId: GroupInfo(g.groupId, g.coordinator, g.epoch, g.error != unknown_group)
        for g in response.groupMetadata
    }
    return Metadata(brokers, streams, groups)


def partition_info(p: api_pb2.PartitionMetadata) -> PartitionInfo:
    return PartitionInfo(
        p.id, p.leader, list(p.replicas), list(p.isr), p.highWatermark, p.newestOffset, p.paused, p.readonly
    )


def ack_from(a: api_pb2.Ack, partition: int | None) -> Ack:
    return Ack(
        a.stream, a.partitionSubject, a.offset, a.correlationId, partition, a.msgSubject, a.ackInbox,
        a.receptionTimestamp, a.commitTimestamp,
    )


def message_from(m: api_pb2.Message) -> Message:
    return Message(
        m.stream, m.partition, m.offset, m.timestamp, m.key or None, m.value, m.subject, dict(m.headers)
    )


@dataclass(frozen=True)
class Membership:
    """A consumer's place in its group, as JoinConsumerGroup answers: the group's coordinator (a
    broker id), its epoch, and the timeouts (seconds) after which the group drops a silent member
    and members report a silent coordinator."""

    coordinator: str
    epoch: int
    consumer_timeout: float
    coordinator_timeout: float


@dataclass(frozen=True)
class Assignments:
    epoch: int
    partitions: dict[str, list[int]]  # stream -> partitions this consumer reads
