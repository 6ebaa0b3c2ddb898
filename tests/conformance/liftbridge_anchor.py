"""The real Liftbridge beside bascule: its processes, go-liftbridge's functional check (``lbtool check``)
and the comparison of their answers against the accepted differences documented in docs/liftbridge.md.

The binaries (``bin/liftbridge``, ``bin/lbtool``) are found in $BASCULE_LIFTBRIDGE_DIR, else in
``<repo>/../shared/anchors/liftbridge``.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import re
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bascule.testing.ports import LOOPBACK, free_port, join_host_port
from bascule.testing.processes import LocalProcess
from bascule.testing.readiness import wait_for_brokers

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "liftbridge.md"
ANCHOR_ENV = "BASCULE_LIFTBRIDGE_DIR"
ACCEPTED_HEADING = "## Conformance: accepted differences"
LBTOOL_TIMEOUT = 300.0
NAMESPACE = "liftbridge-default"  # both servers' default; ack inboxes carry it


def anchor_dir() -> Path:
    return Path(os.environ.get(ANCHOR_ENV) or REPO.parent / "shared" / "anchors" / "liftbridge")


def missing_binaries() -> str | None:
    """Why the suite cannot run here, or None."""
    missing = [name for name in ("liftbridge", "lbtool") if not os.access(anchor_dir() / "bin" / name, os.X_OK)]
    if missing:
        return f"no {' or '.join(missing)} in {anchor_dir() / 'bin'} (set ${ANCHOR_ENV} to the Liftbridge anchor)"
    return None


# ---- Liftbridge processes -------------------------------------------------------------------------


class LiftbridgeServer(LocalProcess):
    """One ``liftbridge`` process on loopback ports, its config written beside its log. Its embedded
    NATS needs a config of its own (`liftbridge_node`): left alone it would listen on every interface."""

    name = "liftbridge"

    def __init__(self, base_dir: Path, server_id: str, config: Mapping[str, Any]) -> None:
        super().__init__(base_dir / f"{server_id}.log", stop_grace=10.0)
        self.server_id = server_id
        self.port = free_port()
        self.config_path = base_dir / f"{server_id}.yaml"
        settings = {"listen": join_host_port(LOOPBACK, self.port), "data.dir": str(base_dir / server_id),
                    "clustering.server.id": server_id, **config}
        self.config_path.write_text(yaml.safe_dump(settings, sort_keys=False))

    @property
    def address(self) -> str:
        return join_host_port(LOOPBACK, self.port)

    def command(self) -> list[str]:
        return [str(anchor_dir() / "bin" / "liftbridge"), "--config", str(self.config_path)]

    def _describe(self) -> str:
        return f"liftbridge {self.server_id} at {self.address} (pid {self.pid})"


@contextlib.contextmanager
def liftbridge_node(base_dir: Path, config: Mapping[str, Any], ready_timeout: float = 30.0) -> Iterator[str]:
    """One Liftbridge server with embedded NATS until it serves its API; yields its gRPC address and
    stops it on the way out."""
    nats_port = free_port()
    nats_config = base_dir / "embedded-nats.conf"
    nats_config.write_text(f'listen: "{join_host_port(LOOPBACK, nats_port)}"\n')
    server = LiftbridgeServer(base_dir, "lb0", {
        "nats.embedded": True, "nats.embedded.config": str(nats_config),
        "nats.servers": [f"nats://{join_host_port(LOOPBACK, nats_port)}"],
        "clustering.raft.bootstrap.seed": True, **config,
    })
    try:
        server._spawn()
        alive = lambda: server._check_alive("at start")  # noqa: E731
        last = wait_for_brokers(server.address, {server.server_id}, ready_timeout, alive)
        if last is not None:
            raise server._error(f"{server._describe()} not ready in {ready_timeout:.0f} s: {last}")
        yield server.address
    finally:
        server.stop()


# ---- lbtool ---------------------------------------------------------------------------------------

_CASE_LINE = re.compile(r"^R (\S+) +(.*)$")
# Liftbridge's ack inboxes are "<namespace>.ack.<NUID>": the NUID differs every run.
_ACK_INBOX = re.compile(re.escape(NAMESPACE) + r"\.ack\.[A-Za-z0-9]+")


def run_lbtool(addresses: list[str], nodes: int) -> dict[str, str]:
    """``lbtool check`` against `addresses`: each case's result line, its random parts normalised."""
    completed = subprocess.run(
        [str(anchor_dir() / "bin" / "lbtool"), "check", "-addrs", ",".join(addresses), "-nodes", str(nodes)],
        capture_output=True, text=True, timeout=LBTOOL_TIMEOUT, check=False,
    )
    cases = parse_cases(completed.stdout)
    if "DONE" not in completed.stdout.splitlines():
        output = (completed.stdout.strip().splitlines() or [""])[-1] + " " + completed.stderr.strip()[-2000:]
        cases["lbtool.exit"] = f"did not finish (exit {completed.returncode}): {output}"
    return cases


def parse_cases(output: str) -> dict[str, str]:
    cases: dict[str, str] = {}
    for line in output.splitlines():
        matched = _CASE_LINE.match(line)
        if matched:
            cases[matched[1]] = _ACK_INBOX.sub(f"{NAMESPACE}.ack.<nuid>", matched[2].strip())
    return cases


# ---- accepted differences ---------------------------------------------------------------------------

_FIELD = re.compile(r'(?<![\w.])([A-Za-z_][\w.]*)=("(?:[^"\\]|\\.)*"|\{[^}]*\}|\S+)')


@dataclass(frozen=True)
class AcceptedDifference:
    """One row of the table in docs/liftbridge.md: in runs on `nodes` (1, 3 or both), the cases
    matching one of `cases` (globs) may differ in `fields` (lbtool's ``name=value`` fields; ``*`` the
    whole line)."""

    nodes: frozenset[int]
    cases: tuple[str, ...]
    fields: frozenset[str]
    status: str  # "differs": deliberate; "pending": to be fixed (`reason` says where); "varies": timing
    reason: str

    def covers(self, nodes: int, case: str) -> bool:
        return nodes in self.nodes and any(fnmatch.fnmatchcase(case, pattern) for pattern in self.cases)


def accepted_differences(doc: Path = DOC) -> list[AcceptedDifference]:
    """The table under ACCEPTED_HEADING: ``| nodes | case | fields | status | reason |``."""
    text = doc.read_text()
    start = text.index(ACCEPTED_HEADING)
    rows = []
    for line in text[start:].splitlines()[1:]:
        if line.startswith("#"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or cells[0] in ("nodes", "") or set(cells[0]) <= set("-: "):
            continue
        nodes, case, fields, status, reason = cells
        if status not in ("differs", "pending", "varies"):
            raise ValueError(f"{doc}: status {status!r} of {case} is not differs, pending or varies")
        rows.append(AcceptedDifference(
            frozenset(int(n) for n in nodes.split(",")), _listed(case), frozenset(_listed(fields)), status, reason,
        ))
    return rows


def _listed(cell: str) -> tuple[str, ...]:
    return tuple(item.strip().strip("`") for item in cell.split(","))


def _masked(line: str, fields: frozenset[str]) -> str:
    return _FIELD.sub(lambda m: f"{m[1]}=<accepted>" if m[1] in fields else m[0], line)


@dataclass
class Comparison:
    nodes: int
    agree: list[str] = field(default_factory=list)
    accepted: dict[str, list[AcceptedDifference]] = field(default_factory=dict)
    unexpected: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return len(self.agree) + len(self.accepted) + len(self.unexpected)

    def report(self) -> str:
        lines = [f"{self.nodes} node(s): {len(self.agree)} of {self.total} cases agree, "
                 f"{len(self.accepted)} differ as documented, {len(self.unexpected)} differ otherwise"]
        for case, (liftbridge, bascule) in sorted(self.unexpected.items()):
            lines += [f"  {case}", f"    liftbridge: {liftbridge}", f"    bascule:    {bascule}"]
        return "\n".join(lines)


def compare(nodes: int, liftbridge: Mapping[str, str], bascule: Mapping[str, str],
            accepted: list[AcceptedDifference]) -> Comparison:
    """Case by case: equal, different only as `accepted` allows, or different otherwise (a case
    only one side printed counts as different in every field)."""
    result = Comparison(nodes)
    for case in sorted(set(liftbridge) | set(bascule)):
        ours, theirs = bascule.get(case), liftbridge.get(case)
        if ours == theirs:
            result.agree.append(case)
            continue
        rows = [row for row in accepted if row.covers(nodes, case)]
        fields = frozenset().union(*(row.fields for row in rows))
        if rows and ("*" in fields or (ours is not None and theirs is not None
                                       and _masked(ours, fields) == _masked(theirs, fields))):
            result.accepted[case] = rows
        else:
            result.unexpected[case] = (theirs, ours)
    return result


def stale_rows(accepted: list[AcceptedDifference], comparisons: list[Comparison]) -> list[AcceptedDifference]:
    """Deliberate differences that no longer excuse anything: the document says more than is true."""
    used = {row for comparison in comparisons for rows in comparison.accepted.values() for row in rows}
    ran = {comparison.nodes for comparison in comparisons}
    return [row for row in accepted if row.status == "differs" and row.nodes <= ran and row not in used]
