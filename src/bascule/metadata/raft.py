"""The pysyncobj shell around the metadata state machine.

pysyncobj runs its own tick thread; commands are applied there. Results travel to
the asyncio loop with ``call_soon_threadsafe``; readers on the loop take the current
state, an immutable value that the tick thread replaces and never changes.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack
import pysyncobj.syncobj
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, SyncObjConsumer, replicated
from pysyncobj.encryptor import SALT as PYSYNCOBJ_SALT
from pysyncobj.monotonic import monotonic
from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.transport import TransportNotReadyError

from bascule import durable
from bascule.metadata import raft_port, raft_standing
from bascule.metadata.journal import install_durable_storage
from bascule.metadata.raft_fixes import SafeSyncObj
from bascule.metadata.replicated import apply_command
from bascule.metadata.state import MetadataState
from bascule.metadata.watch import MetadataWatch
from bascule.wire.commands import Command, encode_command

if TYPE_CHECKING:
    from cryptography.fernet import Fernet

log = logging.getLogger(__name__)
# How often the Raft leader sends entries or a heartbeat: a follower learns of a commit with the next.
APPEND_ENTRIES_PERIOD = 0.15
# A command that pysyncobj neither commits nor fails within this long (a leader that lost its
# quorum keeps it queued) is reported as not committed: its outcome is then unknown.
PROPOSE_TIMEOUT = 10.0
# pysyncobj sends an entry bigger than its AppendEntries batch in pieces, and tags as the last the
# piece that reaches the *command's* length, not the pickled entry's (a few bytes longer): an entry
# whose size falls in that gap arrived cut, and every tick of every follower failed on it from then
# on (a CreateStream of 4,096 partitions did so). No entry is ever split here: batches hold any
# command bascule proposes (at most MAX_COMMAND_BYTES), well within raft_port's message limit.
MAX_COMMAND_BYTES = 4 << 20
APPEND_BATCH_BYTES = 2 * MAX_COMMAND_BYTES


class NoMetadataLeader(Exception):
    """No Raft leader is known, or leadership moved while a command was in flight."""


class MetadataError(Exception):
    """The state machine refused a command; ``code`` is a gRPC status name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class MetadataStore(SyncObjConsumer):
    """The replicated consumer: decodes journaled commands into the state machine."""

    def __init__(self, on_applied: Callable[[], None]) -> None:
        super().__init__()
        self.state = MetadataState()
        self.on_applied = on_applied

    @replicated
    def apply(self, command: bytes) -> tuple[str, str] | None:
        return self.apply_journaled(command)

    def apply_journaled(self, command: bytes) -> tuple[str, str] | None:
        """Apply one journaled command; never raises (see ``apply_command``), on every node alike."""
        self.state, result = apply_command(self.state, command)
        self.on_applied()
        return result

    def rebuild(self, dump: bytes | None, commands: Sequence[bytes]) -> None:
        """The state replayed from the journal, replacing the current one at once: readers never see a
        state half-way through the replay."""
        state = MetadataState() if dump is None else _restored(dump)
        for command in commands:
            state, _ = apply_command(state, command)
        self.state = state
        self.on_applied()

    def _serialize(self) -> bytes:
        return msgpack.packb(self.state.snapshot(), use_bin_type=True)

    def _deserialize(self, data: bytes) -> None:
        self.state = _restored(data)
        self.on_applied()


def _restored(dump: bytes) -> MetadataState:
    return MetadataState.restore(msgpack.unpackb(dump, raw=False, strict_map_key=False))


def raft_conf(data_dir: Path, bind_address: str, password: str | None) -> SyncObjConf:
    raft_dir = data_dir / "raft"
    durable.make_private_directories(raft_dir)
    return SyncObjConf(
        journalFile=str(raft_dir / "journal"),
        fullDumpFile=str(raft_dir / "dump"),
        bindAddress=bind_address,
        password=password or None,
        dynamicMembershipChange=True,
        useFork=False,
        appendEntriesUseBatch=False,
        appendEntriesBatchSizeBytes=APPEND_BATCH_BYTES,
        # Heartbeats and ticks are the whole idle cost of a node. Commands do not wait for a
        # tick (with batching off, a pipe wakes the poller), so ticks can be rare; these keep
        # a Raft re-election around a second.
        appendEntriesPeriod=APPEND_ENTRIES_PERIOD,
        raftMinTimeout=0.5,
        raftMaxTimeout=1.0,
        connectionTimeout=1.0,
        connectionRetryTime=0.5,
        autoTickPeriod=0.1,
        leaderFallbackTimeout=3.0,
        # Peers are named by host: a restarted container comes back at a new address, which a
        # 10-minute DNS cache (pysyncobj's default) would keep out of the group.
        dnsCacheTime=2.0,
        dnsFailCacheTime=1.0,
    )


# pysyncobj derives its session key from the password with PBKDF2-SHA256 at this many rounds on
# every start (16-24 ms of a restart here); the derived key is kept in the Raft directory instead.
PYSYNCOBJ_KDF_ROUNDS = 100_000
_KEY_PERSON = b"bascule-raftkey"


def raft_encryptor(key_file: Path, password: str) -> Fernet:
    """pysyncobj's session encryptor for ``password`` (the key it would derive), derived once:
    ``key_file`` keeps the key beside a digest of the password it came from, and a changed
    password, or a damaged file, derives it again. The file is as secret as the password, and as
    private as the Raft journal beside it."""
    from cryptography.fernet import Fernet
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.pbkdf2 import PBKDF2HMAC

    digest = hashlib.blake2b(password.encode(), digest_size=16, person=_KEY_PERSON).hexdigest()
    try:
        stored_digest, stored_key = key_file.read_text().split()
        if stored_digest == digest:
            return Fernet(stored_key.encode())
    except (OSError, ValueError):
        pass  # none yet, or not one this password made: derive it
    kdf = PBKDF2HMAC(algorithm=hashes.SHA256(), length=32, salt=PYSYNCOBJ_SALT, iterations=PYSYNCOBJ_KDF_ROUNDS)
    key = base64.urlsafe_b64encode(kdf.derive(password.encode()))
    durable.write_atomically(key_file, f"{digest} {key.decode()}\n")
    return Fernet(key)


class EncryptorAtFirstUse:
    """pysyncobj's session encryptor, made when a Raft connection first uses it: a node alone never
    does, and so never loads cryptography (6.7 MiB resident, 15-25 ms of a start)."""

    def __init__(self, make: Callable[[], Fernet]) -> None:
        self._make = make
        self._fernet: Fernet | None = None

    def __getattr__(self, name: str) -> Any:  # only for names not found on it: the Fernet's
        if self._fernet is None:
            self._fernet = self._make()
        return getattr(self._fernet, name)


class MetadataRaft:
    def __init__(
        self,
        address: str,
        peers: list[str],
        data_dir: Path,
        password: str | None,
        on_change: Callable[[], None],
    ) -> None:
        self.address = address
        self._loop = asyncio.get_running_loop()
        self._on_change = on_change
        self._store = MetadataStore(self._applied)
        install_durable_storage()  # before SyncObj opens its journal
        raft_port.install()
        SyncObj._autoTickThread = _tick_thread
        # SyncObj asks for its encryptor as it starts, before any connection: this node's is kept.
        key_file = data_dir / "raft" / "key"
        pysyncobj.syncobj.getEncryptor = lambda secret: EncryptorAtFirstUse(lambda: raft_encryptor(key_file, secret))
        # pysyncobj was imported without cryptography (bascule.metadata); this encryptor brings it.
        pysyncobj.syncobj.HAS_CRYPTO = True
        self._sync = SafeSyncObj(
            address, peers, raft_conf(data_dir, address, password), consumers=[self._store]
        )
        self._sync.addOnTickCallback(self._expire_unanswered_connects)
        self._sync.addOnTickCallback(self._elect_at_once_when_alone)
        self._sync.addOnTickCallback(self._commit_at_once_when_alone)
        self.watch = MetadataWatch()
        self._standing: tuple[str | None, bool] = (None, False)  # (leader, ready) as last told to the watch
        self._sync.addOnTickCallback(self._notice_leadership)
        self._tick_at_once()  # the tick thread's first tick may have run before these callbacks were in

    def _expire_unanswered_connects(self) -> None:
        """Drop connects to peers that got no answer within connectionTimeout (runs on the tick thread).

        pysyncobj checks a connection's timeout only when its socket has an event, and a connect to an
        address nobody holds (a peer restarted at another address) has none until the kernel gives up its
        SYN retries, a minute or two later. Dropped, the next attempt resolves the peer's name again.
        """
        transport = self._sync._SyncObj__transport
        timeout = self._sync.conf.connectionTimeout
        for connection in list(transport._connections.values()):
            started = connection._TcpConnection__lastReadTime  # set by connect()
            if connection.state == CONNECTION_STATE.CONNECTING and monotonic() - started > timeout:
                connection.disconnect()
        raft_port.expire_silent(transport, timeout)

    def _elect_at_once_when_alone(self) -> None:
        """A sole voter stands for election without waiting out an election timeout (runs on the tick
        thread): its own vote is the majority and no other node can lead its group, so a one-node cluster
        serves 0.5 to 1 s sooner after a start. Only once its journal is replayed: the group's members are
        known from the entries it applies, and until then a member of a larger group can look alone."""
        sync = self._sync
        if sync.otherNodes or sync._getLeader() is not None or sync.raftLastApplied < sync.raftCommitIndex:
            return
        sync._SyncObj__raftElectionDeadline = 0
        self._tick_at_once()

    def _commit_at_once_when_alone(self) -> None:
        """A sole voter commits what it appended in a tick at the next tick, and pysyncobj waits up to
        autoTickPeriod for it when no socket wakes it (runs on the tick thread): every metadata command
        of a one-node cluster, its registration and the elections of a restart included, waited 0.1 s.
        Only while its newest entry is of its own term: the next tick then commits it, so this never
        spins."""
        sync = self._sync
        if sync.otherNodes or not sync._isLeader():
            return
        newest_index, newest_term = sync._SyncObj__raftLog[-1][1:3]
        if sync.raftCommitIndex < newest_index and newest_term == sync.raftCurrentTerm:
            self._tick_at_once()

    def _tick_at_once(self) -> None:
        notifier = getattr(self._sync, "_SyncObj__pipeNotifier", None)  # none where pipes are not there
        if notifier is not None:
            notifier.notify()

    def _notice_leadership(self) -> None:
        """Tell the watch when the leader or readiness changed (on the tick thread: pysyncobj has no
        event for either)."""
        standing = (self.leader, self.ready)
        if standing != self._standing:
            self._standing = standing
            self._loop.call_soon_threadsafe(self.watch.notify)

    def _applied(self) -> None:
        self._loop.call_soon_threadsafe(self._changed)

    def _changed(self) -> None:
        self._on_change()
        self.watch.notify()

    async def propose(self, proposal: Command, timeout: float = PROPOSE_TIMEOUT) -> None:
        command = encode_command(proposal)
        if len(command) > MAX_COMMAND_BYTES:
            raise MetadataError("INVALID_ARGUMENT", f"a metadata command of {len(command)} bytes (at most "
                                f"{MAX_COMMAND_BYTES}): fewer partitions, replicas or items at once")
        done: asyncio.Future[tuple[Any, int]] = self._loop.create_future()

        def finished(result: Any, reason: int) -> None:
            self._loop.call_soon_threadsafe(_settle, done, (result, reason))

        self._store.apply(command, callback=finished)
        try:
            result, reason = await asyncio.wait_for(done, timeout)
        except TimeoutError:
            raise NoMetadataLeader(f"metadata command not committed within {timeout:g} s") from None
        if reason != FAIL_REASON.SUCCESS:
            raise NoMetadataLeader(f"metadata command not committed (reason {reason})")
        if result is not None:
            raise MetadataError(*result)

    @property
    def state(self) -> MetadataState:
        """The metadata as last applied on this node: an immutable value, safe to keep."""
        return self._store.state

    @property
    def ready(self) -> bool:
        """The journal has been applied up to the commit index of a leader (or this node's own)."""
        return self._sync.isReady()

    @property
    def is_leader(self) -> bool:
        return self._sync._isLeader()

    @property
    def term(self) -> int:
        """The Raft term this node is in (an int, read whole from the tick thread's state)."""
        return self._sync._SyncObj__raftCurrentTerm

    @property
    def leader(self) -> str | None:
        node = self._sync._getLeader()
        return node.address if node is not None else None

    def status(self) -> dict[str, Any]:
        return self._sync.getStatus()

    def quorum(self) -> dict[str, Any]:
        """This node's view of the group: leader, term, commit index, each voter's match index
        (known only on the leader; -1 elsewhere) and connection state."""
        status = self._sync.getStatus()
        leader = status["leader"].address if status["leader"] is not None else ""
        commit = status["commit_idx"]
        voters = []
        for address in self.members():
            if address == self.address:
                match, connected = (commit if self.is_leader else -1), True
            else:
                match = status.get(f"match_idx_server_{address}", -1)
                connected = status.get(f"partner_node_status_server_{address}") == 2
            voters.append({"address": address, "match_index": match, "connected": connected,
                           "leader": address == leader})
        return {"leader": leader, "term": status["raft_term"], "commit_index": commit, "voters": voters}

    def members(self) -> list[str]:
        return [self.address, *(node.address for node in self._sync.otherNodes)]

    async def add_voter(self, address: str, wait: float) -> bool | None:
        """Add ``address`` to the group: True once committed, False when refused (another
        membership change is not committed yet, or this node is no longer leader), None when not
        settled within ``wait`` (growing from one node, the commit needs the new node itself)."""
        done: asyncio.Future[bool] = self._loop.create_future()

        def finished(_result: Any, reason: int) -> None:
            self._loop.call_soon_threadsafe(_settle, done, reason == FAIL_REASON.SUCCESS)

        self._sync.addNodeToCluster(address, callback=finished)
        try:
            return await asyncio.wait_for(asyncio.shield(done), wait)
        except TimeoutError:
            return None

    def stand_only_while(self, standing_until: Callable[[], float]) -> None:
        """Lead and stand for election only until ``standing_until()``, a monotonic reading (``raft_standing``)."""
        raft_standing.stand_only_while(self._sync, standing_until)

    def close(self) -> None:
        """Stop Raft and wait for its tick thread to close every socket: once this returns, the Raft port is
        free for the next start (a restart in the same process included)."""
        self._sync.destroy_synchronous()


def _tick_thread(sync: Any) -> None:
    """pysyncobj's tick thread (``SyncObj._autoTickThread``, replaced by this) without the fixed 0.1 s
    sleep it takes between binding the Raft port and its first tick: a restarted node's journal replay,
    and so its election and its registration, waited for it (issue 30). ``sync`` is a weak proxy."""
    try:
        sync._SyncObj__transport.tryGetReady()
    except TransportNotReadyError:
        log.exception("the metadata Raft transport did not get ready")
        return
    finally:
        sync._SyncObj__initialised.set()
    try:
        period = sync.conf.autoTickPeriod
        while sync._SyncObj__mainThread.is_alive():
            if sync._SyncObj__destroying:
                sync._doDestroy()
                return
            try:
                sync._onTick(period)
            except Exception:
                log.exception("a metadata Raft tick failed")
                time.sleep(period)  # before trying again, as pysyncobj does
    except ReferenceError:  # the SyncObj is gone
        pass


def _settle(future: asyncio.Future, value: Any) -> None:
    if not future.done():
        future.set_result(value)
