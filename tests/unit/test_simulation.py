"""The simulator (bascule.simulation): seeded runs of the real node code under faults keep every
invariant, a seed replays exactly, and the simulator finds the compound-fault loss of issue 25 when
the rule that fixed it is switched off.

``make simulate SEEDS=1-5000`` runs many more seeds; a failure prints its seed, faults and trace.
"""

from __future__ import annotations

import multiprocessing
import os

import pytest

from bascule.metadata import election
from bascule.simulation.run import simulate

# Seeds run in every `make test`, over the machine's cores (each in a fresh interpreter with a fixed
# PYTHONHASHSEED, so that `make simulate SEEDS=<seed> [QUICK=1]` replays a failure step for step):
# full runs, and many more quick ones (Shape.draw). 100 and 450 take about 130 s on 2 cores, what the
# suite's 20 minutes leave them (120 and 1,000 took 236-252 s); `make simulate SEEDS=1-5000` goes further.
SEEDS = range(1, int(os.environ.get("BASCULE_SIMULATION_SEEDS", "100")) + 1)
QUICK_SEEDS = range(1, int(os.environ.get("BASCULE_SIMULATION_QUICK_SEEDS", "450")) + 1)
# With choose_leader's unclean rule off, this seed has a follower that lost power elected while the
# leader holding the acks it lost restarts (the compound fault of the run's plan,
# "leader_dies_follower_loses_power"; seeds 1-150 with the rule off fail in 6 runs: should a change of
# the simulator move them, run them again and take the first that fails).
UNCLEAN_ELECTION_SEED = 12


def run_seed(seed_and_shape: tuple[int, bool]) -> tuple[int, bool, str]:
    seed, quick = seed_and_shape
    outcome = simulate(seed, quick=quick)
    return seed, outcome.ok, outcome.report()


@pytest.mark.timeout(900)
def test_seeded_runs_under_faults_keep_every_invariant(monkeypatch) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    context = multiprocessing.get_context("spawn")
    with context.Pool(max(1, min(4, os.cpu_count() or 1))) as pool:
        # The full runs (~3x a quick one's time) first: the pool's last chunks are then short ones,
        # and neither worker idles long at the end.
        runs = [(seed, False) for seed in SEEDS] + [(seed, True) for seed in QUICK_SEEDS]
        results = pool.map(run_seed, runs, chunksize=8)
    failures = [report for _, ok, report in results if not ok]
    assert not failures, "\n\n".join(failures)


def test_a_seed_replays_step_for_step() -> None:
    first, second = simulate(7), simulate(7)
    assert first.ok and first.acked > 0
    assert (first.trace, first.acked, first.virtual_seconds) == (second.trace, second.acked, second.virtual_seconds)


def test_with_the_unclean_rule_off_the_simulator_finds_the_loss_of_issue_25(monkeypatch) -> None:
    real = election.choose_leader

    def ignoring_unclean(candidates, isr, exclude=(), unclean=()):
        return real(candidates, isr, exclude)

    monkeypatch.setattr(election, "choose_leader", ignoring_unclean)
    outcome = simulate(UNCLEAN_ELECTION_SEED)
    assert not outcome.ok, outcome.report()
    assert "acked" in (outcome.error or ""), outcome.report()
    assert any("loses power" in line for line in outcome.trace), outcome.report()
