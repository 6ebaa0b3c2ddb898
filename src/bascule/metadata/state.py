"""The metadata state machine: brokers, streams and partitions, and consumer groups.

``MetadataState.apply`` is the only way state changes. It is deterministic and does
no I/O and reads no clock (timestamps travel inside commands), because pysyncobj
replays the whole journal through it on every restart.

A state is an immutable value: ``apply`` returns a new one that shares every unchanged stream
and partition with the old. pysyncobj applies on its own thread while the event loop reads, so
a reader holds one consistent state for as long as it likes, without a lock; and a rule that
fails halfway leaves nothing behind.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from bascule.metadata import groups as group_rules
from bascule.metadata.election import IsrChangeKind, validate_isr_change
from bascule.metadata.groups import ConsumerGroup
from bascule.wire.commands import (
    ActivityPublished,
    ChangeGroupCoordinator,
    ChangeIsr,
    ChangeIsrs,
    ChangeLeader,
    ChangeLeaders,
    Command,
    CreateStream,
    DeleteStream,
    JoinConsumerGroup,
    LeaveConsumerGroup,
    MarkUnclean,
    Pause,
    RegisterBroker,
    Resume,
    SetReadonly,
)

# Result codes, named as the gRPC status codes the API maps them to.
NOT_FOUND = "NOT_FOUND"
ALREADY_EXISTS = "ALREADY_EXISTS"
INVALID_ARGUMENT = "INVALID_ARGUMENT"
FAILED_PRECONDITION = "FAILED_PRECONDITION"
# The result of a batch command some of whose items were refused (the others applied): its message is
# the JSON of {item index: [code, message]} (``refused_items`` reads it).
ITEMS_REFUSED = "ITEMS_REFUSED"

ApplyResult = tuple[str, str] | None  # None on success, else (code, message)


@dataclass(frozen=True)
class Broker:
    id: str
    host: str
    port: int
    raft: str
    incarnation: str = ""  # new at every start of the broker's process


@dataclass(frozen=True)
class Partition:
    stream: str
    id: int
    replicas: tuple[str, ...]
    leader: str
    isr: tuple[str, ...]
    epoch: int = 0  # bumps on every change of this partition's metadata
    leader_epoch: int = 0  # bumps on every leader change
    # The incarnation of the leader's process that was given this leader epoch: a leader that
    # restarted (another incarnation) must not resume it.
    leader_incarnation: str = ""
    paused: bool = False
    readonly: bool = False
    paused_at: int = 0
    readonly_at: int = 0
    # ISR members whose broker restarted after an unclean shutdown (their logs may have lost
    # acknowledged entries) and that have not caught up with a leader since: elections pass them
    # over (metadata.election.choose_leader). Always a subset of the ISR.
    unclean: tuple[str, ...] = ()


@dataclass(frozen=True)
class Stream:
    name: str
    subject: str
    group: str
    created: int
    settings: Mapping[str, Any]
    partitions: Mapping[int, Partition] = field(default_factory=dict)


Change = tuple["MetadataState", ApplyResult]

# Activity events not yet published to the activity stream are kept up to this many; older ones
# are dropped (counted) rather than let the state grow while nothing publishes them.
MAX_PENDING_ACTIVITY = 1024


@dataclass(frozen=True)
class ActivityEvent:
    """A metadata change, for Liftbridge's activity stream (``__activity``): numbered in the order
    the changes were applied, so that the metadata leader publishes each at least once, in order."""

    id: int
    op: str  # create_stream, delete_stream, pause, resume, set_readonly, join_consumer_group, leave_consumer_group
    stream: str = ""
    partitions: tuple[int, ...] = ()
    resume_all: bool = False
    readonly: bool = False
    group: str = ""
    consumer: str = ""
    streams: tuple[str, ...] = ()
    expired: bool = False


@dataclass(frozen=True)
class MetadataState:
    brokers: Mapping[str, Broker] = field(default_factory=dict)
    streams: Mapping[str, Stream] = field(default_factory=dict)
    version: int = 0  # count of applied commands, so readers can tell "unchanged"
    activity: tuple[ActivityEvent, ...] = ()  # not yet published, oldest first
    activity_ids: int = 0  # events numbered so far
    activity_dropped: int = 0  # events dropped unpublished (MAX_PENDING_ACTIVITY)
    groups: Mapping[str, ConsumerGroup] = field(default_factory=dict)

    def apply(self, command: Command) -> Change:
        """The state after ``command``, and its result; a refused command changes nothing but
        the version."""
        state, result = _RULES[command.OP](self, command)
        event = _activity_event(self.activity_ids + 1, command) if result is None else None
        if event is not None:
            state = state._with_event(event)
        return replace(state, version=self.version + 1), result

    def partition(self, stream: str, partition: int) -> Partition | None:
        found = self.streams.get(stream)
        return found.partitions.get(partition) if found else None

    def partitions_led_by(self) -> dict[str, int]:
        counts = {broker: 0 for broker in self.brokers}
        for stream in self.streams.values():
            for p in stream.partitions.values():
                counts[p.leader] = counts.get(p.leader, 0) + 1
        return counts

    def partitions_per_broker(self) -> dict[str, int]:
        counts = {broker: 0 for broker in self.brokers}
        for stream in self.streams.values():
            for p in stream.partitions.values():
                for replica in p.replicas:
                    counts[replica] = counts.get(replica, 0) + 1
        return counts

    def group_assignments(self, group_id: str) -> dict[str, group_rules.Assignment]:
        """Each member's partitions in ``group_id`` at its current epoch (none for an unknown group)."""
        group = self.groups.get(group_id)
        if group is None:
            return {}
        counts = {name: len(stream.partitions) for name, stream in self.streams.items()}
        return group_rules.assignments(group, counts)

    def snapshot(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "brokers": [asdict(b) for b in self.brokers.values()],
            "streams": [
                {**_stream_fields(s), "partitions": [_partition_fields(p) for p in s.partitions.values()]}
                for s in self.streams.values()
            ],
            "activity": [{**asdict(e), "partitions": list(e.partitions), "streams": list(e.streams)}
                         for e in self.activity],
            "activity_ids": self.activity_ids,
            "activity_dropped": self.activity_dropped,
            "groups": [
                {"id": g.id, "coordinator": g.coordinator, "epoch": g.epoch,
                 "members": [{"id": c, "streams": list(streams)} for c, streams in g.members.items()]}
                for g in self.groups.values()
            ],
        }

    @classmethod
    def restore(cls, snapshot: dict[str, Any]) -> MetadataState:
        streams = {}
        for s in snapshot["streams"]:
            partitions = {
                p["id"]: Partition(**{**p, "replicas": tuple(p["replicas"]), "isr": tuple(p["isr"]),
                                      "unclean": tuple(p.get("unclean", ()))})
                for p in s["partitions"]
            }
            streams[s["name"]] = Stream(**{**s, "partitions": partitions})
        brokers = {b["id"]: Broker(**b) for b in snapshot["brokers"]}
        activity = tuple(  # absent from snapshots taken before the activity stream
            ActivityEvent(**{**e, "partitions": tuple(e["partitions"]), "streams": tuple(e.get("streams", ()))})
            for e in snapshot.get("activity", ())
        )
        groups = {  # absent from snapshots taken before consumer groups
            g["id"]: ConsumerGroup(g["id"], g["coordinator"], g["epoch"],
                                   {m["id"]: tuple(m["streams"]) for m in g["members"]})
            for g in snapshot.get("groups", ())
        }
        return cls(brokers, streams, snapshot["version"], activity, snapshot.get("activity_ids", 0),
                   snapshot.get("activity_dropped", 0), groups)

    # ---- rules -------------------------------------------------------------------------------

    def _register_broker(self, c: RegisterBroker) -> Change:
        broker = Broker(c.id, c.host, c.port, c.raft, c.incarnation or "")
        state = replace(self, brokers={**self.brokers, broker.id: broker})
        if not c.unclean or broker.incarnation == self._incarnation(broker.id):
            return state, None
        for stream in self.streams.values():
            changed = [
                _marked_unclean(p, broker.id)
                for p in stream.partitions.values() if broker.id in p.isr and broker.id not in p.unclean
            ]
            state = state._with_partitions(stream.name, changed)
        return state, None

    def _create_stream(self, c: CreateStream) -> Change:
        name = c.name
        if name in self.streams:
            return self, (ALREADY_EXISTS, "stream already exists")
        partitions = {
            index: Partition(
                stream=name, id=index, replicas=tuple(replicas), leader=replicas[0], isr=tuple(replicas),
                leader_incarnation=self._incarnation(replicas[0]),
            )
            for index, replicas in enumerate(c.replicas)
        }
        stream = Stream(name, c.subject, c.group, c.created, dict(c.settings), partitions)
        return replace(self, streams={**self.streams, name: stream}), None

    def _delete_stream(self, c: DeleteStream) -> Change:
        if c.name not in self.streams:
            return self, (NOT_FOUND, "stream does not exist")
        state = replace(self, streams={k: s for k, s in self.streams.items() if k != c.name})
        return state._without_group_stream(c.name), None

    def _pause(self, c: Pause) -> Change:
        found = self._select(c.name, c.partitions)
        if isinstance(found, tuple):
            return self, found
        changed = [replace(p, paused=True, paused_at=c.at, epoch=p.epoch + 1) for p in found if not p.paused]
        state = self._with_partitions(c.name, changed)
        if c.resume_all:
            # Liftbridge: with resumeAll, one publish to any partition resumes them all.
            stream = state.streams[c.name]
            state = state._with_stream(replace(stream, settings={**stream.settings, "resume_all": True}))
        return state, None

    def _resume(self, c: Resume) -> Change:
        stream = self.streams.get(c.name)
        if stream is None or c.partition not in stream.partitions:
            return self, (NOT_FOUND, "no such partition")
        resume_all = stream.settings.get("resume_all", False)
        targets = stream.partitions.values() if resume_all else [stream.partitions[c.partition]]
        if resume_all:
            stream = replace(stream, settings={k: v for k, v in stream.settings.items() if k != "resume_all"})
        changed = [replace(p, paused=False, epoch=p.epoch + 1) for p in targets if p.paused]
        return self._with_stream(stream)._with_partitions(stream.name, changed), None

    def _set_readonly(self, c: SetReadonly) -> Change:
        found = self._select(c.name, c.partitions)
        if isinstance(found, tuple):
            return self, found
        changed = [
            replace(p, readonly=c.readonly, readonly_at=c.at, epoch=p.epoch + 1)
            for p in found if p.readonly != c.readonly
        ]
        return self._with_partitions(c.name, changed), None

    def _change_leader(self, c: ChangeLeader) -> Change:
        changed = self._elected(self.partition(c.name, c.partition), c)
        if not isinstance(changed, Partition):
            return self, changed
        return self._with_partitions(c.name, [changed]), None

    def _elected(self, p: Partition | None, c: ChangeLeader) -> Partition | tuple[str, str]:
        """Partition ``p`` with ``c``'s leader, or why ``c`` is refused."""
        if p is None:
            return NOT_FOUND, "no such partition"
        if c.leader_epoch != p.leader_epoch:
            return FAILED_PRECONDITION, f"stale leader epoch {c.leader_epoch}, current {p.leader_epoch}"
        if c.epoch is not None and c.epoch != p.epoch:
            return FAILED_PRECONDITION, f"stale partition epoch {c.epoch}, current {p.epoch}"
        if c.leader not in p.isr:
            return FAILED_PRECONDITION, f"{c.leader} is not in the ISR"
        # The new leader's log is the partition's from now on: it has nothing to catch up with.
        return replace(
            p, leader=c.leader, leader_incarnation=self._incarnation(c.leader),
            isr=tuple(r for r in p.replicas if r in c.isr), leader_epoch=p.leader_epoch + 1, epoch=p.epoch + 1,
            unclean=tuple(r for r in p.unclean if r in c.isr and r != c.leader),
        )

    def _change_leaders(self, c: ChangeLeaders) -> Change:
        """Each item as ``_change_leader`` applies it, in order: one whose partition is gone, or whose
        leader epoch, partition epoch or leader no longer fits, changes nothing; the others apply.
        Each stream is replaced once, however many of its partitions change."""
        changed: dict[str, dict[int, Partition]] = {}
        for change in c.changes():
            partitions = changed.get(change.name, {})
            elected = self._elected(partitions.get(change.partition) or self.partition(change.name, change.partition),
                                    change)
            if isinstance(elected, Partition):
                changed.setdefault(change.name, {})[change.partition] = elected
        state = self
        for name, partitions in changed.items():
            state = state._with_partitions(name, list(partitions.values()))
        return state, None

    def _change_isr(self, c: ChangeIsr) -> Change:
        changed = self._isr_changed(self.partition(c.name, c.partition), c)
        if not isinstance(changed, Partition):
            return self, changed
        return self._with_partitions(c.name, [changed]), None

    def _isr_changed(self, p: Partition | None, c: ChangeIsr) -> Partition | tuple[str, str]:
        """Partition ``p`` with ``c``'s ISR change, or why ``c`` is refused."""
        if p is None:
            return NOT_FOUND, "no such partition"
        decision = validate_isr_change(
            IsrChangeKind.EXPAND if c.add else IsrChangeKind.SHRINK,
            c.replica, c.leader, c.leader_epoch,
            leader=p.leader, epoch=p.leader_epoch, replicas=p.replicas, isr=p.isr,
            request_partition_epoch=c.epoch, partition_epoch=p.epoch, unclean=p.unclean,
        )
        if not decision.accepted:
            return FAILED_PRECONDITION, f"ISR change refused: {decision.reason}"
        # Either way the replica is no longer unclean: it left the ISR, or it caught up.
        return replace(
            p, isr=tuple(r for r in p.replicas if r in decision.isr), epoch=p.epoch + 1,
            unclean=tuple(r for r in p.unclean if r != c.replica),
        )

    def _change_isrs(self, c: ChangeIsrs) -> Change:
        """Each item as ``_change_isr`` applies it, in order (a second change of a partition meets the
        epoch the first made); the refused ones change nothing and are named in the result."""
        changed: dict[str, dict[int, Partition]] = {}
        refused: dict[int, tuple[str, str]] = {}
        for index, change in enumerate(c.changes()):
            partitions = changed.get(change.name, {})
            outcome = self._isr_changed(
                partitions.get(change.partition) or self.partition(change.name, change.partition), change
            )
            if isinstance(outcome, Partition):
                changed.setdefault(change.name, {})[change.partition] = outcome
            else:
                refused[index] = outcome
        state = self
        for name, partitions in changed.items():
            state = state._with_partitions(name, list(partitions.values()))
        return state, (ITEMS_REFUSED, json.dumps(refused, sort_keys=True)) if refused else None

    def _mark_unclean(self, c: MarkUnclean) -> Change:
        """A replica's own report that its log may have lost entries (its fsync failed): as an
        unclean restart does, it makes an ISR member unelectable until it has caught up."""
        p = self.partition(c.name, c.partition)
        if p is None:
            return self, (NOT_FOUND, "no such partition")
        if c.replica not in p.isr or c.replica in p.unclean:
            return self, None
        return self._with_partitions(c.name, [_marked_unclean(p, c.replica)]), None

    def _join_consumer_group(self, c: JoinConsumerGroup) -> Change:
        """Liftbridge: a join creates the group when it does not exist (with the coordinator the
        metadata leader chose); joining an existing group moves its epoch and rebalances. A new
        group's epoch is the metadata version too, not Liftbridge's 0: a group deleted and created
        again never repeats an epoch, so a reader of the old one cannot pass for a member of the new."""
        missing = [s for s in c.streams if s not in self.streams]
        if missing:
            return self, (FAILED_PRECONDITION, "stream does not exist")
        member = {c.consumer: tuple(sorted(c.streams))}
        group = self.groups.get(c.group)
        if group is None:
            return self._with_group(ConsumerGroup(c.group, c.coordinator, self._next_epoch(), member)), None
        if c.consumer in group.members:
            return self, (FAILED_PRECONDITION, group_rules.ALREADY_MEMBER)
        return self._with_group(
            replace(group, epoch=self._next_epoch(), members={**group.members, **member})
        ), None

    def _leave_consumer_group(self, c: LeaveConsumerGroup) -> Change:
        group = self.groups.get(c.group)
        if group is None:
            return self, (NOT_FOUND, group_rules.GROUP_NOT_FOUND)
        if c.consumer not in group.members:
            return self, (FAILED_PRECONDITION, group_rules.NOT_MEMBER)
        members = {k: v for k, v in group.members.items() if k != c.consumer}
        if not members:  # Liftbridge deletes a group with its last member
            return replace(self, groups={k: g for k, g in self.groups.items() if k != group.id}), None
        return self._with_group(replace(group, epoch=self._next_epoch(), members=members)), None

    def _change_group_coordinator(self, c: ChangeGroupCoordinator) -> Change:
        """Conditional on the coordinator and epoch the metadata leader decided on, so a decision
        taken on a group that changed meanwhile is refused, not applied to the new one."""
        group = self.groups.get(c.group)
        if group is None:
            return self, (NOT_FOUND, group_rules.GROUP_NOT_FOUND)
        if (group.coordinator, group.epoch) != (c.previous, c.epoch):
            return self, (FAILED_PRECONDITION,
                          f"Coordinator generation mismatch, current coordinator: {group.coordinator} "
                          f"epoch: {group.epoch}, got coordinator: {c.previous} epoch: {c.epoch}")
        return self._with_group(replace(group, coordinator=c.coordinator, epoch=self._next_epoch())), None

    def _activity_published(self, c: ActivityPublished) -> Change:
        return replace(self, activity=tuple(e for e in self.activity if e.id > c.id)), None

    # ---- helpers -----------------------------------------------------------------------------

    def _with_event(self, event: ActivityEvent) -> MetadataState:
        pending = (*self.activity, event)
        dropped = max(0, len(pending) - MAX_PENDING_ACTIVITY)
        return replace(self, activity=pending[dropped:], activity_ids=event.id,
                       activity_dropped=self.activity_dropped + dropped)

    def _next_epoch(self) -> int:
        # The version this command makes: unique and increasing, the same on every node.
        return self.version + 1

    def _with_group(self, group: ConsumerGroup) -> MetadataState:
        return replace(self, groups={**self.groups, group.id: group})

    def _without_group_stream(self, stream: str) -> MetadataState:
        """Liftbridge: a deleted stream leaves its groups' members (who stay members), and the
        groups that had it move to a new epoch."""
        changed = {
            g.id: replace(g, epoch=self._next_epoch(),
                          members={c: tuple(s for s in streams if s != stream) for c, streams in g.members.items()})
            for g in self.groups.values() if any(stream in streams for streams in g.members.values())
        }
        return replace(self, groups={**self.groups, **changed}) if changed else self

    def _incarnation(self, broker: str) -> str:
        found = self.brokers.get(broker)
        return found.incarnation if found else ""

    def _select(self, name: str, ids: list[int]) -> list[Partition] | tuple[str, str]:
        stream = self.streams.get(name)
        if stream is None:
            return NOT_FOUND, "stream does not exist"
        if not ids:
            return list(stream.partitions.values())
        missing = [i for i in ids if i not in stream.partitions]
        if missing:
            return NOT_FOUND, f"no such partition {missing[0]}"
        return [stream.partitions[i] for i in ids]

    def _with_stream(self, stream: Stream) -> MetadataState:
        return replace(self, streams={**self.streams, stream.name: stream})

    def _with_partitions(self, name: str, changed: list[Partition]) -> MetadataState:
        if not changed:
            return self
        stream = self.streams[name]
        partitions = {**stream.partitions, **{p.id: p for p in changed}}
        return self._with_stream(replace(stream, partitions=partitions))


# op -> the rule that applies it.
_RULES: dict[str, Callable[[MetadataState, Any], Change]] = {
    RegisterBroker.OP: MetadataState._register_broker,
    CreateStream.OP: MetadataState._create_stream,
    DeleteStream.OP: MetadataState._delete_stream,
    Pause.OP: MetadataState._pause,
    Resume.OP: MetadataState._resume,
    SetReadonly.OP: MetadataState._set_readonly,
    ChangeLeader.OP: MetadataState._change_leader,
    ChangeLeaders.OP: MetadataState._change_leaders,
    ChangeIsr.OP: MetadataState._change_isr,
    ChangeIsrs.OP: MetadataState._change_isrs,
    ActivityPublished.OP: MetadataState._activity_published,
    MarkUnclean.OP: MetadataState._mark_unclean,
    JoinConsumerGroup.OP: MetadataState._join_consumer_group,
    LeaveConsumerGroup.OP: MetadataState._leave_consumer_group,
    ChangeGroupCoordinator.OP: MetadataState._change_group_coordinator,
}


def _activity_event(number: int, c: Command) -> ActivityEvent | None:
    """The activity stream's event for an applied command, if it is one Liftbridge publishes."""
    match c:
        case CreateStream():
            return ActivityEvent(number, c.OP, c.name, tuple(range(len(c.replicas))))
        case DeleteStream():
            return ActivityEvent(number, c.OP, c.name)
        case Pause():
            return ActivityEvent(number, c.OP, c.name, tuple(c.partitions), resume_all=c.resume_all)
        case Resume():
            return ActivityEvent(number, c.OP, c.name, (c.partition,))
        case SetReadonly():
            return ActivityEvent(number, c.OP, c.name, tuple(c.partitions), readonly=c.readonly)
        case JoinConsumerGroup():
            return ActivityEvent(number, c.OP, group=c.group, consumer=c.consumer, streams=tuple(c.streams))
        case LeaveConsumerGroup():
            return ActivityEvent(number, c.OP, group=c.group, consumer=c.consumer, expired=c.expired)
    return None


def _marked_unclean(partition: Partition, replica: str) -> Partition:
    # A new partition epoch: ISR changes decided on the view before the mark are refused.
    unclean = tuple(r for r in partition.isr if r in partition.unclean or r == replica)
    return replace(partition, unclean=unclean, epoch=partition.epoch + 1)


def _stream_fields(stream: Stream) -> dict[str, Any]:
    return {
        "name": stream.name, "subject": stream.subject, "group": stream.group, "created": stream.created,
        "settings": dict(stream.settings),
    }


def _partition_fields(partition: Partition) -> dict[str, Any]:
    return {**asdict(partition), "replicas": list(partition.replicas), "isr": list(partition.isr),
            "unclean": list(partition.unclean)}


def refused_items(message: str) -> dict[int, tuple[str, str]]:
    """The refused items an ITEMS_REFUSED result's message names: {item index: (code, message)}."""
    found = json.loads(message)
    return {int(index): (str(code), str(reason)) for index, (code, reason) in found.items()}
