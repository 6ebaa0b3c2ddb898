"""A subscription's messages from one broker: bascule's batches of stored entries, or Liftbridge's
Subscribe (one gRPC message per record)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from bascule.client.model import Message, message_from
from bascule.wire.batches import as_batch_request
from bascule.wire.entry import decode_entries
from bascule.wire.pb import api_pb2, api_pb2_grpc, data_pb2_grpc


class APIStub(api_pb2_grpc.APIStub):
    """An API stub that keeps its channel, for bascule's own services on the same connection."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        super().__init__(channel)
        self.channel = channel


async def batches_else_messages(stub: APIStub, request: api_pb2.SubscribeRequest) -> AsyncIterator[Message]:
    try:
        async for message in subscribe_batches(stub, request):
            yield message
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
            raise
        async for message in subscribe_messages(stub, request):  # a Liftbridge server
            yield message


async def subscribe_batches(stub: APIStub, request: api_pb2.SubscribeRequest) -> AsyncIterator[Message]:
    """bascule's batch path: stored entries, many per gRPC message, decoded here."""
    batches = data_pb2_grpc.DataStub(stub.channel).SubscribeBatches(as_batch_request(request))
    stream, partition = request.stream, request.partition
    try:
        async for batch in batches:
            # The server CRC-checked these entries as it read them from its log.
            for entry in decode_entries(batch.entries, check_crc=False):
                headers = entry.headers
                yield Message(
                    stream, partition, entry.offset, entry.timestamp, entry.key, entry.value,
                    headers.get("subject", b"").decode(errors="replace"), headers,
                )
    finally:
        batches.cancel()


async def subscribe_messages(stub: api_pb2_grpc.APIStub, request: api_pb2.SubscribeRequest) -> AsyncIterator[Message]:
    """Liftbridge's Subscribe: one gRPC message per record, after an empty handshake."""
    call = stub.Subscribe(request)
    first = True
    try:
        async for message in call:
            if first:
                first = False
                continue
            yield message_from(message)
    finally:
        call.cancel()
