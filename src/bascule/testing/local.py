"""Real bascule processes for tests: one node (`LocalNode`) or a cluster on its own nats-server, or on a NATS
cluster of one server per node (`LocalCluster`).

Everything here is synchronous (``subprocess.Popen``), so it serves sync pytest fixtures and async tests
alike. Calls that wait (``wait_ready``, ``start``, ``restart``) block; from an async test that must keep its
event loop turning meanwhile, pass ``wait=False`` and ``await asyncio.to_thread(node.wait_ready)``.

Each process runs in its own process group, its output in a log file (`bascule.testing.processes`), so a
node's own children (the nats-server of ``--embedded-nats``) are signalled with it and never outlive it.

    with LocalCluster(3) as cluster:
        client = LiftbridgeClient(cluster.brokers)
        ...
        cluster.kill(0)
        cluster.restart(0)   # same gRPC and Raft addresses, same data dir

With ``nats_cluster=True`` node i connects to nats-server i alone, and the servers' routes pass through
proxies of the test process (`bascule.testing.routes`) that ``cluster.routes`` cuts and heals:

    cluster.routes.cut_server(1)   # server 1 (and so node 1) cut off from the other servers
    cluster.routes.heal()

With ``power_cuts=True`` each node's data dir is a FUSE mount (`bascule.testing.powercut`), and
``power_cut(i)`` SIGKILLs node i and drops every write it had not fsynced, as a power cut would;
``disk_faults(i, full=True, prefix="/streams")`` fills its disk (or fails or slows its fsyncs) while it runs.

As a pytest fixture, yield inside the ``with`` so that cleanup (and the removal of the temporary
directory) happens however the test ends:

    @pytest.fixture
    def cluster():
        with LocalCluster(1) as cluster:
            yield cluster
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bascule.client import ClientTls
from bascule.config.loading import RAFT_PASSWORD_ENV
from bascule.natsio.server import (
    LOG_FILE_NAME,
    ServerOptions,
    empty_ports_dir,
    read_ports_file,
)
from bascule.testing.ports import LOOPBACK, free_port, join_host_port
from bascule.testing.powercut import PowerCutDisk
from bascule.testing.processes import LocalProcess, LocalProcessError
from bascule.testing.readiness import wait_for_brokers
from bascule.testing.routes import RouteProxies
from bascule.testing.settings import flat_config

__all__ = ["LocalCluster", "LocalNatsServer", "LocalNode"]

DEFAULT_READY_TIMEOUT = 30.0
DEFAULT_STOP_GRACE = 10.0
LOG_NAME = "bascule.log"
CONFIG_NAME = "bascule.yaml"
EMBEDDED_NATS_CONFIG_NAME = "embedded-nats.conf"
NATS_CLUSTER_NAME = "bascule-test"


# ---- nats-server ---------------------------------------------------------------------------------


class LocalNatsServer(LocalProcess):
    """A nats-server subprocess listening on a fixed port, which it keeps across restarts; see
    `bascule.natsio.server` for how it is found, configured and judged ready."""

    name = "nats-server"

    def __init__(
        self,
        log_path: str | os.PathLike[str],
        *,
        host: str = LOOPBACK,
        port: int | None = None,
        extra_args: Sequence[str] = (),
        stop_grace: float = 5.0,
    ) -> None:
        super().__init__(Path(log_path), stop_grace)
        self.host = host
        self.port = port if port is not None else free_port(host)
        self.extra_args = list(extra_args)
        # Beside the log, so that whoever cleans up the log's dir takes it too.
        self.ports_dir = self.log_path.with_name(f"{self.log_path.stem}-ports")

    @property
    def url(self) -> str:
        return f"nats://{join_host_port(self.host, self.port)}"

    def command(self) -> list[str]:
        return [*ServerOptions(host=self.host, port=self.port).command(self.ports_dir), *self.extra_args]

    def _describe(self) -> str:
        return f"nats-server {self.url} (pid {self.pid})"

    def start(self, wait: bool = True, timeout: float = 10.0) -> None:
        empty_ports_dir(self.ports_dir)
        self._spawn()
        if wait:
            self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Until the server reports its listeners open, in its ports file."""
        if self._popen is None:
            raise LocalProcessError(f"{self._describe()} was never started")
        deadline = time.monotonic() + timeout
        while read_ports_file(self.ports_dir, self._popen.pid) is None:
            self._check_alive("before it was ready")
            if time.monotonic() > deadline:
                raise self._error(f"{self._describe()} not ready after {timeout:.1f} s")
            time.sleep(0.02)

    def restart(self, wait: bool = True, timeout: float = 10.0) -> None:
        self.stop()
        self.start(wait, timeout)


# ---- bascule node --------------------------------------------------------------------------------


class LocalNode(LocalProcess):
    """One ``bascule server`` subprocess.

    Its data dir, gRPC port and Raft port are fixed at construction and kept across restarts.
    `config` (Liftbridge keys, nested or dotted) is written to ``<data_dir>/bascule.yaml``; the
    flags this class passes (id, ports, data dir, NATS, bootstrap) win over it.

    With `embedded_nats` the node runs its own nats-server; unless `config` names an
    ``nats.embedded.config`` file, that server is given a fixed port too (``nats_url``), so NATS
    clients of a test find it again after a restart.

    With `power_cuts` the data dir is a `PowerCutDisk` mount (mounted at the first start, unmounted
    on exit or `unmount`) over the hidden sibling dir ``.<name>.backing``, which holds the files; see
    `power_cut`. The log and the config files are written to the backing dir directly, outside the
    model: a cut must not eat the log lines that explain it.

    A node serving TLS (``tls.cert`` and ``tls.key`` in `config`, with ``tls.client.auth.*`` for mutual
    TLS) is reached through `client_tls` (a `bascule.client.ClientTls`): `wait_ready` uses it, and a
    test's ``Client(node.address, tls=node.client_tls)`` can too.
    """

    name = "bascule node"

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        server_id: str | None = None,
        nats_servers: str | Iterable[str] | None = None,
        embedded_nats: bool = False,
        namespace: str | None = None,
        host: str = LOOPBACK,
        port: int | None = None,
        raft_port: int | None = None,
        raft_bootstrap_seed: bool = False,
        raft_bootstrap_peers: Iterable[str] = (),
        config: Mapping[str, Any] | None = None,
        level: str = "info",
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        python: str = sys.executable,
        stop_grace: float = DEFAULT_STOP_GRACE,
        power_cuts: bool = False,
        client_tls: ClientTls | None = None,
    ) -> None:
        if data_dir is None:
            data_dir = tempfile.mkdtemp(prefix="bascule-node-")
            self.owns_data_dir = True
        else:
            self.owns_data_dir = False
        self.data_dir = Path(data_dir).resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.disk: PowerCutDisk | None = None
        files_dir = self.data_dir
        if power_cuts:
            self.disk = PowerCutDisk(self.data_dir.parent / f".{self.data_dir.name}.backing", self.data_dir)
            files_dir = self.disk.backing
            files_dir.mkdir(exist_ok=True)
        super().__init__(files_dir / LOG_NAME, stop_grace)
        self.server_id = server_id or f"node-{uuid.uuid4().hex[:8]}"
        if isinstance(nats_servers, str):
            nats_servers = [nats_servers]
        self.nats_servers = list(nats_servers or ())
        self.embedded_nats = embedded_nats
        self.embedded_nats_port: int | None = None
        self.embedded_nats_config: Path | None = None
        self.namespace = namespace
        self.host = host
        self.port = port if port is not None else free_port(host)
        self.raft_port = raft_port if raft_port is not None else free_port(host)
        self.raft_bootstrap_seed = raft_bootstrap_seed
        self.raft_bootstrap_peers = list(raft_bootstrap_peers)
        self.level = level
        self.extra_args = list(extra_args)
        self.extra_env = dict(env or {})
        self.client_tls = client_tls  # how readiness checks (and tests' clients) reach a TLS API
        self.python = python
        self.config_path: Path | None = None
        if config:
            import yaml

            self.config_path = files_dir / CONFIG_NAME
            self.config_path.write_text(yaml.safe_dump(_plain(config), sort_keys=False))
        if embedded_nats and "nats.embedded.config" not in flat_config(config):
            self.embedded_nats_port = free_port(host)
            self.embedded_nats_config = files_dir / EMBEDDED_NATS_CONFIG_NAME
            self.embedded_nats_config.write_text(f'listen: "{join_host_port(host, self.embedded_nats_port)}"\n')

    @property
    def nats_url(self) -> str | None:
        """Where this node's NATS is: its first ``nats_servers`` URL, or its embedded server's
        (None when that comes from the caller's own ``nats.embedded.config``)."""
        if self.embedded_nats_port is not None:
            return f"nats://{join_host_port(self.host, self.embedded_nats_port)}"
        return self.nats_servers[0] if self.nats_servers and not self.embedded_nats else None

    @property
    def address(self) -> str:
        """The gRPC API's address, host:port."""
        return join_host_port(self.host, self.port)

    @property
    def raft_address(self) -> str:
        return join_host_port(self.host, self.raft_port)

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<LocalNode {self.server_id} {self.address} raft {self.raft_address} {state}>"

    def _describe(self) -> str:
        return f"node {self.server_id} at {self.address} (pid {self.pid})"

    def command(self) -> list[str]:
        command = [
            self.python, "-m", "bascule.cli", "server",
            "--id", self.server_id,
            "--data-dir", str(self.data_dir),
            "--port", str(self.port),
            "--raft-listen", self.raft_address,
            "--level", self.level,
        ]
        if self.config_path is not None:
            command += ["--config", str(self.config_path)]
        if self.namespace:
            command += ["--ns", self.namespace]
        if self.embedded_nats:
            command.append("--embedded-nats")
        if self.embedded_nats_config is not None:
            command += ["--embedded-nats-config", str(self.embedded_nats_config)]
        if self.nats_servers:
            command += ["--nats-servers", ",".join(self.nats_servers)]
        if self.raft_bootstrap_seed:
            command.append("--raft-bootstrap-seed")
        if self.raft_bootstrap_peers:
            command += ["--raft-bootstrap-peers", ",".join(self.raft_bootstrap_peers)]
        return command + self.extra_args

    def _cwd(self) -> str:
        # Not the caller's directory: `-m` puts the cwd first on sys.path.
        return str(self.data_dir)

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        # Temporary files of the node stay in its data dir, so that a SIGKILL, which skips their
        # cleanup, leaves nothing in the system's /tmp.
        tmp = self.data_dir / "tmp"
        tmp.mkdir(exist_ok=True)
        env["TMPDIR"] = str(tmp)
        env.update(self.extra_env)
        return env

    def start(self, wait: bool = True, timeout: float = DEFAULT_READY_TIMEOUT) -> None:
        """Start the process; with `wait`, until `wait_ready` passes."""
        if self.disk is not None and not self.disk.running:
            self.disk.start()
        self._spawn()
        if wait:
            self.wait_ready(timeout)

    def wait_ready(self, timeout: float = DEFAULT_READY_TIMEOUT, brokers: Iterable[str] | None = None) -> None:
        """Until the gRPC API answers FetchMetadata listing this node's broker id (and every id in `brokers`)."""
        if self._popen is None:
            raise LocalProcessError(f"{self._describe()} was never started")
        expected = {self.server_id, *(brokers or ())}
        credentials = self.client_tls.credentials() if self.client_tls is not None else None
        last = wait_for_brokers(self.address, expected, timeout, lambda: self._check_alive("before it was ready"),
                                credentials)
        if last is not None:
            raise self._error(f"{self._describe()} not ready after {timeout:.1f} s; last: {last}")

    def restart(self, wait: bool = True, timeout: float = DEFAULT_READY_TIMEOUT, *, graceful: bool = True) -> None:
        """Stop (SIGTERM, or SIGKILL when not `graceful`) if running, then start at the same addresses."""
        if graceful:
            self.stop()
        else:
            self.kill()
        self.start(wait, timeout)

    @property
    def stored_dir(self) -> Path:
        """Where the data dir's files are now: the mount while a power-cut disk is mounted, its
        backing dir once unmounted (after `stop`), else the data dir."""
        if self.disk is not None and not self.disk.running:
            return self.disk.backing
        return self.data_dir

    def power_cut(self) -> dict[str, int]:
        """SIGKILL the process group, then drop every write to the data dir that was not fsynced and
        every file created and never synced (`PowerCutDisk.cut`, whose counts this returns). The node
        stays stopped; `start` brings it back as after a kill."""
        if self.disk is None:
            raise LocalProcessError(f"{self._describe()} has no power-cut disk: create it with power_cuts=True")
        self.kill()
        return self.disk.cut()

    def disk_faults(self, *, full: bool = False, fsync_error: bool = False, fsync_delay: float = 0.0,
                    prefix: str = "/") -> None:
        """Switch disk faults of the power-cut disk on (and off those not given), for the files under
        `prefix` in the data dir ("/streams": the partition logs, not the Raft journal), while the node
        runs (`PowerCutDisk.set_faults`); ``disk_faults()`` clears them, and so does `power_cut`."""
        if self.disk is None:
            raise LocalProcessError(f"{self._describe()} has no power-cut disk: create it with power_cuts=True")
        self.disk.set_faults(full=full, fsync_error=fsync_error, fsync_delay=fsync_delay, prefix=prefix)

    def unmount(self) -> None:
        """Unmount the power-cut disk, if any (the files stay in its backing dir; `start` mounts it again)."""
        if self.disk is not None:
            self.disk.stop()

    def remove_data(self) -> None:
        """Delete the data dir (the node must be stopped)."""
        if self.running:
            raise LocalProcessError(f"{self._describe()} is running")
        if self.disk is not None:
            self.disk.stop()
            shutil.rmtree(self.disk.backing, ignore_errors=True)
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> LocalNode:
        try:
            self.start()
        except BaseException:
            self.kill()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self.stop()
        finally:
            self.kill()
            self.unmount()
            if self.owns_data_dir and exc_info[0] is None:
                self.remove_data()


def _plain(value: Any) -> Any:
    """Mappings and sequences as dicts and lists, for yaml.safe_dump."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# ---- cluster -------------------------------------------------------------------------------------


class LocalCluster:
    """A nats-server and `size` bascule nodes on it, each with its own data dir under `base_dir`.

    ``nats_cluster=True`` runs a NATS cluster instead: one nats-server per node (node i on server i only,
    as Liftbridge is deployed), their routes through `routes` (a `RouteProxies`), which cuts them.

    With one node it bootstraps Raft with ``--raft-bootstrap-seed``; with more, every node gets
    ``--raft-bootstrap-peers`` listing all Raft addresses. ``embedded_nats=True`` (one node only)
    lets the node run its own nats-server (``--embedded-nats``) instead.

    Use it as a context manager, or call `start` and `stop`; leaving the ``with`` block stops
    every process it started, whatever happened. `keep_data` None (the default) removes a
    temporary `base_dir` after a clean exit and keeps it (logs included) after an error.

    ``power_cuts=True`` puts each node's data dir on a `PowerCutDisk` (see `LocalNode`), for
    `power_cut`; `stop` unmounts them, leaving the files in ``base_dir/.node-<i>.backing``.

    The nodes share a secret, the Raft password: it authenticates their Raft transport (needed on a
    `host` other than loopback) and seals their NATS traffic. Unless `config` or `env` gives one, the
    cluster makes a random one and gives it to every node as $BASCULE_RAFT_PASSWORD.
    """

    def __init__(
        self,
        size: int = 1,
        *,
        embedded_nats: bool = False,
        nats_cluster: bool = False,
        base_dir: str | os.PathLike[str] | None = None,
        config: Mapping[str, Any] | None = None,
        node_config: Sequence[Mapping[str, Any] | None] | None = None,
        namespace: str | None = None,
        level: str = "info",
        ready_timeout: float = DEFAULT_READY_TIMEOUT,
        stop_grace: float = DEFAULT_STOP_GRACE,
        keep_data: bool | None = None,
        env: Mapping[str, str] | None = None,
        host: str = LOOPBACK,
        power_cuts: bool = False,
        client_tls: ClientTls | None = None,
    ) -> None:
        if size < 1:
            raise ValueError("a cluster needs at least one node")
        if embedded_nats and size != 1:
            raise ValueError("embedded_nats=True is for a single node")
        if embedded_nats and nats_cluster:
            raise ValueError("embedded_nats=True and nats_cluster=True exclude each other")
        if node_config is not None and len(node_config) != size:
            raise ValueError(f"node_config needs one entry per node ({size})")
        if base_dir is None:
            base_dir = tempfile.mkdtemp(prefix="bascule-cluster-")
            self._owns_base_dir = True
        else:
            self._owns_base_dir = False
        self.base_dir = Path(base_dir).resolve()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.size = size
        self.embedded_nats = embedded_nats
        self.ready_timeout = ready_timeout
        self.keep_data = keep_data
        self.routes: RouteProxies | None = None
        self.nats_servers: list[LocalNatsServer] = []
        if nats_cluster:
            self.nats_servers = self._nats_cluster(host)
        elif not embedded_nats:
            self.nats_servers = [LocalNatsServer(self.base_dir / LOG_FILE_NAME, host=host)]
        self.nats: LocalNatsServer | None = self.nats_servers[0] if self.nats_servers else None
        raft_ports = [free_port(host) for _ in range(size)]
        peers = [join_host_port(host, port) for port in raft_ports] if size > 1 else []
        given = "clustering.raft.password" in flat_config(config) or RAFT_PASSWORD_ENV in (env or {})
        if not given:
            env = {RAFT_PASSWORD_ENV: secrets.token_urlsafe(24), **(env or {})}
        self.nodes: list[LocalNode] = []
        for index in range(size):
            merged = {**flat_config(config), **flat_config(node_config[index] if node_config else None)}
            self.nodes.append(
                LocalNode(
                    self.base_dir / f"node-{index}",
                    server_id=f"node-{index}",
                    nats_servers=[self.nats_servers[index if nats_cluster else 0].url] if self.nats else None,
                    embedded_nats=embedded_nats,
                    namespace=namespace,
                    host=host,
                    raft_port=raft_ports[index],
                    raft_bootstrap_seed=size == 1,
                    raft_bootstrap_peers=peers,
                    config=merged or None,
                    level=level,
                    env=env,
                    stop_grace=stop_grace,
                    power_cuts=power_cuts,
                    client_tls=client_tls,
                )
            )
        self._started = False

    def _nats_cluster(self, host: str) -> list[LocalNatsServer]:
        cluster_ports = [free_port(host) for _ in range(self.size)]
        self.routes = RouteProxies(cluster_ports, host)
        return [
            LocalNatsServer(self.base_dir / f"nats-server-{index}.log", host=host, extra_args=[
                "--cluster", f"nats://{join_host_port(host, cluster_port)}", "--cluster_name", NATS_CLUSTER_NAME,
                "--routes", ",".join(self.routes.urls(index)), "--cluster_advertise", self.routes.advertise_address,
                # A node stays on its own server, even when that server is cut off from the others.
                "--no_advertise",
            ])
            for index, cluster_port in enumerate(cluster_ports)
        ]

    # -- addresses --
    @property
    def brokers(self) -> list[str]:
        """Every node's gRPC address, host:port, in node order."""
        return [node.address for node in self.nodes]

    @property
    def nats_url(self) -> str | None:
        """The NATS URL: the cluster's (first) nats-server, or with embedded_nats the node's own."""
        return self.nats.url if self.nats else self.nodes[0].nats_url

    @property
    def server_ids(self) -> list[str]:
        return [node.server_id for node in self.nodes]

    @property
    def running_server_ids(self) -> list[str]:
        """The nodes FetchMetadata lists: those running (a killed one drops out of the list)."""
        return [node.server_id for node in self.nodes if node.running]

    def node(self, index: int) -> LocalNode:
        return self.nodes[index]

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"<LocalCluster {self.size} nodes {self.brokers} nats {self.nats_url} in {self.base_dir}>"

    # -- lifecycle --
    def start(self, wait: bool = True, timeout: float | None = None) -> LocalCluster:
        """Start nats-server and every node; with `wait`, until each node lists all brokers."""
        if self.routes is not None:
            self.routes.start()
        for server in self.nats_servers:
            if not server.running:
                server.start()
        for node in self.nodes:
            if not node.running:
                node.start(wait=False)
        self._started = True
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float | None = None) -> None:
        """Until every running node's FetchMetadata lists every running node of the cluster."""
        deadline = time.monotonic() + (self.ready_timeout if timeout is None else timeout)
        ids = self.running_server_ids
        for node in self.nodes:
            if node.running:
                node.wait_ready(max(0.1, deadline - time.monotonic()), brokers=ids)

    def stop(self, grace: float | None = None) -> None:
        """Stop every node (SIGTERM, all at once, then SIGKILL after the grace period), then nats-server;
        unmount the power-cut disks."""
        try:
            for node in self.nodes:
                node._terminate()
            deadline = time.monotonic() + (self.nodes[0].stop_grace if grace is None else grace)
            for node in self.nodes:
                node._finish_stop(deadline)
            for server in self.nats_servers:
                server.stop()
        finally:
            self.kill_all()
            self._unmount_all()
            if self.routes is not None:
                self.routes.close()

    def _unmount_all(self) -> None:
        for node in self.nodes:
            try:
                node.unmount()
            except Exception:  # noqa: BLE001 - unmount the others
                pass

    def kill_all(self) -> None:
        """SIGKILL every process this cluster started."""
        for process in [*self.nodes, *self.nats_servers]:
            try:
                process.kill()
            except Exception:  # noqa: BLE001 - keep killing the others
                pass

    def __enter__(self) -> LocalCluster:
        try:
            self.start()
        except BaseException:
            self.kill_all()
            self._unmount_all()
            if self.routes is not None:
                self.routes.close()
            raise
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        try:
            self.stop()
        finally:
            self.kill_all()
            keep = self.keep_data if self.keep_data is not None else exc_type is not None
            if self._owns_base_dir and not keep:
                shutil.rmtree(self.base_dir, ignore_errors=True)

    # -- faults --
    def kill(self, index: int) -> None:
        """SIGKILL node `index` (and its process group)."""
        self.nodes[index].kill()

    def restart(self, index: int, wait: bool = True, timeout: float | None = None, *, graceful: bool = True) -> None:
        """Stop node `index` if running (SIGTERM, or SIGKILL when not `graceful`), start it at the same
        addresses and data dir; with `wait`, until it lists every broker again."""
        node = self.nodes[index]
        if graceful:
            node.stop()
        else:
            node.kill()
        node.start(wait=False)
        if wait:
            node.wait_ready(self.ready_timeout if timeout is None else timeout, brokers=self.running_server_ids)

    def power_cut(self, index: int) -> dict[str, int]:
        """SIGKILL node `index`, then drop every write to its data dir that it had not fsynced (the
        cluster needs ``power_cuts=True``); the node stays stopped until `restart`. The cut's counts."""
        return self.nodes[index].power_cut()

    def disk_faults(self, index: int, *, full: bool = False, fsync_error: bool = False, fsync_delay: float = 0.0,
                    prefix: str = "/") -> None:
        """Switch disk faults on node `index`'s data dir (`LocalNode.disk_faults`; the cluster needs
        ``power_cuts=True``); ``disk_faults(index)`` clears them."""
        self.nodes[index].disk_faults(full=full, fsync_error=fsync_error, fsync_delay=fsync_delay, prefix=prefix)

    def pause(self, index: int) -> None:
        """SIGSTOP node `index`."""
        self.nodes[index].pause()

    def resume(self, index: int) -> None:
        """SIGCONT node `index`."""
        self.nodes[index].resume()

    def restart_nats(self, down_time: float = 0.0) -> None:
        """Stop the nats-server (every one of a NATS cluster), wait `down_time` seconds, start it again on the
        same port."""
        if self.nats is None:
            raise LocalProcessError("this cluster's nodes run embedded NATS; restart the node instead")
        for server in self.nats_servers:
            server.stop()
        if down_time:
            time.sleep(down_time)
        for server in self.nats_servers:
            server.start()

    def log_tails(self, lines: int = 20) -> str:
        """The end of every log, for a failure message."""
        parts = []
        for process in [*self.nats_servers, *self.nodes]:
            parts.append(f"--- {process._describe()}: {process.log_path} ---\n{process.log_tail(lines)}")
        return "\n".join(parts)
