"""Every RPC of Liftbridge's API, and envelopes on a stream's subject, fed well-formed hostile values
(huge and negative numbers, unknown enum values, control characters and odd unicode in names, huge
header counts): each gets a status or is dropped, none crashes a handler (UNKNOWN is gRPC's word for
an exception the server did not handle) or hangs, and afterwards the node still creates, acks and
serves. The values come from a seeded random.Random; the seed is in every failure message."""

from __future__ import annotations

import asyncio
import os
import random

import grpc
import nats
import pytest
from conftest import running_node
from google.protobuf.descriptor import FieldDescriptor as F

from bascule.client import Client
from bascule.wire import envelope
from bascule.wire.pb import api_pb2, api_pb2_grpc

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]

ROUNDS = int(os.environ.get("BASCULE_HOSTILE_ROUNDS", "150"))
INTS = [0, 1, -1, 7, 2 ** 31 - 1, -(2 ** 31), 2 ** 63 - 1, -(2 ** 63)]
UINTS = [0, 1, 2 ** 64 - 1, 2 ** 63]
NAMES = ["h", "", "nope", "__cursors", "__activity", "a\r\nb", "a b", "\x00", "../../etc", "/abs", "x" * 5000,
         "é\u202e\ufeff", "😀", "a.*", ">", "h.0", "%2e%2e"]
BYTES = [b"", b"v", b"\x00" * 64, bytes(range(256)), b"\xb9\x0e\x43\xb4\x00\x08\x00\x00garbage"]


def hostile_request(rng: random.Random, message_class):
    """A message of ``message_class`` with every scalar field set to a hostile value, recursively."""
    message = message_class()
    for field in message_class.DESCRIPTOR.fields:
        if rng.random() < 0.3:
            continue
        _set(rng, message, field)
    return message


def _set(rng: random.Random, message, field) -> None:
    name = field.name
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        if field.message_type.fields_by_name["value"].type == F.TYPE_BYTES:  # headers: string -> bytes
            headers = getattr(message, name)
            for _ in range(rng.choice([0, 1, 3, 70_000 if rng.random() < 0.05 else 2])):
                headers[rng.choice(NAMES) + str(rng.random())] = rng.choice(BYTES)
        return
    if field.is_repeated:
        values = getattr(message, name)
        for _ in range(rng.choice([0, 1, 5, 2000])):
            if field.type in (F.TYPE_INT32, F.TYPE_SINT32):
                values.append(rng.choice([v for v in INTS if -(2 ** 31) <= v < 2 ** 31]))
            elif field.type == F.TYPE_STRING:
                values.append(rng.choice(NAMES))
        return
    if field.message_type is not None:
        sub = getattr(message, name)
        for sub_field in field.message_type.fields:
            _set(rng, sub, sub_field)
        return
    if field.type in (F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_ENUM):
        value = rng.choice([v for v in INTS if -(2 ** 31) <= v < 2 ** 31] + [99])
    elif field.type in (F.TYPE_INT64, F.TYPE_SINT64):
        value = rng.choice(INTS)
    elif field.type in (F.TYPE_UINT64, F.TYPE_UINT32):
        value = rng.choice(UINTS) if field.type == F.TYPE_UINT64 else rng.choice([0, 1, 2 ** 32 - 1])
    elif field.type == F.TYPE_BOOL:
        value = rng.random() < 0.5
    elif field.type == F.TYPE_STRING:
        value = rng.choice(NAMES)
    elif field.type == F.TYPE_BYTES:
        value = rng.choice(BYTES)
    else:
        return
    setattr(message, name, value)


REQUEST_TYPES = {
    "CreateStream": api_pb2.CreateStreamRequest, "DeleteStream": api_pb2.DeleteStreamRequest,
    "PauseStream": api_pb2.PauseStreamRequest, "SetStreamReadonly": api_pb2.SetStreamReadonlyRequest,
    "FetchMetadata": api_pb2.FetchMetadataRequest, "FetchPartitionMetadata": api_pb2.FetchPartitionMetadataRequest,
    "Publish": api_pb2.PublishRequest, "PublishToSubject": api_pb2.PublishToSubjectRequest,
    "SetCursor": api_pb2.SetCursorRequest, "FetchCursor": api_pb2.FetchCursorRequest,
    "Subscribe": api_pb2.SubscribeRequest, "PublishAsync": api_pb2.PublishRequest,
}
# Publishes may wait for an ack and a subscription for messages: a deadline is their normal end.
MAY_WAIT = {"Publish", "PublishToSubject", "Subscribe", "PublishAsync"}


async def call(stub, rpc: str, request) -> grpc.StatusCode:
    try:
        if rpc == "Subscribe":
            stream = stub.Subscribe(request, timeout=2)
            async for _ in stream:
                pass
        elif rpc == "PublishAsync":
            async def requests():
                yield request
                yield request

            async for _ in stub.PublishAsync(requests(), timeout=3):
                pass
        else:
            await getattr(stub, rpc)(request, timeout=5)
    except grpc.aio.AioRpcError as exc:
        if rpc == "Subscribe" and request.reverse and (exc.code(), exc.details()) == (grpc.StatusCode.UNKNOWN, "EOF"):
            return grpc.StatusCode.OK  # how a reverse read ends past the oldest message, in Liftbridge's words
        if rpc == "PublishToSubject" and (exc.code(), exc.details()) == (grpc.StatusCode.UNKNOWN,
                                                                         "context deadline exceeded"):
            return grpc.StatusCode.DEADLINE_EXCEEDED  # no ack came before the deadline, in Liftbridge's words
        return exc.code()
    return grpc.StatusCode.OK


async def test_hostile_values_in_every_rpc_and_on_stream_subjects_leave_the_node_serving(tmp_path) -> None:
    seed = int(os.environ.get("BASCULE_HOSTILE_SEED", random.randrange(2 ** 32)))
    rng = random.Random(seed)
    print(f"\nhostile RPCs: seed {seed} (BASCULE_HOSTILE_SEED={seed} to replay), {ROUNDS} rounds")
    async with running_node(tmp_path) as (node, address):
        async with Client(address) as client:
            await client.wait_ready()
            await client.create_stream("h", "h")
            seen: dict[str, set[grpc.StatusCode]] = {}
            channel = grpc.aio.insecure_channel(address, options=[("grpc.max_send_message_length", 1 << 26)])
            stub = api_pb2_grpc.APIStub(channel)
            nc = await nats.connect(node._embedded.url)
            try:
                for round_number in range(ROUNDS):
                    rpc = rng.choice(sorted(REQUEST_TYPES))
                    request = hostile_request(rng, REQUEST_TYPES[rpc])
                    code = await asyncio.wait_for(call(stub, rpc, request), 30)
                    seen.setdefault(rpc, set()).add(code)
                    assert code != grpc.StatusCode.UNKNOWN, (
                        f"seed {seed} round {round_number}: {rpc} crashed on {request}"
                    )
                    if rpc not in MAY_WAIT:
                        assert code != grpc.StatusCode.DEADLINE_EXCEEDED, f"seed {seed}: {rpc} hung on {request}"
                    payload = envelope.encode_message(hostile_request(rng, api_pb2.Message), envelope.MsgType.PUBLISH)
                    if len(payload) <= nc.max_payload:
                        await nc.publish("h", payload)
            finally:
                await nc.close()
                await channel.close()
            seen_names = {rpc: sorted(c.name for c in codes) for rpc, codes in seen.items()}
            print("hostile RPCs: status codes seen", seen_names)
            await client.create_stream("after", "after")
            assert (await client.publish("after", b"ok", ack_policy="all")).offset == 0
            assert [m.value async for m in client.subscribe("after", offset=0, stop_latest=True)] == [b"ok"]
