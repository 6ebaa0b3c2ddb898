"""Authorization of API calls, Liftbridge's model: a Casbin enforcer asked (subject, resource, action),
where the subject is the common name of the client's verified certificate (mutual TLS), the resource
the stream a call names ("*" for calls on the whole cluster, the NATS subject for PublishToSubject)
and the action the RPC's name (PublishAsync's requests are "Publish"). A denial is PERMISSION_DENIED,
or a PublishAsync error of that code.

Stricter than Liftbridge, which leaves them unchecked: a publish naming an ``ackInbox`` publishes its
ack to that NATS subject, so it needs PublishToSubject on it too (a stream capturing the subject
would store the ack); the consumer group calls need Subscribe on each stream of the group (the
streams a join names, else those of the group's members), and a group unknown to the metadata is
refused alike, so that a caller without rights learns nothing of what exists."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Protocol

from bascule.h2grpc import Status
from bascule.metadata.state import MetadataState

CLUSTER = "*"

# What a call must be allowed, as (resource, action) pairs, from its request and the metadata;
# None: refused whatever the policy (it names nothing a right could be checked on).
Rights = list[tuple[str, str]] | None


def _named(field: str, action: str) -> Callable[[Any, MetadataState], Rights]:
    return lambda request, _: [(getattr(request, field), action)]


def _on_cluster(action: str) -> Callable[[Any, MetadataState], Rights]:
    return lambda _, __: [(CLUSTER, action)]


def ack_inbox_rights(request: Any) -> list[tuple[str, str]]:
    """An ack published to the request's ``ackInbox`` is a publish to that subject."""
    return [(request.ackInbox, "PublishToSubject")] if request.ackInbox else []


def _joining(request: Any, _: MetadataState) -> Rights:
    return [(stream, "Subscribe") for stream in sorted(set(request.streams))] or None


def _of_group(request: Any, state: MetadataState) -> Rights:
    group = state.groups.get(request.groupId)
    streams = sorted({s for member in group.members.values() for s in member}) if group is not None else []
    return [(stream, "Subscribe") for stream in streams] or None


CHECKS: dict[str, Callable[[Any, MetadataState], Rights]] = {
    "CreateStream": _named("name", "CreateStream"),
    "DeleteStream": _named("name", "DeleteStream"),
    "PauseStream": _named("name", "PauseStream"),
    "SetStreamReadonly": _named("name", "SetStreamReadonly"),
    "FetchMetadata": _on_cluster("FetchMetadata"),
    "FetchPartitionMetadata": _named("stream", "FetchPartitionMetadata"),
    "Publish": lambda request, _: [(request.stream, "Publish"), *ack_inbox_rights(request)],
    "PublishToSubject": lambda request, _: [(request.subject, "PublishToSubject"), *ack_inbox_rights(request)],
    "Subscribe": _named("stream", "Subscribe"),
    "SubscribeBatches": _named("stream", "SubscribeBatches"),
    "SetCursor": _named("stream", "SetCursor"),
    "FetchCursor": _named("stream", "FetchCursor"),
    "Status": _on_cluster("Status"),
    "Partitions": _on_cluster("Partitions"),
    "JoinConsumerGroup": _joining,
    "LeaveConsumerGroup": _of_group,
    "FetchConsumerGroupAssignments": _of_group,
    "ReportConsumerGroupCoordinator": _of_group,
}


class Enforcer(Protocol):
    def enforce(self, *request: str) -> bool: ...


class Authorization:
    def __init__(self, enforcer: Enforcer) -> None:
        self._enforcer = enforcer

    def allows(self, context: Any, resource: str, action: str) -> bool:
        subject = client_name(context)
        return subject is not None and bool(self._enforcer.enforce(subject, resource, action))

    def refusal(self, context: Any, rights: Rights, call: str) -> str | None:
        """Why the call is refused (the first right it lacks), None when every right is there."""
        if rights is None:
            return f"The client is not authorized to call {call}"
        for resource, action in rights:
            if not self.allows(context, resource, action):
                return denial(resource, action)
        return None

    async def check(self, context: Any, rights: Rights, call: str) -> None:
        problem = self.refusal(context, rights, call)
        if problem is not None:
            await context.abort(Status.PERMISSION_DENIED, problem)

    def guard(self, action: str, handler: Callable[..., Any], state: Callable[[], MetadataState]) -> Callable[..., Any]:
        """``handler`` (a unary or server-streaming RPC) run only when the call is allowed."""
        rights_of = CHECKS[action]
        if inspect.isasyncgenfunction(handler):

            async def streaming(request: Any, context: Any) -> Any:
                await self.check(context, rights_of(request, state()), action)
                async for response in handler(request, context):
                    yield response

            return streaming

        async def unary(request: Any, context: Any) -> Any:
            await self.check(context, rights_of(request, state()), action)
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
