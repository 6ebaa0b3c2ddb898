"""The standard ``grpc.health.v1.Health`` service: SERVING while the server serves, for the empty
service name (the whole server) and for each service it serves by name."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from bascule.h2grpc import Status
from bascule.wire.pb import health_pb2

ServingStatus = health_pb2.HealthCheckResponse.ServingStatus


class Health:
    def __init__(self, services: Iterable[str]) -> None:
        self._services = {"", *services}
        self._serving = False
        self._changed = asyncio.Event()

    def set_serving(self, serving: bool) -> None:
        if serving != self._serving:
            self._serving = serving
            self._changed.set()
            self._changed = asyncio.Event()

    def _status(self, service: str) -> health_pb2.HealthCheckResponse.ServingStatus:
        if service not in self._services:
            return ServingStatus.SERVICE_UNKNOWN
        return ServingStatus.SERVING if self._serving else ServingStatus.NOT_SERVING

    async def Check(self, request, context):
        if request.service not in self._services:
            await context.abort(Status.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=self._status(request.service))

    async def Watch(self, request, context):
        while True:
            changed = self._changed
            yield health_pb2.HealthCheckResponse(status=self._status(request.service))
            await changed.wait()
