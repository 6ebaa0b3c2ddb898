"""Liftbridge's gRPC API (``proto.API``), bascule's batch data path and admin API, on one gRPC
server. Each service is assembled from the RPC groups that implement it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from bascule.api.admin import Admin
from bascule.api.cursors import Cursors
from bascule.api.ports import Cluster, ClusterQueries, Publishing, Replicas
from bascule.api.publish import PublishRPCs
from bascule.api.streams import StreamRPCs
from bascule.api.subscribe import SubscribeRPCs
from bascule.wire.pb import admin_pb2_grpc, api_pb2_grpc, data_pb2_grpc

MAX_GRPC_MESSAGE_BYTES = 64 * 1024 * 1024
# An RPC handler as gRPC calls it: (request or request iterator, context).
Handler = Callable[..., Any]


class API(api_pb2_grpc.APIServicer):
    """Every RPC of ``proto.API``, each taken from the group that implements it."""

    # Declared as attributes, the groups' handlers may replace the servicer's methods.
    CreateStream: Handler
    DeleteStream: Handler
    PauseStream: Handler
    SetStreamReadonly: Handler
    FetchMetadata: Handler
    FetchPartitionMetadata: Handler
    Publish: Handler
    PublishAsync: Handler
    PublishToSubject: Handler
    Subscribe: Handler
    SetCursor: Handler
    FetchCursor: Handler

    def __init__(self, streams: StreamRPCs, publish: PublishRPCs, subscribe: SubscribeRPCs, cursors: Cursors) -> None:
        self.CreateStream = streams.CreateStream
        self.DeleteStream = streams.DeleteStream
        self.PauseStream = streams.PauseStream
        self.SetStreamReadonly = streams.SetStreamReadonly
        self.FetchMetadata = streams.FetchMetadata
        self.FetchPartitionMetadata = streams.FetchPartitionMetadata
        self.Publish = publish.Publish
        self.PublishAsync = publish.PublishAsync
        self.PublishToSubject = publish.PublishToSubject
        self.Subscribe = subscribe.Subscribe
        self.SetCursor = cursors.SetCursor
        self.FetchCursor = cursors.FetchCursor


class Data(data_pb2_grpc.DataServicer):
    """bascule's batch data path: committed entries as stored, many per gRPC message."""

    SubscribeBatches: Handler

    def __init__(self, subscribe: SubscribeRPCs) -> None:
        self.SubscribeBatches = subscribe.SubscribeBatches


def listen(host: str, port: int, tls: tuple[bytes, bytes] | None = None) -> tuple[grpc.aio.Server, int]:
    """A gRPC server bound to ``host``:``port`` (0: a free port), not yet serving; returns it and
    its port. Its services are added once the node that serves them has started."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_BYTES),
        ]
    )
    address = f"{host}:{port}"
    if tls is None:
        bound = server.add_insecure_port(address)
    else:
        cert, key = tls
        bound = server.add_secure_port(address, grpc.ssl_server_credentials([(key, cert)]))
    if not bound:
        raise OSError(f"cannot listen on {address}")
    return server, bound


def add_services(
    server: grpc.aio.Server, cluster: Cluster, replicas: Replicas, publishing: Publishing, queries: ClusterQueries,
) -> None:
    """Liftbridge's API, the batch data path and the admin API, served from a node's parts."""
    subscribe = SubscribeRPCs(cluster, replicas)
    api = API(
        StreamRPCs(cluster, replicas), PublishRPCs(cluster, replicas, publishing), subscribe,
        Cursors(cluster, replicas, publishing),
    )
    api_pb2_grpc.add_APIServicer_to_server(api, server)
    data_pb2_grpc.add_DataServicer_to_server(Data(subscribe), server)
    admin_pb2_grpc.add_AdminServicer_to_server(Admin(cluster, queries), server)
