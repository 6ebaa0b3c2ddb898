"""The follower's side of replication (over NATS, or any ``Transport``): a loop that
runs the pure ``Follower`` machine.

Each action the machine emits is carried out here, in order (a request, a log
change, a wait), and its outcome fed back as the next event.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from nats.errors import Error as NatsError

from bascule.logcontext import concerning
from bascule.natsio.transport import Transport
from bascule.partition.fetchmux import FetchMux, MuxFailed
from bascule.partition.replica import PartitionReplica
from bascule.partition.replication import follower as machine
from bascule.partition.session import FetchSession
from bascule.wire import envelope, replicate
from bascule.wire.entry import walked_prefix
from bascule.wire.pb import internal_pb2
from bascule.wire.sessions import ParkedItem
from bascule.wire.subjects import Subjects

log = logging.getLogger(__name__)

# After the loop itself failed (a bug, a disk error): a pause before it starts again from the log.
RESTART_PAUSE = 1.0
# An entry sent in pieces is gathered in memory: no entry the API or NATS accepts comes near this.
MAX_FRAGMENTED_ENTRY = 256 * 1024 * 1024


@dataclass(frozen=True)
class FollowerSettings:
    fetch_timeout: float
    leader_timeout: float
    max_idle_wait: float

    @property
    def request_timeout(self) -> float:
        # One lost request (say, to a leader that has not subscribed yet) must not add up to a
        # leader timeout: several tries fit in one.
        return min(self.fetch_timeout, self.leader_timeout / 3)

    def machine_config(self) -> machine.FollowerConfig:
        # A healthy idle leader must never be reported: idle waits stay well under the timeout.
        idle = min(self.max_idle_wait, self.leader_timeout / 2)
        return machine.FollowerConfig(leader_timeout=self.leader_timeout, max_idle_wait=idle)


ReportLeader = Callable[[PartitionReplica, str, int], Coroutine[Any, Any, None]]
# Starts the loop's task under its owner (the server's task group); None when the owner is closing.
StartTask = Callable[[Coroutine[Any, Any, None], str], "asyncio.Task[Any] | None"]


def _unowned_task(work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[Any]:
    """For a loop run on its own (tests, tools): its ``stop`` is then the only owner."""
    return asyncio.create_task(work, name=name)


class FollowerLoop:
    def __init__(
        self,
        nc: Transport,
        subjects: Subjects,
        replica: PartitionReplica,
        server_id: str,
        settings: FollowerSettings,
        report_leader: ReportLeader,
        start_task: StartTask | None = None,
        session: FetchSession | None = None,
        mux: FetchMux | None = None,
    ) -> None:
        self.nc = nc
        self.subjects = subjects
        self.replica = replica
        self.server_id = server_id
        self.settings = settings
        self.report_leader = report_leader
        self.start_task = start_task or _unowned_task
        self.session = session  # to the leader's node: where this loop parks while caught up
        self.mux = mux  # to the leader's node: what carries its fetches with those of its neighbours
        self.leader = replica.leader
        self.leader_epoch = replica.leader_epoch
        self._notified = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._reports: set[asyncio.Task] = set()
        self._stopping = False

    def start(self) -> None:
        self._task = self.start_task(self._run(), f"follow {self.replica.stream}/{self.replica.partition}")

    async def stop(self) -> None:
        self._stopping = True
        task = self._task
        # A cancel can be swallowed (asyncio.wait_for in nats-py's request() drops it when the reply
        # lands in the same turn): cancel until the task is really done; the flag ends the loop too.
        while task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=0.1)
        self._task = None
        for report in list(self._reports):
            report.cancel()

    def notify(self) -> None:
        self._notified.set()

    async def _run(self) -> None:
        """Follow until stopped. A failure of the loop is logged and the loop starts again from
        what the log holds (a new machine truncates through the leader first): a follower that
        silently stopped fetching would stay in the ISR until its lag showed, and never catch up.
        Only a failed replica (``PartitionReplica.failed``) ends the loop: the node closes it."""
        concerning(self.replica.stream, self.replica.partition)
        while not self._stopping and not self.replica.closed:
            if self.replica.failed is not None:
                # Not a loop failure to retry: its log takes no more writes, and fetching on would
                # let the leader count this replica's log end as in sync.
                log.error("%s/%s: the follower stops, its replica failed: %s",
                          self.replica.stream, self.replica.partition, self.replica.failed)
                return
            try:
                await self._follow()
            except Exception:
                if self._stopping or self.replica.closed:
                    return
                if self.replica.failed is not None:
                    continue
                log.exception("%s/%s: the follower loop failed; it starts again from the log in %.1f s",
                              self.replica.stream, self.replica.partition, RESTART_PAUSE)
                await asyncio.sleep(RESTART_PAUSE)

    async def _follow(self) -> None:
        """One run of the follower machine, from what the log holds now. It ends (and ``_run``
        starts the next) when the log is found damaged: what follows the damage is fetched again."""
        replica, clock = self.replica, self.replica.clock
        if replica.cut_damage() is not None:
            await replica.sync()
        follower = machine.Follower(
            self.server_id, self.leader, self.leader_epoch, replica.log.epochs,
            replica.log.next_offset, replica.log.high_watermark, clock(),
            log_start_offset=replica.log.oldest_offset, config=self.settings.machine_config(),
        )
        actions = follower.start()
        while not self._stopping and self.replica.failed is None and not self._damaged():
            next_actions: list[machine.Action] = []
            for action in actions:
                next_actions += await self._carry_out(follower, action)
            if not next_actions:
                next_actions = await self._wait(follower, follower.next_deadline())
            actions = next_actions

    def _damaged(self) -> bool:
        damaged = self.replica.log.damaged_from
        return damaged is not None and damaged < self.replica.log.next_offset

    async def _carry_out(self, follower: machine.Follower, action: machine.Action) -> list[machine.Action]:
        replica = self.replica
        if isinstance(action, machine.SendFetch):
            return await self._fetch(follower, action)
        if isinstance(action, machine.SendEpochQuery):
            return await self._ask_epoch(follower, action.epoch)
        if isinstance(action, machine.Pause):
            await asyncio.sleep(max(0.0, action.until - replica.clock()))
        elif isinstance(action, machine.Truncate):
            if action.below_high_watermark:
                log.warning("%s/%s truncating below its HW to %d", replica.stream, replica.partition, action.end_offset)
            replica.truncate(action.end_offset)
            # On disk before new entries are written where the cut ones were.
            await replica.sync()
        elif isinstance(action, machine.SetHighWatermark):
            replica.set_high_watermark(action.hw)
        elif isinstance(action, machine.WaitForData):
            if action.caught_up and self.session is not None:
                return await self._park(follower, self.session)
            return await self._wait(follower, action.until)
        elif isinstance(action, machine.ReportLeader):
            self._report(action)
        return []

    def _report(self, action: machine.ReportLeader) -> None:
        """Report the leader without holding up the loop; the report is this loop's task."""
        task = asyncio.create_task(self.report_leader(self.replica, action.leader_id, action.leader_epoch))
        self._reports.add(task)
        task.add_done_callback(self._report_done)

    def _withdraw_reports(self) -> None:
        """The leader answers again: a report of it still on its way (waiting for a metadata leader,
        say, after a NATS outage) would now only depose a working leader."""
        for task in self._reports:
            task.cancel()

    def _report_done(self, task: asyncio.Task) -> None:
        self._reports.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s/%s: reporting the leader failed", self.replica.stream, self.replica.partition,
                      exc_info=task.exception())

    async def _wait(self, follower: machine.Follower, until: float) -> list[machine.Action]:
        try:
            async with asyncio.timeout(max(0.0, until - self.replica.clock())):
                await self._notified.wait()
        except TimeoutError:
            return follower.tick(self.replica.clock())
        self._notified.clear()
        return follower.on_notify(self.replica.clock())

    async def _park(self, follower: machine.Follower, session: FetchSession) -> list[machine.Action]:
        """Caught up: wait in the fetch session for news, a notification, or a failed round."""
        replica = self.replica
        parked = session.park(
            ParkedItem(replica.stream, replica.partition, self.leader_epoch, follower.log_end_offset, follower.hw),
            self._notified,
        )
        try:
            await self._notified.wait()
        finally:
            session.unpark(parked)
        self._notified.clear()
        if parked.contact is not None:
            follower.on_parked_contact(*parked.contact)
        # After a failed round the machine decides, on its own clock: fetch, and report the leader
        # once it has been silent for a leader timeout.
        return follower.tick(replica.clock()) if parked.failed else follower.on_notify(replica.clock())

    async def _request(self, subject: str, payload: bytes, mux: FetchMux | None = None) -> bytes | None:
        try:
            if mux is None:
                reply = (await self.nc.request(subject, payload, timeout=self.settings.request_timeout)).data
            else:
                reply = await mux.request(
                    self.replica.stream, self.replica.partition, subject, payload, self.settings.request_timeout
                )
        except (TimeoutError, NatsError, MuxFailed) as exc:
            log.debug("request to %s failed: %r", subject, exc)
            return None
        if reply == envelope.NOT_LEADER_REPLY:
            log.debug("%s: not the leader of this epoch (yet); asking again", subject)
            return None
        return reply

    async def _ask_epoch(self, follower: machine.Follower, epoch: int) -> list[machine.Action]:
        replica = self.replica
        query = envelope.encode_message(
            internal_pb2.LeaderEpochOffsetRequest(leaderEpoch=epoch, currentLeaderEpoch=self.leader_epoch),
            envelope.MsgType.LEADER_EPOCH_OFFSET_REQUEST,
        )
        data = await self._request(self.subjects.epoch_offset(replica.stream, replica.partition), query)
        if data is None:
            return follower.on_epoch_query_failed(replica.clock())
        try:
            answer = envelope.decode_message(
                data, envelope.MsgType.LEADER_EPOCH_OFFSET_RESPONSE, internal_pb2.LeaderEpochOffsetResponse
            )
        except envelope.EnvelopeError as exc:
            log.warning("malformed epoch answer for %s/%s: %s", replica.stream, replica.partition, exc)
            return follower.on_epoch_query_failed(replica.clock())
        return follower.on_epoch_answer(answer.leaderEpoch, answer.endOffset, replica.clock())

    async def _fetch(self, follower: machine.Follower, action: machine.SendFetch) -> list[machine.Action]:
        replica = self.replica
        response = await self._fetch_response(action, 0)
        if response is not None and response.fragment_of is not None:
            response = await self._whole_entry(action, response)
        if response is None:
            return follower.on_fetch_failed(replica.clock())
        walked = walked_prefix(response.entries)  # CRC-checked once here: the log is handed them walked
        length = walked[-1][4] if walked else 0
        if length != len(response.entries):
            # Keep the intact entries; the rest is fetched again from where they end.
            log.warning("%s/%s: dropping %d corrupt bytes of a replication response",
                        replica.stream, replica.partition, len(response.entries) - length)
            if not walked:
                # Nothing usable: not an answer. Taken as one (an empty, caught-up reply) it would
                # idle this follower forever below a damaged entry; as a failure, a leader that
                # keeps sending it is reported and replaced.
                return follower.on_fetch_failed(replica.clock())
        if response.leader_epoch == self.leader_epoch:
            self._withdraw_reports()
        positions = [(offset, epoch) for offset, epoch, _, _, _ in walked]
        actions = follower.on_replicate(
            response.leader_epoch, response.hw, positions, replica.clock(), response.leader_time
        )
        for step in actions:
            if isinstance(step, machine.RestartLog):
                log.warning("%s/%s: the leader's log starts at %d, past this replica's end: restarting the log there",
                            replica.stream, replica.partition, step.start_offset)
                replica.restart_log(step.start_offset)
                await replica.sync()
            elif isinstance(step, machine.Append):
                replica.append_replicated(bytes(response.entries[:length]), walked)
                if replica.sync_policy.always:
                    # The next fetch names this log end, and the leader counts it towards the HW:
                    # under "always" an ALL ack means on disk on every ISR member.
                    await asyncio.get_running_loop().run_in_executor(None, replica.log.begin_sync())
        return [a for a in actions if not isinstance(a, (machine.Append, machine.RestartLog))]

    async def _fetch_response(
        self, action: machine.SendFetch, fragment_start: int
    ) -> replicate.ReplicateResponse | None:
        """The leader's answer to a fetch (from ``fragment_start`` of the entry at the fetch
        offset), None when there is none or it is malformed."""
        replica = self.replica
        request = envelope.encode_message(
            internal_pb2.ReplicationRequest(
                replicaID=self.server_id, offset=action.offset - 1, leaderEpoch=action.leader_epoch,
                fragmentStart=fragment_start, leaderTime=action.leader_time,
            ),
            envelope.MsgType.REPLICATION_REQUEST,
        )
        data = await self._request(self.subjects.replicate(replica.stream, replica.partition), request, self.mux)
        if data is None:
            return None
        try:
            return replicate.decode_response(data)
        except envelope.EnvelopeError as exc:
            log.warning("malformed replication response for %s/%s: %s", replica.stream, replica.partition, exc)
            return None

    async def _whole_entry(
        self, action: machine.SendFetch, first: replicate.ReplicateResponse
    ) -> replicate.ReplicateResponse | None:
        """Fetch the rest of an entry too big for one NATS message, piece by piece; the whole
        entry as one response, or None if a piece does not come or does not fit."""
        entry_size = first.fragment_of
        if entry_size is None or entry_size > MAX_FRAGMENTED_ENTRY:
            return None
        pieces = bytearray()
        response: replicate.ReplicateResponse | None = first
        while response is not None:
            if (response.fragment_of, response.fragment_start, response.leader_epoch) != (
                entry_size, len(pieces), first.leader_epoch
            ):
                return None  # the entry changed under us (a new leadership): fetch again
            pieces += response.entries
            if len(pieces) == entry_size:
                return replicate.ReplicateResponse(
                    response.leader_epoch, response.hw, response.leader_time, memoryview(pieces)
                )
            response = await self._fetch_response(action, len(pieces))
        return None


