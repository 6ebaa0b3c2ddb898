"""bascule against JetStream on loopback: ``python benchmarks/run.py [--quick] [--scenario NAME] ...``.

A thin wrapper: the harness lives in ``bascule.bench`` (also ``bascule bench``); ``--help`` lists the
options, ``--list`` the scenarios. Figures and profiles are in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    from bascule.bench import main
except ImportError:  # run from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from bascule.bench import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
