"""Unary RPCs against a running server: FetchMetadata and Publish (ack LEADER, with a deadline,
so the server waits for the write), each from `--concurrency` grpc.aio callers for `--seconds`.

    python benchmarks/unary.py HOST:PORT STREAM [--seconds 5] [--concurrency 16]

Prints one JSON line: calls/s, p50 and p99 (ms) per RPC. For comparing servers (issue 13: "unary
RPCs: no regression"): run it against each, one at a time, on the same machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import grpc

from bascule.wire.pb import api_pb2, api_pb2_grpc


async def measure(stub: api_pb2_grpc.APIStub, call: str, stream: str, seconds: float, concurrency: int) -> dict:
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def caller() -> None:
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            if call == "FetchMetadata":
                await stub.FetchMetadata(api_pb2.FetchMetadataRequest(streams=[stream]), timeout=10)
            else:
                await stub.Publish(api_pb2.PublishRequest(stream=stream, value=b"x" * 100,
                                                          ackPolicy=api_pb2.AckPolicy.LEADER), timeout=10)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {"calls_per_s": round(len(latencies) / elapsed), "p50_ms": round(1000 * latencies[len(latencies) // 2], 2),
            "p99_ms": round(1000 * latencies[int(0.99 * len(latencies))], 2)}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("address")
    parser.add_argument("stream")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    async with grpc.aio.insecure_channel(args.address) as channel:
        stub = api_pb2_grpc.APIStub(channel)
        result = {call: await measure(stub, call, args.stream, args.seconds, args.concurrency)
                  for call in ("FetchMetadata", "Publish")}
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main())
