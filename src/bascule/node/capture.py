"""Capturing the NATS subjects of the partitions this node leads, and acking what publishers asked.

Messages arrive in bursts on the capture connection; a burst is one append. Acks of a burst go
out in one write once their ack point is reached (written, or committed under ack policy ALL).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial

from bascule.natsio.capture import CaptureConnection, Delivery
from bascule.node.partitions import LocalPartition
from bascule.partition.replica import NotLeader, Outcome, PartitionClosed, PartitionReplica
from bascule.wire import capture

log = logging.getLogger(__name__)


def when_ackable(replica: PartitionReplica, policy: int, offset: int, then: Outcome) -> None:
    """Call ``then`` once the record written at ``offset`` may be acked under ``policy``: at once
    (LEADER), or once it is committed (ALL)."""
    if policy == capture.ALL:
        replica.when_committed(offset, then)
    else:
        then(offset, None)


class CapturePath:
    def __init__(self, connection: CaptureConnection, on_not_leader: Callable[[], None]) -> None:
        self.connection = connection
        self.on_not_leader = on_not_leader  # capture stops once the metadata is reconciled again

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
            try:
                if batch.acks:
                    replica.submit(batch.records, partial(self._written, local, batch.acks, time.time_ns()))
                else:
                    replica.submit(batch.records)
            except (NotLeader, PartitionClosed) as exc:
                log.warning("dropping %d messages on %s: %s", len(batch.records), local.subject, exc)
                self.on_not_leader()

        return on_messages

    def _written(
        self, local: LocalPartition, acks: list[tuple[int, capture.AckRequest]], reception_ns: int,
        first_offset: int | None, error: BaseException | None,
    ) -> None:
        if error is not None or first_offset is None:
            return  # no ack: the publisher's timeout tells it the write did not happen
        on_write = [ack for ack in acks if ack[1].policy != capture.ALL]
        on_commit = [ack for ack in acks if ack[1].policy == capture.ALL]
        for group in (on_write, on_commit):
            if group:
                index, request = group[-1]
                when_ackable(local.replica, request.policy, first_offset + index,
                             partial(self._ackable, local, first_offset, group, reception_ns))

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
