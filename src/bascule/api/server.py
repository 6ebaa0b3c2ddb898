"""Liftbridge's gRPC API (``proto.API``), bascule's batch data path and admin API, on one gRPC
server. Each service is assembled from the RPC groups that implement it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bascule.api.admin import Admin
from bascule.api.authz import CHECKS, Authorization
from bascule.api.cursors import Cursors
from bascule.api.groups import GroupRPCs
from bascule.api.health import Health
from bascule.api.ports import Cluster, ClusterQueries, Publishing, Replicas
from bascule.api.publish import PublishRPCs
from bascule.api.streams import StreamRPCs
from bascule.api.subscribe import SubscribeRPCs
from bascule.h2grpc import GrpcServer, service_methods
from bascule.wire.pb import admin_pb2, api_pb2, data_pb2, health_pb2

# An RPC handler as the server calls it: (request or request iterator, context).
Handler = Callable[..., Any]

API_SERVICE = api_pb2.DESCRIPTOR.services_by_name["API"]
DATA_SERVICE = data_pb2.DESCRIPTOR.services_by_name["Data"]
ADMIN_SERVICE = admin_pb2.DESCRIPTOR.services_by_name["Admin"]
HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"]


class API:
    """Every RPC of ``proto.API`` that bascule implements, each taken from the group that
    implements it; the others are UNIMPLEMENTED."""

    def __init__(
        self, streams: StreamRPCs, publish: PublishRPCs, subscribe: SubscribeRPCs, cursors: Cursors, groups: GroupRPCs,
    ) -> None:
        self.CreateStream: Handler = streams.CreateStream
        self.DeleteStream: Handler = streams.DeleteStream
        self.PauseStream: Handler = streams.PauseStream
        self.SetStreamReadonly: Handler = streams.SetStreamReadonly
        self.FetchMetadata: Handler = streams.FetchMetadata
        self.FetchPartitionMetadata: Handler = streams.FetchPartitionMetadata
        self.Publish: Handler = publish.Publish
        self.PublishAsync: Handler = publish.PublishAsync
        self.PublishToSubject: Handler = publish.PublishToSubject
        self.Subscribe: Handler = subscribe.Subscribe
        self.SetCursor: Handler = cursors.SetCursor
        self.FetchCursor: Handler = cursors.FetchCursor
        self.JoinConsumerGroup: Handler = groups.JoinConsumerGroup
        self.LeaveConsumerGroup: Handler = groups.LeaveConsumerGroup
        self.FetchConsumerGroupAssignments: Handler = groups.FetchConsumerGroupAssignments
        self.ReportConsumerGroupCoordinator: Handler = groups.ReportConsumerGroupCoordinator


class Data:
    """bascule's batch data path: committed entries as stored, many per gRPC message."""

    def __init__(self, subscribe: SubscribeRPCs) -> None:
        self.SubscribeBatches: Handler = subscribe.SubscribeBatches


def add_services(
    server: GrpcServer, cluster: Cluster, replicas: Replicas, publishing: Publishing, queries: ClusterQueries,
    authorization: Authorization | None = None,
) -> Health:
    """Liftbridge's API, the batch data path, the admin API and the health service, served from a
    node's parts, every call but health's checked by ``authorization`` when there is one; returns the
    health service, for the server to say when it serves."""
    subscribe = SubscribeRPCs(cluster, replicas)
    api = API(
        StreamRPCs(cluster, replicas), PublishRPCs(cluster, replicas, publishing, authorization), subscribe,
        Cursors(cluster, replicas, publishing), GroupRPCs(cluster),
    )
    served: list[tuple[Any, object]] = [
        (API_SERVICE, api), (DATA_SERVICE, Data(subscribe)), (ADMIN_SERVICE, Admin(cluster, queries)),
    ]
    if authorization is not None:
        for _, servicer in served:
            for action in CHECKS:
                if hasattr(servicer, action):
                    guarded = authorization.guard(action, getattr(servicer, action), lambda: cluster.state)
                    setattr(servicer, action, guarded)
    health = Health(service.full_name for service, _ in served)
    served.append((HEALTH_SERVICE, health))
    for service, servicer in served:
        server.add(service_methods(service, servicer))
    return health
