"""The NATS heartbeats of the metadata Raft voters, which decide whether this node may lead (``metadata.standing``).

Every node publishes its Raft address and the voters it heard, sealed, on ``<ns>.raft.metadata.heartbeat``,
every ``HEARTBEAT_PERIOD``; each heartbeat received moves this node's standing, which the Raft shell reads from
pysyncobj's tick thread (``metadata.raft_standing``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import msgpack
from nats.aio.msg import Msg
from nats.errors import Error as NatsError

from bascule.metadata.raft import MetadataRaft
from bascule.metadata.standing import NatsContact
from bascule.natsio.sealed import SealedNats
from bascule.wire.subjects import Subjects

log = logging.getLogger(__name__)

HEARTBEAT_PERIOD = 0.25
# Eight heartbeats missed: past a loop stall or two, short of what a cut may cost in writes.
CONTACT_TIMEOUT = 2.0


class NatsHeartbeats:
    def __init__(
        self, nc: SealedNats, subjects: Subjects, raft: MetadataRaft, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.nc = nc
        self.subjects = subjects
        self.raft = raft
        self.clock = clock
        self._contact = NatsContact(raft.address, CONTACT_TIMEOUT)
        # Read by pysyncobj's tick thread: one float, replaced whole.
        self.standing_until = self._contact.standing_until(raft.members())

    def standing(self) -> float:
        return self.standing_until

    async def start(self) -> None:
        await self.nc.subscribe(self.subjects.metadata_heartbeat, cb=self._on_heartbeat)

    async def run(self) -> None:
        while True:
            if self.nc.client.is_connected:  # a heartbeat buffered through a reconnect would come late
                await self._publish()
            self._refresh()
            await asyncio.sleep(HEARTBEAT_PERIOD)

    async def _publish(self) -> None:
        heard = self._contact.heard(self.clock())
        try:
            await self.nc.publish(self.subjects.metadata_heartbeat, msgpack.packb(
                {"raft": self.raft.address, "heard": heard}, use_bin_type=True,
            ))
        except NatsError as exc:  # the connection dropped meanwhile: silence is what the others should see
            log.debug("metadata heartbeat not sent: %r", exc)

    def joined(self, node: str) -> None:
        """This node, the metadata leader, admits ``node``, which asked over NATS (``NatsContact.joined``)."""
        self._contact.joined(node, self.clock())
        self._refresh()

    async def _on_heartbeat(self, msg: Msg) -> None:
        try:
            body = msgpack.unpackb(msg.data, raw=False)
            sender, heard = body["raft"], body["heard"]
            if not isinstance(sender, str) or not isinstance(heard, list):
                raise ValueError("not a heartbeat")
        except Exception as exc:  # garbage from a node of another version must not reach the table
            log.warning("dropping a malformed metadata heartbeat: %s", exc)
            return
        self._contact.heartbeat(sender, heard, self.raft.members(), self.clock())
        self._refresh()

    def _refresh(self) -> None:
        until = self._contact.standing_until(self.raft.members())
        now = self.clock()
        if (until > now) != (self.standing_until > now):
            if until > now:
                log.info("in contact with a majority of the metadata voters over NATS: may lead the metadata again")
            else:
                log.warning("out of contact over NATS with a majority of the metadata voters (%s heard within "
                            "%.1f s): not leading the metadata", self._contact.heard(now) or "none",
                            CONTACT_TIMEOUT)
        self.standing_until = until
