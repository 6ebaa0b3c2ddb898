"""``python -m bascule.simulation --seeds 1-1000 [--faults N] [--quick] [--verbose]``: run seeds,
print each failure with its trace, exit 1 if any failed."""

from __future__ import annotations

import argparse
import sys
import time

from bascule.simulation.run import simulate


def seeds(text: str) -> list[int]:
    """``7``, ``1-100`` or ``1,5,9-12``."""
    chosen: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        chosen += range(int(first), int(last or first) + 1)
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bascule.simulation", description=__doc__)
    parser.add_argument("--seeds", type=seeds, default=seeds("1-100"), help="seeds to run: 7, 1-100 or 1,5,9-12")
    parser.add_argument("--faults", type=int, default=None, help="faults per run (default: drawn from the seed)")
    parser.add_argument("--quick", action="store_true", help="short runs: 3 nodes, 1-4 faults over 1-3 s")
    parser.add_argument("--verbose", action="store_true", help="a line for every run, not only failures")
    args = parser.parse_args(argv)
    started, failed, acked = time.monotonic(), [], 0
    for seed in args.seeds:
        outcome = simulate(seed, args.faults, args.quick)
        acked += outcome.acked
        if not outcome.ok or args.verbose:
            print(outcome.report(), flush=True)
        if not outcome.ok:
            failed.append(seed)
    print(f"{len(args.seeds)} runs, {len(failed)} failed {failed if failed else ''}, {acked} acked, "
          f"in {time.monotonic() - started:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
