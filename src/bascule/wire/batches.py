"""Conversions between Liftbridge's SubscribeRequest and bascule's BatchSubscribeRequest, which
carries the same positions (the batch path reuses Liftbridge's start/stop rules)."""

from __future__ import annotations

from bascule.wire.pb import api_pb2, data_pb2

POSITION_FIELDS = (
    "stream", "partition", "startPosition", "startOffset", "startTimestamp",
    "readISRReplica", "stopPosition", "stopOffset", "stopTimestamp",
)


def as_batch_request(request: api_pb2.SubscribeRequest) -> data_pb2.BatchSubscribeRequest:
    return data_pb2.BatchSubscribeRequest(**{f: getattr(request, f) for f in POSITION_FIELDS})


def as_subscribe_request(request: data_pb2.BatchSubscribeRequest) -> api_pb2.SubscribeRequest:
    return api_pb2.SubscribeRequest(**{f: getattr(request, f) for f in POSITION_FIELDS})
