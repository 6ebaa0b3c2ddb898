"""The floor of each Python gRPC server stack, measured with the Node client in one run:
``.venv/bin/python benchmarks/grpc_stacks.py [--count N] [--trials 3]``.

Every server does nothing but answer Subscribe with an empty handshake and then N copies of one
prebuilt 120-byte Message (offset and value set, serialized once), so what it costs per message is
the stack's own cost. The stacks:

- grpcio: grpc.aio, a generic handler without a response serializer yielding the bytes;
- h2grpc: bascule's server (``bascule.h2grpc``, GrpcServer and service_methods over the API's
  descriptor), the servicer yielding the serialized message, once per message;
- h2grpc_framed: the same, yielding ``Framed`` batches of 100 messages framed once;
- grpclib: grpclib's Server with a codec that passes bytes through (when grpclib is installed).

Each server runs in its own process (``grpc_stacks.py --serve STACK``); the trials go round the
stacks in turn, each one ``node grpc_bench.js subscribe`` reading N messages, with the server's CPU
time (utime + stime from /proc/<pid>/stat) counted from GO to the client's result. The table has the
medians: messages per second (the client's, first message to last), the server's and the client's
CPU microseconds per message.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import struct
import sys
import time
from collections.abc import AsyncIterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path[0] = str(Path(__file__).resolve().parents[1])  # as in run.py: benchmarks.* from this checkout
if find_spec("bascule") is None:
    sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "src"))

from benchmarks.harness import READY_TIMEOUT, REPO_ROOT, BenchError, log  # noqa: E402
from benchmarks.node_client import NodeSetup, node_subscribe, prepare  # noqa: E402
from benchmarks.workers import worker_env  # noqa: E402

STACKS = ("grpcio", "h2grpc", "h2grpc_framed", "grpclib")
MESSAGE_BYTES = 120
OFFSET = 123_456
BATCH = 100
WARMUP = 2_000
SELF = Path(__file__).resolve()


def prebuilt_message() -> bytes:
    """A Message with offset and value set, serialized: MESSAGE_BYTES long."""
    from bascule.wire.pb import api_pb2

    for size in range(MESSAGE_BYTES):
        data = api_pb2.Message(offset=OFFSET, value=b"x" * size).SerializeToString()
        if len(data) == MESSAGE_BYTES:
            return data
    raise AssertionError(f"no value size makes a {MESSAGE_BYTES}-byte Message")


def framed(messages: list[bytes]) -> bytes:
    """gRPC's framing: each message after a 5-byte prefix (not compressed, length big-endian)."""
    return b"".join(struct.pack(">BI", 0, len(m)) + m for m in messages)


# --- the servers (each in its own process) --------------------------------------------------------


async def serve_grpcio(port: int, count: int, message: bytes) -> AsyncIterator[None]:
    import grpc

    from bascule.wire.pb import api_pb2

    async def subscribe(request: Any, context: Any) -> AsyncIterator[bytes]:
        yield b""  # the handshake: an empty Message
        for _ in range(count):
            yield message

    handler = grpc.method_handlers_generic_handler("proto.API", {
        # no response_serializer: the bytes go out as they are
        "Subscribe": grpc.unary_stream_rpc_method_handler(
            subscribe, request_deserializer=api_pb2.SubscribeRequest.FromString),
    })
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    try:
        yield
    finally:
        await server.stop(0)


async def serve_h2grpc(port: int, count: int, message: bytes, batched: bool) -> AsyncIterator[None]:
    from bascule.h2grpc import Framed, GrpcServer, service_methods
    from bascule.wire.pb import api_pb2

    batch = Framed(framed([message] * BATCH))
    rest = Framed(framed([message] * (count % BATCH)))

    class Floor:
        async def Subscribe(self, request: Any, context: Any) -> AsyncIterator[bytes]:  # noqa: N802 - the RPC's name
            yield b""  # the handshake: an empty Message
            if batched:
                for _ in range(count // BATCH):
                    yield batch
                if rest:
                    yield rest
            else:
                for _ in range(count):
                    yield message

    server = GrpcServer()
    await server.bind("127.0.0.1", port)
    server.add(service_methods(api_pb2.DESCRIPTOR.services_by_name["API"], Floor()))
    await server.start()
    try:
        yield
    finally:
        await server.stop(grace=0)


async def serve_grpclib(port: int, count: int, message: bytes) -> AsyncIterator[None]:
    from grpclib.const import Cardinality, Handler
    from grpclib.encoding.proto import ProtoCodec
    from grpclib.server import Server

    from bascule.wire.pb import api_pb2

    class PassBytes(ProtoCodec):
        """Bytes as they are, messages serialized."""

        def encode(self, message: Any, message_type: Any) -> bytes:
            return message if isinstance(message, bytes) else super().encode(message, message_type)

    class Floor:
        async def subscribe(self, stream: Any) -> None:
            await stream.recv_message()
            await stream.send_message(b"")  # the handshake: an empty Message
            send = stream.send_message
            for _ in range(count):
                await send(message)

        def __mapping__(self) -> dict[str, Handler]:
            return {"/proto.API/Subscribe": Handler(self.subscribe, Cardinality.UNARY_STREAM,
                                                    api_pb2.SubscribeRequest, api_pb2.Message)}

    server = Server([Floor()], codec=PassBytes())
    await server.start("127.0.0.1", port)
    try:
        yield
    finally:
        server.close()
        await server.wait_closed()


async def serve(stack: str, port: int, count: int) -> None:
    """Serve until stdin closes; READY on stdout once listening."""
    message = prebuilt_message()
    servers = {
        "grpcio": lambda: serve_grpcio(port, count, message),
        "h2grpc": lambda: serve_h2grpc(port, count, message, batched=False),
        "h2grpc_framed": lambda: serve_h2grpc(port, count, message, batched=True),
        "grpclib": lambda: serve_grpclib(port, count, message),
    }
    async with contextlib.asynccontextmanager(servers[stack])():
        print("READY", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


def serve_main(stack: str, port: int, count: int) -> int:
    # bascule's server process tunes its garbage collector so; every stack gets the same
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)
    asyncio.run(serve(stack, port, count))
    return 0


# --- the run --------------------------------------------------------------------------------------


class StackServer:
    """One stack's server process."""

    def __init__(self, stack: str, port: int, count: int) -> None:
        self.stack, self.port, self.count = stack, port, count
        self.process: asyncio.subprocess.Process | None = None
        self._errors: asyncio.Task[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, str(SELF), "--serve", self.stack, "--port", str(self.port),
            "--count", str(self.count), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, cwd=REPO_ROOT, env=worker_env(),
        )
        assert self.process.stdout is not None and self.process.stderr is not None
        self._errors = asyncio.create_task(self.process.stderr.read())  # drained: a full pipe would block it
        try:
            line = await asyncio.wait_for(self.process.stdout.readline(), READY_TIMEOUT)
        except TimeoutError:
            line = b""
        if line.strip() != b"READY":
            self.process.kill()
            errors = await self._errors
            raise BenchError(f"{self.stack} server did not start: {errors.decode(errors='replace')[-2000:]}")

    async def stop(self) -> None:
        if self.process is None or self.process.returncode is not None:
            return
        assert self.process.stdin is not None
        self.process.stdin.close()  # its signal to stop
        try:
            await asyncio.wait_for(self.process.wait(), 5)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
        if self._errors is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._errors, 5)


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def format_table(rows: list[dict[str, Any]], count: int, trials: int) -> str:
    header = (f"{'stack':<15} {'msg/s':>10} {'±':>5} {'server us/msg':>14} {'client us/msg':>14} "
              f"{'first ms':>9}  trials (msg/s)")
    out = [f"Subscribe floor: {count:,} prebuilt {MESSAGE_BYTES}-byte messages per trial, {trials} trial(s), "
           f"Node @grpc/grpc-js client; medians", header, "-" * len(header)]
    for row in rows:
        if row.get("skipped"):
            out.append(f"{row['stack']:<15} skipped: {row['skipped']}")
            continue
        rates = [t["rate"] for t in row["trials"]]
        if not rates:
            out.append(f"{row['stack']:<15} failed: {row['errors'][0] if row['errors'] else '?'}")
            continue
        rate = median(rates)
        assert rate is not None
        spread = f"{50 * (max(rates) - min(rates)) / rate:.0f}%" if len(rates) > 1 else ""
        server = median([t["server_cpu_us_per_msg"] for t in row["trials"]])
        client = median([t["client_cpu_us_per_msg"] for t in row["trials"]])
        first = median([t["first_ms"] for t in row["trials"]])
        out.append(f"{row['stack']:<15} {rate:>10,.0f} {spread:>5} {server:>14.2f} {client:>14.2f} {first:>9.1f}  "
                   + ", ".join(f"{r:,.0f}" for r in rates)
                   + (f"  ({len(row['errors'])} failed: {row['errors'][0]})" if row["errors"] else ""))
    out.append("±: half the range (max - min) as % of the median; server us/msg: the server process's CPU "
               "time (utime + stime) per message; client us/msg: the Node client's")
    return "\n".join(out)


async def measure(args: argparse.Namespace) -> int:
    from bascule.testing import free_port

    setup: NodeSetup = await prepare()
    if not setup.ok:
        print(f"grpc_stacks: the Node client cannot run: {setup.reason}", file=sys.stderr)
        return 2
    stacks = [s.strip() for s in args.stacks.split(",") if s.strip()]
    rows: dict[str, dict[str, Any]] = {s: {"stack": s, "trials": [], "errors": []} for s in stacks}
    if "grpclib" in stacks and find_spec("grpclib") is None:
        rows["grpclib"]["skipped"] = "grpclib is not installed (pip install grpclib)"
    servers = {s: StackServer(s, free_port(), args.count) for s in stacks if not rows[s].get("skipped")}
    timeout = 30 + args.count / 1000
    try:
        for stack, server in servers.items():
            try:
                await server.start()
            except BenchError as exc:
                rows[stack]["skipped"] = str(exc)
        live = {s: server for s, server in servers.items() if not rows[s].get("skipped")}
        log(f"grpc_stacks: servers up: {', '.join(f'{s} (pid {v.pid})' for s, v in live.items())}; "
            f"node {setup.versions.get('node')}, @grpc/grpc-js {setup.versions.get('@grpc/grpc-js')}")
        for server in live.values():  # warm-up, not counted
            with contextlib.suppress(BenchError):
                await node_subscribe(setup, server.address, "floor", min(WARMUP, args.count), [server.pid], timeout)
            await asyncio.sleep(0.5)
        for trial in range(1, args.trials + 1):
            for stack, server in live.items():
                try:
                    result = await node_subscribe(setup, server.address, "floor", args.count, [server.pid], timeout)
                except BenchError as exc:
                    log(f"grpc_stacks: {stack} trial {trial} FAILED: {exc}")
                    rows[stack]["errors"].append(str(exc).splitlines()[0])
                    continue
                rows[stack]["trials"].append(result)
                log(f"grpc_stacks: {stack} trial {trial}: {result['rate']:,.0f} msg/s, server "
                    f"{result['server_cpu_us_per_msg']:.2f} us/msg, "
                    f"client {result['client_cpu_us_per_msg']:.2f} us/msg")
                await asyncio.sleep(0.5)
    finally:
        await asyncio.gather(*(server.stop() for server in servers.values()))
    print(format_table(list(rows.values()), args.count, args.trials))
    return 0 if all(row["trials"] and not row["errors"] for row in rows.values() if not row.get("skipped")) else 1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/grpc_stacks.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=200_000, help="messages per trial (default 200,000)")
    parser.add_argument("--trials", type=int, default=3, help="trials per stack (default 3)")
    parser.add_argument("--stacks", default=",".join(STACKS), help=f"comma-separated (default {','.join(STACKS)})")
    parser.add_argument("--serve", choices=STACKS, help=argparse.SUPPRESS)  # a server process
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return serve_main(args.serve, args.port, args.count)
    started = time.monotonic()
    status = asyncio.run(measure(args))
    log(f"grpc_stacks: {time.monotonic() - started:.0f} s")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
