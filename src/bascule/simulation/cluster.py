"""A simulated bascule cluster: real node glue (``NodeCore``: partitions, leader and follower
machines and their appliers, the metadata service and its elections, maintenance) on real commit
logs in a scratch directory, over the in-memory bus and the modelled metadata log, on the loop's
virtual time.

A node crashes as a killed process does (its connection and tasks end at once, its files keep
what was written), loses power (the same, and then each log loses what it had not synced), or stops
cleanly (and starts again clean).
"""

from __future__ import annotations

import asyncio
import logging
import random
import traceback
from collections.abc import Callable
from pathlib import Path

from bascule.config import Config
from bascule.node.core import NodeCore
from bascule.node.tasks import Tasks
from bascule.partition.encryption import MasterKey
from bascule.partition.log import CommitLog
from bascule.simulation.metadata import MetadataLog
from bascule.testing.bus import MemoryBus
from bascule.wire.subjects import Subjects

log = logging.getLogger(__name__)

HOST = "127.0.0.1"


class SimNode:
    def __init__(
        self, node_id: str, data_dir: Path, config: Config, bus: MemoryBus, metadata: MetadataLog,
        live: Callable[[], list[str]], clock_rate: float, clock_offset: float, trace: Callable[[str], None],
    ) -> None:
        self.id = node_id
        self.data_dir = data_dir
        self.config = config
        self.bus = bus
        self.metadata = metadata
        self.live = live
        self.clock_rate = clock_rate
        self.clock_offset = clock_offset
        self.trace = trace
        self.generation = 0
        self.clean = True  # its last run stopped cleanly (a fresh node is clean)
        self.core: NodeCore | None = None
        self.failure: BaseException | None = None  # a task of a running node failed: a bug
        self._life: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._registered = False

    def clock(self) -> float:
        """This node's monotonic clock: its own origin, and a rate a little off the true one."""
        return asyncio.get_running_loop().time() * self.clock_rate + self.clock_offset

    @property
    def up(self) -> bool:
        return self._life is not None

    @property
    def incarnation(self) -> str:
        return f"{self.id}.{self.generation}"

    def start(self) -> None:
        self.generation += 1
        clean_start, self.clean = self.clean, False  # the marker goes before any log opens
        self._registered = False
        self._stop = asyncio.Event()
        self._life = asyncio.get_running_loop().create_task(self._run(clean_start), name=f"node {self.incarnation}")
        self._life.add_done_callback(self._ended)
        self.trace(f"{self.incarnation} starts ({'clean' if clean_start else 'unclean'})")

    async def _run(self, clean_start: bool) -> None:
        async with asyncio.TaskGroup() as group:
            tasks = Tasks(group)
            member = self.metadata.join(self.id, self._metadata_changed)
            core = self.core = NodeCore(
                self.config, self.data_dir, self.id, self.incarnation, self.bus.node(self.id),
                Subjects(self.config.clustering.namespace), member, tasks, MasterKey.from_environment({}),
                self.live, self.clock,
            )
            await core.start()
            tasks.spawn(self._register(core, clean_start), "register broker")
            core.maintenance.start()
            assert self._stop is not None
            await self._stop.wait()
            await tasks.close()
            await core.partitions.close()
            self.clean = self._registered and core.partitions.closed_sound

    async def _register(self, core: NodeCore, clean_start: bool) -> None:
        await core.register(HOST, 0, self.id, clean_start)
        self._registered = True

    def _metadata_changed(self) -> None:
        if self.core is not None:
            self.core.partitions.schedule_reconcile()

    def _ended(self, life: asyncio.Task[None]) -> None:
        if self._life is life and not life.cancelled() and life.exception() is not None:
            self.failure = life.exception()
            for line in traceback.format_exception(self.failure):
                self.trace(line.rstrip())

    async def stop(self) -> None:
        """A clean stop: every log synced and closed."""
        life, stop = self._life, self._stop
        if life is None or stop is None:
            return
        self.trace(f"{self.incarnation} stops")
        stop.set()
        await asyncio.wait({life})
        self._gone()

    def crash(self, power_cut: bool) -> None:
        """Killed now: nothing more goes out, no task runs on, the files keep what was written. With
        ``power_cut``, each log then loses what its last successful fsync did not cover."""
        life = self._life
        if life is None:
            return
        self.trace(f"{self.incarnation} {'loses power' if power_cut else 'is killed'}")
        self._gone()
        synced: dict[Path, int] = {}
        if self.core is not None:
            for local in self.core.partitions.all():
                replica = local.replica
                synced[replica.log.directory] = replica.log.synced_end
                replica.stop()
                replica.log.abandon()
        life.cancel()
        if power_cut:
            for directory, synced_end in synced.items():
                lost = _cut_back(directory, synced_end)
                if lost:
                    self.trace(f"{self.id}: partition {directory.name} lost offsets "
                               f"{synced_end}..{synced_end + lost - 1} to the power cut")

    def _gone(self) -> None:
        self._life = None
        self.bus.disconnect(self.id)
        self.metadata.leave(self.id)

    def held(self, directory_of: Callable[[str, int], Path | None], stream: str, partition: int,
             offset: int, value: bytes) -> bool:
        """Whether this node's log of the partition holds ``value`` at ``offset`` (up or down)."""
        local = self.core.partitions.get(stream, partition) if self.up and self.core is not None else None
        if local is not None and not local.replica.closed:
            entries = local.replica.log.read(offset, max_entries=1) if offset < local.replica.log.next_offset else []
        else:
            directory = directory_of(self.id, partition)
            if directory is None or not directory.exists():
                return False
            commit_log = CommitLog.open(directory)
            try:
                entries = commit_log.read(offset, max_entries=1) if offset < commit_log.next_offset else []
            finally:
                commit_log.abandon()
        return bool(entries) and entries[0].offset == offset and entries[0].value == value


def _cut_back(directory: Path, synced_end: int) -> int:
    """What a power cut leaves of the log in ``directory``: what its last fsync covered. Returns how
    many entries it lost."""
    commit_log = CommitLog.open(directory)
    try:
        lost = max(0, commit_log.next_offset - synced_end)
        if lost:
            commit_log.truncate(synced_end)
        return lost
    finally:
        commit_log.close()


def drifting_clock(random_source: random.Random, max_drift: float) -> tuple[float, float]:
    """A node's clock (rate, origin): rates within ``max_drift`` of the true one, unrelated origins."""
    return 1.0 + random_source.uniform(-max_drift, max_drift), random_source.uniform(0.0, 1e6)
