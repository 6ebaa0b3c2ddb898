"""Smoke check of the compose cluster from this machine: an RF=3 stream, publishes (gRPC with ack ALL and
plain NATS), reads.  Run: .venv/bin/python compose/check.py   (after podman-compose ... up -d)"""

import asyncio
import sys

import grpc
import nats

from bascule.client import BasculeError, Client

BROKERS = ["127.0.0.1:9292", "127.0.0.1:9293", "127.0.0.1:9294"]
NATS_URL = "nats://127.0.0.1:4222"


async def main() -> int:
    async with Client(BROKERS[0]) as client:
        await client.wait_ready(deadline=30)
        for _ in range(150):  # right after `up -d`, the nodes are still registering
            metadata = await client.fetch_metadata()
            if len(metadata.brokers) == len(BROKERS):
                break
            await asyncio.sleep(0.2)
        print("brokers:", metadata.brokers)
        try:
            await client.create_stream("orders", "orders.in", replication_factor=3)
        except BasculeError as error:
            if error.code != grpc.StatusCode.ALREADY_EXISTS:
                raise
        for _ in range(100):
            partition = (await client.fetch_metadata("orders")).streams["orders"].partitions[0]
            if len(partition.isr) == 3:
                break
            await asyncio.sleep(0.2)
        print("partition:", partition)
        for i in range(3):
            ack = await client.publish("orders", f"order {i}".encode(), ack_policy="all")
            print("acked offset", ack.offset)
    connection = await nats.connect(NATS_URL)
    await connection.publish("orders.in", b"plain NATS publish")
    await connection.drain()
    await asyncio.sleep(0.5)
    async with Client(BROKERS[1]) as client:
        got = [(m.offset, m.value) async for m in client.subscribe("orders", start="earliest", stop_latest=True)]
    print("reads:", got)
    return 0 if len(partition.isr) == 3 and got and got[-1][1] == b"plain NATS publish" else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
