"""The benchmark command: ``python benchmarks/run.py [--quick] [--scenario NAME] ...`` from a checkout
(or ``python -m benchmarks.run``); ``--help`` lists the options, ``--list`` the scenarios. See
``benchmarks/__init__.py`` for what each scenario measures, benchmarks/RESULTS.md for figures."""

from __future__ import annotations

import argparse
import asyncio
import compileall
import json
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import traceback
from importlib.util import find_spec
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    # Run as a script, this file's directory would lead sys.path, and its modules could shadow others
    # by name; the repo root puts them under `benchmarks.` instead.
    sys.path[0] = str(Path(__file__).resolve().parents[1])
if find_spec("bascule") is None:  # a checkout without the package installed
    sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "src"))

import bascule  # noqa: E402
from benchmarks import node_client  # noqa: E402
from benchmarks.environment import machine_info, versions  # noqa: E402
from benchmarks.harness import BASCULE, JETSTREAM, NATS, BenchError, Context, log, now  # noqa: E402
from benchmarks.metrics import loadavg  # noqa: E402
from benchmarks.profiling import Profiler, format_profile  # noqa: E402
from benchmarks.report import format_markdown, format_table, summarize  # noqa: E402
from benchmarks.scenarios import GROUPS, SCENARIOS, select_scenarios  # noqa: E402

PROG = "benchmarks/run.py"

# Message counts: full runs (the defaults) and --quick smoke runs.
FULL_COUNTS = {
    "capture": 500_000,
    "acked": 200_000,
    "consume": 200_000,
    "durable": 50_000,
    "ceiling": 1_000_000,
    "scale": 300_000,
    "restart": 1_000_000,
    "stability": 6_000_000,
    "kills": 5,
}
QUICK_COUNTS = {
    "capture": 20_000,
    "acked": 10_000,
    "consume": 20_000,
    "durable": 5_000,
    "ceiling": 100_000,
    "scale": 20_000,
    "restart": 50_000,
    "stability": 200_000,
    "kills": 2,
}
MESSAGE_COUNTS = ("capture", "acked", "consume", "durable", "ceiling", "scale", "restart", "stability")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="bascule against JetStream on loopback: every server and load process started here.",
    )
    parser.add_argument("--scenario", "-s", action="append", default=[],
                        help=f"scenario to run (repeatable, comma-separated): {', '.join(SCENARIOS)}; "
                             f"groups: {', '.join(GROUPS)}; default all")
    parser.add_argument("--system", action="append", default=[], choices=[BASCULE, JETSTREAM],
                        help="run only against this system (repeatable; default both)")
    parser.add_argument("--trials", type=int, default=None,
                        help="trials per scenario and system (default 3; 1 with --quick)")
    parser.add_argument("--quick", action="store_true", help="short smoke run: small counts, 1 trial")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH ('-' = stdout)")
    parser.add_argument("--markdown", metavar="PATH", help="also write the table as Markdown to PATH")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument("--size", type=int, default=100, help="message payload bytes (default 100)")
    parser.add_argument("--window", type=int, default=1000, help="acked publishes in flight (default 1000)")
    parser.add_argument("--publishers", type=int, default=1, help="publisher processes for capture (default 1)")
    for key in MESSAGE_COUNTS:
        parser.add_argument(f"--{key}-messages", type=int, metavar="N",
                            help=f"messages per {key} trial (default {FULL_COUNTS[key]:,}; "
                                 f"--quick {QUICK_COUNTS[key]:,})")
    parser.add_argument("--kills", type=int, help=f"leader kills per failover trial (default {FULL_COUNTS['kills']}; "
                                                  f"--quick {QUICK_COUNTS['kills']})")
    parser.add_argument("--failover-timeout", type=float, default=30.0, help="seconds to wait for recovery")
    parser.add_argument("--scale-partitions", default="1,10,100", help="partition counts (default 1,10,100)")
    parser.add_argument("--scale-replicas", type=int, default=3, help="replication factor in scale (default 3)")
    parser.add_argument("--scale-nodes", type=int, default=None, help="nodes in scale (default max(3, replicas))")
    parser.add_argument("--scale-publishers", type=int, default=2, help="publisher processes in scale (default 2)")
    parser.add_argument("--idle-partitions", type=int, default=100, help="idle partitions for the RSS figure")
    parser.add_argument("--acked-variants", default="",
                        help="acked_r3's bascule variants to run, comma-separated (default all: grpc, nats, "
                             "node_grpc, raw_grpc, raw_grpc_ids, grpc_floor), e.g. raw_grpc,raw_grpc_ids")
    parser.add_argument("--stall-timeout", type=float, default=30.0,
                        help="fail a trial when nothing progresses for this many seconds (default 30)")
    parser.add_argument("--profile", metavar="DIR",
                        help="py-spy the bascule nodes in one extra, unmeasured trial of the profiled scenarios")
    parser.add_argument("--profile-rate", type=int, default=100, help="py-spy samples per second (default 100)")
    parser.add_argument("--profile-scenarios", default="",
                        help="comma-separated scenarios to profile (default: "
                             + ", ".join(s.name for s in SCENARIOS.values() if s.profile) + ")")
    parser.add_argument("--profile-native", action="store_true",
                        help="py-spy --native: show C/Cython frames too (grpc's, protobuf's)")
    parser.add_argument("--workdir", help="where the temporary directories go (default the system's)")
    parser.add_argument("--keep", action="store_true", help="keep data dirs and logs (their path is printed)")
    parser.add_argument("--bascule-log-level", default="info", help="bascule nodes' --level (default info)")
    return parser


def message_counts(args: argparse.Namespace) -> dict[str, int]:
    counts = dict(QUICK_COUNTS if args.quick else FULL_COUNTS)
    for key in MESSAGE_COUNTS:
        value = getattr(args, f"{key}_messages")
        if value is not None:
            counts[key] = value
    if args.kills is not None:
        counts["kills"] = args.kills
    return counts


async def run(args: argparse.Namespace, profiler: Profiler | None) -> dict[str, Any]:
    """Every scenario of `args.scenario` against the systems asked for; the report, summarised."""
    counts = message_counts(args)
    base = Path(tempfile.mkdtemp(prefix="bascule-vs-jetstream-", dir=args.workdir))
    report: dict[str, Any] = {
        "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "machine": machine_info(),
        "versions": versions(),
        "settings": {"trials": args.trials, "quick": args.quick, "size": args.size, "window": args.window,
                     "publishers": args.publishers, "counts": counts,
                     "scale_partitions": args.scale_partitions, "scale_replicas": args.scale_replicas},
        "scenarios": {},
        "workdir": str(base),
    }
    log(f"benchmarks: scenarios {', '.join(args.scenario)}; {args.trials} trial(s); work dir {base}")
    if BASCULE in args.system and any(SCENARIOS[name].node_client for name in args.scenario):
        # once per run, before any server starts: node found, npm ci if node_modules is missing
        report["node_client"] = (await node_client.prepare()).summary()
    try:
        for name in args.scenario:
            profiled = name in args.profile_scenarios if args.profile_scenarios else SCENARIOS[name].profile
            ctx = Context(args, base / name, counts, profiler if profiled else None)
            report["scenarios"][name] = await run_scenario(ctx, name)
    finally:
        report["machine"]["loadavg_at_end"] = loadavg()
        if profiler is not None:
            report["profiles"] = profiler.summaries
        if args.keep:
            log(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    summarize(report, SCENARIOS)
    return report


async def run_scenario(ctx: Context, name: str) -> dict[str, Any]:
    """A scenario's trials against each of its systems; a failure is recorded and the next one runs."""
    scenario = SCENARIOS[name]
    ctx.dir.mkdir(parents=True, exist_ok=True)
    entry: dict[str, Any] = {"title": scenario.title, "trials": {}, "loadavg_before": loadavg()}
    for system in scenario.systems:
        if system != NATS and system not in ctx.args.system:
            continue
        started = now()
        log(f"== {name} / {system}: {scenario.title}")
        try:
            entry["trials"][system] = await scenario.run(ctx, system)
        except (TimeoutError, BenchError, OSError, RuntimeError) as exc:
            log(f"{name} / {system} FAILED: {exc}")
            entry["trials"][system] = [{"error": f"setup: {exc}"}]
        except Exception as exc:  # noqa: BLE001 - one broken scenario must not stop the others
            log(f"{name} / {system} FAILED:\n{traceback.format_exc()}")
            entry["trials"][system] = [{"error": f"{type(exc).__name__}: {exc}"}]
        entry.setdefault("wall_s", {})[system] = round(now() - started, 1)
    if not ctx.args.keep:
        shutil.rmtree(ctx.dir, ignore_errors=True)
    return entry


def list_scenarios() -> None:
    for scenario in SCENARIOS.values():
        print(f"{scenario.name:<11} {scenario.title}")
    for group, members in GROUPS.items():
        print(f"{group:<11} = {', '.join(members)}")


def complete_args(args: argparse.Namespace) -> None:
    """Fill in the defaults that depend on other arguments, and expand the scenario names."""
    if args.trials is None:
        args.trials = 1 if args.quick else 3
    args.system = args.system or [BASCULE, JETSTREAM]
    args.scale_partitions = [int(x) for x in str(args.scale_partitions).split(",") if x.strip()]
    try:
        args.scenario = select_scenarios(args.scenario)
        args.profile_scenarios = select_scenarios([args.profile_scenarios]) if args.profile_scenarios else []
    except ValueError as exc:
        raise SystemExit(f"{PROG}: {exc}") from None


def print_report(report: dict[str, Any], args: argparse.Namespace) -> None:
    out = sys.stderr if args.json == "-" else sys.stdout  # keep stdout pure JSON with --json -
    print(f"machine: {report['machine']['nproc']} x {report['machine']['cpu_model']}; load average "
          f"{report['machine']['loadavg_at_start']} -> {report['machine']['loadavg_at_end']}", file=out)
    print(format_table(report), file=out)
    node = report.get("node_client")
    if node is not None and not node["available"]:
        print(f"node_grpc_* metrics skipped: {node['reason']}", file=out)
    if report.get("profiles"):
        print(f"\nprofiles (raw collapsed stacks and full summaries in {args.profile}):", file=out)
        for label, summary in report["profiles"].items():
            print(file=out)
            print(format_profile(label, {**summary, "self": summary["self"][:10],
                                         "inclusive": summary["inclusive"][:10]}), end="", file=out)
    if args.markdown:
        Path(args.markdown).write_text(format_markdown(report))
    if args.json:
        text = json.dumps(report, indent=2, default=str)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.list:
        list_scenarios()
        return 0
    complete_args(args)
    # Node processes start as an installed package's would: from bytecode (see `make bytecode`).
    compileall.compile_dir(Path(bascule.__file__).parent, quiet=1)
    subprocess.run([sys.executable, "-m", "bascule.dataclass_code"], check=True)
    profiler = Profiler(Path(args.profile).resolve(), args.profile_rate, args.profile_native) if args.profile else None

    def terminate(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        report = asyncio.run(run(args, profiler))
    except KeyboardInterrupt:
        log("interrupted: servers and workers stopped")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    print_report(report, args)
    failed = any("error" in t for e in report["scenarios"].values() for ts in e["trials"].values() for t in ts)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
