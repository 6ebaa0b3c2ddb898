"""The NATS subjects of the replication protocol (Liftbridge's names)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Subjects:
    namespace: str

    def replicate(self, stream: str, partition: int) -> str:
        return f"{self.namespace}.{stream}.{partition}.replicate"

    def epoch_offset(self, stream: str, partition: int) -> str:
        return f"{self.namespace}.{stream}.{partition}.offset"

    def ack_inbox(self, token: str) -> str:
        """An ack inbox's name, Liftbridge's form (``<ns>.ack.<token>``, a random token): what the
        acks of a PublishAsync call, or of a Publish that names no inbox, say they were sent to."""
        return f"{self.namespace}.ack.{token}"

    def fetch_session(self, server_id: str) -> str:
        """Where a leader node takes the fetch session rounds of every follower node."""
        return f"{self.namespace}.fetch.{server_id}"

    def fetch_mux(self, server_id: str) -> str:
        """Where a leader node takes the multiplexed fetches of every follower node."""
        return f"{self.namespace}.fetchmux.{server_id}"

    def notify(self, server_id: str) -> str:
        return f"{self.namespace}.notify.{server_id}"

    @property
    def propagate(self) -> str:
        return f"{self.namespace}.raft.metadata.propagate"

    @property
    def metadata_heartbeat(self) -> str:
        return f"{self.namespace}.raft.metadata.heartbeat"

    @property
    def join(self) -> str:
        return f"{self.namespace}.raft.metadata.join"

    @property
    def admin_status(self) -> str:
        return f"{self.namespace}.admin.status"

    @property
    def admin_replicas(self) -> str:
        return f"{self.namespace}.admin.replicas"
