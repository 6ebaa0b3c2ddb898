"""Publishing for the API: appends to partitions this node leads, bursts forwarded to the leaders
of partitions led elsewhere (``node.forwarding``), and envelopes through NATS where Liftbridge's way
is the contract (a publish naming an ack inbox, a subject other streams capture too, PublishToSubject:
on the partition's subject, acked to an inbox)."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Sequence
from functools import partial

from bascule.metadata.raft import MetadataError, MetadataRaft
from bascule.metadata.state import NOT_FOUND
from bascule.natsio.publisher import EnvelopePublisher
from bascule.node.capture import ack_point, numbered, when_ackable
from bascule.node.forwarding import Forwarder
from bascule.partition.replica import NotLeader, PartitionReplica, Placement, placed_offsets, settle
from bascule.partition.replication.concurrency import NO_EXPECTATION
from bascule.wire import capture
from bascule.wire.dedup import message_ids
from bascule.wire.entry import Record
from bascule.wire.names import partition_subject
from bascule.wire.pb import api_pb2
from bascule.wire.subjects import Subjects

# How long a publish waits for its ack (its commit, under ack policy ALL) before the client is
# told UNAVAILABLE; the write may still commit, as with any ack that is lost.
ACK_TIMEOUT = 30.0
# gRPC delivers pipelined publishes one per event-loop turn; waiting this long lets one write,
# one fsync and one replication round serve a whole window of them instead of one each.
API_WRITE_LINGER = 0.0005
# What a batch of one adds to a PublishRequest's size (its header and fixed fields; the stream
# name and every variable field are counted in the request's size already), besides the ack inbox.
FORWARDING_HEADROOM = 64
ACK_INBOX_TOKEN_BYTES = 11  # random bytes of an ack inbox's name, in hex



class PublishPath:
    def __init__(self, raft: MetadataRaft, envelopes: EnvelopePublisher, forwarder: Forwarder,
                 subjects: Subjects) -> None:
        self.raft = raft
        self.envelopes = envelopes
        self.forwarder = forwarder
        self.subjects = subjects

    def new_ack_inbox(self) -> str:
        """The ack inbox a PublishAsync call's acks name, or a Publish's that names none, as
        Liftbridge's (this node's acks go back on the call: nobody listens on it)."""
        return self.subjects.ack_inbox(secrets.token_hex(ACK_INBOX_TOKEN_BYTES))

    async def start(self) -> None:
        """Serve the bursts other nodes forward to the partitions this node leads."""
        await self.forwarder.start(self.submit_burst)

    async def close(self) -> None:
        await self.forwarder.close()

    @property
    def max_message_bytes(self) -> int:
        """The largest publish request accepted: forwarded to a leader elsewhere, it must fit one
        NATS message as an envelope with this node's ack inbox. Replication carries whatever that
        makes (big entries go in pieces)."""
        return self.envelopes.max_message_bytes

    @property
    def max_forwarded_bytes(self) -> int:
        """The largest publish request forwarded in a burst (with its batch's header, it fits one
        NATS message); a bigger one goes as an envelope."""
        inbox = self.subjects.ack_inbox("0" * 2 * ACK_INBOX_TOKEN_BYTES)
        return self.forwarder.max_batch_bytes - FORWARDING_HEADROOM - len(inbox.encode())

    def forward_burst(
        self, leader: str, stream: str, partition: int, requests: list[api_pb2.PublishRequest],
        on_acks: capture.BurstOutcome | None, inbox: str = "",
    ) -> None:
        """Forward a burst of API publishes to the partition's leader, ``leader``; ``on_acks`` as
        ``submit_burst``'s (``wire.forwarding.Unforwarded`` when the leader wrote none of them)."""
        self.forwarder.forward(leader, stream, partition, requests, on_acks, inbox)

    def submit(
        self, replica: PartitionReplica, subject: str, record: Record, policy: api_pb2.AckPolicy, correlation_id: str,
        on_ack: capture.AckOutcome, expected_offset: int = NO_EXPECTATION, inbox: str = "",
    ) -> None:
        """Append to a partition this node leads, whose messages carry ``subject``; ``on_ack``
        gets the ack (naming ``inbox``) once written (committed, under ack policy ALL), or the error
        (IncorrectOffset: the partition checks expected offsets and the record would not get
        ``expected_offset``)."""
        reception = time.time_ns()
        request = capture.AckRequest(inbox, correlation_id, policy, subject)

        def ackable(offset: int | None, error: BaseException | None) -> None:
            if error is not None or offset is None:
                on_ack(None, error)
            else:
                on_ack(capture.ack_message(replica.stream, subject, offset, request, reception,
                                           time.time_ns()), None)

        def written(placement: Placement | None, error: BaseException | None) -> None:
            if error is None and placement is not None:
                when_ackable(replica, policy, placed_offsets(placement, 1)[0], ackable)
            else:
                on_ack(None, error)

        replica.submit([record], written, API_WRITE_LINGER, [expected_offset], message_ids([record]))

    def submit_burst(
        self, replica: PartitionReplica, subject: str, records: list[Record], correlation_ids: list[str],
        policies: list[api_pb2.AckPolicy], on_acks: capture.BurstOutcome, expected_offsets: list[int] | None = None,
        inbox: str = "",
    ) -> None:
        """Append the records of a burst of API publishes (``records[i]`` published with
        ``correlation_ids[i]`` and ack policy ``policies[i]``, expecting offset
        ``expected_offsets[i]``) to a partition this node leads, in one write with one callback;
        ``on_acks`` gets the gRPC-framed PublishResponses of the acked ones (naming ``inbox``), those acked on write
        and those acked on commit in separate calls, or their indices and the error. A partition
        that checks expected offsets takes each record alone, as Liftbridge's does: a record
        refused (IncorrectOffset) takes none of the others with it."""
        if replica.concurrency_control and len(records) > 1:
            for index, record in enumerate(records):
                alone = None if expected_offsets is None else expected_offsets[index:index + 1]
                self.submit_burst(replica, subject, [record], correlation_ids[index:index + 1],
                                  policies[index:index + 1], partial(_reindexed, on_acks, index), alone, inbox)
            return
        reception = time.time_ns()
        acked = [index for index, policy in enumerate(policies) if policy != capture.NONE]
        ids = message_ids(records)
        if not acked:
            replica.submit(records, expected=expected_offsets, ids=ids)
            return

        def ackable(offsets: Sequence[int], policy: api_pb2.AckPolicy, group: list[int], _: int | None,
                    error: BaseException | None) -> None:
            if error is not None:
                on_acks(group, None, error)
            else:
                base, numbers = numbered(offsets, group)
                on_acks(group, capture.publish_responses(
                    replica.stream, subject, policy, base, numbers, [correlation_ids[index] for index in group],
                    reception, time.time_ns(), inbox), None)

        def written(placement: Placement | None, error: BaseException | None) -> None:
            if error is not None or placement is None:
                on_acks(acked, None, error or NotLeader("not written"))
                return
            offsets = placed_offsets(placement, len(records))
            groups: dict[api_pb2.AckPolicy, list[int]] = {}  # acked on write, or on commit (ALL)
            for index in acked:
                groups.setdefault(policies[index], []).append(index)
            for policy, group in groups.items():
                when_ackable(replica, policy, ack_point(offsets, group), partial(ackable, offsets, policy, group))

        replica.submit(records, written, API_WRITE_LINGER, expected_offsets, ids)

    async def publish(
        self, replica: PartitionReplica, subject: str, record: Record, policy: api_pb2.AckPolicy, correlation_id: str,
        expected_offset: int = NO_EXPECTATION, inbox: str = "",
    ) -> api_pb2.Ack:
        """``submit``, awaited."""
        acked: asyncio.Future[api_pb2.Ack] = asyncio.get_running_loop().create_future()
        self.submit(replica, subject, record, policy, correlation_id, partial(settle, acked), expected_offset, inbox)
        return await asyncio.wait_for(acked, ACK_TIMEOUT)

    async def publish_to_subject(
        self, subject: str, message: api_pb2.Message, wait: bool, timeout: float | None = None,
        from_stream: str | None = None,
    ) -> api_pb2.Ack | None:
        """Publish an envelope on NATS, as Liftbridge does, and optionally wait for the leader's ack
        (``from_stream``'s, when given)."""
        if not wait:
            await self.envelopes.publish(subject, message)
            return None
        return await self.envelopes.request(subject, message, timeout or ACK_TIMEOUT, from_stream)

    async def publish_remote(self, request: api_pb2.PublishRequest, wait: bool) -> api_pb2.Ack | None:
        """Publish through the partition's NATS subject, as Liftbridge does: for a partition led
        elsewhere, one whose subject other streams capture too, or a request naming an ack inbox."""
        stream = self.raft.state.streams.get(request.stream)
        if stream is None:
            raise MetadataError(NOT_FOUND, "No such stream or partition")
        message = api_pb2.Message(
            key=request.key, value=request.value, headers=request.headers, ackInbox=request.ackInbox,
            correlationId=request.correlationId, ackPolicy=request.ackPolicy, offset=request.expectedOffset,
        )
        # Every stream capturing the subject acks; the caller named one, and is answered by it.
        return await self.publish_to_subject(
            partition_subject(stream.subject, request.partition), message, wait, from_stream=request.stream
        )


def _reindexed(
    on_acks: capture.BurstOutcome, index: int, indices: list[int], responses: bytes | None,
    error: BaseException | None,
) -> None:
    """A one-record burst's outcome as the outcome of record ``index`` of the burst it came from."""
    on_acks([index] * len(indices), responses, error)
