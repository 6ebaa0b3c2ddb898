"""Capturing the NATS subjects of the partitions this node leads, and acking what publishers asked.

Messages arrive in bursts on the capture connection; a burst is one append. Acks of a burst go
out in one write once their ack point is reached (written, or committed under ack policy ALL).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from functools import partial

from bascule.natsio.capture import CaptureConnection, Delivery
from bascule.node.partitions import LocalPartition
from bascule.partition.encryption import EncryptionUnavailable
from bascule.partition.replica import (
    NotLeader,
    Outcome,
    PartitionClosed,
    PartitionReplica,
    Placement,
    ReplicaFailed,
    placed_offsets,
)
from bascule.partition.replication.concurrency import IncorrectOffset
from bascule.wire import capture
from bascule.wire.pb import api_pb2

log = logging.getLogger(__name__)

DROP_REASONS = ("not_leader", "closed", "failed", "invalid", "write_error")


def when_ackable(replica: PartitionReplica, policy: int, offset: int, then: Outcome) -> None:
    """Call ``then`` once the record written at ``offset`` may be acked under ``policy``: at once
    (LEADER), or once it is committed (ALL)."""
    if policy == capture.ALL:
        replica.when_committed(offset, then)
    else:
        then(offset, None)


def ack_point(offsets: Sequence[int], indices: list[int]) -> int:
    """The offset whose commit the acks of the records ``indices`` (ascending) of a write wait for:
    the highest of theirs (a duplicate's is its first copy's, which may be below the others)."""
    return offsets[indices[-1]] if isinstance(offsets, range) else max(offsets[index] for index in indices)


def numbered(offsets: Sequence[int], indices: list[int]) -> tuple[int, list[int]]:
    """(base, numbers) such that base + numbers[i] is the offset of record indices[i]: what the
    ack encoders take, which number a burst's acks from its first offset."""
    if isinstance(offsets, range):
        return offsets.start, indices
    return 0, [offsets[index] for index in indices]


def drop_reason(error: BaseException) -> str:
    """Why a burst the replica refused or failed was dropped, as ``CapturePath.dropped`` counts it."""
    if isinstance(error, ReplicaFailed):
        return "failed"
    if isinstance(error, PartitionClosed):
        return "closed"
    if isinstance(error, NotLeader):
        return "not_leader"
    if isinstance(error, ValueError):
        return "invalid"  # a record the log cannot store: the whole burst goes
    return "write_error"


class CapturePath:
    def __init__(self, connection: CaptureConnection, on_not_leader: Callable[[], None]) -> None:
        self.connection = connection
        self.on_not_leader = on_not_leader  # capture stops once the metadata is reconciled again
        # Captured messages given up on before they were written (and synced, under sync: always),
        # so never acked, by reason: for the metrics endpoint.
        self.dropped = dict.fromkeys(DROP_REASONS, 0)

    async def switch(self, local: LocalPartition, capturing: bool) -> None:
        """Capture the partition's subject or stop, as ``capturing`` says; a subscription is in
        place on the NATS server when this returns, so a publish right after is not lost."""
        if capturing and local.capture is None:
            local.capture = self.connection.subscribe(local.subject, local.group, self._handler(local))
            await self.connection.flush()
        elif not capturing and local.capture is not None:
            self.connection.unsubscribe(local.capture)
            local.capture = None

    def _handler(self, local: LocalPartition) -> Callable[[list[Delivery]], None]:
        replica = local.replica

        def on_messages(deliveries: list[Delivery]) -> None:
            batch = capture.capture_batch(deliveries)
            count = len(batch.records)
            try:
                if replica.concurrency_control:
                    self._submit_each(local, batch, capture.expected_offsets(deliveries))
                elif batch.acks:
                    replica.submit(batch.records, partial(self._written, local, batch.acks, count, time.time_ns()),
                                   ids=batch.ids)
                else:
                    replica.submit(batch.records, partial(self._count_if_dropped, count), ids=batch.ids)
            except (NotLeader, PartitionClosed) as exc:
                self.dropped[drop_reason(exc)] += count
                log.warning("dropping %d messages on %s: %s", count, local.subject, exc)
                self.on_not_leader()

        return on_messages

    def _submit_each(self, local: LocalPartition, batch: capture.CapturedBatch, expected: list[int]) -> None:
        """Under optimistic concurrency control, as Liftbridge, each message is appended alone: at
        the offset it expects, or not at all (acked with INCORRECT_OFFSET)."""
        acks = dict(batch.acks)
        reception_ns = time.time_ns()
        for index, record in enumerate(batch.records):
            outcome = partial(self._written_alone, local, acks.get(index), reception_ns)
            ids = None if batch.ids is None else batch.ids[index:index + 1]
            local.replica.submit([record], outcome, expected=expected[index:index + 1], ids=ids)

    def _written_alone(
        self, local: LocalPartition, ack: capture.AckRequest | None, reception_ns: int,
        offset: Placement | None, error: BaseException | None,
    ) -> None:
        if isinstance(error, IncorrectOffset):
            log.debug("refused a message on %s: %s", local.subject, error)
            if ack is not None:
                self._refuse(local, [ack], api_pb2.Ack.Error.INCORRECT_OFFSET, reception_ns)
        elif ack is None:
            self._count_if_dropped(1, offset, error)
        else:
            self._written(local, [(0, ack)], 1, reception_ns, offset, error)

    def _count_if_dropped(self, count: int, placement: Placement | None, error: BaseException | None) -> None:
        """The outcome of a burst of ``count`` messages: counted in ``dropped`` if it failed."""
        if error is not None:
            self.dropped[drop_reason(error)] += count

    def _written(
        self, local: LocalPartition, acks: list[tuple[int, capture.AckRequest]], count: int,
        reception_ns: int, placement: Placement | None, error: BaseException | None,
    ) -> None:
        if error is not None or placement is None:
            self._count_if_dropped(count, placement, error)
            if isinstance(error, EncryptionUnavailable):  # Liftbridge acks this refusal
                self._refuse(local, [request for _, request in acks], api_pb2.Ack.Error.ENCRYPTION, reception_ns)
            return  # else no ack: the publisher's timeout tells it the write did not happen
        offsets = placed_offsets(placement, count)
        base, numbers = numbered(offsets, [index for index, _ in acks])
        acks = [(number, request) for number, (_, request) in zip(numbers, acks)]
        on_write = [ack for ack in acks if ack[1].policy != capture.ALL]
        on_commit = [ack for ack in acks if ack[1].policy == capture.ALL]
        for group in (on_write, on_commit):
            if group:
                highest = group[-1][0] if isinstance(offsets, range) else max(number for number, _ in group)
                when_ackable(local.replica, group[-1][1].policy, base + highest,
                             partial(self._ackable, local, base, group, reception_ns))

    def _refuse(
        self, local: LocalPartition, requests: list[capture.AckRequest], error: api_pb2.Ack.Error, reception_ns: int,
    ) -> None:
        refused_ns = time.time_ns()
        self.connection.publish_many([
            capture.encode_refusal(local.replica.stream, local.subject, request, error, reception_ns, refused_ns)
            for request in requests
        ])

    def _ackable(
        self, local: LocalPartition, first_offset: int, acks: list[tuple[int, capture.AckRequest]],
        reception_ns: int, last_offset: int | None, error: BaseException | None,
    ) -> None:
        """All of a batch's acks in one write on the capture connection: through nats-py, each
        publish would cost more than the rest of the message's capture."""
        if error is None:
            encoded = capture.encode_acks(local.replica.stream, local.subject, first_offset, acks, reception_ns,
                                          time.time_ns())
            self.connection.publish_many(encoded)
