"""Liftbridge's activity stream: on the metadata leader, every stream change (and every join and
leave of a consumer group) the metadata applied
is published to ``__activity`` (subject ``<namespace>.activity``) at least once, in the order the
changes were applied.

The events wait in the metadata state (``MetadataState.activity``) until the leader has published
one and journaled ``activity_published`` for it: a leader that fails between the two has its
successor publish the event again, never skip it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from bascule.config.model import ActivityConfig
from bascule.metadata.raft import MetadataError, MetadataRaft, NoMetadataLeader
from bascule.metadata.state import ALREADY_EXISTS, ActivityEvent
from bascule.node.publishing import PublishPath
from bascule.wire.names import ACTIVITY_STREAM
from bascule.wire.pb import api_pb2
from bascule.wire.policies import ACK_POLICIES

log = logging.getLogger(__name__)

IDLE_POLL = 0.1  # seconds between looks at the metadata while there is nothing to publish
MAX_BACKOFF = 10.0

Call = Callable[..., Awaitable[None]]


class ActivityPublisher:
    def __init__(
        self, config: ActivityConfig, namespace: str, raft: MetadataRaft, call: Call, publishing: PublishPath,
    ) -> None:
        self.config = config
        self.subject = f"{namespace}.activity"
        self.raft = raft
        self.call = call
        self.publishing = publishing

    async def run(self) -> None:
        backoff = 0.0
        while True:
            state = self.raft.state
            if not self.raft.is_leader or not state.activity:
                await asyncio.sleep(IDLE_POLL)
                continue
            try:
                if ACTIVITY_STREAM not in state.streams:
                    await self._create_stream()
                await self._publish(state.activity[0])
                backoff = 0.0
            except (MetadataError, NoMetadataLeader, TimeoutError, ConnectionError) as exc:
                backoff = min(max(backoff * 2, 1.0), MAX_BACKOFF)
                log.warning("activity event %d not published (%r); again in %.0f s",
                            state.activity[0].id, exc, backoff)
                await asyncio.sleep(backoff)

    async def _create_stream(self) -> None:
        try:
            # Every broker holds a replica, as Liftbridge's MaxReplication.
            await self.call("create_stream", name=ACTIVITY_STREAM, subject=self.subject, group="",
                            replication_factor=-1, partitions=1, settings={})
        except MetadataError as exc:
            if exc.code != ALREADY_EXISTS:
                raise

    async def _publish(self, event: ActivityEvent) -> None:
        policy = ACK_POLICIES[self.config.publish_ack_policy]
        message = api_pb2.Message(value=encode_event(event).SerializeToString(), ackPolicy=policy)
        await self.publishing.publish_to_subject(
            self.subject, message, wait=policy != api_pb2.AckPolicy.NONE, timeout=self.config.publish_timeout
        )
        await self.call("activity_published", id=event.id)


def encode_event(event: ActivityEvent) -> api_pb2.ActivityStreamEvent:
    """Liftbridge's ActivityStreamEvent for ``event``."""
    partitions = list(event.partitions)
    ops: dict[str, tuple[api_pb2.ActivityStreamOp, str, Any]] = {
        "create_stream": (api_pb2.CREATE_STREAM, "createStreamOp",
                          api_pb2.CreateStreamOp(stream=event.stream, partitions=partitions)),
        "delete_stream": (api_pb2.DELETE_STREAM, "deleteStreamOp", api_pb2.DeleteStreamOp(stream=event.stream)),
        "pause": (api_pb2.PAUSE_STREAM, "pauseStreamOp",
                  api_pb2.PauseStreamOp(stream=event.stream, partitions=partitions, resumeAll=event.resume_all)),
        "resume": (api_pb2.RESUME_STREAM, "resumeStreamOp",
                   api_pb2.ResumeStreamOp(stream=event.stream, partitions=partitions)),
        "set_readonly": (api_pb2.SET_STREAM_READONLY, "setStreamReadonlyOp",
                         api_pb2.SetStreamReadonlyOp(stream=event.stream, partitions=partitions,
                                                     readonly=event.readonly)),
        "join_consumer_group": (api_pb2.JOIN_CONSUMER_GROUP, "joinConsumerGroupOp",
                                api_pb2.JoinConsumerGroupOp(groupId=event.group, consumerId=event.consumer,
                                                            streams=list(event.streams))),
        "leave_consumer_group": (api_pb2.LEAVE_CONSUMER_GROUP, "leaveConsumerGroupOp",
                                 api_pb2.LeaveConsumerGroupOp(groupId=event.group, consumerId=event.consumer,
                                                              expired=event.expired)),
    }
    op, field, body = ops[event.op]
    return api_pb2.ActivityStreamEvent(id=event.id, op=op, **{field: body})
