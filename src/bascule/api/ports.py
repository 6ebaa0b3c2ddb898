"""What the gRPC API needs from a node, as protocols: the API depends on these, never on
``bascule.node``, and the composition root (``bascule.server``) hands it the node's parts."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from bascule.metadata.state import MetadataState
from bascule.partition.replica import PartitionReplica
from bascule.partition.replication.concurrency import NO_EXPECTATION
from bascule.wire.capture import BurstOutcome
from bascule.wire.entry import Record
from bascule.wire.pb import api_pb2
from bascule.wire.settings import StreamDefaults

# "stream/partition" -> (log end offset, HW, epoch of the last entry, oldest offset, bytes of its log files)
ReplicaStates = Mapping[str, tuple[int, int, int, int, int]]


class LedPartition(Protocol):
    """A partition replica on this node, and the NATS subject its messages carry."""

    @property
    def replica(self) -> PartitionReplica: ...

    @property
    def subject(self) -> str: ...


class Cluster(Protocol):
    """The metadata as this node last applied it, and changes through the metadata leader."""

    server_id: str

    @property
    def state(self) -> MetadataState: ...

    def live_brokers(self) -> set[str]:
        """The ids of the brokers that answer (Liftbridge lists only those)."""
        ...

    async def call(self, op: str, **args: Any) -> None: ...

    async def create_stream(
        self, name: str, subject: str, group: str, replication_factor: int, partitions: int,
        settings: dict[str, Any],
    ) -> None: ...

    @property
    def group_timeouts(self) -> tuple[float, float]:
        """groups.consumer.timeout and groups.coordinator.timeout, in seconds."""
        ...

    @property
    def stream_defaults(self) -> StreamDefaults:
        """What a stream that leaves a setting unset gets on this node."""
        ...

    async def metadata_when(self, predicate: Callable[[MetadataState], bool], timeout: float) -> MetadataState:
        """The metadata once ``predicate`` holds of it, or as it is after ``timeout`` seconds."""
        ...

    async def catch_up(self) -> None:
        """Until this node's metadata is at least the metadata leader's as of now."""
        ...

    async def join_consumer_group(self, group: str, consumer: str, streams: list[str]) -> tuple[str, int]:
        """Join ``group`` (created if need be); its coordinator and epoch. Raises MetadataError."""
        ...

    def fetch_group_assignments(self, group: str, consumer: str, epoch: int) -> tuple[int, dict[str, tuple[int, ...]]]:
        """The group epoch and the consumer's partitions per stream, served by the group's
        coordinator (this node) as a heartbeat of the consumer. Raises MetadataError."""
        ...


class Replicas(Protocol):
    """The partition replicas this node runs."""

    def get(self, stream: str, partition: int) -> LedPartition | None: ...

    async def until_leading(self, stream: str, partition: int) -> LedPartition | None: ...

    async def until_resumed(self, stream: str, partition: int) -> None: ...


class Publishing(Protocol):
    @property
    def max_message_bytes(self) -> int: ...

    @property
    def max_forwarded_bytes(self) -> int:
        """The largest publish request ``forward_burst`` takes."""
        ...

    def new_ack_inbox(self) -> str:
        """The ack inbox a PublishAsync call's acks name, or a Publish's that names none."""
        ...

    def forward_burst(
        self, leader: str, stream: str, partition: int, requests: list[api_pb2.PublishRequest],
        on_acks: BurstOutcome | None, inbox: str = "",
    ) -> None:
        """Forward a burst of publishes to the partition's leader, another node; ``on_acks`` as
        ``submit_burst``'s (``wire.forwarding.Unforwarded``: the leader wrote none of them)."""
        ...

    def submit_burst(
        self, replica: PartitionReplica, subject: str, records: list[Record], correlation_ids: list[str],
        policies: list[api_pb2.AckPolicy], on_acks: BurstOutcome, expected_offsets: list[int] | None = None,
        inbox: str = "",
    ) -> None: ...

    async def publish(
        self, replica: PartitionReplica, subject: str, record: Record, policy: api_pb2.AckPolicy, correlation_id: str,
        expected_offset: int = NO_EXPECTATION, inbox: str = "",
    ) -> api_pb2.Ack: ...

    async def publish_to_subject(
        self, subject: str, message: api_pb2.Message, wait: bool, timeout: float | None = None
    ) -> api_pb2.Ack | None: ...

    async def publish_remote(self, request: api_pb2.PublishRequest, wait: bool) -> api_pb2.Ack | None: ...


class ClusterQueries(Protocol):
    async def raft_quorum(self) -> dict[str, Any]: ...

    async def gather_replica_states(self, timeout: float) -> Mapping[str, ReplicaStates]: ...
