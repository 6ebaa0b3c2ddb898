"""go-liftbridge (lbtool pub) against a 3-node bascule cluster and a 3-node Liftbridge v1.9.0 cluster, trials
interleaved: RF=3, ack ALL, 1000 publishes in flight, a new stream per trial (so its leader lands anywhere).

go-liftbridge sends PublishAsync to a broker of its choice, often not the partition's leader; each trial says
which broker was the leader and which one took the publishes (the broker whose connection from lbtool carried
the most bytes), with the servers' CPU per message (every node and the NATS server) and each node's share.

    .venv/bin/python -m benchmarks.lbtool_cluster --trials 4 -n 100000
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ANCHORS = Path(os.environ.get("LIFTBRIDGE_ANCHORS", "/work/shared/anchors/liftbridge"))
LBTOOL = ANCHORS / "bin" / "lbtool"
LIFTBRIDGE = ANCHORS / "bin" / "liftbridge"
HOST = "127.0.0.1"
CLK_TCK = os.sysconf("SC_CLK_TCK")
SOCKET_POLL = 0.2  # seconds between looks at lbtool's connections
PUB_TIMEOUT = 600.0


@dataclass
class Broker:
    server_id: str
    address: str  # host:port of its gRPC API
    pid: int


@dataclass
class Trial:
    system: str
    rate: float
    errors: int
    leader: str
    sent_to: str
    cpu_us_per_msg: float
    node_cpu_us: dict[str, float] = field(default_factory=dict)

    @property
    def forwarded(self) -> bool:
        return self.sent_to != self.leader


def process_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


class BytesToBrokers:
    """Samples lbtool's TCP connections (ss) while it runs: bytes it sent to each broker port."""

    def __init__(self, lbtool_pid: int, ports: dict[int, str]) -> None:
        self.pid = lbtool_pid
        self.ports = ports
        self.sent: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> BytesToBrokers:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(SOCKET_POLL):
            out = subprocess.run(["ss", "-tinpH", "state", "established"], capture_output=True, text=True).stdout
            seen: dict[str, int] = {}
            # Each socket is a line with its addresses and users:((...pid=N...)), then a line of counters.
            for head, counters in zip(out.splitlines()[::2], out.splitlines()[1::2], strict=False):
                if f"pid={self.pid}," not in head:
                    continue
                parts = head.split()
                port = int(parts[3].rsplit(":", 1)[1]) if len(parts) > 3 else -1
                broker = self.ports.get(port)
                found = re.search(r"bytes_acked:(\d+)", counters)
                if broker is not None and found:
                    seen[broker] = seen.get(broker, 0) + int(found.group(1))
            for broker, count in seen.items():
                self.sent[broker] = max(self.sent.get(broker, 0), count)

    @property
    def busiest(self) -> str:
        return max(self.sent, key=self.sent.__getitem__) if self.sent else "?"


@contextmanager
def cpu_spent(pids: list[int]) -> Iterator[dict[int, float]]:
    """CPU seconds each of `pids` spent inside the block (the dict is filled in on the way out)."""
    before = {pid: process_cpu_seconds(pid) for pid in pids}
    spent: dict[int, float] = {}
    yield spent
    spent.update({pid: process_cpu_seconds(pid) - seconds for pid, seconds in before.items()})


def lbtool_output(command: list[str], ports: dict[int, str] | None = None,
                  timeout: float = PUB_TIMEOUT) -> tuple[str, str]:
    """lbtool's output, and with `ports` (broker port -> id) the broker it sent the most bytes to."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        if ports is None:
            return process.communicate(timeout=timeout)[0], "?"
        with BytesToBrokers(process.pid, ports) as sampler:
            output = process.communicate(timeout=timeout)[0]
        return output, sampler.busiest
    finally:
        if process.poll() is None:  # a timeout or Ctrl-C: lbtool must not outlive the run
            process.kill()
            process.wait()


def run_lbtool(system: str, brokers: list[Broker], extra_pids: list[int], stream: str, args: argparse.Namespace,
               leader_of: object, ack: str = "all", rf: int = 3, sample: bool = True) -> Trial:
    """One `lbtool pub` trial; `sample` watches which broker took the publishes (pointless on one node)."""
    command = [str(LBTOOL), "pub", "-addrs", ",".join(b.address for b in brokers), "-stream", stream,
               "-n", str(args.n), "-size", str(args.size), "-window", str(args.window), "-ack", ack, "-rf", str(rf),
               "-warm"]
    ports = {int(b.address.rsplit(":", 1)[1]): b.server_id for b in brokers} if sample else None
    # The warm-up publish and the stream's creation are in the CPU too: small against n messages.
    with cpu_spent([b.pid for b in brokers] + extra_pids) as spent:
        output, sent_to = lbtool_output(command, ports)
    found = re.search(r"rate=(\d+) msg/s errors=(\d+)", output)
    if found is None:
        raise RuntimeError(f"{system}: lbtool pub failed:\n{output}")
    leader = leader_of(stream)  # type: ignore[operator]
    node_cpu = {b.server_id: spent[b.pid] for b in brokers}
    return Trial(system, float(found.group(1)), int(found.group(2)), leader, sent_to,
                 sum(spent.values()) / args.n * 1e6, {sid: cpu / args.n * 1e6 for sid, cpu in node_cpu.items()})


def fetch_metadata(address: str, stream: str | None = None, timeout: float = 10.0) -> object:
    """FetchMetadata from a broker, with grpcio (the same API on both systems)."""
    import grpc

    from bascule.wire.pb import api_pb2, api_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        request = api_pb2.FetchMetadataRequest(streams=[stream] if stream else [])
        return api_pb2_grpc.APIStub(channel).FetchMetadata(request, timeout=timeout)


def fetch_leader(address: str, stream: str) -> str:
    """The partition leader as a broker's metadata says."""
    response = fetch_metadata(address, stream)
    for metadata in response.streamMetadata:  # type: ignore[attr-defined]
        if metadata.name == stream:
            return str(metadata.partitions[0].leader)
    return "?"


@contextmanager
def bascule_cluster(base: Path, level: str, size: int = 3,
                    embedded_nats: bool = False) -> Iterator[tuple[list[Broker], list[int]]]:
    """bascule's nodes and the pids of the NATS they use: the shared nats-server, or each node's own child
    (``--embedded-nats``, one node)."""
    from bascule.testing.local import LocalCluster

    with LocalCluster(size, base_dir=base / "bascule", level=level, keep_data=False,
                      embedded_nats=embedded_nats) as cluster:
        brokers = [Broker(node.server_id, node.address, node.pid) for node in cluster.nodes]  # type: ignore[arg-type]
        children = [pid for node in cluster.nodes for pid in node.pids() if pid != node.pid]
        yield brokers, [cluster.nats.pid] if cluster.nats and cluster.nats.pid else children


@contextmanager
def liftbridge_cluster(base: Path, size: int = 3,
                       embedded_nats: bool = False) -> Iterator[tuple[list[Broker], list[int]]]:
    """Liftbridge's brokers on one nats-server, or one broker with its NATS embedded (in its own process, so
    no NATS pid is yielded)."""
    from bascule.testing.local import LocalNatsServer
    from bascule.testing.ports import free_port

    root = base / "liftbridge"
    root.mkdir(parents=True)
    nats = None if embedded_nats else LocalNatsServer(root / "nats.log")
    processes: list[subprocess.Popen[bytes]] = []
    try:
        if nats is None:
            nats_settings = embedded_nats_settings(root, free_port(HOST))
        else:
            nats.start()
            nats_settings = f"nats.servers: [\"{nats.url}\"]\n"
        ids = [f"lb{index + 1}" for index in range(size)]
        brokers = []
        for server_id in ids:
            port = free_port(HOST)
            bootstrap = f"raft.bootstrap.peers: [{', '.join(ids)}]" if size > 1 else "raft.bootstrap.seed: true"
            config = root / f"{server_id}.yaml"
            config.write_text(
                f"listen: {HOST}:{port}\ndata.dir: {root / server_id}\nlogging.level: warn\n{nats_settings}"
                f"clustering: {{server.id: {server_id}, {bootstrap}}}\n"
            )
            log = open(root / f"{server_id}.log", "wb")  # noqa: SIM115 (closed with the process)
            processes.append(subprocess.Popen([str(LIFTBRIDGE), "--config", str(config)], stdout=log, stderr=log))
            log.close()
            brokers.append(Broker(server_id, f"{HOST}:{port}", processes[-1].pid))
        wait_for_metadata_leader(brokers)
        yield brokers, [nats.pid] if nats is not None and nats.pid else []
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if nats is not None:
            nats.stop()


def embedded_nats_settings(root: Path, port: int) -> str:
    """Config lines for Liftbridge's embedded NATS: it needs a config file of its own to bind loopback only."""
    nats_config = root / "embedded-nats.conf"
    nats_config.write_text(f'listen: "{HOST}:{port}"\n')
    return (f"nats.embedded: true\nnats.embedded.config: {nats_config}\n"
            f"nats.servers: [\"nats://{HOST}:{port}\"]\n")


def wait_for_metadata_leader(brokers: list[Broker], timeout: float = 60.0) -> None:
    """Until every broker is registered in the metadata (Liftbridge's Raft has a leader) and, on several brokers,
    the metadata leader takes a CreateStream: a fresh cluster lists its brokers a while before that, and lbtool's
    first create would fail with "no responders"."""
    import grpc

    deadline = time.monotonic() + timeout
    while True:
        try:
            if (len(fetch_metadata(brokers[0].address, timeout=5.0).brokers) == len(brokers)  # type: ignore[attr-defined]
                    and (len(brokers) == 1 or creates_streams(brokers[0].address))):
                return
        except grpc.RpcError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("the Liftbridge cluster did not form")
        time.sleep(0.5)


def creates_streams(address: str, name: str = "ready-probe") -> bool:
    """Whether a stream can be created (and then deleted) through the broker at `address`."""
    import grpc

    from bascule.wire.pb import api_pb2, api_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stub = api_pb2_grpc.APIStub(channel)
        try:
            stub.CreateStream(api_pb2.CreateStreamRequest(subject=name, name=name), timeout=5.0)
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.ALREADY_EXISTS:
                return False
        stub.DeleteStream(api_pb2.DeleteStreamRequest(name=name), timeout=5.0)
    return True


def summary(trials: list[Trial]) -> list[str]:
    lines = []
    for system in ("bascule", "liftbridge"):
        mine = [t for t in trials if t.system == system]
        if not mine:
            continue
        best = max(t.rate for t in mine)
        worst = min(t.rate for t in mine)
        lines.append(f"{system}: median {statistics.median(t.rate for t in mine):,.0f} msg/s, best {best:,.0f}, "
                     f"worst {worst:,.0f} (worst/best {worst / best:.2f}); forwarded in "
                     f"{sum(t.forwarded for t in mine)} of {len(mine)}")
    rates = {s: statistics.median(t.rate for t in trials if t.system == s) for s in ("bascule", "liftbridge")
             if any(t.system == s for t in trials)}
    if len(rates) == 2:
        lines.append(f"bascule/liftbridge median rate: {rates['bascule'] / rates['liftbridge']:.2f}x")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=4, help="trials per system, interleaved")
    parser.add_argument("-n", type=int, default=100_000, help="messages per trial")
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--window", type=int, default=1000)
    parser.add_argument("--systems", default="bascule,liftbridge")
    parser.add_argument("--bascule-log-level", default="warn")
    args = parser.parse_args()
    systems = args.systems.split(",")
    if "liftbridge" in systems and not LIFTBRIDGE.exists() or not LBTOOL.exists():
        raise SystemExit(f"lbtool and liftbridge are expected under {ANCHORS}/bin")
    base = Path(tempfile.mkdtemp(prefix="lbtool-cluster-"))
    print(f"load average before: {os.getloadavg()}; {os.cpu_count()} cores", flush=True)
    trials: list[Trial] = []
    try:
        with ExitStack() as stack:
            clusters = {}
            if "bascule" in systems:
                clusters["bascule"] = stack.enter_context(bascule_cluster(base, args.bascule_log_level))
            if "liftbridge" in systems:
                clusters["liftbridge"] = stack.enter_context(liftbridge_cluster(base))
            for index in range(args.trials):
                for system, (brokers, extra) in clusters.items():
                    stream = f"bench-{index}-{int(time.time())}"
                    trial = run_lbtool(system, brokers, extra, stream, args,
                                       lambda name, b=brokers: fetch_leader(b[0].address, name))
                    trials.append(trial)
                    shares = " ".join(f"{sid}={us:.0f}" for sid, us in trial.node_cpu_us.items())
                    print(f"{system:10} trial {index}: {trial.rate:9,.0f} msg/s  errors={trial.errors}  "
                          f"leader={trial.leader} sent_to={trial.sent_to}  "
                          f"cpu={trial.cpu_us_per_msg:.1f} us/msg (nodes: {shares})", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    for line in summary(trials):
        print(line)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
