"""The metadata state machine: brokers, streams and partitions.

``MetadataState.apply`` is the only way state changes. It is deterministic and does
no I/O and reads no clock (timestamps travel inside commands), because pysyncobj
replays the whole journal through it on every restart.

A state is an immutable value: ``apply`` returns a new one that shares every unchanged stream
and partition with the old. pysyncobj applies on its own thread while the event loop reads, so
a reader holds one consistent state for as long as it likes, without a lock; and a rule that
fails halfway leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from bascule.metadata.election import IsrChangeKind, validate_isr_change

# Result codes, named as the gRPC status codes the API maps them to.
NOT_FOUND = "NOT_FOUND"
ALREADY_EXISTS = "ALREADY_EXISTS"
INVALID_ARGUMENT = "INVALID_ARGUMENT"
FAILED_PRECONDITION = "FAILED_PRECONDITION"

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
    op: str  # create_stream, delete_stream, pause, resume or set_readonly
    stream: str
    partitions: tuple[int, ...] = ()
    resume_all: bool = False
    readonly: bool = False


@dataclass(frozen=True)
class MetadataState:
    brokers: Mapping[str, Broker] = field(default_factory=dict)
    streams: Mapping[str, Stream] = field(default_factory=dict)
    version: int = 0  # count of applied commands, so readers can tell "unchanged"
    activity: tuple[ActivityEvent, ...] = ()  # not yet published, oldest first
    activity_ids: int = 0  # events numbered so far
    activity_dropped: int = 0  # events dropped unpublished (MAX_PENDING_ACTIVITY)

    def apply(self, command: dict[str, Any]) -> Change:
        """The state after ``command``, and its result; a refused command changes nothing but
        the version."""
        handler: Callable[[dict[str, Any]], Change] = getattr(self, "_" + command["op"])
        state, result = handler(command)
        if result is None and command["op"] in _ACTIVITY_OPS:
            state = state._with_activity(command)
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

    def snapshot(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "brokers": [asdict(b) for b in self.brokers.values()],
            "streams": [
                {**_stream_fields(s), "partitions": [_partition_fields(p) for p in s.partitions.values()]}
                for s in self.streams.values()
            ],
            "activity": [{**asdict(e), "partitions": list(e.partitions)} for e in self.activity],
            "activity_ids": self.activity_ids,
            "activity_dropped": self.activity_dropped,
        }

    @classmethod
    def restore(cls, snapshot: dict[str, Any]) -> MetadataState:
        streams = {}
        for s in snapshot["streams"]:
            partitions = {
                p["id"]: Partition(**{**p, "replicas": tuple(p["replicas"]), "isr": tuple(p["isr"])})
                for p in s["partitions"]
            }
            streams[s["name"]] = Stream(**{**s, "partitions": partitions})
        brokers = {b["id"]: Broker(**b) for b in snapshot["brokers"]}
        activity = tuple(  # absent from snapshots taken before the activity stream
            ActivityEvent(**{**e, "partitions": tuple(e["partitions"])}) for e in snapshot.get("activity", ())
        )
        return cls(brokers, streams, snapshot["version"], activity, snapshot.get("activity_ids", 0),
                   snapshot.get("activity_dropped", 0))

    # ---- rules -------------------------------------------------------------------------------

    def _register_broker(self, c: dict[str, Any]) -> Change:
        broker = Broker(c["id"], c["host"], c["port"], c["raft"], c.get("incarnation", ""))
        return replace(self, brokers={**self.brokers, broker.id: broker}), None

    def _create_stream(self, c: dict[str, Any]) -> Change:
        name = c["name"]
        if name in self.streams:
            return self, (ALREADY_EXISTS, "stream already exists")
        partitions = {
            index: Partition(
                stream=name, id=index, replicas=tuple(replicas), leader=replicas[0], isr=tuple(replicas),
                leader_incarnation=self._incarnation(replicas[0]),
            )
            for index, replicas in enumerate(c["replicas"])
        }
        stream = Stream(name, c["subject"], c["group"], c["created"], dict(c["settings"]), partitions)
        return replace(self, streams={**self.streams, name: stream}), None

    def _delete_stream(self, c: dict[str, Any]) -> Change:
        if c["name"] not in self.streams:
            return self, (NOT_FOUND, "stream does not exist")
        return replace(self, streams={k: s for k, s in self.streams.items() if k != c["name"]}), None

    def _pause(self, c: dict[str, Any]) -> Change:
        found = self._select(c["name"], c["partitions"])
        if isinstance(found, tuple):
            return self, found
        changed = [replace(p, paused=True, paused_at=c["at"], epoch=p.epoch + 1) for p in found if not p.paused]
        state = self._with_partitions(c["name"], changed)
        if c["resume_all"]:
            # Liftbridge: with resumeAll, one publish to any partition resumes them all.
            stream = state.streams[c["name"]]
            state = state._with_stream(replace(stream, settings={**stream.settings, "resume_all": True}))
        return state, None

    def _resume(self, c: dict[str, Any]) -> Change:
        stream = self.streams.get(c["name"])
        if stream is None or c["partition"] not in stream.partitions:
            return self, (NOT_FOUND, "no such partition")
        resume_all = stream.settings.get("resume_all", False)
        targets = stream.partitions.values() if resume_all else [stream.partitions[c["partition"]]]
        if resume_all:
            stream = replace(stream, settings={k: v for k, v in stream.settings.items() if k != "resume_all"})
        changed = [replace(p, paused=False, epoch=p.epoch + 1) for p in targets if p.paused]
        return self._with_stream(stream)._with_partitions(stream.name, changed), None

    def _set_readonly(self, c: dict[str, Any]) -> Change:
        found = self._select(c["name"], c["partitions"])
        if isinstance(found, tuple):
            return self, found
        changed = [
            replace(p, readonly=c["readonly"], readonly_at=c["at"], epoch=p.epoch + 1)
            for p in found if p.readonly != c["readonly"]
        ]
        return self._with_partitions(c["name"], changed), None

    def _change_leader(self, c: dict[str, Any]) -> Change:
        p = self.partition(c["name"], c["partition"])
        if p is None:
            return self, (NOT_FOUND, "no such partition")
        if c["leader_epoch"] != p.leader_epoch:
            return self, (FAILED_PRECONDITION, f"stale leader epoch {c['leader_epoch']}, current {p.leader_epoch}")
        if c.get("epoch", p.epoch) != p.epoch:
            return self, (FAILED_PRECONDITION, f"stale partition epoch {c['epoch']}, current {p.epoch}")
        if c["leader"] not in p.isr:
            return self, (FAILED_PRECONDITION, f"{c['leader']} is not in the ISR")
        changed = replace(
            p, leader=c["leader"], leader_incarnation=self._incarnation(c["leader"]),
            isr=tuple(r for r in p.replicas if r in c["isr"]), leader_epoch=p.leader_epoch + 1, epoch=p.epoch + 1,
        )
        return self._with_partitions(c["name"], [changed]), None

    def _change_isr(self, c: dict[str, Any]) -> Change:
        p = self.partition(c["name"], c["partition"])
        if p is None:
            return self, (NOT_FOUND, "no such partition")
        decision = validate_isr_change(
            IsrChangeKind.EXPAND if c["add"] else IsrChangeKind.SHRINK,
            c["replica"], c["leader"], c["leader_epoch"],
            leader=p.leader, epoch=p.leader_epoch, replicas=p.replicas, isr=p.isr,
            request_partition_epoch=c.get("epoch"), partition_epoch=p.epoch,
        )
        if not decision.accepted:
            return self, (FAILED_PRECONDITION, f"ISR change refused: {decision.reason}")
        changed = replace(p, isr=tuple(r for r in p.replicas if r in decision.isr), epoch=p.epoch + 1)
        return self._with_partitions(c["name"], [changed]), None

    def _activity_published(self, c: dict[str, Any]) -> Change:
        return replace(self, activity=tuple(e for e in self.activity if e.id > c["id"])), None

    # ---- helpers -----------------------------------------------------------------------------

    def _with_activity(self, c: dict[str, Any]) -> MetadataState:
        op = c["op"]
        if op == "create_stream":
            partitions: tuple[int, ...] = tuple(range(len(c["replicas"])))
        elif op == "resume":
            partitions = (c["partition"],)
        else:
            partitions = tuple(c.get("partitions", ()))
        event = ActivityEvent(
            self.activity_ids + 1, op, c["name"], partitions, c.get("resume_all", False), c.get("readonly", False)
        )
        pending = (*self.activity, event)
        dropped = max(0, len(pending) - MAX_PENDING_ACTIVITY)
        return replace(self, activity=pending[dropped:], activity_ids=event.id,
                       activity_dropped=self.activity_dropped + dropped)

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


_ACTIVITY_OPS = frozenset({"create_stream", "delete_stream", "pause", "resume", "set_readonly"})


def _stream_fields(stream: Stream) -> dict[str, Any]:
    return {
        "name": stream.name, "subject": stream.subject, "group": stream.group, "created": stream.created,
        "settings": dict(stream.settings),
    }


def _partition_fields(partition: Partition) -> dict[str, Any]:
    return {**asdict(partition), "replicas": list(partition.replicas), "isr": list(partition.isr)}
