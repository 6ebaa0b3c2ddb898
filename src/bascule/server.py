"""The composition root: ``bascule server`` builds a node and its gRPC API from the
configuration, and runs them in one task group until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import io
import logging
import resource
import signal
import sys
import threading
import traceback
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from bascule import logs
from bascule.api.authz import Authorization
from bascule.api.server import add_services
from bascule.config import Config, ConfigError, load_config, overrides_from_args
from bascule.config.model import MetricsConfig
from bascule.config.values import join_host_port
from bascule.h2grpc import GrpcLimits, GrpcServer, server_tls_context
from bascule.listening import naming_listener
from bascule.node.node import Node
from bascule.node.tasks import Tasks

if TYPE_CHECKING:
    from bascule.metrics import GrpcCalls, MetricsServer

log = logging.getLogger("bascule")

GC_THRESHOLD = 50_000
SHUTDOWN_GRACE = 1.0
HANDOFF_TIMEOUT = 5.0  # seconds a stopping node spends handing its partitions over
STOP_REPORT_AFTER = 5.0  # seconds the stop after the handoff may take before it logs where it is


async def run(
    config: Config,
    ready: asyncio.Event | None = None,
    stop: asyncio.Event | None = None,
    nodes: list[Node] | None = None,
    metrics_servers: list[MetricsServer] | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM or until ``stop`` is set; ``ready`` is set once the API serves.

    ``nodes``, when given, receives the running node, and ``metrics_servers`` its metrics endpoint when
    one is configured (for in-process tests). Every task of the
    node is in this call's task group: one that fails stops the server, and the error comes out
    of this call.
    """
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        async with asyncio.TaskGroup() as group:
            await _serve(config, Tasks(group), ready, stop, nodes, metrics_servers)
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


async def _serve(
    config: Config, tasks: Tasks, ready: asyncio.Event | None, stop: asyncio.Event, nodes: list[Node] | None,
    metrics_servers: list[MetricsServer] | None,
) -> None:
    tls = None
    if config.tls.enabled:
        tls = await asyncio.to_thread(server_tls_context, config.tls.cert, config.tls.key, config.tls.client_auth_ca)
    node = Node(config, tasks)
    if nodes is not None:
        nodes.append(node)
    grpc_calls = _grpc_calls(config.metrics)
    server = GrpcServer(ssl_context=tls, observer=None if grpc_calls is None else grpc_calls.observe,
                        limits=grpc_limits_for_open_files(config.grpc))
    metrics = None
    try:
        # The API's port goes into the broker registration, so it is bound before the node starts.
        with naming_listener("the gRPC API", config.listen_host, config.port, "listen, port, -p/--port"):
            port = await server.bind(config.listen_host, config.port)
        if not await _started_unless_stopped(node.start(port), stop):
            log.info("stopped while starting")
            return
        metrics = await _start_metrics(config.metrics, node, grpc_calls)
        if metrics is not None and metrics_servers is not None:
            metrics_servers.append(metrics)
        health = add_services(server, node, node.partitions, node.publishing, node.admin,
                              await asyncio.to_thread(_authorization, config))
        await server.start()
        health.set_serving(True)
        log.info("gRPC API listening on %s:%s", config.listen_host, port)
        if ready is not None:
            ready.set()
        await stop.wait()
        log.info("shutting down")
        health.set_serving(False)
        # Before the API closes: writers are told "not leader" and go to the new leaders at once.
        await node.hand_off_leaderships(HANDOFF_TIMEOUT)
    finally:
        slow_stop = report_a_slow_stop(asyncio.get_running_loop())
        try:
            if metrics is not None:
                await metrics.stop()
            await server.stop(grace=SHUTDOWN_GRACE)
            await node.stop()
        finally:
            slow_stop.cancel()


def report_a_slow_stop(loop: asyncio.AbstractEventLoop, after: float = STOP_REPORT_AFTER) -> threading.Timer:
    """A timer, to be cancelled once the stop is done, that logs every thread's stack and every
    task's of ``loop`` should the stop still run after ``after`` seconds: a stop that hangs says
    where (a node stopped with its NATS and peers once hung past its 10 s, silently). The timer is a
    thread of its own, so a loop stuck in a call still gets reported."""

    def report() -> None:
        names = {thread.ident: thread.name for thread in threading.enumerate()}
        stacks = [f"thread {names.get(ident, ident)}:\n{''.join(traceback.format_stack(frame))}"
                  for ident, frame in sys._current_frames().items()]
        log.warning("still stopping after %g s; each thread is at:\n%s", after, "\n".join(stacks))
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nothing of it is left
            loop.call_soon_threadsafe(_log_tasks, after)

    timer = threading.Timer(after, report)
    timer.daemon = True
    timer.start()
    return timer


def _log_tasks(after: float) -> None:
    stacks = io.StringIO()
    for task in asyncio.all_tasks():
        task.print_stack(file=stacks)
    log.warning("still stopping after %g s; each task is at:\n%s", after, stacks.getvalue())


async def _started_unless_stopped(starting: Coroutine[Any, Any, None], stop: asyncio.Event) -> bool:
    """Whether ``starting`` completed before ``stop`` was set (SIGTERM while the node waits for NATS
    or a join); if not, it is cancelled."""
    start = asyncio.ensure_future(starting)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({start, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if not start.done():
        start.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await start
        return False
    start.result()
    return True


# Imported only where used, as casbin below: each costs megabytes of every node's memory (issue 30).
def _grpc_calls(config: MetricsConfig) -> GrpcCalls | None:
    """The gRPC calls' counts, kept only for a metrics endpoint."""
    if config.port is None:
        return None
    from bascule.metrics import GrpcCalls

    return GrpcCalls()


async def _start_metrics(config: MetricsConfig, node: Node, grpc_calls: GrpcCalls | None) -> MetricsServer | None:
    """The metrics, /healthz and /readyz endpoint, when configured."""
    if config.port is None:
        return None
    from bascule.metrics import MetricsServer

    metrics = MetricsServer(node, grpc_calls)
    with naming_listener("the metrics endpoint", config.host, config.port, "metrics.listen, --metrics-port"):
        await metrics.start(config.host, config.port)
    log.info("metrics, /healthz and /readyz on http://%s", join_host_port(config.host, metrics.port))
    return metrics


def _authorization(config: Config) -> Authorization | None:
    """Liftbridge's tls.client.authz: a Casbin enforcer on the configured model and policy files."""
    if not config.tls.client_authz:
        return None
    import casbin

    return Authorization(casbin.Enforcer(config.tls.client_authz_model, config.tls.client_authz_policy))


def tune_garbage_collector() -> None:
    """Capture allocates a few short-lived objects per message and frees them by reference
    counting; the cycle collector's default of a pass every 700 allocations then costs a
    large share of an append for nothing. Objects alive at start-up are frozen out of it,
    without a full collection first: it found some 25 unreachable objects (5 KB) among the
    39,000 of the imports and cost 10-14 ms of every start."""
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, 20, 20)


def raise_open_files_limit() -> None:
    """The soft limit of open files up to the hard one, as Go's runtime does: the default soft limit
    (often 1024) is below what the gRPC port's connection limit, the log's segments, Raft and NATS
    need together."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(hard, 1 << 20) if hard != resource.RLIM_INFINITY else 1 << 20
    if soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    log.debug("open files limit: %s", resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def grpc_limits_for_open_files(limits: GrpcLimits) -> GrpcLimits:
    """The configured limits, with no more gRPC connections than half the open files the process may
    have: the other half is for the log's segments, Raft and NATS."""
    open_files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if open_files == resource.RLIM_INFINITY or limits.max_connections <= open_files // 2:
        return limits
    log.warning("at most %d gRPC connections (grpc.max.connections is %d): the process may open %d files",
                open_files // 2, limits.max_connections, open_files)
    return dataclasses.replace(limits, max_connections=open_files // 2)


def run_from_args(args: argparse.Namespace, config: Config | None = None) -> int:
    """``bascule server`` with ``args``; ``config``, when given, is what they and the environment
    configure (read already)."""
    if config is None:
        try:
            config = load_config(args.config, overrides_from_args(args))
        except ConfigError as exc:
            print(f"bascule server: {exc}", file=sys.stderr)
            return 2
    logs.configure(config.logging)
    tune_garbage_collector()
    raise_open_files_limit()
    try:
        asyncio.run(run(config))
    except ExceptionGroup as group:  # what failed in the server's task group
        failures = group.subgroup(OSError)
        if failures is None:
            raise
        for failure in failures.exceptions:
            print(f"bascule server: {failure}", file=sys.stderr)
        return 1
    return 0
