"""A plain install (no `testing` extra) is told which extra bascule.testing.containers needs."""

from __future__ import annotations

import subprocess
import sys


def test_containers_without_testcontainers_name_the_extra_to_install() -> None:
    code = ("import sys; sys.modules['testcontainers'] = None\n"
            "try:\n    import bascule.testing.containers\nexcept ImportError as e:\n    print(e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert "pip install 'bascule[testing]'" in done.stdout, done.stdout + done.stderr
