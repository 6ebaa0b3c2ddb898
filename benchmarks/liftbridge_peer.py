"""bascule against the real Liftbridge v1.9.0 through go-liftbridge (`lbtool`, ../shared/anchors/liftbridge), in
one run, the two systems' trials interleaved (which one goes first alternates). Each trial gets servers started for
it, so only the system measured runs, and a trial never sees the previous one's data:

1. one node, each with its embedded NATS (both systems' default): `lbtool pub`, PublishAsync ack LEADER, 100-byte
   messages, 1000 in flight: msg/s and the server's CPU per message;
2. the same node, `lbtool sub` of those messages from the earliest: msg/s and the server's CPU per message;
3. three nodes on one nats-server, RF=3 ack ALL: benchmarks.lbtool_cluster's setups and trial;
4. failover with each system's defaults (bascule's leader timeout 2 s, Liftbridge's replica.max.leader.timeout
   15 s): `lbtool failover` while a script SIGKILLs the partition leader's process; recovery time (kill to the
   first acked publish), acked messages lost and duplicates, as lbtool prints them. go-liftbridge publishes
   through a broker its hash ring picks, which may be the one killed: such an attempt is counted and repeated
   (see `failover_trial`);
5. RSS of one idle node at start, and with 100 idle streams of one partition each.

Counted: CPU is user + system time from /proc over the lbtool run, the stream's creation and lbtool's warm-up
publish included. One node: bascule's node process group (the node, the nats-server its --embedded-nats starts
and that server's watchdog, a small Python process); Liftbridge's one process (its NATS runs inside it). Three
nodes: every node and the shared nats-server. RSS is the VmRSS of the same processes, summed (each one's in the
trial's line). Figures are medians over the trials; lost and duplicates are sums.

    .venv/bin/python -m benchmarks.liftbridge_peer --trials 3
    .venv/bin/python -m benchmarks.liftbridge_peer --quick    # smoke run: 1 trial, small counts
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from benchmarks.lbtool_cluster import (
    LBTOOL,
    LIFTBRIDGE,
    Broker,
    bascule_cluster,
    cpu_spent,
    fetch_leader,
    fetch_metadata,
    lbtool_output,
    liftbridge_cluster,
    run_lbtool,
)
from benchmarks.metrics import rss_mib

SYSTEMS = ("bascule", "liftbridge")
PHASES = ("memory", "pubsub", "cluster", "failover")
FAILOVER_TIMEOUT = 300.0  # lbtool retries for 90 s after the kill, then reads back for up to 20 s
Results = dict[str, dict[str, list[float]]]  # figure -> system -> one value per trial


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    summed: bool = False  # over the trials: one lost message in any trial must show


ROWS = (
    Row("pub_rate", "1 node: pub, PublishAsync ack LEADER, msg/s"),
    Row("pub_cpu", "1 node: pub, server CPU us/msg"),
    Row("sub_rate", "1 node: sub, msg/s"),
    Row("sub_cpu", "1 node: sub, server CPU us/msg"),
    Row("cluster_rate", "3 nodes RF=3 ack ALL: pub msg/s"),
    Row("cluster_cpu", "3 nodes: pub, CPU us/msg (nodes + NATS)"),
    Row("fo_recover", "failover, defaults: recovery s"),
    Row("fo_lost", "failover: acked lost", summed=True),
    Row("fo_dups", "failover: duplicates", summed=True),
    Row("fo_to_killed", "failover: attempts publishing via the killed leader", summed=True),
    Row("fo_gave_up", "failover: attempts lbtool gave up (90 s)", summed=True),
    Row("rss_start", "RSS, one idle node at start, MiB"),
    Row("rss_idle", "RSS, with the idle streams, MiB"),
)


def record(results: Results, system: str, **figures: float) -> None:
    for key, value in figures.items():
        results.setdefault(key, {}).setdefault(system, []).append(float(value))


@contextmanager
def servers(system: str, base: Path, args: argparse.Namespace,
            size: int) -> Iterator[tuple[list[Broker], list[int]]]:
    """Fresh servers of `system`, removed with their data afterwards. One node runs its embedded NATS (each
    system's default); three share a nats-server, as lbtool_cluster runs them."""
    embedded = size == 1
    try:
        if system == "bascule":
            with bascule_cluster(base, args.bascule_log_level, size, embedded_nats=embedded) as found:
                yield found
        else:
            with liftbridge_cluster(base, size, embedded_nats=embedded) as found:
                yield found
    finally:
        shutil.rmtree(base, ignore_errors=True)


def addresses(brokers: list[Broker]) -> str:
    return ",".join(broker.address for broker in brokers)


def server_pids(brokers: list[Broker], extra: list[int]) -> list[int]:
    return [broker.pid for broker in brokers] + extra


# ---- trials: each starts its servers, records its figures and returns a line for the log -----------------


def pubsub_trial(system: str, base: Path, args: argparse.Namespace, results: Results) -> str:
    with servers(system, base, args, 1) as (brokers, extra):
        pub = run_lbtool(system, brokers, extra, "peer", args, lambda _stream: brokers[0].server_id,
                         ack="leader", rf=1, sample=False)
        sub_rate, got, sub_cpu = lbtool_sub(brokers, extra, "peer", args.n)
    record(results, system, pub_rate=pub.rate, pub_cpu=pub.cpu_us_per_msg, sub_rate=sub_rate, sub_cpu=sub_cpu)
    return (f"pub {pub.rate:,.0f} msg/s errors={pub.errors} cpu={pub.cpu_us_per_msg:.2f} us/msg; "
            f"sub {sub_rate:,.0f} msg/s got={got} cpu={sub_cpu:.2f} us/msg")


def lbtool_sub(brokers: list[Broker], extra: list[int], stream: str, n: int) -> tuple[float, int, float]:
    """`lbtool sub` of offsets 0..n-1: msg/s, messages received, server CPU us per message."""
    command = [str(LBTOOL), "sub", "-addrs", addresses(brokers), "-stream", stream, "-n", str(n)]
    with cpu_spent(server_pids(brokers, extra)) as spent:
        output, _ = lbtool_output(command)
    found = re.search(r"got=(\d+) .*rate=(\d+) msg/s", output)
    if found is None or int(found[1]) == 0:
        raise RuntimeError(f"lbtool sub failed:\n{output}")
    got = int(found[1])
    return float(found[2]), got, sum(spent.values()) / got * 1e6


def cluster_trial(system: str, base: Path, args: argparse.Namespace, results: Results) -> str:
    cluster_args = argparse.Namespace(**{**vars(args), "n": args.cluster_n})
    with servers(system, base, args, 3) as (brokers, extra):
        trial = run_lbtool(system, brokers, extra, "peer-cluster", cluster_args,
                           lambda stream: fetch_leader(brokers[0].address, stream))
    record(results, system, cluster_rate=trial.rate, cluster_cpu=trial.cpu_us_per_msg)
    shares = " ".join(f"{sid}={us:.0f}" for sid, us in trial.node_cpu_us.items())
    return (f"{trial.rate:,.0f} msg/s errors={trial.errors} leader={trial.leader} sent_to={trial.sent_to} "
            f"cpu={trial.cpu_us_per_msg:.1f} us/msg (nodes: {shares})")


@dataclass(frozen=True)
class Failover:
    recover: float | None  # None: no acked publish in lbtool's 90 s after the kill
    lost: int
    dups: int
    to_killed: bool  # go-liftbridge's publishes went to the killed broker: its errors were EOF
    lines: str


def failover_trial(system: str, base: Path, args: argparse.Namespace, results: Results) -> str:
    """Attempts until go-liftbridge publishes through a broker that survives. Its hash ring of brokers, not the
    leader, picks the broker publishes go to; when that broker is killed the client is stuck on it until its broker
    list changes (re-read only when a subscription re-subscribes), and the recovery is the client's, not the
    server's. Such attempts are counted and shown, and only the others give the recovery time."""
    lines = []
    for attempt in range(args.failover_attempts):
        outcome = failover_once(base / f"attempt-{attempt}", args, system)
        record(results, system, fo_lost=outcome.lost, fo_dups=outcome.dups, fo_to_killed=outcome.to_killed,
               fo_gave_up=outcome.recover is None)
        lines.append(f"attempt {attempt}: {outcome.lines}")
        if not outcome.to_killed:
            if outcome.recover is not None:
                record(results, system, fo_recover=outcome.recover)
            break
    return "\n    ".join(lines)


def failover_once(base: Path, args: argparse.Namespace, system: str) -> Failover:
    with servers(system, base, args, 3) as (brokers, _extra):
        script = write_kill_script(base / "kill-leader.sh", brokers)
        warm_up(brokers, "fo")
        command = [str(LBTOOL), "failover", "-n", str(args.failover_n), "-kill", f"sh {script}",
                   "-addrs", addresses(brokers)]
        output, _ = lbtool_output(command, timeout=FAILOVER_TIMEOUT)
    recover, lost, dups = failover_figures(output)
    lines = " | ".join(line[2:].strip() for line in output.splitlines()
                       if line.startswith(("R fo.kill", "R fo.publish", "R fo.error_kinds", "R fo.after",
                                           "R fo.readback", "R fo.live_sub")))
    return Failover(recover if recover >= 0 else None, lost, dups, '"EOF"' in output, re.sub(r" {2,}", " ", lines))


def warm_up(brokers: list[Broker], stream: str) -> None:
    """lbtool failover's stream, created RF=3 with one acked message (ack ALL) before it runs: on a fresh cluster
    its first publish, which has no retry before the kill, can time out while the followers start fetching."""
    command = [str(LBTOOL), "pub", "-addrs", addresses(brokers), "-stream", stream, "-n", "0", "-window", "1",
               "-ack", "all", "-rf", "3", "-warm"]
    output, _ = lbtool_output(command)
    took = re.search(r"^WARMUP ([\d.]+)s", output, re.MULTILINE)
    if took is None or float(took[1]) >= 30.0:  # lbtool retries it for 30 s, then goes on regardless
        raise RuntimeError(f"the warm-up of {stream} failed:\n{output}")


def write_kill_script(path: Path, brokers: list[Broker]) -> Path:
    """A script lbtool runs with the leader's server id: SIGKILL that broker's process."""
    cases = "".join(f"  {broker.server_id}) kill -9 {broker.pid} ;;\n" for broker in brokers)
    path.write_text(f'case "$1" in\n{cases}  *) echo "no broker $1" >&2; exit 1 ;;\nesac\n')
    return path


def failover_figures(output: str) -> tuple[float, int, int]:
    """Recovery seconds, acked messages missing from the read-back, duplicates in it."""
    publish = re.search(r"^R fo\.publish +acked=.* recover=(-?[\d.]+)s", output, re.MULTILINE)
    readback = re.search(r"^R fo\.readback .*acked_missing=(\d+) duplicates=(\d+)", output, re.MULTILINE)
    killed = re.search(r"^R fo\.kill +leader=\S", output, re.MULTILINE)
    if publish is None or readback is None or killed is None or "kill failed" in output:
        raise RuntimeError(f"lbtool failover did not kill a leader or did not report:\n{output}")
    return float(publish[1]), int(readback[1]), int(readback[2])


def memory_trial(system: str, base: Path, args: argparse.Namespace, results: Results) -> str:
    with servers(system, base, args, 1) as (brokers, extra):
        pids = server_pids(brokers, extra)
        time.sleep(args.settle)
        at_start = sum(rss_mib(pid) or 0.0 for pid in pids)
        create_idle_streams(brokers[0].address, args.idle_streams)
        time.sleep(args.settle)
        idle = sum(rss_mib(pid) or 0.0 for pid in pids)
        parts = " + ".join(f"{Path(f'/proc/{pid}/comm').read_text().strip()} {rss_mib(pid) or 0.0:.1f}"
                           for pid in pids)
    record(results, system, rss_start=at_start, rss_idle=idle)
    return f"at start {at_start:.1f} MiB, with {args.idle_streams} idle streams {idle:.1f} MiB ({parts})"


def create_idle_streams(address: str, count: int, timeout: float = 120.0) -> None:
    """`count` streams of one partition each, until every one has a leader."""
    import grpc

    from bascule.wire.pb import api_pb2, api_pb2_grpc

    names = [f"idle-{index}" for index in range(count)]
    with grpc.insecure_channel(address) as channel:
        stub = api_pb2_grpc.APIStub(channel)
        for name in names:
            request = api_pb2.CreateStreamRequest(subject=f"idle.{name}", name=name, replicationFactor=1, partitions=1)
            stub.CreateStream(request, timeout=30.0)
    deadline = time.monotonic() + timeout
    while not all_led(address, names):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the {count} idle streams at {address} did not all get a leader")
        time.sleep(0.2)


def all_led(address: str, names: list[str]) -> bool:
    metadata = fetch_metadata(address).streamMetadata  # type: ignore[attr-defined]
    led = {stream.name for stream in metadata if stream.partitions and stream.partitions[0].leader}
    return set(names) <= led


TRIALS: dict[str, Callable[[str, Path, argparse.Namespace, Results], str]] = {
    "memory": memory_trial, "pubsub": pubsub_trial, "cluster": cluster_trial, "failover": failover_trial,
}


# ---- the table -----------------------------------------------------------------------------------------


def figure(values: list[float], summed: bool) -> float | None:
    if not values:
        return None
    return sum(values) if summed else statistics.median(values)


def shown(value: float | None, summed: bool) -> str:
    if value is None:
        return "-"
    if summed:
        return f"{value:.0f}"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def ratio(ours: float | None, theirs: float | None) -> str:
    return "-" if ours is None or not theirs else f"{ours / theirs:.2f}x"


def table(results: Results, args: argparse.Namespace) -> list[str]:
    lines = [f"| {args.trials} trial(s) each | bascule | liftbridge | bascule/liftbridge |",
             "| --- | ---: | ---: | ---: |"]
    for row in ROWS:
        values = results.get(row.key, {})
        ours, theirs = (figure(values.get(system, []), row.summed) for system in SYSTEMS)
        if ours is not None or theirs is not None:
            cells = [row.label, shown(ours, row.summed), shown(theirs, row.summed),
                     "-" if row.summed else ratio(ours, theirs)]  # a ratio of counts says nothing
            lines.append(f"| {' | '.join(cells)} |")
    return lines


# ---- command line ----------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=3, help="trials per system and measure, interleaved")
    parser.add_argument("-n", type=int, default=200_000, help="messages per one-node pub (and sub) trial")
    parser.add_argument("--cluster-n", type=int, default=100_000, help="messages per three-node trial")
    parser.add_argument("--failover-n", type=int, default=3000, help="lbtool failover's publishes (kill at n/3)")
    parser.add_argument("--failover-attempts", type=int, default=3,
                        help="per failover trial, while go-liftbridge publishes via the killed leader")
    parser.add_argument("--idle-streams", type=int, default=100)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--window", type=int, default=1000)
    parser.add_argument("--settle", type=float, default=2.0, help="seconds before each RSS reading")
    parser.add_argument("--phases", default=",".join(PHASES), help=f"some of {','.join(PHASES)}")
    parser.add_argument("--bascule-log-level", default="warn")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 1 trial, 20k/10k/300 messages, 2 failover attempts")
    args = parser.parse_args()
    if args.quick:
        args.trials, args.n, args.cluster_n, args.failover_n, args.failover_attempts = 1, 20_000, 10_000, 300, 2
    args.phases = args.phases.split(",")
    if unknown := set(args.phases) - set(PHASES):
        parser.error(f"unknown phases {sorted(unknown)}")
    return args


def run(args: argparse.Namespace, root: Path) -> Results:
    results: Results = {}
    for phase in args.phases:
        for index in range(args.trials):
            for system in SYSTEMS if index % 2 == 0 else SYSTEMS[::-1]:
                line = TRIALS[phase](system, root / f"{phase}-{system}-{index}", args, results)
                print(f"{phase:8} {system:10} trial {index}: {line}", flush=True)
    return results


def stop_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds the servers' context managers, which stop them


def main() -> None:
    args = parse_args()
    if not (LIFTBRIDGE.exists() and LBTOOL.exists()):
        raise SystemExit(f"lbtool and liftbridge are expected at {LBTOOL} and {LIFTBRIDGE}")
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    root = Path(tempfile.mkdtemp(prefix="liftbridge-peer-"))
    print(f"load average before: {os.getloadavg()}; {os.cpu_count()} cores", flush=True)
    try:
        results = run(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("\n".join(table(results, args)))
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
