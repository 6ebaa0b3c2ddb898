"""The part of a node that keeps its partitions replicated and its metadata led: built the same way
on a node (over NATS and pysyncobj, by ``Node``) and in the simulator (over an in-memory bus and a
modelled metadata log, by ``bascule.simulation``), so that what the simulator runs is this glue.

It holds the metadata service (the metadata leader's work, and forwarding to it), the partition
replicas kept in step with the metadata, the admin queries elections gather positions with, the
consumer group coordinator and the periodic maintenance (ISR changes, checkpoints, the cleaner,
failing disks), and registers this incarnation as a broker.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

from bascule.config import Config
from bascule.metadata.election import Position
from bascule.metadata.raft import NoMetadataLeader
from bascule.metadata.replicated import ReplicatedMetadata
from bascule.metadata.service import MetadataService
from bascule.natsio.transport import Transport
from bascule.node.admin import ADMIN_TIMEOUT, AdminQueries
from bascule.node.groups import GroupCoordinator
from bascule.node.maintenance import Maintenance
from bascule.node.partitions import Partitions
from bascule.node.tasks import Tasks
from bascule.partition.encryption import MasterKey
from bascule.wire.subjects import Subjects

REGISTRATION_RETRY = 0.2


class NodeCore:
    def __init__(
        self, config: Config, data_dir: Path, server_id: str, incarnation: str, nc: Transport, subjects: Subjects,
        raft: ReplicatedMetadata, tasks: Tasks, master_key: MasterKey, live_brokers: Callable[[], Collection[str]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        clustering = config.clustering
        self.server_id = server_id
        self.incarnation = incarnation
        self.raft = raft
        self.metadata = MetadataService(
            raft, nc, subjects, clustering.replica_max_leader_timeout, self._gather_positions, live_brokers,
            config.groups.coordinator_timeout, config.stream_defaults, clock,
        )
        self.groups = GroupCoordinator(
            server_id, config.groups.consumer_timeout, lambda: raft.state, self.metadata.call, tasks, clock,
        )
        self.partitions = Partitions(
            config, data_dir, server_id, incarnation, nc, subjects, raft, self.metadata, tasks, master_key, clock,
        )
        self.admin = AdminQueries(server_id, nc, subjects, raft, self.partitions)
        self.maintenance = Maintenance(
            config, server_id, raft, self.metadata, self.partitions, tasks, self.groups,
            self.admin.gather_replica_reports, clock,
        )

    async def start(self) -> None:
        """Subscribe, and bring up the partitions the metadata assigns here (the maintenance
        starts separately: ``maintenance.start()``)."""
        await self.partitions.start()
        await self.metadata.start()
        await self.admin.start()
        self.partitions.schedule_reconcile()

    async def register(self, host: str, port: int, raft_address: str, clean_start: bool) -> None:
        """Register this incarnation, until the metadata has it. After an unclean shutdown, the
        metadata marks this broker's ISR memberships unclean in the same command
        (``MetadataState._register_broker``)."""
        wanted = (host, port, raft_address, self.incarnation)
        while True:
            registered = self.raft.state.brokers.get(self.server_id)
            if registered and (registered.host, registered.port, registered.raft, registered.incarnation) == wanted:
                return
            try:
                await self.metadata.call(
                    "register_broker", id=self.server_id, host=host, port=port, raft=raft_address,
                    incarnation=self.incarnation, unclean=not clean_start,
                )
            except NoMetadataLeader:
                await asyncio.sleep(REGISTRATION_RETRY)

    async def _gather_positions(
        self, wanted: Mapping[tuple[str, int], Collection[str]]
    ) -> dict[tuple[str, int], dict[str, Position]]:
        """The positions of each partition's replicas on its brokers, as many as answer: one request,
        answered once by every broker for all of its replicas."""
        brokers = set().union(*wanted.values()) if wanted else set()
        if not brokers:
            return {}
        names = [f"{stream}/{partition}" for stream, partition in wanted]
        reports = await self.admin.gather_replica_reports(ADMIN_TIMEOUT, brokers, names)
        positions: dict[tuple[str, int], dict[str, Position]] = {}
        for (stream, partition), asked in wanted.items():
            name = f"{stream}/{partition}"
            positions[stream, partition] = {
                broker: Position(report[name][2], report[name][0])
                for broker, report in reports.items() if broker in asked and name in report
            }
        return positions
