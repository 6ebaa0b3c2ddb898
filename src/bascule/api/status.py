"""How failures reach gRPC clients: Liftbridge's status codes and messages, because existing
clients branch on them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import TypeVar

from bascule.h2grpc import CallContext, Status
from bascule.metadata.raft import MetadataError, NoMetadataLeader
from bascule.partition.encryption import EncryptionUnavailable
from bascule.partition.replica import NotLeader, PartitionClosed
from bascule.wire.names import RESERVED_STREAMS

log = logging.getLogger(__name__)

T = TypeVar("T")

NO_LEADER = "no known metadata leader"
UNAVAILABLE = "unavailable"  # how a transient failure's message starts (PublishAsync has no such code)

METADATA_CODES = {
    "NOT_FOUND": Status.NOT_FOUND,
    "ALREADY_EXISTS": Status.ALREADY_EXISTS,
    "INVALID_ARGUMENT": Status.INVALID_ARGUMENT,
    "FAILED_PRECONDITION": Status.FAILED_PRECONDITION,
}


async def metadata_call(context: CallContext, proposal: Awaitable[T]) -> T:
    """Await a metadata change, and what it returns; its refusal aborts the call with the matching status."""
    try:
        return await proposal
    except MetadataError as exc:
        await context.abort(METADATA_CODES.get(exc.code, Status.INTERNAL), exc.message)
    except NoMetadataLeader:
        # Liftbridge's words, but UNAVAILABLE: clients retry that, and it is transient.
        await context.abort(Status.UNAVAILABLE, NO_LEADER)
    raise AssertionError("unreachable: abort raises")


async def refuse_internal_stream(name: str, context: CallContext) -> None:
    """The internal streams (cursors) are the server's own: clients may not delete or stop them."""
    if name in RESERVED_STREAMS:
        await context.abort(Status.INVALID_ARGUMENT, "Stream is reserved")  # Liftbridge's words


class PublishError(Exception):
    def __init__(self, status: Status, message: str, async_code: str) -> None:
        super().__init__(message)
        self.status, self.message, self.async_code = status, message, async_code


def publish_failure(error: BaseException) -> PublishError:
    """What a client is told about a publish that failed with ``error``: transient failures
    (no leader yet, leadership moving, an ack that did not come in time) are UNAVAILABLE (async
    code UNKNOWN, message "unavailable: ..."), which clients retry."""
    if isinstance(error, PublishError):
        return error
    if isinstance(error, MetadataError):
        status = METADATA_CODES.get(error.code, Status.INTERNAL)
        async_code = "NOT_FOUND" if status is Status.NOT_FOUND else "BAD_REQUEST"
        return PublishError(status, error.message, async_code)
    if isinstance(error, NoMetadataLeader):
        return PublishError(Status.UNAVAILABLE, f"{UNAVAILABLE}: {NO_LEADER}", "UNKNOWN")
    if isinstance(error, TimeoutError):  # asyncio.TimeoutError is TimeoutError since 3.11
        return PublishError(Status.UNAVAILABLE, f"{UNAVAILABLE}: timed out waiting for the ack", "UNKNOWN")
    if isinstance(error, (PartitionClosed, NotLeader, asyncio.CancelledError)):
        return PublishError(Status.UNAVAILABLE, f"{UNAVAILABLE}: {error}", "UNKNOWN")
    if isinstance(error, OSError):
        # The leader's disk refused the write (full, say): it hands the partition to another ISR
        # member (node.maintenance), so a retry finds a leader that can store it.
        return PublishError(Status.UNAVAILABLE, f"{UNAVAILABLE}: the leader could not store it: {error}",
                            "UNKNOWN")
    if isinstance(error, EncryptionUnavailable):  # Liftbridge's code and words (Publish: INTERNAL)
        return PublishError(Status.INTERNAL, f"encryption failed on partition: {error}", "ENCRYPTION_FAILED")
    if isinstance(error, ValueError):  # a record the log cannot encode
        return PublishError(Status.INVALID_ARGUMENT, f"bad message: {error}", "BAD_REQUEST")
    log.error("publish failed", exc_info=error)
    return PublishError(Status.INTERNAL, f"publish failed: {error}", "INTERNAL")
