"""Both ends of forwarding API publishes to a partition led on another node (``wire.forwarding``):
a burst goes as one sealed request to the leader's forwarding subject, the leader appends it as one
burst of its own, and its reply carries the gRPC-framed responses the forwarding node passes on.

One NATS round trip and no protobuf per burst on the forwarding node; on the leader, what a burst
of direct publishes costs plus reading the batch.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from nats.errors import NoRespondersError

from bascule.metadata.raft import MetadataRaft
from bascule.natsio.transport import Transport, TransportMessage, TransportSubscription
from bascule.node.partitions import LocalPartition, Partitions
from bascule.partition.encryption import EncryptionUnavailable
from bascule.partition.replica import NotLeader, PartitionClosed
from bascule.partition.replication.concurrency import IncorrectOffset
from bascule.wire import capture
from bascule.wire.capture import BurstOutcome
from bascule.wire.dedup import MESSAGE_ID_HEADER, headers_with_id
from bascule.wire.entry import Record
from bascule.wire.forwarding import (
    ErrorKind,
    ForwardedBatch,
    ForwardingError,
    ReplyPart,
    Unforwarded,
    decode_batch,
    decode_reply,
    encode_entry,
    encode_header,
    encode_refusal,
    encode_reply,
    forward_subject,
)
from bascule.wire.pb import api_pb2

log = logging.getLogger(__name__)

# How long a forwarded burst waits for the leader's reply (its commit, under ack policy ALL) before
# its publishes fail as timed out; they may still commit, as with any ack that is lost.
FORWARD_TIMEOUT = 30.0

SubmitBurst = Callable[..., None]  # PublishPath.submit_burst


@dataclass(frozen=True)
class _Target:
    """Where a burst is forwarded: its leader's forwarding subject, and the partition it leads."""

    subject: str
    leader: str
    stream: str
    partition: int


class Forwarder:
    """Sends bursts to the leaders of partitions led elsewhere, and serves the bursts other nodes
    forward to the partitions this node leads. In flight: a task per burst, as many as the gRPC
    calls' own bounds on their unanswered requests allow."""

    def __init__(self, transport: Transport, namespace: str, server_id: str, raft: MetadataRaft,
                 partitions: Partitions) -> None:
        self.transport = transport
        self.namespace = namespace
        self.server_id = server_id
        self.raft = raft
        self.partitions = partitions
        self.submit_burst: SubmitBurst | None = None  # set by the PublishPath that owns it
        self._subscription: TransportSubscription | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # The bursts awaiting their leader's reply, by partition, with the leader each went to.
        self._unanswered: dict[tuple[str, int], dict[asyncio.Task[None], str]] = {}
        self._moved: set[asyncio.Task[None]] = set()  # of those, the ones cancelled as their leader moved
        self._watching = False

    async def start(self, submit_burst: SubmitBurst) -> None:
        """Serve forwarded bursts, appended with ``submit_burst``; the NATS server has the
        subscription when this returns."""
        self.submit_burst = submit_burst
        self._subscription = await self.transport.subscribe(forward_subject(self.namespace, self.server_id),
                                                             self._serve)
        await self.transport.flush()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._subscription is not None:
            subscription, self._subscription = self._subscription, None
            try:
                await subscription.unsubscribe()
            except Exception:  # the connection is closing too: nothing more comes anyway
                log.debug("unsubscribing the forwarding subject failed", exc_info=True)

    @property
    def max_batch_bytes(self) -> int:
        return self.transport.max_payload

    # ---- the forwarding node ------------------------------------------------------------------

    def forward(self, leader: str, stream: str, partition: int, requests: list[api_pb2.PublishRequest],
                on_acks: BurstOutcome | None, inbox: str = "") -> None:
        """Send ``requests`` (to ``stream``/``partition``, led by ``leader``) in as few batches as fit
        a NATS message; ``on_acks`` gets the framed responses of those that asked for an ack (their
        acks naming ``inbox``), or their indices and the error (``Unforwarded``: nothing was
        written). Without ``on_acks`` nothing is awaited."""
        target = _Target(forward_subject(self.namespace, leader), leader, stream, partition)
        header = functools.partial(encode_header, stream, partition, inbox=inbox)
        limit = self.max_batch_bytes - len(header(0))
        start, size, entries = 0, 0, list[bytes]()
        for index, request in enumerate(requests):
            entry = encode_entry(request.ackPolicy, request.expectedOffset, request.correlationId.encode(),
                                 request.key, request.value, dict(request.headers) if request.headers else None)
            if entries and size + len(entry) > limit:
                self._send(target, header, entries, requests, start, on_acks)
                start, size, entries = index, 0, []
            entries.append(entry)
            size += len(entry)
        if entries:
            self._send(target, header, entries, requests, start, on_acks)

    def _send(self, target: _Target, header: Callable[[int], bytes], entries: list[bytes],
              requests: list[api_pb2.PublishRequest], first: int, on_acks: BurstOutcome | None) -> None:
        payload = header(len(entries)) + b"".join(entries)
        if on_acks is None:
            self._spawn(self.transport.publish(target.subject, payload))
            return
        acked = [first + i for i in range(len(entries)) if requests[first + i].ackPolicy != capture.NONE]
        self._spawn(self._request(target, payload, len(entries), first, acked, on_acks))

    async def _request(self, target: _Target, payload: bytes, count: int, first: int, acked: list[int],
                       on_acks: BurstOutcome) -> None:
        subject, task, key = target.subject, asyncio.current_task(), (target.stream, target.partition)
        assert task is not None
        self._unanswered.setdefault(key, {})[task] = target.leader
        self._watch_leaders()
        try:
            reply = await self.transport.request(subject, payload, FORWARD_TIMEOUT)
            parts = decode_reply(reply.data, count)
        except asyncio.CancelledError:
            if task not in self._moved:
                raise
            on_acks(acked, None, NotLeader(f"{key[0]}/{key[1]}: its leader changed from {target.leader} while a "
                                           "forwarded burst was unanswered"))
            return
        except NoRespondersError:
            on_acks(acked, None, Unforwarded(f"nobody takes forwarded publishes on {subject}"))
            return
        except ForwardingError as exc:
            log.warning("a forwarded burst's reply on %s does not parse: %s", subject, exc)
            on_acks(acked, None, RuntimeError(f"the leader's reply does not parse: {exc}"))
            return
        except Exception as exc:  # timed out, or the connection is gone
            on_acks(acked, None, exc)
            return
        finally:
            self._answered(task, key)
        wanted = set(acked)
        for part in parts:
            indices = [first + index for index in part.indices if first + index in wanted]
            wanted.difference_update(indices)
            if not indices:
                continue
            if part.error is None:
                on_acks(indices, part.framed, None)
            else:
                on_acks(indices, None, _error(part.error, part.message))
        if wanted:  # never left hanging, whatever the leader answered
            on_acks(sorted(wanted), None, RuntimeError("the leader left forwarded publishes unanswered"))

    def _answered(self, task: asyncio.Task[None], key: tuple[str, int]) -> None:
        self._moved.discard(task)
        bursts = self._unanswered[key]
        del bursts[task]
        if not bursts:
            del self._unanswered[key]

    def _watch_leaders(self) -> None:
        if not self._watching:
            self._watching = True
            self._spawn(self._fail_moved_bursts())

    async def _fail_moved_bursts(self) -> None:
        """While bursts are unanswered: those whose partition the metadata gives another leader are
        told NotLeader, as by any leader that lost its leadership, and their clients retry with the
        new one. A leader that died with a burst (SIGKILL, a lost connection) never answers it, and
        its client would wait out FORWARD_TIMEOUT, past the failover. The burst may have been
        written, as any publish whose ack is lost."""
        try:
            while self._unanswered:
                moved = await self.raft.watch.until(self._moved_or_idle, None)
                for task in moved if isinstance(moved, list) else ():
                    self._moved.add(task)
                    task.cancel()
        finally:
            self._watching = False

    def _moved_or_idle(self) -> list[asyncio.Task[None]] | bool:
        """The unanswered bursts whose partition is now led elsewhere, not told yet; True when none
        is unanswered."""
        if not self._unanswered:
            return True
        state = self.raft.state
        moved = []
        for (stream, partition), bursts in self._unanswered.items():
            meta = state.partition(stream, partition)
            moved += [task for task, leader in bursts.items()
                      if (meta is None or meta.leader != leader) and task not in self._moved]
        return moved

    # ---- the leader -------------------------------------------------------------------------

    async def _serve(self, msg: TransportMessage) -> None:
        try:
            batch = decode_batch(msg.data)
        except ForwardingError as exc:
            log.warning("refusing a forwarded burst that does not parse: %s", exc)
            self._reply(msg.reply, encode_refusal(ErrorKind.MALFORMED, str(exc)))
            return
        local = self.partitions.get(batch.stream, batch.partition)
        if local is not None and local.replica.is_leader:
            self._append(local, batch, msg.reply)
            return
        meta = self.raft.state.partition(batch.stream, batch.partition)
        if meta is not None and meta.leader == self.server_id and not meta.paused:
            self._spawn(self._append_once_leading(batch, msg.reply))
            return
        self._reply(msg.reply, encode_refusal(ErrorKind.NOT_LEADER, f"not the leader of {batch.stream}/"
                                                                     f"{batch.partition}"))

    async def _append_once_leading(self, batch: ForwardedBatch, reply: str) -> None:
        """A burst that came before this node took up the leadership the metadata gave it."""
        local = await self.partitions.until_leading(batch.stream, batch.partition)
        if local is not None and local.replica.is_leader:
            self._append(local, batch, reply)
        else:
            self._reply(reply, encode_refusal(ErrorKind.NOT_LEADER, f"not the leader of {batch.stream}/"
                                                                    f"{batch.partition}"))

    def _append(self, local: LocalPartition, batch: ForwardedBatch, reply: str) -> None:
        """Append the burst as a burst of this node's own API publishes; reply once each publish
        that asked for an ack is acked or failed."""
        assert self.submit_burst is not None, "forwarder not started"
        replica = local.replica
        records = _records(local.subject, batch)
        policies = batch.policies
        parts: list[ReplyPart] = []
        unanswered = sum(policy != capture.NONE for policy in policies)

        def on_acks(indices: list[int], framed: bytes | None, error: BaseException | None) -> None:
            nonlocal unanswered
            if framed is None:
                parts.append(ReplyPart(indices, error=_kind(error), message=str(error or "not acked")))
            else:
                parts.append(ReplyPart(indices, framed))
            unanswered -= len(indices)
            if unanswered <= 0:
                self._reply(reply, encode_reply(parts))

        expected = batch.expected_offsets if replica.concurrency_control else None
        try:
            self.submit_burst(replica, local.subject, records, batch.correlation_ids, policies, on_acks, expected,
                              batch.inbox)
        except (NotLeader, PartitionClosed) as exc:  # refused before anything was written
            self._reply(reply, encode_refusal(ErrorKind.NOT_LEADER, str(exc)))
            return
        if not unanswered:
            self._reply(reply, encode_reply([]))

    def _reply(self, reply: str, payload: bytes) -> None:
        if reply:  # a burst of ack-NONE publishes waits for no answer
            self._spawn(self.transport.publish(reply, payload))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("forwarding: %s", task.exception())


def _records(subject: str, batch: ForwardedBatch) -> list[Record]:
    """The records as a direct publish of each would make them (the subject and reply headers
    Liftbridge records on every message, shared and encoded once when a publish has no others)."""
    shared, block = capture.stored_headers(subject, "")
    own = {"subject": subject.encode(), "reply": b""}
    records = []
    for value, key, headers in zip(batch.values, batch.keys, batch.headers, strict=True):
        if not headers:
            records.append(Record(value, key or None, shared, 0, block))
        elif len(headers) == 1 and (message_id := headers.get(MESSAGE_ID_HEADER)) is not None:
            with_id, with_id_block = headers_with_id(message_id, shared, block)
            records.append(Record(value, key or None, with_id, 0, with_id_block))
        else:
            records.append(Record(value, key or None, {**headers, **own}))
    return records


_KINDS: list[tuple[type[BaseException], ErrorKind]] = [
    (IncorrectOffset, ErrorKind.INCORRECT_OFFSET),
    (EncryptionUnavailable, ErrorKind.ENCRYPTION),
    ((NotLeader, PartitionClosed), ErrorKind.UNAVAILABLE),  # type: ignore[list-item]
    (TimeoutError, ErrorKind.TIMEOUT),  # before OSError: it is one
    (OSError, ErrorKind.STORE),
    (ValueError, ErrorKind.INVALID),
]


def _kind(error: BaseException | None) -> ErrorKind:
    """How the leader tells the forwarding node why publishes failed."""
    for classes, kind in _KINDS:
        if isinstance(error, classes):
            return kind
    return ErrorKind.INTERNAL


def _error(kind: ErrorKind, message: str) -> BaseException:
    """The failure the forwarding node meets, as it would have met it appending the publishes itself
    (so its client is told alike)."""
    made: dict[ErrorKind, Callable[[str], BaseException]] = {
        ErrorKind.NOT_LEADER: Unforwarded,
        ErrorKind.INCORRECT_OFFSET: IncorrectOffset,
        ErrorKind.UNAVAILABLE: NotLeader,
        ErrorKind.ENCRYPTION: EncryptionUnavailable,
        ErrorKind.STORE: OSError,
        ErrorKind.INVALID: ValueError,
        ErrorKind.TIMEOUT: TimeoutError,
    }
    if kind is ErrorKind.MALFORMED:
        return RuntimeError(f"the leader could not read the forwarded burst: {message}")
    return made.get(kind, RuntimeError)(message)

