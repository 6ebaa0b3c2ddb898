"""Liftbridge's consumer group RPCs: join, leave, fetch assignments (the member's heartbeat, served
by the group's coordinator) and report an unresponsive coordinator.

Under Casbin authorization they need Subscribe on the group's streams, where Liftbridge checks
nothing (``api.authz``)."""

from __future__ import annotations

from bascule.api.ports import Cluster
from bascule.api.status import metadata_call
from bascule.h2grpc import Status
from bascule.metadata.raft import MetadataError
from bascule.wire.names import consumer_group_id_error, consumer_id_error
from bascule.wire.pb import api_pb2

NANOSECONDS = 1_000_000_000


class GroupRPCs:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    async def JoinConsumerGroup(self, request, context):
        await _check_member(request, context)
        if not request.streams:
            await context.abort(Status.INVALID_ARGUMENT, "No streams provided")
        coordinator, epoch = await metadata_call(context, self.cluster.join_consumer_group(
            request.groupId, request.consumerId, sorted(set(request.streams)),
        ))
        consumer_timeout, coordinator_timeout = self.cluster.group_timeouts
        return api_pb2.JoinConsumerGroupResponse(
            coordinator=coordinator, epoch=epoch, consumerTimeout=round(consumer_timeout * NANOSECONDS),
            coordinatorTimeout=round(coordinator_timeout * NANOSECONDS),
        )

    async def LeaveConsumerGroup(self, request, context):
        await _check_member(request, context)
        await metadata_call(context, self.cluster.call(
            "leave_consumer_group", group=request.groupId, consumer=request.consumerId, expired=False,
        ))
        return api_pb2.LeaveConsumerGroupResponse()

    async def FetchConsumerGroupAssignments(self, request, context):
        await _check_member(request, context)
        try:
            epoch, assigned = self.cluster.fetch_group_assignments(request.groupId, request.consumerId, request.epoch)
        except MetadataError as exc:
            code = Status.NOT_FOUND if exc.code == "NOT_FOUND" else Status.FAILED_PRECONDITION
            await context.abort(code, exc.message)
        response = api_pb2.FetchConsumerGroupAssignmentsResponse(epoch=epoch)
        for stream, partitions in sorted(assigned.items()):
            response.assignments.add(stream=stream, partitions=partitions)
        return response

    async def ReportConsumerGroupCoordinator(self, request, context):
        await _check_member(request, context)
        if not request.coordinator:
            await context.abort(Status.INVALID_ARGUMENT, "No coordinator provided")
        await metadata_call(context, self.cluster.call(
            "report_group_coordinator", group=request.groupId, consumer=request.consumerId,
            coordinator=request.coordinator, epoch=request.epoch,
        ))
        return api_pb2.ReportConsumerGroupCoordinatorResponse()


async def _check_member(request, context) -> None:
    """Liftbridge's checks of the ids every group RPC names, in its words, then bascule's bounds."""
    for problem in (consumer_group_id_error(request.groupId), consumer_id_error(request.consumerId)):
        if problem:
            await context.abort(Status.INVALID_ARGUMENT, problem)
