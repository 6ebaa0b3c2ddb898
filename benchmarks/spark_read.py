"""Spark batch-read throughput of the bascule data source next to the raw gRPC subscribe rate.

    .venv/bin/python benchmarks/spark_read.py                      # 200k 100-byte messages, 3 partitions
    .venv/bin/python benchmarks/spark_read.py --messages 50000 --repeat 2

Starts a one-node bascule (embedded NATS) unless --brokers names one, fills a stream through plain
NATS publishes, then times, on the same data:

- raw: bascule's async client subscribing to every partition at once, in this one process;
- spark: `spark.read.format("bascule")` materialized through the `noop` sink (every column
  converted, nothing written), local[N] (default local[2]), after one warm-up read that starts
  Spark's Python workers.

It prints messages/s for each, best and median of --repeat runs, and spark/raw.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid

import nats

from bascule.client import Client
from bascule.testing.local import LocalCluster


async def fill(broker: str, nats_url: str, stream: str, partitions: int, messages: int, size: int) -> None:
    async with Client(broker) as client:
        await client.create_stream(stream, f"{stream}.in", partitions=partitions)
        nc = await nats.connect(nats_url)
        payload = b"x" * size
        subjects = [f"{stream}.in" if p == 0 else f"{stream}.in.{p}" for p in range(partitions)]
        for i in range(messages):
            await nc.publish(subjects[i % partitions], payload)
            if i % 20_000 == 0:
                await nc.flush()
        await nc.flush()
        await nc.drain()
        wanted = [len(range(p, messages, partitions)) - 1 for p in range(partitions)]
        deadline = time.monotonic() + 300
        for p in range(partitions):
            while (await client.fetch_partition_metadata(stream, p)).high_watermark < wanted[p]:
                if time.monotonic() > deadline:
                    raise SystemExit(f"partition {p} never got its {wanted[p] + 1} messages")
                await asyncio.sleep(0.1)


async def raw_read(broker: str, stream: str, partitions: int) -> int:
    async with Client(broker) as client:
        ends = [(await client.fetch_partition_metadata(stream, p)).high_watermark for p in range(partitions)]

        async def one(p: int) -> int:
            count = 0
            async for _ in client.subscribe(stream, p, offset=0, stop_offset=ends[p]):
                count += 1
            return count

        return sum(await asyncio.gather(*(one(p) for p in range(partitions))))


def rate(count: int, seconds: list[float]) -> tuple[float, float]:
    return count / min(seconds), count / statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100, help="bytes per message")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--brokers", help="an existing bascule (host:port); with --nats-url")
    parser.add_argument("--nats-url")
    args = parser.parse_args()

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    cluster = None
    if args.brokers:
        broker, nats_url = args.brokers, args.nats_url
    else:
        cluster = LocalCluster(1, embedded_nats=True).start()
        broker, nats_url = cluster.brokers[0], cluster.nats_url
    try:
        stream = f"bench-{uuid.uuid4().hex[:6]}"
        started = time.perf_counter()
        asyncio.run(fill(broker, nats_url, stream, args.partitions, args.messages, args.size))
        print(f"filled {stream}: {args.messages} x {args.size} B in {args.partitions} partitions "
              f"({time.perf_counter() - started:.1f} s)")

        raw_times = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            count = asyncio.run(raw_read(broker, stream, args.partitions))
            raw_times.append(time.perf_counter() - started)
            assert count == args.messages, count

        from pyspark.sql import SparkSession

        from bascule.spark import BasculeDataSource

        started = time.perf_counter()
        spark = (
            SparkSession.builder.master(args.master).config("spark.ui.enabled", "false")
            .config("spark.driver.host", "127.0.0.1").config("spark.ui.showConsoleProgress", "false").getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        spark.dataSource.register(BasculeDataSource)
        print(f"SparkSession {args.master} started in {time.perf_counter() - started:.1f} s")
        df = spark.read.format("bascule").option("brokers", broker).option("stream", stream).load()
        started = time.perf_counter()
        assert df.count() == args.messages
        print(f"warm-up read (count, starts the Python workers) {time.perf_counter() - started:.1f} s")
        spark_times = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            df.write.format("noop").mode("overwrite").save()
            spark_times.append(time.perf_counter() - started)
        spark.stop()

        raw_best, raw_median = rate(args.messages, raw_times)
        spark_best, spark_median = rate(args.messages, spark_times)
        print(f"load average at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
        print(f"{'':34}{'best':>12}{'median':>12}")
        print(f"{'raw gRPC subscribe (1 process)':34}{raw_best:>10,.0f}/s{raw_median:>10,.0f}/s")
        print(f"{'Spark read, ' + args.master + ' (noop sink)':34}{spark_best:>10,.0f}/s{spark_median:>10,.0f}/s")
        print(f"{'spark / raw':34}{spark_best / raw_best:>12.2f}{spark_median / raw_median:>12.2f}")
    finally:
        if cluster is not None:
            cluster.stop()


if __name__ == "__main__":
    main()
