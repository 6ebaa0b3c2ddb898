"""Scale with partitions (issue 32): what N replicated partitions cost bascule at rest and in a mass
failover, next to JetStream holding the same number of R3 streams.

bascule: 3 nodes (LocalCluster, real processes on loopback, one nats-server), N partitions RF=3 in
streams of at most bascule.wire.names.MAX_PARTITIONS partitions each. JetStream: 3 routed nats-servers, N R3
file streams. For each partition count and system, on a fresh cluster:

- idle CPU (utime+stime from /proc over a quiet window after a settle) and RSS of each server,
  first with nothing created, then with the N partitions (streams);
- create: from the first create request until every partition has its full ISR in the metadata
  (JetStream: every stream has a leader and both other replicas current, from STREAM.INFO); a count
  whose creation has not finished after --create-timeout stops there, with how far it got;
- memory per partition: RSS with N less RSS with none, divided by N, per server;
- the metadata Raft's files on disk (bascule: <data>/raft; JetStream: the meta group's directory);
- mass failover: SIGKILL of the server leading the most partitions (about a third), then the time
  until every partition (stream) has a live leader in the metadata, and how many were re-led.

Prints one JSON line per (count, system) and one line of bascule/JetStream ratios per count.
Usage: .venv/bin/python benchmarks/partitions.py --partitions 100,1000 [--system bascule|jetstream|both]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import signal
import sys
import tempfile
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    # As a script, this file's directory would lead sys.path and its modules could shadow others by name.
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bascule.wire.names import MAX_PARTITIONS  # noqa: E402
from benchmarks.harness import BASCULE, JETSTREAM, BenchError, Context, log, now  # noqa: E402
from benchmarks.metrics import cpu_seconds, loadavg, rss_mib  # noqa: E402

REPLICAS = 3
POLL_SECONDS = 0.2
JS_API_TIMEOUT = 5.0
JS_CREATES_IN_FLIGHT = 16
# A leaderless stream's STREAM.INFO goes unanswered (or fails after a delay): short waits keep polls frequent.
JS_INFO_TIMEOUT = 1.0
JS_INFOS_IN_FLIGHT = 500
# (seconds since the start, partitions ready) at each poll of a wait
Progress = list[tuple[float, int]]


# ---- measuring -----------------------------------------------------------------------------------


async def idle_figures(pids_by_server: dict[str, list[int]], settle: float, window: float) -> dict[str, Any]:
    """After `settle` s, each server's CPU (% of one core) over `window` s, then its RSS (MiB)."""
    await asyncio.sleep(settle)
    before = {name: cpu_seconds(pids) for name, pids in pids_by_server.items()}
    started = now()
    await asyncio.sleep(window)
    elapsed = now() - started
    return {
        "cpu_pct": {name: round(100 * (cpu_seconds(pids) - before[name]) / elapsed, 2)
                    for name, pids in pids_by_server.items()},
        "rss_mib": rss_each(pids_by_server),
        "loadavg": loadavg(),
    }


def rss_each(pids_by_server: dict[str, list[int]]) -> dict[str, float]:
    return {name: round(sum(rss_mib(pid) or 0.0 for pid in pids), 1) for name, pids in pids_by_server.items()}


def mean(values: Any) -> float:
    values = list(values)
    return round(sum(values) / len(values), 2) if values else math.nan


def kib_per_partition(empty: dict[str, float], loaded: dict[str, float], count: int) -> dict[str, float]:
    return {name: round((loaded[name] - empty[name]) * 1024 / count, 1) for name in loaded if name in empty}


def file_sizes(directory: Path) -> dict[str, int]:
    """Bytes of every file under `directory`, by path relative to it."""
    if not directory.is_dir():
        return {}
    return {str(p.relative_to(directory)): p.stat().st_size for p in sorted(directory.rglob("*")) if p.is_file()}


async def poll_until_all(count_ready: Callable[[], Awaitable[int]], total: int, started: float,
                         timeout: float) -> Progress:
    """Poll until `count_ready()` reaches `total` or `timeout` s after `started`; the polls' progress. A
    failing poll counts as no change."""
    progress: Progress = []
    while True:
        try:
            ready = await count_ready()
        except Exception:  # noqa: BLE001 - a metadata leader moving or a killed server: poll again
            ready = progress[-1][1] if progress else 0
        progress.append((round(now() - started, 3), ready))
        if ready >= total or now() - started > timeout:
            return progress
        await asyncio.sleep(POLL_SECONDS)


def ready_at(progress: Progress, seconds: float) -> int:
    """What the last poll at or before `seconds` found ready (a count can fall: an ISR shrinks again)."""
    return next((ready for at, ready in reversed(progress) if at <= seconds), 0)


def stream_sizes(count: int) -> list[int]:
    """`count` partitions in as few streams as the per-stream limit allows, of near-equal sizes."""
    streams = math.ceil(count / MAX_PARTITIONS)
    return [count // streams + (1 if i < count % streams else 0) for i in range(streams)]


def failover_figures(killed: str, re_led: int, total: int, progress: Progress, goal: float) -> dict[str, Any]:
    seconds, live_led = progress[-1]
    return {"killed": killed, "re_led": re_led, "seconds": seconds if live_led >= total else None,
            "live_led_at_end": live_led, f"live_led_at_{goal:g}_s": ready_at(progress, goal),
            "polls": len(progress)}


# ---- bascule -------------------------------------------------------------------------------------


class BasculeScale:
    """A LocalCluster of 3 nodes with the leader timeout asked for, and the streams of one count."""

    name = BASCULE

    def __init__(self, args: argparse.Namespace, base: Path) -> None:
        from bascule.testing.local import LocalCluster

        config = {"clustering.replica.max.leader.timeout": f"{args.leader_timeout}s"}
        self.cluster = LocalCluster(3, base_dir=base, config=config, keep_data=True, level=args.bascule_log_level)
        self.streams: list[str] = []
        self.count = 0

    async def __aenter__(self) -> BasculeScale:
        try:
            await asyncio.to_thread(self.cluster.start)
        except BaseException:
            await asyncio.to_thread(self.cluster.stop)
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.cluster.stop)

    def pids_by_server(self) -> dict[str, list[int]]:
        """The nodes' and, apart from them (not a data server), their nats-server's."""
        pids = {node.server_id: node.pids() for node in self.cluster.nodes if node.running}
        assert self.cluster.nats is not None
        pids["nats-server"] = self.cluster.nats.pids()
        return pids

    def data_servers(self) -> list[str]:
        return self.cluster.server_ids

    def client(self, exclude: str = "") -> Any:
        from bascule.client import Client

        return Client([n.address for n in self.cluster.nodes if n.server_id != exclude], timeout=60.0)

    async def partitions(self, client: Any) -> list[Any]:
        metadata = await client.fetch_metadata(*self.streams)
        found = [metadata.streams.get(name) for name in self.streams]
        return [p for info in found if info is not None and info.exists for p in info.partitions.values()]

    async def create(self, count: int, timeout: float) -> Progress:
        """One CreateStream per stream, then until every partition has a leader and a full ISR."""
        self.count = count
        async with self.client() as client:
            started = now()
            for i, size in enumerate(stream_sizes(count)):
                name = f"scale{i}"
                await client.create_stream(name, f"scale.{i}", replication_factor=REPLICAS, partitions=size)
                self.streams.append(name)

            async def full_isr() -> int:
                return sum(1 for p in await self.partitions(client) if p.leader and len(p.isr) == REPLICAS)

            return await poll_until_all(full_isr, count, started, timeout)

    def raft_files(self) -> dict[str, dict[str, int]]:
        """The metadata Raft's journal (`journal`, `journal.meta`) and snapshot (`dump`) of each node."""
        return {node.server_id: file_sizes(node.data_dir / "raft") for node in self.cluster.nodes}

    async def fail_over(self, timeout: float, goal: float) -> dict[str, Any]:
        """SIGKILL the node leading the most partitions; until the metadata names a live leader for each."""
        async with self.client() as client:
            leaders = Counter(p.leader for p in await self.partitions(client))
            metadata_leader = (await client.status())["raftLeaderId"]
        killed, re_led = leaders.most_common(1)[0]
        live = set(self.cluster.server_ids) - {killed}
        async with self.client(exclude=killed) as watcher:

            async def live_led() -> int:
                return sum(1 for p in await self.partitions(watcher) if p.leader in live)

            started = now()
            await asyncio.to_thread(self.cluster.kill, self.cluster.server_ids.index(killed))
            progress = await poll_until_all(live_led, self.count, started, timeout)
        return {**failover_figures(killed, re_led, self.count, progress, goal),
                "metadata_leader_killed": killed == metadata_leader}

    async def wait_snapshots(self, timeout: float) -> None:
        """Until every running node has written a Raft snapshot (pysyncobj: 300 s after its start, or past
        5,000 journal entries), or `timeout`."""
        deadline = now() + timeout
        while now() < deadline:
            if all((node.data_dir / "raft" / "dump").exists() for node in self.cluster.nodes if node.running):
                return
            await asyncio.sleep(1.0)


# ---- JetStream -----------------------------------------------------------------------------------


class JetStreamScale:
    """3 routed nats-servers with JetStream (benchmarks.systems.JetStreamSystem) and N R3 streams."""

    name = JETSTREAM

    def __init__(self, args: argparse.Namespace, base: Path) -> None:
        from benchmarks.systems import JetStreamSystem

        self.system = JetStreamSystem(Context(args, base, {}), "jetstream", 3)
        self.count = 0

    async def __aenter__(self) -> JetStreamScale:
        await self.system.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.system.__aexit__(*exc)

    def pids_by_server(self) -> dict[str, list[int]]:
        return {f"js{i}": [pid] for i, pid in enumerate(self.system.server_pids()) if pid is not None}

    def data_servers(self) -> list[str]:
        return [f"js{i}" for i in range(self.system.size)]

    async def streams(self) -> list[dict[str, Any]]:
        """Every stream's info from STREAM.LIST (used while every stream has a leader: the list waits for
        leaderless streams' answers, then leaves them out as "missing")."""
        listed: list[dict[str, Any]] = []
        offset = 0
        while True:
            reply = await self.system.nc.request("$JS.API.STREAM.LIST", json.dumps({"offset": offset}).encode(),
                                                 timeout=JS_API_TIMEOUT)
            page = json.loads(reply.data)
            if "error" in page:
                raise BenchError(f"STREAM.LIST: {page['error']}")
            streams, missing = page.get("streams") or [], page.get("missing") or []
            listed += streams
            offset += len(streams) + len(missing)
            if (not streams and not missing) or offset >= page.get("total", 0):
                return listed

    async def cluster_info(self, name: str, in_flight: asyncio.Semaphore) -> dict[str, Any]:
        """The stream's cluster part of STREAM.INFO (answered by its leader), or {} without an answer."""
        async with in_flight:
            try:
                reply = await self.system.nc.request(f"$JS.API.STREAM.INFO.{name}", b"", timeout=JS_INFO_TIMEOUT)
            except Exception:  # noqa: BLE001 - no leader to answer yet, or the server we ask reconnecting
                return {}
        info = json.loads(reply.data)
        return {} if "error" in info else info.get("cluster") or {}

    def counter_of(self, ready: Callable[[dict[str, Any]], bool]) -> Callable[[], Awaitable[int]]:
        """A count of the streams whose cluster info is `ready`; a stream once ready is not asked again."""
        pending = {f"scale{i}" for i in range(self.count)}
        in_flight = asyncio.Semaphore(JS_INFOS_IN_FLIGHT)

        async def count_ready() -> int:
            names = sorted(pending)
            infos = await asyncio.gather(*(self.cluster_info(name, in_flight) for name in names))
            pending.difference_update(name for name, info in zip(names, infos) if ready(info))
            return self.count - len(pending)

        return count_ready

    async def add_stream(self, index: int, deadline: float) -> None:
        """Asks until the stream is created or `deadline` passes (the count's creation then stops)."""
        while now() < deadline:
            try:
                await self.system.js.add_stream(name=f"scale{index}", subjects=[f"scale.{index}"],
                                                num_replicas=REPLICAS, storage="file")
                return
            except Exception:  # noqa: BLE001 - the meta leader busy or moving: try again
                await asyncio.sleep(0.2)

    async def create(self, count: int, timeout: float) -> Progress:
        """The streams created, a few requests in flight, then until each has a leader and both other
        replicas current."""
        self.count = count
        in_flight = asyncio.Semaphore(JS_CREATES_IN_FLIGHT)
        started = now()

        async def add(index: int) -> None:
            async with in_flight:
                await self.add_stream(index, started + timeout)

        await asyncio.gather(*(add(i) for i in range(count)))
        return await poll_until_all(self.counter_of(_all_current), count, started, timeout)

    def raft_files(self) -> dict[str, dict[str, int]]:
        """The JetStream meta group's Raft directory of each server (its log blocks and snapshots)."""
        return {f"js{i}": file_sizes(self.system.base / f"store{i}" / "jetstream" / "$SYS" / "_js_" / "_meta_")
                for i in range(self.system.size)}

    async def fail_over(self, timeout: float, goal: float) -> dict[str, Any]:
        """SIGKILL the server leading the most streams; until STREAM.INFO names a live leader for each."""
        leaders = Counter((s.get("cluster") or {}).get("leader") for s in await self.streams())
        killed, re_led = leaders.most_common(1)[0]
        index = int(str(killed).removeprefix("js"))
        await self.system.connect((index + 1) % self.system.size)  # a watcher on a server that survives
        live = set(self.data_servers()) - {killed}
        live_led = self.counter_of(lambda cluster: cluster.get("leader") in live)
        pid = self.system.server_pids()[index]
        assert pid is not None
        started = now()
        os.kill(pid, signal.SIGKILL)
        try:
            progress = await poll_until_all(live_led, self.count, started, timeout)
        finally:
            await self.system.servers[index].kill()  # reaps it
        return failover_figures(str(killed), re_led, self.count, progress, goal)

    async def wait_snapshots(self, timeout: float) -> None:
        """JetStream snapshots its meta group on its own schedule: nothing to wait for."""


def _all_current(cluster: dict[str, Any]) -> bool:
    replicas = cluster.get("replicas") or []
    return bool(cluster.get("leader")) and len(replicas) == REPLICAS - 1 and all(
        r.get("current") and not r.get("offline") for r in replicas)


# ---- one count on one system ----------------------------------------------------------------------

Scale = BasculeScale | JetStreamScale


async def measure_scale(scale: Scale, count: int, args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Fills `result` as it goes, so that a failure keeps what was measured before it."""
    name = scale.name
    result["empty"] = await idle_figures(scale.pids_by_server(), args.settle, args.window)
    log(f"{name} {count}: empty cluster idle {result['empty']['cpu_pct']}; creating")
    await timed_create(scale, count, args.create_timeout, result)
    log(f"{name} {count}: created in {result['create_s']} s; idling")
    result["idle"] = await idle_figures(scale.pids_by_server(), args.settle, args.window)
    result["raft_files"] = scale.raft_files()
    log(f"{name} {count}: idle {result['idle']['cpu_pct']}; killing a leader")
    result["failover"] = await scale.fail_over(args.failover_timeout, args.leader_timeout + 2)
    log(f"{name} {count}: failover {result['failover']}")
    await scale.wait_snapshots(args.snapshot_wait)
    result["raft_files_after_failover"] = scale.raft_files()
    summarize(result, count, scale.data_servers())


async def timed_create(scale: Scale, count: int, timeout: float, result: dict[str, Any]) -> None:
    """The creation's time; or, when `timeout` stops it, how far it got every 30 s and the RSS then."""
    progress = await scale.create(count, timeout)
    stopped_at, ready = progress[-1]
    if ready < count:
        result["create_ready_at_s"] = {s: ready_at(progress, s) for s in range(30, int(stopped_at) + 1, 30)}
        result["rss_mib_at_stop"] = rss_each(scale.pids_by_server())
        raise BenchError(f"creation stopped: {ready} of {count} ready after {stopped_at} s")
    result["create_s"] = stopped_at


def summarize(result: dict[str, Any], count: int, servers: list[str]) -> None:
    """The per-server means the ratios compare, over the data servers (bascule's nats-server apart)."""
    idle, empty = result["idle"], result["empty"]
    per_partition = kib_per_partition(empty["rss_mib"], idle["rss_mib"], count)
    result["summary"] = {
        "create_s": result["create_s"],
        "idle_cpu_pct_per_server": mean(idle["cpu_pct"][s] for s in servers),
        "empty_cpu_pct_per_server": mean(empty["cpu_pct"][s] for s in servers),
        "rss_mib_per_server": mean(idle["rss_mib"][s] for s in servers),
        "kib_per_partition": mean(per_partition[s] for s in servers),
        "metadata_raft_bytes_per_server": mean(sum(files.values()) for files in result["raft_files"].values()),
        "failover_s": result["failover"]["seconds"],
        "re_led": result["failover"]["re_led"],
    }


def ratios(bascule: dict[str, Any], jetstream: dict[str, Any]) -> dict[str, Any]:
    line: dict[str, Any] = {"ratio": "bascule/jetstream", "partitions": bascule["partitions"]}
    for key, value in bascule["summary"].items():
        other = jetstream["summary"].get(key)
        line[key] = round(value / other, 2) if value is not None and other else None
    return line


async def measure(system: str, count: int, args: argparse.Namespace, base: Path) -> dict[str, Any]:
    result: dict[str, Any] = {"system": system, "partitions": count,
                              "streams": len(stream_sizes(count)) if system == BASCULE else count,
                              "loadavg_start": loadavg()}
    scale_class = BasculeScale if system == BASCULE else JetStreamScale
    try:
        async with scale_class(args, base / f"{system}-{count}") as scale:
            await measure_scale(scale, count, args, result)
    except (BenchError, TimeoutError, OSError, RuntimeError) as exc:
        log(f"{system} {count} FAILED: {exc}")
        result["error"] = str(exc)
    result["loadavg_end"] = loadavg()
    return result


async def run_all(args: argparse.Namespace, base: Path) -> None:
    for count in args.partitions:
        results = {}
        for system in args.systems:
            results[system] = await measure(system, count, args, base)
            print(json.dumps(results[system]), flush=True)
        if all("summary" in results.get(s, {}) for s in (BASCULE, JETSTREAM)):
            print(json.dumps(ratios(results[BASCULE], results[JETSTREAM])), flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", default="100,1000", help="partition counts (default 100,1000)")
    parser.add_argument("--system", default="both", choices=[BASCULE, JETSTREAM, "both"])
    parser.add_argument("--leader-timeout", type=float, default=3.0,
                        help="bascule's clustering.replica.max.leader.timeout, s (default 3)")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds before each idle window (default 5)")
    parser.add_argument("--window", type=float, default=10.0, help="idle window, s (default 10)")
    parser.add_argument("--create-timeout", type=float, default=240.0,
                        help="give a count up when creation takes longer, s (default 240)")
    parser.add_argument("--failover-timeout", type=float, default=180.0, help="s (default 180)")
    parser.add_argument("--snapshot-wait", type=float, default=0.0,
                        help="after the failover, wait up to this many s for bascule's Raft snapshots (pysyncobj "
                             "writes one 300 s after a node starts), to measure them (default 0: do not wait)")
    parser.add_argument("--bascule-log-level", default="info", help="the nodes' --level (default info)")
    parser.add_argument("--workdir", help="where the clusters' directories go (default the system's temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the data dirs and logs (their path is logged)")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    args.partitions = [int(x) for x in args.partitions.split(",") if x.strip()]
    args.systems = [BASCULE, JETSTREAM] if args.system == "both" else [args.system]
    base = Path(tempfile.mkdtemp(prefix="bascule-partitions-", dir=args.workdir))
    log(f"partitions {args.partitions}, systems {args.systems}, work dir {base}, load average {loadavg()}")
    try:
        asyncio.run(run_all(args, base))
    except KeyboardInterrupt:
        return 130
    finally:
        if args.keep:
            log(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
