"""Who this node is, kept in its data dir: its server id, its cluster secret, its Raft address and
its Raft peers.

Each is chosen once and then read back at every start: partitions name their replicas by server
id, and the Raft group knows its voters by address. Blocking file I/O with fsyncs: callers run
these in a thread. The files are private (0600, in 0700 directories), as everything in the data dir.
"""

from __future__ import annotations

import secrets
import socket
import uuid
from pathlib import Path

from bascule import durable
from bascule.config.model import ClusteringConfig


def server_id(clustering: ClusteringConfig, data_dir: Path) -> str:
    if clustering.server_id:
        return clustering.server_id
    id_file = data_dir / "server-id"
    if id_file.exists():
        return id_file.read_text().strip()
    generated = uuid.uuid4().hex[:16]
    durable.write_atomically(id_file, generated + "\n")
    return generated


def cluster_secret(clustering: ClusteringConfig, data_dir: Path) -> str:
    """The secret of the node's Raft transport, and whose key seals its node-to-node NATS
    traffic: the cluster's Raft password, or for a node given none, a random one made at its
    first start (enough for a cluster of one node; the nodes of a bigger cluster must share a
    password)."""
    if clustering.raft_password:
        return clustering.raft_password
    if clustering.raft_insecure:
        return f"bascule insecure development secret of {clustering.namespace}"
    secret_file = data_dir / "cluster-secret"
    if secret_file.exists():
        return secret_file.read_text().strip()
    generated = secrets.token_urlsafe(32)
    durable.write_atomically(secret_file, generated + "\n")
    return generated


def raft_address(clustering: ClusteringConfig, data_dir: Path) -> str:
    """The configured Raft address, or for port 0 a free port chosen at the first start."""
    host, port = clustering.raft_listen.rsplit(":", 1)
    if int(port):
        return f"{host}:{port}"
    address_file = data_dir / "raft-address"
    if address_file.exists():
        return address_file.read_text().strip()
    with socket.socket() as probe:
        probe.bind((host, 0))
        address = f"{host}:{probe.getsockname()[1]}"
    durable.write_atomically(address_file, address + "\n")
    return address


def known_raft_peers(clustering: ClusteringConfig, data_dir: Path, address: str) -> list[str] | None:
    """The other voters to start Raft with: the bootstrap peers, the group this node joined
    earlier, or none for a seed or a node with a journal; None when the node must join first."""
    if clustering.raft_bootstrap_peers:
        return [p for p in clustering.raft_bootstrap_peers if p != address]
    peers_file = _peers_file(data_dir)
    if peers_file.exists():
        return [p for p in peers_file.read_text().split() if p != address]
    if clustering.raft_bootstrap_seed or (data_dir / "raft" / "journal").exists():
        return []
    return None


def remember_raft_members(data_dir: Path, members: list[str], address: str) -> list[str]:
    """Keep the members a join returned, for later starts; returns the other voters."""
    peers_file = _peers_file(data_dir)
    durable.make_private_directories(peers_file.parent)
    durable.write_atomically(peers_file, "\n".join(members) + "\n")
    return [m for m in members if m != address]


def _peers_file(data_dir: Path) -> Path:
    return data_dir / "raft" / "peers"


CLEAN_SHUTDOWN = "clean-shutdown"


def take_clean_shutdown(data_dir: Path) -> bool:
    """Whether the previous run of this node stopped cleanly (every log synced and closed; or it
    kept no logs), and from now on, whatever happens to this run, not: the marker goes before any
    log is written. A crash and a power cut look the same from here, so any other stop counts as
    unclean."""
    marker = data_dir / CLEAN_SHUTDOWN
    if not marker.exists():
        return not (data_dir / "streams").exists()  # no logs: nothing to have lost
    marker.unlink()
    durable.sync_directory(data_dir)
    return True


def record_clean_shutdown(data_dir: Path) -> None:
    """Every log of this node is synced and closed, and the metadata knows of any loss found at
    its start: the next start may count as clean."""
    durable.write_atomically(data_dir / CLEAN_SHUTDOWN, "")
