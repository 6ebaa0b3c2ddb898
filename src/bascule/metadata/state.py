"""The metadata state machine: brokers, streams and partitions.

``MetadataState.apply`` is the only way state changes. It is deterministic and does
no I/O and reads no clock (timestamps travel inside commands), because pysyncobj
replays the whole journal through it on every restart.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from bascule.metadata.election import IsrChangeKind, validate_isr_change

# Result codes, named as the gRPC status codes the API maps them to.
NOT_FOUND = "NOT_FOUND"
ALREADY_EXISTS = "ALREADY_EXISTS"
INVALID_ARGUMENT = "INVALID_ARGUMENT"
FAILED_PRECONDITION = "FAILED_PRECONDITION"

ApplyResult = tuple[str, str] | None  # None on success, else (code, message)


@dataclass
class Broker:
    id: str
    host: str
    port: int
    raft: str
    incarnation: str = ""  # new at every start of the broker's process


@dataclass
class Partition:
    stream: str
    id: int
    replicas: list[str]
    leader: str
    isr: list[str]
    epoch: int = 0  # bumps on every change of this partition's metadata
    leader_epoch: int = 0  # bumps on every leader change
    # The incarnation of the leader's process that was given this leader epoch: a leader that
    # restarted (another incarnation) must not resume it.
    leader_incarnation: str = ""
    paused: bool = False
    readonly: bool = False
    paused_at: int = 0
    readonly_at: int = 0


@dataclass
class Stream:
    name: str
    subject: str
    group: str
    created: int
    settings: dict[str, Any]
    partitions: dict[int, Partition] = field(default_factory=dict)


class MetadataState:
    def __init__(self) -> None:
        self.brokers: dict[str, Broker] = {}
        self.streams: dict[str, Stream] = {}
        self.version = 0  # count of applied commands, so readers can tell "unchanged"

    def apply(self, command: dict[str, Any]) -> ApplyResult:
        handler: Callable[[dict[str, Any]], ApplyResult] = getattr(self, "_" + command["op"])
        result = handler(command)
        self.version += 1
        return result

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
                {**asdict(s), "partitions": [asdict(p) for p in s.partitions.values()]}
                for s in self.streams.values()
            ],
        }

    @classmethod
    def restore(cls, snapshot: dict[str, Any]) -> "MetadataState":
        state = cls()
        state.version = snapshot["version"]
        state.brokers = {b["id"]: Broker(**b) for b in snapshot["brokers"]}
        for s in snapshot["streams"]:
            partitions = {p["id"]: Partition(**p) for p in s["partitions"]}
            state.streams[s["name"]] = Stream(**{**s, "partitions": partitions})
        return state

    def _register_broker(self, c: dict[str, Any]) -> ApplyResult:
        self.brokers[c["id"]] = Broker(c["id"], c["host"], c["port"], c["raft"], c.get("incarnation", ""))
        return None

    def _create_stream(self, c: dict[str, Any]) -> ApplyResult:
        name = c["name"]
        if name in self.streams:
            return ALREADY_EXISTS, "stream already exists"
        stream = Stream(name, c["subject"], c["group"], c["created"], dict(c["settings"]))
        for index, replicas in enumerate(c["replicas"]):
            stream.partitions[index] = Partition(
                stream=name, id=index, replicas=list(replicas), leader=replicas[0], isr=list(replicas),
                leader_incarnation=self._incarnation(replicas[0]),
            )
        self.streams[name] = stream
        return None

    def _delete_stream(self, c: dict[str, Any]) -> ApplyResult:
        if self.streams.pop(c["name"], None) is None:
            return NOT_FOUND, "stream does not exist"
        return None

    def _pause(self, c: dict[str, Any]) -> ApplyResult:
        found = self._select(c["name"], c["partitions"])
        if isinstance(found, tuple):
            return found
        for p in found:
            if not p.paused:
                p.paused, p.paused_at = True, c["at"]
                p.epoch += 1
        if c["resume_all"]:
            # Liftbridge: with resumeAll, one publish to any partition resumes them all.
            stream = self.streams[c["name"]]
            stream.settings["resume_all"] = True
        return None

    def _resume(self, c: dict[str, Any]) -> ApplyResult:
        stream = self.streams.get(c["name"])
        if stream is None or c["partition"] not in stream.partitions:
            return NOT_FOUND, "no such partition"
        targets = (
            stream.partitions.values()
            if stream.settings.pop("resume_all", False)
            else [stream.partitions[c["partition"]]]
        )
        for p in targets:
            if p.paused:
                p.paused = False
                p.epoch += 1
        return None

    def _set_readonly(self, c: dict[str, Any]) -> ApplyResult:
        found = self._select(c["name"], c["partitions"])
        if isinstance(found, tuple):
            return found
        for p in found:
            if p.readonly != c["readonly"]:
                p.readonly, p.readonly_at = c["readonly"], c["at"]
                p.epoch += 1
        return None

    def _change_leader(self, c: dict[str, Any]) -> ApplyResult:
        p = self.partition(c["name"], c["partition"])
        if p is None:
            return NOT_FOUND, "no such partition"
        if c["leader_epoch"] != p.leader_epoch:
            return FAILED_PRECONDITION, f"stale leader epoch {c['leader_epoch']}, current {p.leader_epoch}"
        if c.get("epoch", p.epoch) != p.epoch:
            return FAILED_PRECONDITION, f"stale partition epoch {c['epoch']}, current {p.epoch}"
        if c["leader"] not in p.isr:
            return FAILED_PRECONDITION, f"{c['leader']} is not in the ISR"
        p.leader = c["leader"]
        p.leader_incarnation = self._incarnation(p.leader)
        p.isr = [r for r in p.replicas if r in c["isr"]]
        p.leader_epoch += 1
        p.epoch += 1
        return None

    def _change_isr(self, c: dict[str, Any]) -> ApplyResult:
        p = self.partition(c["name"], c["partition"])
        if p is None:
            return NOT_FOUND, "no such partition"
        decision = validate_isr_change(
            IsrChangeKind.EXPAND if c["add"] else IsrChangeKind.SHRINK,
            c["replica"], c["leader"], c["leader_epoch"],
            leader=p.leader, epoch=p.leader_epoch, replicas=p.replicas, isr=p.isr,
            request_partition_epoch=c.get("epoch"), partition_epoch=p.epoch,
        )
        if not decision.accepted:
            return FAILED_PRECONDITION, f"ISR change refused: {decision.reason}"
        p.isr = [r for r in p.replicas if r in decision.isr]
        p.epoch += 1
        return None

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
