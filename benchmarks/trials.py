"""The trials of one scenario against one system: the measured ones, then with --profile one extra,
profiled and not counted; a failed trial is recorded as such and the next one runs."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from benchmarks.harness import BenchError, Context, log, now
from benchmarks.metrics import loadavg
from benchmarks.report import METRICS, format_value

Trial = Callable[[int, bool], Awaitable[dict[str, Any]]]


def trial_plan(ctx: Context) -> list[tuple[int, bool]]:
    """(trial number, profiled) pairs."""
    plan = [(i, False) for i in range(1, ctx.args.trials + 1)]
    if ctx.profiler is not None:
        plan.append((len(plan) + 1, True))
    return plan


async def run_trials(ctx: Context, scenario: str, system: str, trial: Trial) -> list[dict[str, Any]]:
    results = []
    for number, profiled in trial_plan(ctx):
        tag = " (profiled, not counted)" if profiled else ""
        log(f"{scenario} / {system}: trial {number}{tag}")
        started = now()
        try:
            metrics = await trial(number, profiled)
        except (TimeoutError, BenchError, OSError, RuntimeError) as exc:
            log(f"{scenario} / {system}: trial {number} FAILED: {exc}")
            metrics = {"error": str(exc) or repr(exc)}
        metrics["loadavg"] = loadavg()
        metrics["wall_s"] = round(now() - started, 2)
        if profiled:
            metrics["profiled"] = True
        else:
            log(f"{scenario} / {system}: trial {number}: " + ", ".join(
                f"{k}={format_value(v)}" for k, v in metrics.items() if k in METRICS or k == "error"))
        results.append(metrics)
    return results


@contextlib.asynccontextmanager
async def maybe_profile(ctx: Context, label: str, pids: dict[str, int | None], on: bool) -> AsyncIterator[None]:
    """Record `pids` with py-spy under `label` if `on` (a profiled trial) and the run profiles."""
    if on and ctx.profiler is not None:
        ctx.profiling = label
        try:
            async with ctx.profiler.record(label, pids):
                yield
        finally:
            ctx.profiling = None
    else:
        yield
