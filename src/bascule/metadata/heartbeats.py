"""The NATS heartbeats of the metadata Raft voters, which decide whether this node may lead (``metadata.standing``).

Every node publishes its Raft address and the voters it heard, sealed, on ``<ns>.raft.metadata.heartbeat``,
every ``HEARTBEAT_PERIOD``; each heartbeat received moves this node's standing, which the Raft shell reads from
pysyncobj's tick thread (``metadata.raft_standing``).

The heartbeats run on a thread of their own, over a NATS connection of their own (issue 32). On the node's
event loop and its one internal connection, a heartbeat waited behind everything else the node did and
received: at 10,000 partitions a failover's work held the loop for 2-5 s at a time, the metadata leader
heard nobody for its contact timeout and gave up its leadership, every report and ISR change in flight
failed with it and was sent again, and the next leader met the same load. What the standing is for stays
checked: a heartbeat goes only while the node's own connection is up (a node cut off from NATS is silent,
as before) and while its event loop has run within ``LOOP_STALL_LIMIT`` (a loop that is stuck, not slow,
leaves the node silent, and so without standing, as a stalled loop did before).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable

import msgpack
from nats.aio.msg import Msg
from nats.errors import Error as NatsError

from bascule.metadata.raft import MetadataRaft
from bascule.metadata.standing import NatsContact, loop_alive
from bascule.natsio.sealed import SealedNats
from bascule.wire.subjects import Subjects

log = logging.getLogger(__name__)

HEARTBEAT_PERIOD = 0.25
# Eight heartbeats missed: past a loop stall or two, short of what a cut may cost in writes.
CONTACT_TIMEOUT = 2.0
# How long the node's event loop may go without running before its heartbeats stop: a loop busy with a
# failover of thousands of partitions ran late by up to 5 s (issue 32); one stuck for longer serves nothing.
LOOP_STALL_LIMIT = 10.0
# How long the heartbeats' connection has to come up (then tried again after CONNECT_RETRY), and to close.
CONNECT_TIMEOUT = 10.0
CONNECT_RETRY = 1.0
CLOSE_TIMEOUT = 1.0

# Opens the heartbeats' own NATS connection, on the loop that calls it (the heartbeats' thread).
Connect = Callable[[], Awaitable[SealedNats]]


class NatsHeartbeats:
    """The heartbeats' thread and what crosses threads: ``standing_until`` (read by pysyncobj's tick thread),
    ``loop_seen`` (written by the node's event loop), and ``joined`` (handed to the heartbeats' loop)."""

    def __init__(
        self, connect: Connect, subjects: Subjects, raft: MetadataRaft, nats_connected: Callable[[], bool],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.connect = connect
        self.subjects = subjects
        self.raft = raft
        self.nats_connected = nats_connected  # the node's own connection (read across threads: a flag)
        self.clock = clock
        self._contact = NatsContact(raft.address, CONTACT_TIMEOUT)  # the heartbeats' thread's alone
        # Read by pysyncobj's tick thread: one float, replaced whole.
        self.standing_until = self._contact.standing_until(raft.members())
        self.loop_seen = clock()  # when the node's event loop last ran (``run``): one float, replaced whole
        self._loop: asyncio.AbstractEventLoop | None = None  # the heartbeats' thread's
        self._stopped: asyncio.Event | None = None  # on that loop; set through _stop
        self._stop_asked = threading.Event()
        self._thread: threading.Thread | None = None

    def standing(self) -> float:
        return self.standing_until

    def start(self) -> None:
        """Start the heartbeats' thread (it connects, and tries again until it does)."""
        self._thread = threading.Thread(target=self._thread_main, name="metadata heartbeats", daemon=True)
        self._thread.start()

    async def run(self) -> None:
        """On the node's event loop, until cancelled: say that it runs, then stop the heartbeats' thread."""
        try:
            while True:
                self.loop_seen = self.clock()
                await asyncio.sleep(HEARTBEAT_PERIOD)
        finally:
            await asyncio.shield(asyncio.to_thread(self._stop))

    def joined(self, node: str) -> None:
        """This node, the metadata leader, admits ``node``, which asked over NATS (``NatsContact.joined``)."""
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the heartbeats' loop ended: nothing to tell
                self._loop.call_soon_threadsafe(self._joined, node)

    # ---- the heartbeats' thread ---------------------------------------------------------------

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._beat())
        except Exception:
            log.exception("the metadata heartbeats stopped: this node stops leading the metadata")

    async def _beat(self) -> None:
        self._stopped = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        if self._stop_asked.is_set():  # asked before this loop could hear it
            return
        nc = await self._connected()
        if nc is None:
            return
        try:
            await nc.subscribe(self.subjects.metadata_heartbeat, cb=self._on_heartbeat)
            while not self._stopped.is_set():
                # Not through a reconnect of either connection (a heartbeat buffered through it would come
                # late), nor from a node whose loop is stuck: the others then stop counting it.
                if nc.client.is_connected and self.nats_connected() and loop_alive(
                        self.loop_seen, self.clock(), LOOP_STALL_LIMIT):
                    await self._publish(nc)
                self._refresh()
                await self._pause(HEARTBEAT_PERIOD)
        finally:
            # Best effort, and short: nothing queued on it matters, and NATS may be gone (stopped with the node).
            with contextlib.suppress(Exception):
                await asyncio.wait_for(nc.client.close(), CLOSE_TIMEOUT)

    async def _connected(self) -> SealedNats | None:
        """The heartbeats' connection, tried until it opens; None when stopped first."""
        assert self._stopped is not None
        while not self._stopped.is_set():
            try:
                return await asyncio.wait_for(self.connect(), CONNECT_TIMEOUT)
            except (OSError, TimeoutError, NatsError) as exc:
                log.warning("metadata heartbeats: no NATS connection yet (%r); trying again", exc)
                await self._pause(CONNECT_RETRY)
        return None

    async def _pause(self, seconds: float) -> None:
        """``seconds``, or less if the heartbeats are stopped meanwhile."""
        assert self._stopped is not None
        try:
            await asyncio.wait_for(self._stopped.wait(), seconds)
        except TimeoutError:
            pass

    def _stop(self) -> None:
        """From any thread but the heartbeats' own: end their loop, and wait for it."""
        self._stop_asked.set()
        if self._loop is not None and self._stopped is not None:
            with contextlib.suppress(RuntimeError):  # its loop ended already
                self._loop.call_soon_threadsafe(self._stopped.set)
        if self._thread is not None:
            self._thread.join(CLOSE_TIMEOUT + 1.0)  # a daemon thread: a stop never waits for it longer

    async def _publish(self, nc: SealedNats) -> None:
        heard = self._contact.heard(self.clock())
        try:
            await nc.publish(self.subjects.metadata_heartbeat, msgpack.packb(
                {"raft": self.raft.address, "heard": heard}, use_bin_type=True,
            ))
        except NatsError as exc:  # the connection dropped meanwhile: silence is what the others should see
            log.debug("metadata heartbeat not sent: %r", exc)

    def _joined(self, node: str) -> None:
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
