"""The table of methods a server serves, read from the services' protobuf descriptors."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor


@dataclass(frozen=True, slots=True)
class Method:
    path: str  # "/package.Service/Method"
    client_streaming: bool
    server_streaming: bool
    decode: Callable[[bytes], Any]
    # (request, context) or (request iterator, context); a coroutine, or an async iterator of
    # responses when server_streaming. A response is a message, bytes already serialized, or
    # Framed: several responses serialized and framed.
    handler: Callable[..., Any]


def service_methods(service: ServiceDescriptor, servicer: object) -> Iterator[Method]:
    """A Method for each RPC of ``service`` that ``servicer`` has an attribute for, named as in
    the proto; the others are left out, so calls to them are UNIMPLEMENTED."""
    for rpc in service.methods:
        handler = getattr(servicer, rpc.name, None)
        if handler is None:
            continue
        request_class = message_factory.GetMessageClass(rpc.input_type)
        yield Method(
            f"/{service.full_name}/{rpc.name}", rpc.client_streaming, rpc.server_streaming,
            request_class.FromString, handler,
        )
