"""What runs inside a load process: ``python -m benchmarks.worker_process KIND SPEC``.

A worker connects, prints READY, waits for GO on stdin, does its KIND of work as SPEC (JSON) says, and
prints one line: RESULT and a JSON object, or ERROR and why (the traceback goes to stderr, its log).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from bascule.natsio.flush import flush
from benchmarks.harness import STREAM_SUBJECT_PREFIX, now


def emit(tag: str, payload: Any = None) -> None:
    sys.stdout.write(tag + ("" if payload is None else " " + json.dumps(payload)) + "\n")
    sys.stdout.flush()


async def wait_go() -> float:
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    if line.strip() != "GO":
        raise SystemExit(3)  # the harness went away
    return now()


def percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def latency_summary(values: list[float]) -> dict[str, float]:
    values.sort()
    return {"p50_ms": 1000 * percentile(values, 0.50), "p99_ms": 1000 * percentile(values, 0.99),
            "max_ms": 1000 * (values[-1] if values else float("nan"))}


async def nats_connect(url: str) -> Any:
    import nats

    return await nats.connect(url, max_reconnect_attempts=-1, pending_size=64 * 1024 * 1024)


class Reception:
    """Counts received messages: when the first came, and `done` once `count` have."""

    def __init__(self, count: int) -> None:
        self.count, self.received, self.first, self.end = count, 0, 0.0, 0.0
        self.done = asyncio.get_running_loop().create_future()

    def got_one(self) -> bool:
        """One more message; True once the count is reached."""
        self.received += 1
        if self.received == 1:
            self.first = now()
        if self.received >= self.count and not self.done.done():
            self.end = now()
            self.done.set_result(None)
        return self.done.done()

    async def on_message(self, msg: Any) -> None:
        self.got_one()

    def result(self) -> dict[str, Any]:
        return {"first": self.first, "end": self.end, "received": self.received}


class AckTally:
    """The outcomes of `count` pipelined publishes, each a future: latencies, failures, and `finished`
    (the time of the last) once every one is settled."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.settled = 0
        self.latencies: list[float] = []
        self.errors = 0
        self.first_error: str | None = None
        self.finished: asyncio.Future[float] = asyncio.get_running_loop().create_future()

    def track(self, outcome: asyncio.Future[Any], sent_at: float) -> None:
        outcome.add_done_callback(lambda future: self._settle(future, now() - sent_at))

    def _settle(self, future: asyncio.Future[Any], latency: float) -> None:
        failure = "cancelled" if future.cancelled() else future.exception()
        if failure is None:
            self.latencies.append(latency)
        else:
            self.errors += 1
            self.first_error = self.first_error or repr(failure)
        self.settled += 1
        if self.settled == self.count and not self.finished.done():
            self.finished.set_result(now())

    def result(self, start: float, end: float) -> dict[str, Any]:
        return {"start": start, "end": end, "acked": len(self.latencies), "errors": self.errors,
                "first_error": self.first_error, **latency_summary(self.latencies)}


async def worker_nats_pub(spec: dict[str, Any]) -> dict[str, Any]:
    """Plain core-NATS publishes, round-robin over the subjects, then a flush."""
    nc = await nats_connect(spec["url"])
    subjects, count = spec["subjects"], spec["count"]
    payload = b"x" * spec["size"]
    emit("READY")
    start = await wait_go()
    publish = nc.publish
    if len(subjects) == 1:
        subject = subjects[0]
        for _ in range(count):
            await publish(subject, payload)
    else:
        k = len(subjects)
        for i in range(count):
            await publish(subjects[i % k], payload)
    await flush(nc, timeout=600)
    end = now()
    await nc.close()
    return {"start": start, "end": end, "count": count}


async def worker_nats_sub(spec: dict[str, Any]) -> dict[str, Any]:
    nc = await nats_connect(spec["url"])
    count = spec["count"]
    reception = Reception(count)
    await nc.subscribe(spec["subject"], cb=reception.on_message, pending_msgs_limit=count + 10,
                       pending_bytes_limit=count * 512 + (1 << 20))
    await flush(nc)
    emit("READY")
    await wait_go()
    await reception.done
    await nc.close()
    return reception.result()


async def worker_bascule_acked_grpc(spec: dict[str, Any]) -> dict[str, Any]:
    """PublishAsync with ack ALL, at most `window` requests unacknowledged."""
    import grpc

    from bascule.wire.pb import api_pb2, api_pb2_grpc

    count, window = spec["count"], spec["window"]
    payload = b"x" * spec["size"]
    channel = grpc.aio.insecure_channel(spec["address"])
    stub = api_pb2_grpc.APIStub(channel)
    await stub.FetchMetadata(api_pb2.FetchMetadataRequest(), timeout=10)
    sent = [0.0] * count
    latencies: list[float] = []
    slots = asyncio.Semaphore(window)
    errors, first_error = 0, None
    emit("READY")
    start = await wait_go()

    async def requests() -> AsyncIterator[api_pb2.PublishRequest]:
        for i in range(count):
            await slots.acquire()
            sent[i] = now()
            yield api_pb2.PublishRequest(stream=spec["stream"], partition=spec["partition"], value=payload,
                                         ackPolicy=api_pb2.AckPolicy.ALL, correlationId=str(i))

    call = stub.PublishAsync(requests())
    done = 0
    async for response in call:
        received = now()
        if response.HasField("asyncError"):
            errors += 1
            first_error = first_error or response.asyncError.message
        else:
            latencies.append(received - sent[int(response.correlationId)])
        slots.release()
        done += 1
        if done == count:
            break
    end = now()
    call.cancel()
    await channel.close()
    return {"start": start, "end": end, "acked": len(latencies), "errors": errors, "first_error": first_error,
            **latency_summary(latencies)}


async def worker_bascule_acked_nats(spec: dict[str, Any]) -> dict[str, Any]:
    """Liftbridge publish envelopes on the partition subject, ack ALL to an inbox, `window` in flight."""
    from bascule.wire import envelope
    from bascule.wire.pb import api_pb2

    # Hand-rolled rather than on bascule.natsio.publisher.EnvelopePublisher.send(): side by side (R3,
    # 50,000 publishes, 6 runs each), its future per publish and Ack decoded per ack took this process
    # 60 % more CPU per message and the benchmark a fifth of its rate.
    nc = await nats_connect(spec["url"])
    count, window = spec["count"], spec["window"]
    payload = b"x" * spec["size"]
    prefix = f"_INBOX.benchack.{uuid.uuid4().hex[:12]}."
    sent = [0.0] * count
    latencies: list[float] = []
    slots = asyncio.Semaphore(window)
    finished = asyncio.get_running_loop().create_future()
    state = {"acked": 0, "bad": 0}
    cut = len(prefix)

    async def on_ack(msg: Any) -> None:
        received = now()
        index = int(msg.subject[cut:])
        if state["acked"] == 0:  # check one ack in full
            ack = envelope.decode_message(msg.data, envelope.MsgType.ACK, api_pb2.Ack)
            if ack.correlationId != str(index):
                state["bad"] += 1
        latencies.append(received - sent[index])
        state["acked"] += 1
        slots.release()
        if state["acked"] == count and not finished.done():
            finished.set_result(received)

    await nc.subscribe(prefix + "*", cb=on_ack, pending_msgs_limit=count + 10)
    await flush(nc)
    emit("READY")
    start = await wait_go()
    subject = spec["subject"]
    header = envelope.header(envelope.MsgType.PUBLISH)
    for i in range(count):
        await slots.acquire()
        message = api_pb2.Message(value=payload, ackInbox=f"{prefix}{i}", correlationId=str(i),
                                  ackPolicy=api_pb2.AckPolicy.ALL)
        sent[i] = now()
        await nc.publish(subject, header + message.SerializeToString())
    end = await finished
    await nc.close()
    return {"start": start, "end": end, "acked": state["acked"], "errors": state["bad"],
            "first_error": "ack with a wrong correlation id" if state["bad"] else None,
            **latency_summary(latencies)}


async def worker_js_acked(spec: dict[str, Any]) -> dict[str, Any]:
    """js.publish_async with at most `window` publishes pending."""
    nc = await nats_connect(spec["url"])
    count = spec["count"]
    js = nc.jetstream(publish_async_max_pending=spec["window"])
    payload = b"x" * spec["size"]
    tally = AckTally(count)
    emit("READY")
    start = await wait_go()
    subject = spec["subject"]
    for _ in range(count):
        sent_at = now()
        tally.track(await js.publish_async(subject, payload), sent_at)
    end = await tally.finished
    await nc.close()
    return tally.result(start, end)


async def worker_bascule_consume(spec: dict[str, Any]) -> dict[str, Any]:
    from bascule.client import Client

    reception = Reception(spec["count"])
    async with Client(spec["address"]) as client:
        await client.fetch_metadata()
        emit("READY")
        start = await wait_go()
        async for _ in client.subscribe(spec["stream"], spec["partition"], start="earliest"):
            if reception.got_one():
                break
    return {"start": start, **reception.result()}


async def worker_bascule_consume_grpc(spec: dict[str, Any]) -> dict[str, Any]:
    """Liftbridge's Subscribe as any Liftbridge client calls it: one gRPC message per record."""
    import grpc

    from bascule.wire.pb import api_pb2, api_pb2_grpc

    reception = Reception(spec["count"])
    channel = grpc.aio.insecure_channel(spec["address"])
    stub = api_pb2_grpc.APIStub(channel)
    await stub.FetchMetadata(api_pb2.FetchMetadataRequest(), timeout=10)
    emit("READY")
    start = await wait_go()
    request = api_pb2.SubscribeRequest(stream=spec["stream"], partition=spec["partition"],
                                       startPosition=api_pb2.StartPosition.EARLIEST)
    call = stub.Subscribe(request)
    handshake = True  # Liftbridge's first message is an empty one
    async for _ in call:
        if handshake:
            handshake = False
        elif reception.got_one():
            break
    call.cancel()
    await channel.close()
    return {"start": start, **reception.result()}


async def worker_grpc_floor_server(spec: dict[str, Any]) -> dict[str, Any]:
    """A Liftbridge API server whose Subscribe streams one prebuilt Message `count` times and whose
    PublishAsync acks each request at once."""
    import grpc

    from bascule.wire.pb import api_pb2, api_pb2_grpc

    message = api_pb2.Message(offset=123456, value=b"x" * spec["size"], timestamp=time.time_ns(), stream="floor",
                              subject=f"{STREAM_SUBJECT_PREFIX}.floor", headers={})

    class FloorAPI(api_pb2_grpc.APIServicer):
        async def FetchMetadata(self, request: Any, context: Any) -> Any:
            return api_pb2.FetchMetadataResponse()

        async def Subscribe(self, request: Any, context: Any) -> AsyncIterator[Any]:
            yield api_pb2.Message()
            for _ in range(spec["count"]):
                yield message

        async def PublishAsync(self, requests: Any, context: Any) -> AsyncIterator[Any]:
            async for request in requests:
                ack = api_pb2.Ack(stream=request.stream, offset=1, correlationId=request.correlationId,
                                  ackPolicy=request.ackPolicy)
                yield api_pb2.PublishResponse(ack=ack, correlationId=request.correlationId)

    server = grpc.aio.server()
    api_pb2_grpc.add_APIServicer_to_server(FloorAPI(), server)
    server.add_insecure_port(f"127.0.0.1:{spec['port']}")
    await server.start()
    emit("READY")
    await wait_go()
    await server.wait_for_termination()
    return {}


async def worker_js_consume(spec: dict[str, Any]) -> dict[str, Any]:
    nc = await nats_connect(spec["url"])
    js = nc.jetstream()
    count = spec["count"]
    reception = Reception(count)
    await js.account_info()
    emit("READY")
    start = await wait_go()
    await js.subscribe(spec["subject"], cb=reception.on_message, ordered_consumer=True,
                       pending_msgs_limit=count + 10, pending_bytes_limit=count * 1024 + (1 << 20))
    await reception.done
    await nc.close()
    return {"start": start, **reception.result()}


WORKERS: dict[str, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]] = {
    "nats_pub": worker_nats_pub,
    "nats_sub": worker_nats_sub,
    "bascule_acked_grpc": worker_bascule_acked_grpc,
    "bascule_acked_nats": worker_bascule_acked_nats,
    "js_acked": worker_js_acked,
    "bascule_consume": worker_bascule_consume,
    "bascule_consume_grpc": worker_bascule_consume_grpc,
    "grpc_floor_server": worker_grpc_floor_server,
    "js_consume": worker_js_consume,
}


def worker_main(argv: list[str]) -> int:
    kind, spec = argv[0], json.loads(argv[1])
    try:
        import uvloop  # the harness measures with it when installed

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    try:
        result = runner(WORKERS[kind](spec))
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - the harness gets one line, the log the traceback
        traceback.print_exc()
        emit("ERROR", f"{type(exc).__name__}: {exc}")
        return 1
    emit("RESULT", result)
    return 0


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
