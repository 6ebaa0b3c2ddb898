"""bascule's async Python client (Liftbridge's gRPC API, go-liftbridge v2 its model); docs/client.md.

    async with Client(["127.0.0.1:9292", "127.0.0.1:9293"]) as client:
        await client.create_stream("orders", "orders.in", partitions=3, settings=StreamSettings(min_isr=2))
        ack = await client.publish("orders", b"hello", key=b"customer-7", partitioner=partition_by_key)
        async for message in client.subscribe("orders", ack.partition, start="earliest"):
            ...
"""

from bascule.client.core import DEFAULT_RESUBSCRIBE_WAIT, Client, _as_dict
from bascule.client.groups import Consumer
from bascule.client.model import (
    Ack,
    Assignments,
    BasculeError,
    GroupInfo,
    Membership,
    Message,
    Metadata,
    PartitionInfo,
    StreamInfo,
)
from bascule.client.partitioners import Partitioner, RoundRobin, partition_by_key
from bascule.client.reading import subscribe_batches as _subscribe_batches
from bascule.client.reading import subscribe_messages as _subscribe_messages
from bascule.client.settings import StreamSettings
from bascule.client.tls import ClientTls
from bascule.wire.dedup import MESSAGE_ID_HEADER
from bascule.wire.policies import ACK_POLICIES, START_POSITIONS

__all__ = [
    "ACK_POLICIES", "DEFAULT_RESUBSCRIBE_WAIT", "MESSAGE_ID_HEADER", "START_POSITIONS", "Ack", "Assignments",
    "BasculeError", "Client", "ClientTls", "Consumer", "GroupInfo", "Membership", "Message", "Metadata",
    "PartitionInfo", "Partitioner", "RoundRobin", "StreamInfo", "StreamSettings", "_as_dict", "_subscribe_batches",
    "_subscribe_messages", "partition_by_key",
]
