"""Work for the metadata leader: run here when this node leads Raft, else forwarded over NATS.

Every node subscribes to the propagate and join subjects; only the Raft leader
answers, so a request reaches whichever node leads at that moment. Requests and
replies are Liftbridge envelopes (types 8/9 and 4/5) with msgpack bodies.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

import msgpack
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import Error as NatsError

from bascule.metadata.placement import PlacementError, place
from bascule.metadata.raft import MetadataError, MetadataRaft, NoMetadataLeader
from bascule.metadata.state import INVALID_ARGUMENT, NOT_FOUND, MetadataState
from bascule.partition.replication.election import (
    Candidate, LeaderFailureReports, ReportVerdict, choose_leader, isr_after_leader_change,
)
from bascule.partition.subjects import Subjects
from bascule.wire import envelope

log = logging.getLogger(__name__)

FORWARD_TIMEOUT = 5.0
JOIN_RETRY = 0.5
LEADER_POLL = 0.02


def _pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def _unpack(data: bytes | memoryview) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


class MetadataService:
    def __init__(
        self, raft: MetadataRaft, nc: NATS, subjects: Subjects, leader_grace: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.raft = raft
        self.nc = nc
        self.subjects = subjects
        self.clock = clock
        self._reports = LeaderFailureReports(election_grace=leader_grace)
        self._positions: dict[tuple[str, int, str], tuple[int, int]] = {}

    async def start(self) -> None:
        await self.nc.subscribe(self.subjects.propagate, cb=self._on_propagated)
        await self.nc.subscribe(self.subjects.join, cb=self._on_join)

    async def call(self, op: str, **args: Any) -> None:
        """Run ``op`` on the metadata leader; raises MetadataError or NoMetadataLeader."""
        await self._wait_for_leader()
        if self.raft.is_leader:
            return await self._execute(op, args)
        request = envelope.encode(envelope.MsgType.PROPAGATED_REQUEST, _pack({"op": op, "args": args}))
        try:
            reply = await self.nc.request(self.subjects.propagate, request, timeout=FORWARD_TIMEOUT)
            kind, payload = envelope.decode(reply.data)
            if kind != envelope.MsgType.PROPAGATED_RESPONSE:
                raise envelope.EnvelopeError(f"unexpected {kind.name}")
            error = _unpack(payload).get("error")
        except (asyncio.TimeoutError, NatsError) as exc:
            raise NoMetadataLeader(f"no metadata leader answered: {exc!r}") from exc
        except (envelope.EnvelopeError, ValueError, AttributeError) as exc:
            raise NoMetadataLeader(f"malformed reply from the metadata leader: {exc}") from exc
        if error:
            raise MetadataError(*error)

    async def _wait_for_leader(self) -> None:
        """Wait (briefly) until Raft knows a leader: a request forwarded to nobody only times out."""
        deadline = self.clock() + FORWARD_TIMEOUT
        while self.raft.leader is None and self.clock() < deadline:
            await asyncio.sleep(LEADER_POLL)

    async def _on_propagated(self, msg: Msg) -> None:
        if not self.raft.is_leader or not msg.reply:
            return
        try:
            kind, payload = envelope.decode(msg.data)
            body = _unpack(payload)
            op, args = body["op"], dict(body["args"])
            if kind != envelope.MsgType.PROPAGATED_REQUEST or not isinstance(op, str):
                raise ValueError("not a propagated request")
        except Exception as exc:  # garbage from the network must not reach the handlers
            log.warning("dropping malformed propagated request: %s", exc)
            return
        error = None
        try:
            await self._execute(op, args)
        except MetadataError as exc:
            error = [exc.code, exc.message]
        except NoMetadataLeader:
            return  # leadership moved: the caller times out and retries
        except (TypeError, ValueError) as exc:
            error = [INVALID_ARGUMENT, f"bad {op} request: {exc}"]
        await self.nc.publish(msg.reply, envelope.encode(envelope.MsgType.PROPAGATED_RESPONSE, _pack({"error": error})))

    async def _execute(self, op: str, args: dict[str, Any]) -> None:
        if op == "create_stream":
            await self._create_stream(**args)
        elif op == "report_leader":
            await self._report_leader(**args)
        else:
            await self.raft.propose(op, **args)

    async def _create_stream(
        self, name: str, subject: str, group: str, replication_factor: int, partitions: int,
        settings: dict[str, Any],
    ) -> None:
        def placement(state: MetadataState) -> list[list[str]]:
            return place(
                sorted(state.brokers), state.partitions_per_broker(), state.partitions_led_by(),
                replication_factor, partitions,
            )

        try:
            replicas = self.raft.read(placement)
        except PlacementError as exc:
            raise MetadataError(INVALID_ARGUMENT, str(exc)) from exc
        await self.raft.propose(
            "create_stream", name=name, subject=subject, group=group, created=time.time_ns(),
            settings=settings, replicas=replicas,
        )

    async def _report_leader(
        self, stream: str, partition: int, leader: str, leader_epoch: int, reporter: str,
        last_epoch: int, log_end_offset: int,
    ) -> None:
        """Liftbridge's witness rule: a quorum of ISR followers must report before the leader moves."""
        current = self.raft.read(lambda s: s.partition(stream, partition))
        if current is None:
            raise MetadataError(NOT_FOUND, "no such partition")
        key = (stream, partition)
        self._positions[(stream, partition, reporter)] = (last_epoch, log_end_offset)
        verdict = self._reports.report(
            key, leader, leader_epoch, reporter,
            leader=current.leader, epoch=current.leader_epoch, isr=current.isr, now=self.clock(),
        )
        if verdict is not ReportVerdict.LEADER_FAILED:
            return
        witnesses = [r for r in current.isr if (stream, partition, r) in self._positions and r != current.leader]
        candidates = [Candidate(r, *self._positions[(stream, partition, r)]) for r in witnesses]
        new_leader = choose_leader(candidates, current.isr, exclude={current.leader})
        if new_leader is None:
            log.warning("%s/%s: leader %s failed and no ISR replica can replace it", stream, partition, leader)
            return
        isr = sorted(isr_after_leader_change(current.isr, current.leader, new_leader))
        log.info("%s/%s: leader %s failed (epoch %d), electing %s", stream, partition, leader, leader_epoch, new_leader)
        await self.raft.propose(
            "change_leader", name=stream, partition=partition, leader=new_leader,
            leader_epoch=current.leader_epoch, isr=isr,
        )
        self._reports.elected(key, current.leader_epoch + 1, self.clock())

    async def _on_join(self, msg: Msg) -> None:
        if not self.raft.is_leader or not msg.reply:
            return
        try:
            kind, payload = envelope.decode(msg.data)
            address = _unpack(payload)["raft"]
            if kind != envelope.MsgType.RAFT_JOIN_REQUEST or not isinstance(address, str):
                raise ValueError("not a join request")
        except Exception as exc:
            log.warning("dropping malformed join request: %s", exc)
            return
        members = self.raft.members()
        if address not in members:
            log.info("adding %s to the metadata Raft group", address)
            self.raft.add_voter(address)
        reply = _pack({"members": sorted(set(members) | {address})})
        await self.nc.publish(msg.reply, envelope.encode(envelope.MsgType.RAFT_JOIN_RESPONSE, reply))


async def join_cluster(nc: NATS, subjects: Subjects, raft_address: str, stopping: asyncio.Event) -> list[str]:
    """Ask the metadata leader to add this node's Raft address; returns the group's members."""
    request = envelope.encode(envelope.MsgType.RAFT_JOIN_REQUEST, _pack({"raft": raft_address}))
    while not stopping.is_set():
        try:
            reply = await nc.request(subjects.join, request, timeout=FORWARD_TIMEOUT)
            kind, payload = envelope.decode(reply.data)
            members = _unpack(payload)["members"]
            if kind == envelope.MsgType.RAFT_JOIN_RESPONSE and isinstance(members, list):
                return [str(m) for m in members]
        except (asyncio.TimeoutError, NatsError, envelope.EnvelopeError, ValueError, KeyError, TypeError) as exc:
            log.info("waiting to join the metadata Raft group: %r", exc)
        await asyncio.sleep(JOIN_RETRY)
    raise asyncio.CancelledError
