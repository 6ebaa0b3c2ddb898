"""Finding the replica a read is served from: this node must lead the partition (or, when the
client allows it, hold a replica of it)."""

from __future__ import annotations

from bascule.api.ports import Cluster, LedPartition, Replicas
from bascule.h2grpc import CallContext, Status


async def readable_partition(
    cluster: Cluster, replicas: Replicas, stream: str, partition: int, context: CallContext,
    allow_isr: bool = False,
) -> LedPartition:
    """The local replica to read ``stream``/``partition`` from, or the call aborted."""
    meta = cluster.state.partition(stream, partition)
    if meta is None:
        await context.abort(Status.NOT_FOUND, "No such partition")
    local = replicas.get(stream, partition)
    leads = meta.leader == cluster.server_id
    if leads and (local is None or not local.replica.is_leader):
        # named leader but not leading yet (just started, or handing back an epoch of an
        # earlier run): its high watermark is not the partition's until it leads
        local = await replicas.until_leading(stream, partition) or replicas.get(stream, partition)
        leads = local is not None and local.replica.is_leader
    # Liftbridge's readISRReplica: any replica here serves what it knows to be committed.
    readable = leads or allow_isr
    if local is None or not readable:
        await context.abort(Status.FAILED_PRECONDITION, "Server not partition leader")
    return local
