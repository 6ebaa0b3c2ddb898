"""Where a bascule server's resident memory at start goes (issue 30): the RSS and anonymous memory
of one fresh interpreter after each step of the server's imports, in the order that charges each
library its own share, then the server's mappings by file (shared libraries are counted in RSS
although other processes share their pages).

Each step's figure is what it adds to the steps before it. The steps import as `bascule server` does
(bascule.cli.prepare_server_imports and import_server) for a configuration without TLS: ssl is left to
its first use (asyncio is imported without it, every other module finds a placeholder), and crc32c and
nats-py read their versions without importlib.metadata (a stand-in gives them installed_version).

Usage: .venv/bin/python benchmarks/memory_floor.py
"""

from __future__ import annotations

import collections
import importlib
import os
import subprocess
import sys

# (label, modules imported by the step): "defer ssl" is the server's deferral of ssl (asyncio imported
# for it), "defer P.S" its deferral of P's submodule S, "stand-ins" its stand-in for importlib.metadata
# (until "withdraw stand-ins"), and "dataclass code" its dataclasses' kept code (bascule.cli's
# prepare_server_imports does them all). cryptography is not among them: a node loads it only for a Raft
# connection or an encrypted stream (6.7 MiB); nor is ssl: a node loads it only for TLS (4.4 MiB).
STEPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("CPython 3.11 with this script's own imports (subprocess...)", ()),
    ("asyncio (ssl deferred: no OpenSSL)", ("defer ssl",)),
    ("protobuf (upb) and the API's descriptors (python_message deferred)",
     ("defer google.protobuf.internal.python_message", "google.protobuf.descriptor_pool", "bascule.wire.pb.api_pb2")),
    ("crc32c, msgpack (versions without importlib.metadata)", ("stand-ins", "crc32c", "msgpack")),
    ("pysyncobj (without cryptography)", ("bascule.metadata",)),
    ("nats-py (nats.js deferred; secrets -> hmac -> libcrypto)", ("defer nats.js", "nats")),
    ("bascule's modules (the server and everything it imports)",
     ("dataclass code", "bascule.server", "withdraw stand-ins")),
)


def memory_kib() -> tuple[int, int]:
    """(RSS, anonymous) of this process, KiB."""
    fields = {}
    with open("/proc/self/smaps_rollup") as rollup:
        for line in rollup:
            name, _, rest = line.partition(":")
            if name in ("Rss", "Anonymous"):
                fields[name] = int(rest.split()[0])
    return fields["Rss"], fields["Anonymous"]


def by_mapping() -> list[tuple[str, int]]:
    """RSS of this process per mapped file (anonymous memory and the heap as their own rows), KiB."""
    totals: collections.Counter[str] = collections.Counter()
    current = "[anon]"
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            first = line.split(maxsplit=6)
            if "-" in first[0] and not first[0].endswith(":"):
                current = os.path.basename(first[5].strip()) if len(first) > 5 else "[anon]"
            elif first[0] == "Rss:":
                totals[current] += int(first[1])
    return totals.most_common(12)


def steps() -> None:
    """In the child: prints one line per step."""
    previous = memory_kib()
    stand_ins = []
    for label, modules in STEPS:
        for module in modules:
            from bascule import deferred_imports  # here, not charged to CPython

            if module == "defer ssl":
                deferred_imports.defer_ssl()
            elif module.startswith("defer "):
                package, _, child = module.removeprefix("defer ").rpartition(".")
                deferred_imports.defer_submodules(((package, child),))
            elif module == "stand-ins":
                stand_ins.append(deferred_imports.stand_in_for_versions())
            elif module == "withdraw stand-ins":
                for placeholder in stand_ins:
                    deferred_imports.withdraw(placeholder)
            elif module == "dataclass code":
                from bascule import dataclass_code

                dataclass_code.install()
            else:
                importlib.import_module(module)
        now = memory_kib()
        print(f"{label:72s} {now[0] / 1024:6.1f} {(now[0] - previous[0]) / 1024:+6.1f} "
              f"{now[1] / 1024:6.1f} {(now[1] - previous[1]) / 1024:+6.1f} {len(sys.modules):5d}")
        previous = now
    print("\nRSS by mapping, MiB:")
    for name, kib in by_mapping():
        print(f"  {kib / 1024:6.1f}  {name}")


def main() -> None:
    if sys.argv[1:] == ["--child"]:
        steps()
        return
    print(f"{'step':72s} {'RSS':>6s} {'+':>6s} {'anon':>6s} {'+':>6s} {'mods':>5s}  (MiB)")
    # A fresh interpreter: this one has imported subprocess and more already.
    subprocess.run([sys.executable, __file__, "--child"], check=True)


if __name__ == "__main__":
    main()
