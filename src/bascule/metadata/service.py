"""Work for the metadata leader: run here when this node leads Raft, else forwarded over NATS.

Every node subscribes to the propagate and join subjects; only the Raft leader
answers, so a request reaches whichever node leads at that moment. Requests and
replies are Liftbridge envelopes (types 8/9 and 4/5) with msgpack bodies.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Coroutine, Mapping
from typing import Any, TypeVar, cast

import msgpack
from nats.errors import Error as NatsError

from bascule.metadata.election import Elect, Elections, PartitionView, Position
from bascule.metadata.groups import CoordinatorReports, choose_coordinator
from bascule.metadata.levels import BATCHES, cluster_level
from bascule.metadata.placement import PlacementError, place
from bascule.metadata.raft import MAX_COMMAND_BYTES, MetadataError, NoMetadataLeader
from bascule.metadata.replicated import ReplicatedMetadata
from bascule.metadata.state import (
    FAILED_PRECONDITION,
    INVALID_ARGUMENT,
    ITEMS_REFUSED,
    NOT_FOUND,
    Partition,
    refused_items,
)
from bascule.natsio.sealed import SealedNats
from bascule.natsio.transport import Transport, TransportMessage
from bascule.wire import envelope
from bascule.wire.commands import (
    MAX_BATCH_ITEMS,
    ChangeGroupCoordinator,
    ChangeIsr,
    ChangeIsrs,
    ChangeLeader,
    ChangeLeaders,
    CommandError,
    CreateStream,
    JoinConsumerGroup,
    command_from_map,
    validate_request,
)
from bascule.wire.settings import StreamDefaults, min_isr_error
from bascule.wire.subjects import Subjects

log = logging.getLogger(__name__)
T = TypeVar("T")

FORWARD_TIMEOUT = 5.0
# How long a join request waits for its answer before it is sent again: past JOIN_SETTLE, and short, since
# a request that came while the group had no leader (an election, or a leader admitting another node) is
# never answered. Asking again is harmless: a member is answered at once.
JOIN_ATTEMPT_TIMEOUT = 2.0
# How long a node waits to apply what the metadata leader had applied when it answered (a
# follower learns of commits at the leader's next append, every APPEND_ENTRIES_PERIOD).
CATCH_UP_WAIT = 2.0
CATCH_UP = "catch_up"  # a request that changes nothing: the leader's answer says how far it is
JOIN_RETRY = 0.5
# How long a join request waits for its membership change to commit before the answer goes out
# anyway (growing from one node, the commit needs the joiner, which starts Raft after the answer).
JOIN_SETTLE = 1.0


def _pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def _unpack(data: bytes | memoryview) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


PartitionKey = tuple[str, int]  # (stream, partition)
# Positions of partitions' replicas on the given brokers, as many as answer, gathered with one request
# to each broker for all of them: {(stream, partition): brokers} -> {(stream, partition): {broker: position}}.
GatherPositions = Callable[[Mapping[PartitionKey, Collection[str]]], Awaitable[dict[PartitionKey, dict[str, Position]]]]
# What an item of a batched request (``change_isrs``) answers: None when done, else a MetadataError's
# [code, message], the message cut to this many characters (a batch's answer stays far below a NATS message).
MAX_ITEM_MESSAGE = 200
# What a ChangeLeaders command's items may add up to (encoded): half of what a metadata command may be.
COMMAND_BUDGET = MAX_COMMAND_BYTES // 2


class MetadataService:
    def __init__(
        self, raft: ReplicatedMetadata, nc: Transport, subjects: Subjects, leader_timeout: float,
        gather_positions: GatherPositions, live_brokers: Callable[[], Collection[str]],
        coordinator_timeout: float, stream_defaults: StreamDefaults, clock: Callable[[], float] = time.monotonic,
    ):
        self.raft = raft
        self.stream_defaults = stream_defaults
        self.nc = nc
        self.subjects = subjects
        self.clock = clock
        self._gather_positions = gather_positions
        self._live_brokers = live_brokers
        self._elections = Elections(
            election_grace=leader_timeout, return_patience=leader_timeout, leave_memory=leader_timeout
        )
        self._coordinator_reports = CoordinatorReports(coordinator_timeout)
        # Partitions whose successor is being chosen: a report reaching the quorum again meanwhile
        # (a reporter's next batch) adds nothing but a stale election.
        self._electing: set[PartitionKey] = set()
        # Told of each node this leader admits to the Raft group (the node's NATS heartbeats count it as heard).
        self.on_join: Callable[[str], None] = lambda address: None

    async def start(self) -> None:
        await self.nc.subscribe(self.subjects.propagate, cb=self._on_propagated)
        await self.nc.subscribe(self.subjects.join, cb=self._on_join)

    async def call(self, op: str, **args: Any) -> Any:
        """Run ``op`` on the metadata leader; raises MetadataError or NoMetadataLeader. Once it
        returns, this node's metadata is at least what the leader's was when it answered (bounded
        by CATCH_UP_WAIT): what a caller changed is what it reads next, here. Returns what the op
        answers (a batched request's outcome per item; None for the others)."""
        await self._wait_for_leader()
        if self.raft.is_leader:
            return await self._execute(op, args)
        request = envelope.encode(envelope.MsgType.PROPAGATED_REQUEST, _pack({"op": op, "args": args}))
        try:
            reply = await self._forward(request)
            kind, payload = envelope.decode(reply.data)
            if kind != envelope.MsgType.PROPAGATED_RESPONSE:
                raise envelope.EnvelopeError(f"unexpected {kind.name}")
            answer = _unpack(payload)
            error, version, result = answer.get("error"), answer.get("version", 0), answer.get("result")
            if not isinstance(version, int):
                raise ValueError(f"a version of {type(version).__name__}")
        except (TimeoutError, NatsError) as exc:
            raise NoMetadataLeader(f"no metadata leader answered: {exc!r}") from exc
        except (envelope.EnvelopeError, ValueError, AttributeError) as exc:
            raise NoMetadataLeader(f"malformed reply from the metadata leader: {exc}") from exc
        if error:
            raise MetadataError(*error)
        await self.raft.watch.until(lambda: self.raft.state.version >= version, CATCH_UP_WAIT)
        return result

    async def catch_up(self) -> None:
        """Until this node's metadata is at least what the metadata leader's is now: before a
        refusal that a change this node has not yet applied may have lifted (a stream created, or
        made writable again, through another node)."""
        await self.call(CATCH_UP)

    async def _forward(self, request: bytes) -> TransportMessage:
        """The metadata leader's reply; NoMetadataLeader as soon as Raft's leader changes: a leader that gave
        up its leadership (cut off from NATS, say) never answers, and its successor never saw the request."""
        leader = self.raft.leader
        asking = asyncio.ensure_future(self.nc.request(self.subjects.propagate, request, timeout=FORWARD_TIMEOUT))
        moved = asyncio.ensure_future(self.raft.watch.until(lambda: self.raft.leader != leader, None))
        try:
            await asyncio.wait({asking, moved}, return_when=asyncio.FIRST_COMPLETED)
            if not asking.done():
                raise NoMetadataLeader(f"the metadata leader changed from {leader} while it was asked")
            return asking.result()
        finally:
            asking.cancel()
            moved.cancel()

    async def _wait_for_leader(self) -> None:
        """Wait (briefly) until Raft knows a leader: a request forwarded to nobody only times out."""
        await self.raft.watch.until(lambda: self.raft.leader is not None, FORWARD_TIMEOUT)

    async def _on_propagated(self, msg: TransportMessage) -> None:
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
        error = result = None
        try:
            result = await self._execute(op, args)
        except MetadataError as exc:
            error = [exc.code, exc.message]
        except NoMetadataLeader:
            return  # leadership moved: the caller times out and retries
        except (TypeError, ValueError) as exc:
            error = [INVALID_ARGUMENT, f"bad {op} request: {exc}"]
        except Exception as exc:  # one request fails alone; the subscription keeps serving
            log.exception("propagated %s request failed", op)
            error = ["INTERNAL", f"{op} failed: {exc}"]
        answer = {"error": error, "version": self.raft.state.version}
        if result is not None:
            answer["result"] = result
        await self.nc.publish(msg.reply, envelope.encode(envelope.MsgType.PROPAGATED_RESPONSE, _pack(answer)))

    async def _execute(self, op: str, args: dict[str, Any]) -> Any:
        """Run a request here, the metadata leader; whoever sent it, every argument is checked
        before anything is read or proposed."""
        if op == CATCH_UP:
            return None
        try:
            validate_request(op, args)
        except CommandError as exc:
            raise MetadataError(INVALID_ARGUMENT, str(exc)) from exc
        if op == "create_stream":
            await self._create_stream(**args)
        elif op == "report_leader":
            await self._report_leader(**args)
        elif op == "report_leaders":
            await self._report_leaders(args["items"])
        elif op == "leader_returned":
            await self._leader_returned(**args)
        elif op == "leaders_returned":
            await self._leaders_returned(args["items"])
        elif op == "change_isrs":
            return await self._change_isrs(args["items"])
        elif op == "join_consumer_group":
            await self._join_consumer_group(**args)
        elif op == "report_group_coordinator":
            await self._report_group_coordinator(**args)
        else:
            if op == "change_isr" and not args["add"]:
                # Before the outcome: a removal that times out here may still commit.
                self._elections.reports.left_isr(
                    (args["name"], args["partition"]), args["replica"], args["leader_epoch"], self.clock()
                )
            await self.raft.propose(command_from_map({**args, "op": op}))
        return None

    async def _create_stream(
        self, name: str, subject: str, group: str, replication_factor: int, partitions: int,
        settings: dict[str, Any],
    ) -> None:
        problem = min_isr_error(name, settings, replication_factor, self.stream_defaults)
        if problem:
            raise MetadataError(INVALID_ARGUMENT, problem)
        state = self.raft.state
        try:
            replicas = place(
                sorted(state.brokers), state.partitions_per_broker(), state.partitions_led_by(),
                replication_factor, partitions,
            )
        except PlacementError as exc:
            raise MetadataError(INVALID_ARGUMENT, str(exc)) from exc
        await self.raft.propose(CreateStream(
            name=name, subject=subject, group=group, created=time.time_ns(), settings=settings, replicas=replicas,
        ))

    async def _report_leader(self, stream: str, partition: int, leader: str, leader_epoch: int, reporter: str) -> None:
        """Liftbridge's witness rule: a quorum of ISR followers must report before the leader moves;
        the successor is chosen on positions gathered then, from the registered incarnations."""
        view = self._view(stream, partition)
        self._elections.reports.metadata_term(self.raft.term, self.clock())
        if self._elections.leader_reported((stream, partition), view, leader, leader_epoch, reporter, self.clock()):
            await self._elect_successors({(stream, partition): (leader, leader_epoch, reporter)})

    async def _report_leaders(self, items: list[dict[str, Any]]) -> None:
        """A node's reports of several partitions (``report_leader``'s items), each counted by the
        witness rule; the partitions whose leaders now count as failed are elected together: their
        positions gathered with one request per broker, their elections one command."""
        self._elections.reports.metadata_term(self.raft.term, self.clock())
        failed = {}
        for item in items:
            key = (item["stream"], item["partition"])
            view = _partition_view(self.raft.state.partition(*key))
            if view is None:
                self._elections.forget(key)
            elif self._elections.leader_reported(
                key, view, item["leader"], item["leader_epoch"], item["reporter"], self.clock()
            ):
                failed[key] = (item["leader"], item["leader_epoch"], item["reporter"])
        await self._elect_successors(failed)

    async def _elect_successors(self, failed: Mapping[PartitionKey, tuple[str, int, str]]) -> None:
        """Elect a successor of each failed (leader, leader epoch, last reporter), on positions
        gathered now, in one command."""
        failed = {key: report for key, report in failed.items() if key not in self._electing}
        if not failed:
            return
        self._electing.update(failed)
        try:
            await self._elect_failed(failed)
        finally:
            self._electing.difference_update(failed)

    async def _elect_failed(self, failed: Mapping[PartitionKey, tuple[str, int, str]]) -> None:
        wanted = {}
        for key, (leader, _, _) in failed.items():
            view = _partition_view(self.raft.state.partition(*key))
            if view is not None:
                wanted[key] = view.isr - {leader}
        gathered = await self._gather_positions(wanted)
        decisions = {}
        # Each election's ties go to the broker leading fewest, counting those this batch gives it.
        leaderships = self.raft.state.partitions_led_by()
        for key, (leader, leader_epoch, reporter) in failed.items():
            view = _partition_view(self.raft.state.partition(*key))
            if view is None:
                self._elections.forget(key)
                continue
            decision = self._elections.successor(view, leader, leader_epoch, gathered.get(key, {}), leaderships)
            if decision is not None:
                leaderships[decision.leader] = leaderships.get(decision.leader, 0) + 1
            if decision is None:
                if view.unclean:
                    log.info("%s/%s: leader %s reported by %s; not electing the unclean %s while no clean ISR "
                             "member answers", *key, leader, reporter, sorted(view.unclean))
                continue
            log.info("%s/%s: leader %s failed (epoch %d), electing %s", *key, leader, leader_epoch, decision.leader)
            decisions[key] = decision
        await self._propose_elections(decisions)

    async def _leader_returned(
        self, stream: str, partition: int, leader: str, leader_epoch: int, last_epoch: int, log_end_offset: int,
    ) -> None:
        """A leader restarted: it never resumes its old epoch (see ``Elections``)."""
        view = self._view(stream, partition)
        if view.leader != leader or view.leader_epoch != leader_epoch:
            return
        item = {"stream": stream, "partition": partition, "leader": leader, "leader_epoch": leader_epoch,
                "last_epoch": last_epoch, "log_end_offset": log_end_offset}
        if not await self._elect_returned([item]):
            unclean = f" (unclean: {sorted(view.unclean)})" if view.unclean else ""
            raise NoMetadataLeader(f"{stream}/{partition}: waiting for the positions of the ISR{unclean}")

    async def _leaders_returned(self, items: list[dict[str, Any]]) -> None:
        """A node's ``leader_returned`` items, elected together (one gathering, one command); those
        that must wait are asked again by the node."""
        await self._elect_returned(items)

    async def _elect_returned(self, items: list[dict[str, Any]]) -> set[PartitionKey]:
        """Elect the partitions of returned leaders that may be elected now; those elected."""
        returning = {}
        for item in items:
            key = (item["stream"], item["partition"])
            view = _partition_view(self.raft.state.partition(*key))
            if view is not None and (view.leader, view.leader_epoch) == (item["leader"], item["leader_epoch"]):
                returning[key] = (item, view.isr - {item["leader"]})
        if not returning:
            return set()
        gathered = await self._gather_positions({key: brokers for key, (_, brokers) in returning.items()})
        decisions = {}
        leaderships = self.raft.state.partitions_led_by()  # as for _elect_failed
        for key, (item, _) in returning.items():
            view = _partition_view(self.raft.state.partition(*key))
            if view is None:
                continue
            positions = {**gathered.get(key, {}), item["leader"]: Position(item["last_epoch"], item["log_end_offset"])}
            decision = self._elections.leader_returned(
                key, view, item["leader"], item["leader_epoch"], positions, self.clock(), leaderships,
            )
            if decision is not None:
                leaderships[decision.leader] = leaderships.get(decision.leader, 0) + 1
                log.info("%s/%s: leader %s returned (epoch %d), electing %s", *key, item["leader"],
                         item["leader_epoch"], decision.leader)
                decisions[key] = decision
        await self._propose_elections(decisions)
        return set(decisions)

    async def _change_isrs(self, items: list[dict[str, Any]]) -> list[list[str] | None]:
        """A leader's ISR changes of several partitions in one ChangeIsrs command, or each in its own
        ChangeIsr: one alone, or while a voter does not know ChangeIsrs (``metadata.levels``). The outcome
        of each, in order: None when applied, else [code, message]. NoMetadataLeader when an outcome is
        unknown (every item's then is)."""
        now = self.clock()
        for item in items:
            if not item["add"]:  # before the outcome, as for a change_isr
                self._elections.reports.left_isr((item["name"], item["partition"]), item["replica"],
                                                 item["leader_epoch"], now)
        if len(items) == 1 or not self._batches_known():
            if len(items) > 1:
                log.info("proposing %d ISR changes one by one: a metadata voter does not know ChangeIsrs", len(items))
            return await _settled([self._propose_isr_change(item) for item in items])
        answers: list[list[str] | None] = [None] * len(items)
        try:
            await self.raft.propose(ChangeIsrs(items=items))
        except MetadataError as exc:
            if exc.code != ITEMS_REFUSED:
                raise
            try:
                refused = refused_items(exc.message)
            except (ValueError, TypeError) as problem:  # never: the state's own words
                raise NoMetadataLeader(f"unreadable ISR change outcomes: {problem}") from exc
            for index, (code, message) in refused.items():
                answers[index] = [code, message[:MAX_ITEM_MESSAGE]]
        return answers

    async def _propose_isr_change(self, item: dict[str, Any]) -> list[str] | None:
        """One ISR change as its own ChangeIsr: None when applied, else [code, message]."""
        try:
            await self.raft.propose(ChangeIsr(**item))
        except MetadataError as exc:
            return [exc.code, exc.message[:MAX_ITEM_MESSAGE]]
        return None

    async def _join_consumer_group(self, group: str, consumer: str, streams: list[str]) -> None:
        """Liftbridge: the group's coordinator is chosen when a join creates it, here, so that
        applying the join needs no view of which brokers are up."""
        state = self.raft.state
        existing = state.groups.get(group)
        coordinator = existing.coordinator if existing else choose_coordinator(
            state.groups.values(), set(self._live_brokers()) & set(state.brokers)
        )
        if coordinator is None:
            raise MetadataError(FAILED_PRECONDITION, "No group coordinator candidates")
        await self.raft.propose(JoinConsumerGroup(
            group=group, consumer=consumer, streams=sorted(set(streams)), coordinator=coordinator,
        ))

    async def _report_group_coordinator(self, group: str, consumer: str, coordinator: str, epoch: int) -> None:
        """Liftbridge's coordinator failover: once more than half of the members reported the current
        coordinator (within the coordinator timeout of each other), another live broker takes it."""
        found = self.raft.state.groups.get(group)
        if found is None:
            raise MetadataError(FAILED_PRECONDITION, f"No such consumer group {group}")
        if (found.coordinator, found.epoch) != (coordinator, epoch):
            raise MetadataError(
                FAILED_PRECONDITION,
                f"Coordinator generation mismatch, current coordinator: {found.coordinator} epoch: {found.epoch}, "
                f"got coordinator: {coordinator} epoch: {epoch}",
            )
        if consumer not in found.members:
            raise MetadataError(FAILED_PRECONDITION, f"Consumer {consumer} is not a member of consumer group {group}")
        if not self._coordinator_reports.report(found, consumer, self.clock()):
            return
        state = self.raft.state
        candidates = (set(self._live_brokers()) & set(state.brokers)) - {found.coordinator}
        successor = choose_coordinator(state.groups.values(), candidates)
        if successor is None:
            raise MetadataError(FAILED_PRECONDITION, "No group coordinator candidates")
        log.info("consumer group %s: coordinator %s reported failed (epoch %d), moving to %s",
                 group, coordinator, epoch, successor)
        await self.raft.propose(ChangeGroupCoordinator(
            group=group, coordinator=successor, previous=coordinator, epoch=epoch,
        ))

    def _view(self, stream: str, partition: int) -> PartitionView:
        view = _partition_view(self.raft.state.partition(stream, partition))
        if view is None:
            self._elections.forget((stream, partition))
            raise MetadataError(NOT_FOUND, "no such partition")
        return view

    async def _propose_elections(self, decisions: Mapping[PartitionKey, Elect]) -> None:
        """The elections in ChangeLeaders commands (of at most MAX_BATCH_ITEMS and COMMAND_BUDGET), or each
        in its own ChangeLeader: one alone, or while a voter does not know ChangeLeaders (``metadata.levels``).
        Each elected partition starts its grace period; an item the metadata refused when it applied
        (stale: the partition moved meanwhile) changed nothing. Raises when an outcome is unknown."""
        if len(decisions) == 1 or not self._batches_known():
            if len(decisions) > 1:
                log.info("proposing %d elections one by one: a metadata voter does not know ChangeLeaders",
                         len(decisions))
            await _settled([self._propose_election(key, decision) for key, decision in decisions.items()])
            return
        keys = list(decisions)
        items = {
            key: {"name": key[0], "partition": key[1], "leader": decision.leader,
                  "leader_epoch": decision.leader_epoch, "epoch": decision.epoch, "isr": list(decision.isr)}
            for key, decision in decisions.items()
        }
        for chunk in _chunks(keys, [len(_pack(items[key])) for key in keys]):
            log.info("proposing %d elections in one command", len(chunk))
            await self.raft.propose(ChangeLeaders(items=[items[key] for key in chunk]))
            state, now = self.raft.state, self.clock()
            for key in chunk:
                found = state.partition(*key)
                decision = decisions[key]
                if found is not None and (found.leader, found.leader_epoch) == (decision.leader,
                                                                                decision.leader_epoch + 1):
                    self._elections.elected(key, decision.leader_epoch + 1, now)

    async def _propose_election(self, key: PartitionKey, decision: Elect) -> None:
        try:
            await self.raft.propose(ChangeLeader(
                name=key[0], partition=key[1], leader=decision.leader, leader_epoch=decision.leader_epoch,
                epoch=decision.epoch, isr=list(decision.isr),
            ))
        except MetadataError as exc:
            log.info("%s/%s: the election of %s was refused: %s", *key, decision.leader, exc.message)
            return
        self._elections.elected(key, decision.leader_epoch + 1, self.clock())

    def _batches_known(self) -> bool:
        """Whether every metadata voter knows ChangeLeaders and ChangeIsrs: they are journaled only then."""
        return cluster_level(self.raft.members(), self.raft.state.brokers.values()) >= BATCHES

    async def _on_join(self, msg: TransportMessage) -> None:
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
            self.on_join(address)
            # Growing from one node, the change commits only once the joiner runs Raft, after this answer.
            settle = 0.0 if len(members) == 1 else JOIN_SETTLE
            if await self.raft.add_voter(address, settle) is False:
                # Raft takes one membership change at a time: the joiner asks again.
                reply = _pack({"members": None, "error": "another membership change is under way"})
                await self.nc.publish(msg.reply, envelope.encode(envelope.MsgType.RAFT_JOIN_RESPONSE, reply))
                return
            members = self.raft.members()
        reply = _pack({"members": sorted(set(members) | {address})})
        await self.nc.publish(msg.reply, envelope.encode(envelope.MsgType.RAFT_JOIN_RESPONSE, reply))


async def _settled(proposals: list[Coroutine[Any, Any, T]]) -> list[T]:
    """The outcomes of ``proposals``, proposed together and in order (Raft keeps the order in which they
    are proposed, so that a partition's second change meets the epoch its first made, as in one
    command): raises the first failure once every one has settled, since another may have committed."""
    outcomes = await asyncio.gather(*proposals, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return cast(list[T], outcomes)


def _chunks(keys: list[PartitionKey], sizes: list[int]) -> list[list[PartitionKey]]:
    """``keys`` in runs of at most MAX_BATCH_ITEMS whose items' encoded ``sizes`` add up to at most
    COMMAND_BUDGET (a run of one may be bigger: the proposal then refuses it)."""
    chunks: list[list[PartitionKey]] = [[]]
    size = 0
    for key, item_size in zip(keys, sizes):
        if chunks[-1] and (len(chunks[-1]) >= MAX_BATCH_ITEMS or size + item_size > COMMAND_BUDGET):
            chunks.append([])
            size = 0
        chunks[-1].append(key)
        size += item_size
    return [chunk for chunk in chunks if chunk]


def _partition_view(partition: Partition | None) -> PartitionView | None:
    if partition is None:
        return None
    return PartitionView(
        partition.leader, partition.leader_epoch, partition.epoch, frozenset(partition.isr),
        frozenset(partition.replicas), frozenset(partition.unclean),
    )


async def join_cluster(nc: SealedNats, subjects: Subjects, raft_address: str) -> list[str]:
    """Ask the metadata leader to add this node's Raft address, until it does (or the caller is
    cancelled); returns the group's members."""
    request = envelope.encode(envelope.MsgType.RAFT_JOIN_REQUEST, _pack({"raft": raft_address}))
    while True:
        try:
            reply = await nc.request(subjects.join, request, timeout=JOIN_ATTEMPT_TIMEOUT)
            kind, payload = envelope.decode(reply.data)
            answer = _unpack(payload)
            members = answer["members"]
            if kind == envelope.MsgType.RAFT_JOIN_RESPONSE and isinstance(members, list):
                return [str(m) for m in members]
            log.info("not joined the metadata Raft group yet: %s", answer.get("error", "malformed answer"))
        except (TimeoutError, NatsError, envelope.EnvelopeError, ValueError, KeyError, TypeError) as exc:
            log.info("waiting to join the metadata Raft group (do the nodes share clustering.raft.password?): %r", exc)
        await asyncio.sleep(JOIN_RETRY)
