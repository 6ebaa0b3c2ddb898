"""The stream RPCs: create, delete, pause, readonly, and the metadata clients route by."""

from __future__ import annotations

import time

from bascule.api.ports import Cluster, Replicas
from bascule.api.reading import readable_partition
from bascule.api.status import metadata_call, refuse_internal_stream
from bascule.metadata.state import MetadataState, Partition
from bascule.wire.pb import api_pb2
from bascule.wire.settings import settings_from_request


class StreamRPCs:
    def __init__(self, cluster: Cluster, replicas: Replicas) -> None:
        self.cluster = cluster
        self.replicas = replicas

    async def CreateStream(self, request, context):
        await metadata_call(
            context,
            self.cluster.create_stream(
                request.name, request.subject, request.group, request.replicationFactor,
                request.partitions, settings_from_request(request),
            ),
        )
        return api_pb2.CreateStreamResponse()

    async def DeleteStream(self, request, context):
        await refuse_internal_stream(request.name, context)
        await metadata_call(context, self.cluster.call("delete_stream", name=request.name))
        return api_pb2.DeleteStreamResponse()

    async def PauseStream(self, request, context):
        await refuse_internal_stream(request.name, context)
        await metadata_call(
            context,
            self.cluster.call(
                "pause", name=request.name, partitions=list(request.partitions),
                resume_all=request.resumeAll, at=time.time_ns(),
            ),
        )
        return api_pb2.PauseStreamResponse()

    async def SetStreamReadonly(self, request, context):
        await refuse_internal_stream(request.name, context)
        await metadata_call(
            context,
            self.cluster.call(
                "set_readonly", name=request.name, partitions=list(request.partitions),
                readonly=request.readonly, at=time.time_ns(),
            ),
        )
        return api_pb2.SetStreamReadonlyResponse()

    async def FetchMetadata(self, request, context):
        state = self.cluster.state
        response = self._metadata(state, list(request.streams))
        _add_groups(response, state, list(request.groups))
        return response

    def _metadata(self, state: MetadataState, names: list[str]) -> api_pb2.FetchMetadataResponse:
        response = api_pb2.FetchMetadataResponse()
        replicas, leaders = state.partitions_per_broker(), state.partitions_led_by()
        live = self.cluster.live_brokers()
        for broker in state.brokers.values():
            if broker.id not in live:
                continue
            response.brokers.add(
                id=broker.id, host=broker.host, port=broker.port,
                partitionCount=replicas.get(broker.id, 0), leaderCount=leaders.get(broker.id, 0),
            )
        for name in names or sorted(state.streams):
            stream = state.streams.get(name)
            if stream is None:
                response.streamMetadata.add(name=name, error=api_pb2.StreamMetadata.Error.UNKNOWN_STREAM)
                continue
            entry = response.streamMetadata.add(
                name=stream.name, subject=stream.subject, creationTimestamp=stream.created
            )
            for partition in stream.partitions.values():
                entry.partitions[partition.id].CopyFrom(self._partition_metadata(partition))
        return response

    def _partition_metadata(self, partition: Partition) -> api_pb2.PartitionMetadata:
        local = self.replicas.get(partition.stream, partition.id)
        hw, newest = -1, -1
        metadata = api_pb2.PartitionMetadata(
            id=partition.id, leader=partition.leader, replicas=partition.replicas,
            isr=partition.isr, paused=partition.paused, readonly=partition.readonly,
        )
        if local is not None and not local.replica.closed:
            replica = local.replica
            hw, newest = replica.high_watermark, replica.newest_offset
            # Liftbridge's event times: this node's own, since the replica opened here
            for field, times in (("messagesReceivedTimestamps", replica.received),
                                 ("pauseTimestamps", replica.pause_changes),
                                 ("readonlyTimestamps", replica.readonly_changes)):
                getattr(metadata, field).CopyFrom(
                    api_pb2.PartitionEventTimestamps(firstTimestamp=times.first, latestTimestamp=times.latest)
                )
        metadata.highWatermark, metadata.newestOffset = hw, newest
        return metadata

    async def FetchPartitionMetadata(self, request, context):
        await readable_partition(self.cluster, self.replicas, request.stream, request.partition, context)
        partition = self.cluster.state.partition(request.stream, request.partition)
        if partition is None:  # deleted meanwhile
            return api_pb2.FetchPartitionMetadataResponse()
        return api_pb2.FetchPartitionMetadataResponse(metadata=self._partition_metadata(partition))


def _add_groups(response: api_pb2.FetchMetadataResponse, state: MetadataState, group_ids: list[str]) -> None:
    """Liftbridge: the groups asked for, by name (an unknown one is answered UNKNOWN_GROUP)."""
    for group_id in group_ids:
        group = state.groups.get(group_id)
        if group is None:
            response.groupMetadata.add(groupId=group_id, error=api_pb2.ConsumerGroupMetadata.Error.UNKNOWN_GROUP)
        else:
            response.groupMetadata.add(groupId=group_id, coordinator=group.coordinator, epoch=group.epoch)
