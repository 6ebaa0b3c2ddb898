"""The API's ack policies and start positions by the names people give them (the client's arguments, the
CLI's flags, the activity stream's setting)."""

from bascule.wire.pb import api_pb2

ACK_POLICIES = {"leader": api_pb2.AckPolicy.LEADER, "all": api_pb2.AckPolicy.ALL, "none": api_pb2.AckPolicy.NONE}
START_POSITIONS = {
    "new": api_pb2.StartPosition.NEW_ONLY,
    "earliest": api_pb2.StartPosition.EARLIEST,
    "latest": api_pb2.StartPosition.LATEST,
    "offset": api_pb2.StartPosition.OFFSET,
    "timestamp": api_pb2.StartPosition.TIMESTAMP,
}
