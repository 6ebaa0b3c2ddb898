"""bascule's admin API (``bascule.admin.Admin``): the Raft quorum and per-replica partition state.

The Raft leader alone knows each voter's match index, so Status is answered from
its view, fetched over NATS when another node is asked. Partition state is spread
over the replicas: Partitions asks every broker for its local logs' extent at once and
merges the answers with the metadata (unless only the metadata is asked for), and adds each stream's
settings as this node runs it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from bascule.api.ports import Cluster, ClusterQueries, ReplicaStates
from bascule.metadata.state import Partition, Stream
from bascule.partition.encryption import stream_encrypted
from bascule.wire.pb import admin_pb2
from bascule.wire.settings import EffectiveSettings, effective_settings

log = logging.getLogger(__name__)

GATHER_TIMEOUT = 1.0
UNKNOWN_STATE = (-1, -1, -1, -1, -1)  # a replica that did not answer


class Admin:
    def __init__(self, cluster: Cluster, queries: ClusterQueries) -> None:
        self.cluster = cluster
        self.queries = queries

    async def Status(self, request, context):
        quorum = await self.queries.raft_quorum()
        brokers = list(self.cluster.state.brokers.values())
        by_raft = {b.raft: b.id for b in brokers}
        response = admin_pb2.StatusResponse(
            raftLeader=quorum["leader"], raftLeaderId=by_raft.get(quorum["leader"], ""),
            term=quorum["term"], commitIndex=quorum["commit_index"], answeredBy=quorum["answered_by"],
        )
        for b in sorted(brokers, key=lambda b: b.id):
            response.brokers.add(id=b.id, host=b.host, port=b.port, raftAddress=b.raft)
        for voter in quorum["voters"]:
            match = voter["match_index"]
            response.voters.add(
                address=voter["address"], brokerId=by_raft.get(voter["address"], ""), matchIndex=match,
                lag=quorum["commit_index"] - match if match >= 0 else -1,
                connected=voter["connected"], leader=voter["leader"],
            )
        return response

    async def Partitions(self, request, context):
        states = {} if request.metadataOnly else await self.queries.gather_replica_states(GATHER_TIMEOUT)
        streams = sorted(
            (st for st in self.cluster.state.streams.values() if not request.stream or st.name == request.stream),
            key=lambda st: st.name,
        )
        response = admin_pb2.PartitionsResponse()
        for stream in streams:
            settings = effective_settings(stream.name, stream.settings, self.cluster.stream_defaults)
            response.streams.append(_stream_status(stream, settings))
            for partition in sorted(stream.partitions.values(), key=lambda p: p.id):
                status = _partition_status(partition, settings.compacted, states.get(partition.leader, {}))
                if not request.metadataOnly:
                    _add_replica_statuses(status, partition, states)
                response.partitions.append(status)
        return response


def _stream_status(stream: Stream, settings: EffectiveSettings) -> admin_pb2.StreamStatus:
    replication_factor = max((len(p.replicas) for p in stream.partitions.values()), default=0)
    return admin_pb2.StreamStatus(
        name=stream.name, subject=stream.subject, group=stream.group, replicationFactor=replication_factor,
        creationTime=stream.created, settings=admin_pb2.StreamSettings(
            segmentMaxBytes=settings.segment_max_bytes, segmentMaxAge=_ms(settings.segment_max_age),
            retentionMaxBytes=settings.retention_max_bytes, retentionMaxMessages=settings.retention_max_messages,
            retentionMaxAge=_ms(settings.retention_max_age), cleanerInterval=_ms(settings.cleaner_interval),
            compactEnabled=settings.compacted, autoPauseTime=_ms(settings.auto_pause_time),
            autoPauseDisableIfSubscribers=settings.auto_pause_unless_subscribed, minIsr=settings.min_isr,
            optimisticConcurrencyControl=settings.concurrency_control,
            encryption=stream_encrypted(stream.name, stream.settings),
        ),
    )


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def _partition_status(partition: Partition, compacted: bool, leader_states: ReplicaStates) -> admin_pb2.PartitionStatus:
    key = f"{partition.stream}/{partition.id}"
    leader_end, leader_hw, _, oldest, size = leader_states.get(key, UNKNOWN_STATE)
    return admin_pb2.PartitionStatus(
        stream=partition.stream, partition=partition.id, leader=partition.leader, replicas=list(partition.replicas),
        isr=list(partition.isr), highWatermark=leader_hw, partitionEpoch=partition.epoch,
        leaderEpoch=partition.leader_epoch, paused=partition.paused, readonly=partition.readonly,
        compacted=compacted, unclean=list(partition.unclean), oldestOffset=oldest,
        newestOffset=leader_end - 1 if leader_end >= 0 else -1,
        messages=leader_end - oldest if oldest >= 0 else -1, sizeBytes=size,
    )


def _add_replica_statuses(
    status: admin_pb2.PartitionStatus, partition: Partition, states: Mapping[str, ReplicaStates]
) -> None:
    key = f"{partition.stream}/{partition.id}"
    leader_end = states.get(partition.leader, {}).get(key, UNKNOWN_STATE)[0]
    for replica in partition.replicas:
        reachable = key in states.get(replica, {})
        end, hw, _, oldest, size = states.get(replica, {}).get(key, UNKNOWN_STATE)
        status.replicaStatus.add(
            id=replica, logEndOffset=end, highWatermark=hw, inIsr=replica in partition.isr, reachable=reachable,
            lag=max(leader_end - end, 0) if reachable and leader_end >= 0 else -1, oldestOffset=oldest,
            sizeBytes=size,
        )
