"""bascule's admin API (``bascule.admin.Admin``): the Raft quorum and per-replica partition state.

The Raft leader alone knows each voter's match index, so Status is answered from
its view, fetched over NATS when another node is asked. Partition state is spread
over the replicas: Partitions asks every broker for its local log ends at once and
merges the answers with the metadata (unless only the metadata is asked for).
"""

from __future__ import annotations

import logging

from bascule.api.ports import Cluster, ClusterQueries
from bascule.wire.pb import admin_pb2
from bascule.wire.settings import effective_settings

log = logging.getLogger(__name__)

GATHER_TIMEOUT = 1.0


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
        reports = {} if request.metadataOnly else await self.queries.gather_replica_reports(GATHER_TIMEOUT)
        partitions = [
            (
                p.stream, p.id, p.leader, list(p.replicas), list(p.isr), p.epoch, p.leader_epoch, p.paused, p.readonly,
                effective_settings(st.name, st.settings, self.cluster.stream_defaults).compacted, list(p.unclean),
            )
            for st in self.cluster.state.streams.values() if not request.stream or st.name == request.stream
            for p in st.partitions.values()
        ]
        response = admin_pb2.PartitionsResponse()
        for stream, pid, leader, replicas, isr, epoch, leader_epoch, paused, readonly, compact, unclean in sorted(
            partitions
        ):
            key = f"{stream}/{pid}"
            leader_end, leader_hw, _ = reports.get(leader, {}).get(key, (-1, -1, -1))
            status = response.partitions.add(
                stream=stream, partition=pid, leader=leader, replicas=replicas, isr=isr,
                highWatermark=leader_hw, partitionEpoch=epoch, leaderEpoch=leader_epoch,
                paused=paused, readonly=readonly, compacted=compact, unclean=unclean,
            )
            if request.metadataOnly:
                continue
            for replica in replicas:
                reachable = key in reports.get(replica, {})
                end, hw, _ = reports.get(replica, {}).get(key, (-1, -1, -1))
                status.replicaStatus.add(
                    id=replica, logEndOffset=end, highWatermark=hw, inIsr=replica in isr, reachable=reachable,
                    lag=max(leader_end - end, 0) if reachable and leader_end >= 0 else -1,
                )
        return response

