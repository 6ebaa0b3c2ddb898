"""``bascule server``: a node plus its gRPC API, until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
import sys
from pathlib import Path

from bascule.api.service import bind
from bascule.node.config import Config, ConfigError, load_config, overrides_from_args
from bascule.node.node import Node

log = logging.getLogger("bascule")

GC_THRESHOLD = 50_000


async def run(
    config: Config,
    ready: asyncio.Event | None = None,
    stop: asyncio.Event | None = None,
    nodes: list[Node] | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM or until ``stop`` is set; ``ready`` is set once the API serves.

    ``nodes``, when given, receives the running node (for in-process tests).
    """
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    tls = None
    if config.tls.enabled:
        tls = (Path(config.tls.cert).read_bytes(), Path(config.tls.key).read_bytes())
    node = Node(config)
    if nodes is not None:
        nodes.append(node)
    server, port = bind(node, config.listen_host, config.port, tls)
    try:
        await node.start(port)
        await server.start()
        log.info("gRPC API listening on %s:%s", config.listen_host, port)
        if ready is not None:
            ready.set()
        await stop.wait()
        log.info("shutting down")
    finally:
        await server.stop(grace=1.0)
        await node.stop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


def tune_garbage_collector() -> None:
    """Capture allocates a few short-lived objects per message and frees them by reference
    counting; the cycle collector's default of a pass every 700 allocations then costs a
    large share of an append for nothing. Objects alive at start-up are frozen out of it."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, 20, 20)


def run_from_args(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config, overrides_from_args(args))
    except ConfigError as exc:
        print(f"bascule server: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=config.logging.level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("pysyncobj").setLevel(logging.WARNING)
    tune_garbage_collector()
    try:
        asyncio.run(run(config))
    except OSError as exc:
        print(f"bascule server: {exc}", file=sys.stderr)
        return 1
    return 0
