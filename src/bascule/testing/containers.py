"""bascule in containers for tests, through testcontainers: one node (`BasculeContainer`) or a cluster of
nodes on their own NATS server and private network (`BasculeCluster`).

The images are made by ``compose/podman-setup.sh`` (which also starts podman's Docker-API service and prints
the environment to use); `BASCULE_IMAGE` and `BASCULE_NATS_IMAGE` name them, by default
``localhost/bascule:latest`` and ``localhost/bascule-nats:latest``. With podman, call `use_podman()` before
the first container (it sets what testcontainers needs: DOCKER_HOST, no Ryuk, docker_host connection mode).

    from bascule.testing.containers import BasculeCluster, BasculeContainer, use_podman

    use_podman()
    with BasculeContainer() as node:
        client = Client(node.get_broker())           # 127.0.0.1:<port>
        nats_url = node.get_nats_url()               # the node's embedded NATS, nats://127.0.0.1:<port>

    with BasculeCluster(3) as cluster:
        cluster.brokers                              # ["127.0.0.1:<port>", ...]
        cluster.kill(0)                              # SIGKILL node 0's container
        cluster.restart(0)                           # start it again: same addresses, same data

The nodes of a cluster talk Raft across the network, which bascule allows only with a password (pysyncobj
unpickles what peers send): `BasculeCluster` generates one for each cluster (`raft_password`) and gives it to
its nodes in their environment ($BASCULE_RAFT_PASSWORD), not on their command line.

Addresses: each node's gRPC API listens inside its container on the same port number as the one published
on the host's 127.0.0.1, and the node advertises 127.0.0.1:<port>. So the broker addresses in the cluster
metadata are the ones a client on the host connects to, as Liftbridge clients (which connect to partition
leaders by their advertised address) need. Nothing is published on other interfaces.

Without Ryuk nothing reaps containers left by an interrupted run: everything made here carries the label
`LABEL`, and `OWNER_LABEL` naming the process that made it; `remove_leftovers()` removes those whose
process is gone (those of test sessions running at the same time stay).
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

try:
    from docker import version as docker_api_version
    from docker.errors import APIError
    from docker.types import EndpointConfig
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.network import Network
except ImportError as missing:  # not in a plain install: say which extra brings it
    raise ImportError(f"bascule.testing.containers needs testcontainers: pip install 'bascule[testing]' ({missing})"
                      ) from missing

from bascule.client import ClientTls
from bascule.testing.ports import LOOPBACK, free_port
from bascule.testing.processes import LocalProcessError
from bascule.testing.readiness import wait_for_brokers
from bascule.testing.settings import flat_config

__all__ = [
    "DEFAULT_IMAGE",
    "DEFAULT_NATS_IMAGE",
    "LABEL",
    "BasculeCluster",
    "BasculeContainer",
    "ContainerError",
    "NatsContainer",
    "default_image",
    "default_nats_image",
    "remove_leftovers",
    "use_podman",
]

DEFAULT_IMAGE = "localhost/bascule:latest"
DEFAULT_NATS_IMAGE = "localhost/bascule-nats:latest"
PODMAN_SOCKET = "/run/podman/podman.sock"
LABEL = "io.github.bascule.testing"
OWNER_LABEL = "io.github.bascule.testing.owner"  # host:pid of the process that made the container
NATS_PORT = 4222
RAFT_PORT = 9393
METRICS_PORT = 9102  # Prometheus metrics, /healthz and /readyz, published on the host's loopback
RAFT_PASSWORD_ENV = "BASCULE_RAFT_PASSWORD"  # read by `bascule server` (bascule.config)
CONFIG_PATH = "/etc/bascule/testing.yaml"
NATS_CONFIG_PATH = "/etc/bascule/testing-nats.conf"
DATA_DIR = "/var/lib/bascule"
TLS_DIR = "/etc/bascule/tls"


@dataclass(frozen=True)
class ServerTls:
    """PEM bytes of a node's gRPC certificate and key, and of the CA its clients' certificates must
    come from (None: no client certificates asked for)."""

    cert: bytes
    key: bytes
    client_ca: bytes | None = None
DEFAULT_READY_TIMEOUT = 60.0
# podman 4.3's archive upload sometimes fails with a 500 ("passing bulk input to subprocess: write |1: broken
# pipe") on a loaded machine; the same upload a moment later succeeds.
ARCHIVE_ATTEMPTS = 4
ARCHIVE_RETRY_DELAY = 0.5


class ContainerError(LocalProcessError):
    """A container did not start, exited, or did not get ready in time (the message ends with its log)."""


def default_image() -> str:
    return os.environ.get("BASCULE_IMAGE") or DEFAULT_IMAGE


def default_nats_image() -> str:
    return os.environ.get("BASCULE_NATS_IMAGE") or DEFAULT_NATS_IMAGE


def use_podman(socket: str = PODMAN_SOCKET) -> None:
    """Point testcontainers at podman's Docker API at `socket`, keeping settings already in the environment.

    testcontainers reads some of these variables when it is imported: they are set on its live
    configuration too, so calling this after the import works.
    """
    os.environ.setdefault("DOCKER_HOST", f"unix://{socket}")
    os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")  # the Ryuk image cannot be pulled
    # /.dockerenv may exist on the host, and podman's container list lacks HostConfig: pick the mode.
    os.environ.setdefault("TESTCONTAINERS_CONNECTION_MODE", "docker_host")
    from testcontainers.core.config import ConnectionMode, testcontainers_config

    testcontainers_config.ryuk_disabled = os.environ["TESTCONTAINERS_RYUK_DISABLED"].lower() == "true"
    testcontainers_config.connection_mode_override = ConnectionMode(os.environ["TESTCONTAINERS_CONNECTION_MODE"])


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _stale(labels: Mapping[str, str] | None, own: bool) -> bool:
    """Whether a labelled container or network was left by a process of this machine that is gone
    (or, with `own`, made by this one)."""
    owner = (labels or {}).get(OWNER_LABEL)
    if owner is None:
        return True  # made by an older version of this module
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False  # another machine's, on a shared engine: not ours to judge
    if int(pid) == os.getpid():
        return own
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    return False


def remove_leftovers(*, own: bool = False, all_sessions: bool = False) -> int:
    """Remove the containers and networks labelled `LABEL` that processes now gone left behind (runs that
    could not clean up); `own` adds this process's, `all_sessions` takes every one. Returns how many
    containers were removed."""
    import docker

    client = docker.from_env()
    try:
        removed = 0
        for container in client.containers.list(all=True, filters={"label": LABEL}):
            if all_sessions or _stale(container.labels, own):
                container.remove(force=True, v=True)
                removed += 1
        for network in client.networks.list(filters={"label": LABEL}):
            if all_sessions or _stale(network.attrs.get("Labels"), own):
                network.remove()
        return removed
    finally:
        client.close()


def _labels(**extra: str) -> dict[str, str]:
    return {LABEL: "true", OWNER_LABEL: _owner(), **extra}


def _join_network(
    container: DockerContainer, network: Network, alias: str | None, ipv4_address: str | None
) -> dict[str, Any]:
    """Put `container` on `network` under `alias`; the create() arguments that fix its address, if given."""
    container.with_network(network)
    if alias:
        container.with_network_aliases(alias)
    if not ipv4_address:
        return {}
    # testcontainers passes no address: its networking_config is replaced by this one.
    endpoint = EndpointConfig(
        docker_api_version.__version__, aliases=[alias] if alias else None, ipv4_address=ipv4_address
    )
    return {"networking_config": {network.name: endpoint}}


def _publish_on_loopback(container: DockerContainer, port: int, host_port: int | None) -> None:
    # with_bind_ports takes no host address; docker-py takes (address,) or (address, port) tuples.
    container.ports[f"{port}/tcp"] = (LOOPBACK, host_port) if host_port else (LOOPBACK,)  # type: ignore[assignment]


class _Node(DockerContainer):
    """A container that can be killed, stopped and started again (DockerContainer.stop removes it)."""

    def _wrapped(self):
        container = self.get_wrapped_container()
        if container is None:
            raise ContainerError(f"{self._describe()} was never started")
        return container

    def _describe(self) -> str:
        return f"container {self._name or self.image}"

    def _transfer_into_container(self, transferable: Any, destination_in_container: str, mode: int) -> None:
        for attempt in range(1, ARCHIVE_ATTEMPTS + 1):
            try:
                super()._transfer_into_container(transferable, destination_in_container, mode)
                return
            except APIError as error:
                if not error.is_server_error() or attempt == ARCHIVE_ATTEMPTS:
                    raise
                time.sleep(ARCHIVE_RETRY_DELAY * attempt)

    def state(self) -> str:
        """The container's status as the engine reports it now: created, running, exited, ..."""
        container = self._wrapped()
        container.reload()
        return container.status

    @property
    def running(self) -> bool:
        return self._container is not None and self.state() == "running"

    def logs(self, lines: int | None = None) -> str:
        """The container's output (stdout and stderr together), the last `lines` lines if given."""
        if self._container is None:
            return "(not started)"
        try:
            text = self._wrapped().logs(stdout=True, stderr=True).decode(errors="replace")
        except Exception as exc:  # noqa: BLE001 - for error messages only
            return f"(no logs: {exc})"
        return "\n".join(text.splitlines()[-lines:]) if lines else text

    def _error(self, message: str, lines: int = 40) -> ContainerError:
        return ContainerError(f"{message}\n--- last {lines} lines of {self._describe()} ---\n{self.logs(lines)}")

    def kill(self) -> None:
        """SIGKILL the container's processes; it stays, with its data, to be started again."""
        if self.running:
            self._wrapped().kill()
        self._wait_status({"exited", "stopped"})

    def shutdown(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `timeout` seconds; the container stays, to be started again."""
        if self.running:
            self._wrapped().stop(timeout=max(1, round(timeout)))
        self._wait_status({"exited", "stopped"})

    def start_again(self) -> None:
        """Start the stopped container (same name, network alias, published ports and data)."""
        self._wrapped().start()
        self._wait_status({"running"})

    def _wait_status(self, statuses: set[str], timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while (status := self.state()) not in statuses:
            if time.monotonic() > deadline:
                raise self._error(f"{self._describe()} is {status}, not {'/'.join(sorted(statuses))}")
            time.sleep(0.05)


class NatsContainer(_Node):
    """nats-server alone (the NATS image), published on 127.0.0.1; on a network, reachable as `alias`."""

    def __init__(
        self,
        image: str | None = None,
        *,
        network: Network | None = None,
        alias: str = "nats",
        ipv4_address: str | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(image or default_nats_image())
        self.with_command(["--name", alias, "--port", str(NATS_PORT)])
        kwargs: dict[str, Any] = {"labels": _labels(role="nats")}
        _publish_on_loopback(self, NATS_PORT, None)
        if network is not None:
            kwargs.update(_join_network(self, network, alias, ipv4_address))
        self.with_kwargs(**kwargs)
        if name:
            self.with_name(name)
        self.alias = alias
        self._url: str | None = None

    def start(self, timeout: float = 20.0) -> NatsContainer:
        super().start()
        deadline = time.monotonic() + timeout
        while "Server is ready" not in self.logs():
            if self.state() not in ("running", "created"):
                raise self._error("nats-server exited")
            if time.monotonic() > deadline:
                raise self._error(f"nats-server not ready after {timeout:.0f} s")
            time.sleep(0.05)
        # Read once: a stopped container's mapped ports cannot be read.
        self._url = f"nats://{LOOPBACK}:{self.get_exposed_port(NATS_PORT)}"
        return self

    def get_url(self) -> str:
        """nats://127.0.0.1:<published port>, for clients on the host."""
        if self._url is None:
            raise ContainerError("nats-server has not been started")
        return self._url


class BasculeContainer(_Node):
    """One bascule node in a container.

    Alone (the default) it runs its own NATS (``--embedded-nats``, published on 127.0.0.1, see
    `get_nats_url`) and bootstraps Raft as the seed. `BasculeCluster` makes nodes with `nats_servers`,
    `raft_listen` and `raft_peers` instead.

    port: the gRPC port, the same inside the container and on the host's 127.0.0.1 (default: a free one).
    raft_password: given to the node as $BASCULE_RAFT_PASSWORD; a `raft_listen` other than loopback needs one.
    config: more settings for the node's YAML configuration (nested or dotted keys), such as
    ``{"clustering.replica.max.lag.time": "3s"}``. extra_args: more ``bascule server`` flags.
    tls: the gRPC API's certificate, key and (for mutual TLS) client CA, PEM bytes, copied into the
    container and configured; client_tls (a `bascule.client.ClientTls`) is how `wait_ready`, and a
    test's ``Client(node.get_broker(), tls=node.client_tls)``, reach it.
    """

    def __init__(
        self,
        image: str | None = None,
        *,
        server_id: str = "bascule",
        port: int | None = None,
        config: Mapping[str, Any] | None = None,
        nats_servers: Sequence[str] | None = None,
        raft_listen: str | None = None,
        raft_peers: Sequence[str] = (),
        raft_password: str | None = None,
        network: Network | None = None,
        alias: str | None = None,
        ipv4_address: str | None = None,
        sysctls: Mapping[str, str] | None = None,
        name: str | None = None,
        level: str = "info",
        extra_args: Sequence[str] = (),
        ready_timeout: float = DEFAULT_READY_TIMEOUT,
        tls: ServerTls | None = None,
        client_tls: ClientTls | None = None,
    ) -> None:
        super().__init__(image or default_image())
        self.server_id = server_id
        self.client_tls = client_tls
        self.port = port or free_port(LOOPBACK)
        self.embedded_nats = not nats_servers
        self.ready_timeout = ready_timeout
        settings = {
            "listen": f"0.0.0.0:{self.port}",
            "host": LOOPBACK,  # advertised: clients on the host connect to 127.0.0.1:<port>
            "data.dir": DATA_DIR,
            "metrics.listen": f"0.0.0.0:{METRICS_PORT}",
            **(self._copy_tls_files(tls) if tls is not None else {}),
            **flat_config(config),
        }
        command = ["server", "--config", CONFIG_PATH, "--id", server_id, "--level", level]
        if not nats_servers:
            command += ["--embedded-nats-config", NATS_CONFIG_PATH]
            self.with_copy_into_container(f"listen: 0.0.0.0:{NATS_PORT}\n".encode(), NATS_CONFIG_PATH)
            _publish_on_loopback(self, NATS_PORT, None)
        else:
            command += ["--nats-servers", ",".join(nats_servers)]
        if raft_listen:
            command += ["--raft-listen", raft_listen]
        if raft_peers:
            command += ["--raft-bootstrap-peers", ",".join(raft_peers)]
        else:
            command.append("--raft-bootstrap-seed")
        command += list(extra_args)
        self.with_command(command)
        if raft_password:
            self.with_env(RAFT_PASSWORD_ENV, raft_password)
        self.with_copy_into_container(yaml.safe_dump(settings, sort_keys=False).encode(), CONFIG_PATH)
        _publish_on_loopback(self, self.port, self.port)
        _publish_on_loopback(self, METRICS_PORT, None)
        kwargs: dict[str, Any] = {"labels": _labels(role="bascule", server_id=server_id)}
        if sysctls:
            kwargs["sysctls"] = dict(sysctls)
        if network is not None:
            kwargs.update(_join_network(self, network, alias, ipv4_address))
        self.with_kwargs(**kwargs)
        if name:
            self.with_name(name)
        self._nats_url: str | None = None
        self._metrics_url: str | None = None

    def _copy_tls_files(self, tls: ServerTls) -> dict[str, Any]:
        """Copy the TLS files in (root's, readable by the image's user: a test container's own key);
        the settings naming them."""
        settings: dict[str, Any] = {"tls.cert": TLS_DIR + "/server.pem", "tls.key": TLS_DIR + "/server.key"}
        files = {"server.pem": tls.cert, "server.key": tls.key}
        if tls.client_ca is not None:
            files["client-ca.pem"] = tls.client_ca
            settings.update({"tls.client.auth.enabled": True, "tls.client.auth.ca": TLS_DIR + "/client-ca.pem"})
        for name, content in files.items():
            self.with_copy_into_container(content, f"{TLS_DIR}/{name}", mode=0o444)
        return settings

    def _describe(self) -> str:
        return f"bascule node {self.server_id} at {self.get_broker()}"

    def start(self, wait: bool = True) -> BasculeContainer:
        """Create and start the container; with `wait`, until its API lists this broker."""
        super().start()
        if self.embedded_nats:
            # Read now: a stopped container's mapped ports cannot be read.
            self._nats_url = f"nats://{LOOPBACK}:{self.get_exposed_port(NATS_PORT)}"
        self._metrics_url = f"http://{LOOPBACK}:{self.get_exposed_port(METRICS_PORT)}"
        if wait:
            self.wait_ready()
        return self

    def get_broker(self) -> str:
        """The gRPC API's address for clients on the host: 127.0.0.1:<port>."""
        return f"{LOOPBACK}:{self.port}"

    def get_metrics_url(self) -> str:
        """The node's metrics endpoint for the host: ``<url>/metrics``, ``/healthz``, ``/readyz``."""
        if self._metrics_url is None:
            raise ContainerError(f"{self._describe()} has not been started")
        return self._metrics_url

    def get_nats_url(self) -> str:
        """The embedded NATS server's URL for clients on the host (single node only)."""
        if not self.embedded_nats:
            raise ContainerError(f"{self._describe()} has no embedded NATS; ask its cluster for nats_url")
        if self._nats_url is None:
            raise ContainerError(f"{self._describe()} has not been started")
        return self._nats_url

    def wait_ready(self, timeout: float | None = None, brokers: Sequence[str] = ()) -> None:
        """Until FetchMetadata lists this node's broker id and every id in `brokers`."""
        timeout = self.ready_timeout if timeout is None else timeout

        def check_running() -> None:
            if self.state() != "running":
                raise self._error(f"{self._describe()} exited before it was ready")

        credentials = self.client_tls.credentials() if self.client_tls is not None else None
        last = wait_for_brokers(self.get_broker(), {self.server_id, *brokers}, timeout, check_running, credentials)
        if last is not None:
            raise self._error(f"{self._describe()} not ready after {timeout:.0f} s; last: {last}")

    def restart(self, wait: bool = True, *, graceful: bool = True, brokers: Sequence[str] = ()) -> None:
        """Stop (SIGTERM, or SIGKILL when not `graceful`) if running, start again; with `wait`, until ready."""
        if graceful:
            self.shutdown()
        else:
            self.kill()
        self.start_again()
        if wait:
            self.wait_ready(brokers=brokers)


class BasculeCluster:
    """`size` bascule nodes and a nats-server, each in its own container on a private network.

    Node i has server id and network alias ``node-<i>``, Raft address ``node-<i>:9393`` (every node gets
    them all as ``--raft-bootstrap-peers``), and its gRPC API on 127.0.0.1 (`brokers`). `nats_url` is the
    NATS server for clients on the host; inside the network it is ``nats://nats:4222``. `raft_password` is
    the nodes' Raft password: the one given, else the config's ``clustering.raft.password``, else a new
    random one.

    stable_addresses (the default): each node has a fixed IP address on the network, which it keeps when
    restarted, and gives up a TCP connect that gets no answer after about 7 s (sysctl
    net.ipv4.tcp_syn_retries=2, inside its own network namespace). bascule's Raft transport (pysyncobj)
    waits on a connect that gets no answer for as long as the kernel retries it: with the engine's usual
    dynamic addresses, a node restarted at another address stays cut off from the metadata group until the
    peers' connects to its old address fail (70 s and more). False gives the engine's defaults.

    Use it as a context manager, or call `start` and `stop`; leaving the ``with`` block removes every
    container and the network, whatever happened.
    """

    def __init__(
        self,
        size: int = 3,
        *,
        image: str | None = None,
        nats_image: str | None = None,
        config: Mapping[str, Any] | None = None,
        level: str = "info",
        ready_timeout: float = 90.0,
        stable_addresses: bool = True,
        raft_password: str | None = None,
    ) -> None:
        if size < 1:
            raise ValueError("a cluster needs at least one node")
        self.size = size
        self.image = image or default_image()
        self.nats_image = nats_image or default_nats_image()
        self.config = dict(config or {})
        self.raft_password = (
            raft_password or flat_config(config).get("clustering.raft.password") or secrets.token_urlsafe(24)
        )
        self.level = level
        self.ready_timeout = ready_timeout
        self.stable_addresses = stable_addresses
        self.network: Network | None = None
        self.nats: NatsContainer | None = None
        self.nodes: list[BasculeContainer] = []

    @property
    def server_ids(self) -> list[str]:
        return [f"node-{index}" for index in range(self.size)]

    @property
    def running_server_ids(self) -> list[str]:
        """The nodes FetchMetadata lists: those running (a killed one drops out of the list)."""
        return [node.server_id for node in self.nodes if node.running]

    @property
    def brokers(self) -> list[str]:
        """Every node's gRPC address for clients on the host, in node order."""
        return [node.get_broker() for node in self.nodes]

    @property
    def nats_url(self) -> str:
        if self.nats is None:
            raise ContainerError("the cluster has not been started")
        return self.nats.get_url()

    def node(self, index: int) -> BasculeContainer:
        return self.nodes[index]

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"<BasculeCluster {self.size} nodes {self.brokers} nats {self.nats and self.nats._url}>"

    def start(self, wait: bool = True) -> BasculeCluster:
        self.network = Network(docker_network_kw={"labels": _labels()})
        self.network.create()
        nats_address, *addresses = (
            self._fixed_addresses(self.network) if self.stable_addresses else [None] * (self.size + 1)
        )
        self.nats = NatsContainer(self.nats_image, network=self.network, ipv4_address=nats_address).start()
        peers = [f"{server_id}:{RAFT_PORT}" for server_id in self.server_ids] if self.size > 1 else []
        for server_id, address in zip(self.server_ids, addresses):
            node = BasculeContainer(
                self.image,
                server_id=server_id,
                config=self.config,
                nats_servers=[f"nats://{self.nats.alias}:{NATS_PORT}"],
                raft_listen=f"{server_id}:{RAFT_PORT}",
                raft_peers=peers,
                raft_password=self.raft_password,
                network=self.network,
                alias=server_id,
                ipv4_address=address,
                sysctls={"net.ipv4.tcp_syn_retries": "2"} if self.stable_addresses else None,
                level=self.level,
                ready_timeout=self.ready_timeout,
            )
            self.nodes.append(node)
            node.start(wait=False)
        if wait:
            self.wait_ready()
        return self

    def _fixed_addresses(self, network: Network) -> list[str]:
        """Fixed addresses for NATS and then the nodes, high in the subnet the engine gave the network (its
        own allocations start at the bottom). NATS's too: restarted at a new address, it is out of the
        nodes' reach until their resolver lets go of the old one (tens of seconds)."""
        docker_network = network._network
        assert docker_network is not None, "the network is created first"
        docker_network.reload()
        subnets = [ipaddress.ip_network(pool["Subnet"]) for pool in docker_network.attrs["IPAM"]["Config"]]
        subnet = next(net for net in subnets if net.version == 4)
        top = int(subnet.broadcast_address) - 1
        return [str(ipaddress.ip_address(top - self.size + index)) for index in range(self.size + 1)]

    def wait_ready(self, timeout: float | None = None) -> None:
        """Until every running node lists every running node of the cluster."""
        deadline = time.monotonic() + (self.ready_timeout if timeout is None else timeout)
        for node in self.nodes:
            if node.running:
                node.wait_ready(max(1.0, deadline - time.monotonic()), brokers=self.running_server_ids)

    def stop(self) -> None:
        """Remove every container and the network."""
        errors = []
        for container in [*self.nodes, *([self.nats] if self.nats else [])]:
            try:
                container.stop()
            except Exception as exc:  # noqa: BLE001 - remove the others anyway
                errors.append(exc)
        if self.network is not None and self.network._network is not None:
            try:
                self.network.remove()
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)
        self.nodes, self.nats, self.network = [], None, None
        if errors:
            raise ContainerError(f"cleanup failed: {errors}")

    def __enter__(self) -> BasculeCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- faults --
    def kill(self, index: int) -> None:
        """SIGKILL node `index`'s container."""
        self.nodes[index].kill()

    def restart(self, index: int, wait: bool = True, *, graceful: bool = True) -> None:
        """Stop node `index` if running (SIGTERM, or SIGKILL when not `graceful`), start it again with the same
        addresses and data; with `wait`, until it lists every broker again."""
        self.nodes[index].restart(wait, graceful=graceful, brokers=[
            node.server_id for i, node in enumerate(self.nodes) if i == index or node.running])

    def log_tails(self, lines: int = 30) -> str:
        """The end of every container's log, for a failure message."""
        parts = []
        for container in [*([self.nats] if self.nats else []), *self.nodes]:
            try:
                state = container.state()
            except Exception as exc:  # noqa: BLE001 - for error messages only
                state = f"state unknown: {exc}"
            parts.append(f"--- {container._describe()} ({state}) ---\n{container.logs(lines)}")
        return "\n".join(parts)
