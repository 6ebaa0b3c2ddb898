"""Authorization of API calls, Liftbridge's model: a Casbin enforcer asked (subject, resource, action),
where the subject is the common name of the client's verified certificate (mutual TLS), the resource
the stream a call names ("*" for calls on the whole cluster, the NATS subject for PublishToSubject)
and the action the RPC's name (PublishAsync's requests are "Publish"). A denial is PERMISSION_DENIED,
or a PublishAsync error of that code."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Protocol

import grpc

CLUSTER = "*"

# The resource each RPC acts on, from its request.
RESOURCES: dict[str, Callable[[Any], str]] = {
    "CreateStream": lambda request: request.name,
    "DeleteStream": lambda request: request.name,
    "PauseStream": lambda request: request.name,
    "SetStreamReadonly": lambda request: request.name,
    "FetchMetadata": lambda request: CLUSTER,
    "FetchPartitionMetadata": lambda request: request.stream,
    "Publish": lambda request: request.stream,
    "PublishToSubject": lambda request: request.subject,
    "Subscribe": lambda request: request.stream,
    "SubscribeBatches": lambda request: request.stream,
    "SetCursor": lambda request: request.stream,
    "FetchCursor": lambda request: request.stream,
    "Status": lambda request: CLUSTER,
    "Partitions": lambda request: CLUSTER,
}


class Enforcer(Protocol):
    def enforce(self, *request: str) -> bool: ...


class Authorization:
    def __init__(self, enforcer: Enforcer) -> None:
        self._enforcer = enforcer

    def allows(self, context: Any, resource: str, action: str) -> bool:
        subject = client_name(context)
        return subject is not None and bool(self._enforcer.enforce(subject, resource, action))

    async def check(self, context: Any, resource: str, action: str) -> None:
        if not self.allows(context, resource, action):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, denial(resource, action))

    def guard(self, action: str, handler: Callable[..., Any]) -> Callable[..., Any]:
        """``handler`` (a unary or server-streaming RPC) run only when the call is allowed."""
        resource_of = RESOURCES[action]
        if inspect.isasyncgenfunction(handler):

            async def streaming(request: Any, context: Any) -> Any:
                await self.check(context, resource_of(request), action)
                async for response in handler(request, context):
                    yield response

            return streaming

        async def unary(request: Any, context: Any) -> Any:
            await self.check(context, resource_of(request), action)
            return await handler(request, context)

        return unary


def denial(resource: str, action: str) -> str:
    return f"The client is not authorized to call {action} on resource {resource}"


def client_name(context: Any) -> str | None:
    """The common name in the subject of the client's verified certificate, None without one."""
    certificate = context.peer_certificate()
    if not certificate:
        return None
    for rdn in certificate.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None
