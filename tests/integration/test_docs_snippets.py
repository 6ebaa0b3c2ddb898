"""Docs as tests (issue 29): every block of README.md, docs/*.md and compose/README.md that a reader would copy
runs here, as written, against real processes, so a snippet that stops working fails the suite.

- Every fenced block is run here, run by another test (``ELSEWHERE``), or marked in the markdown with a line
  ``<!-- not run: <reason> -->`` just before it; ``text`` blocks are what commands print. A new block that is
  none of these fails ``test_every_block_is_run_or_marked``, so none can escape.
- Shell blocks run through ``bash -e`` in a temporary directory holding a ``.venv`` link to the checkout's, so
  ``.venv/bin/...`` works as written and relative paths (``./data``, ``cluster/``) land there.
- The README's "Trying it" and "Python client" snippets run against the node `make run` starts: its command
  is read from the Makefile and run in that temporary directory, with two changes so that the suite never
  needs (or disturbs) ports 9292 and 4222: ``--port`` gets a free port and the embedded NATS server a config
  file naming a free one. The snippets then reach it through ``$BASCULE_ADDRESS`` and, where they name
  ``127.0.0.1:9292`` or ``127.0.0.1:4222``, those words replaced by its addresses.
- The one-machine cluster snippet runs with each port it names replaced by a free port, nothing else.
- YAML blocks are loaded by bascule's config loader (``bascule.config.load_config``), as a file given to
  ``bascule server -c`` (docs/operations.md's Prometheus ``rule_files`` is compared with compose/prometheus.yml);
  nats-server configuration blocks (``conf``) are checked by ``nats-server -t``.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from bascule.config import load_config
from bascule.natsio.server import nats_server_path
from bascule.testing.ports import free_port
from bascule.testing.readiness import wait_for_brokers

pytestmark = [pytest.mark.timeout(180)]

ROOT = Path(__file__).parents[2]
DOCUMENTS = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")), "compose/README.md"]
OUTPUT = {"text"}  # what a command prints
NOT_RUN = re.compile(r"<!-- not run: (\S.*?) -->")

# Blocks other tests run, or that need what the suite does not have: (document, section heading or None for
# the whole document, the block's first line or None for every block) -> why.
ELSEWHERE: dict[tuple[str, str | None, str | None], str] = {
    ("README.md", "## Spark", None): "run by tests/integration/test_spark_docs.py",
    ("docs/spark.md", None, None): "run by tests/integration/test_spark_docs.py",
    ("docs/client.md", None, None): "run by tests/integration/test_client_docs.py",
    ("compose/README.md", None, 'eval "$(compose/podman-setup.sh --compose)"    # as root; prints progress on '
     "stderr, exports on stdout"): "needs root and podman; tests/integration/test_containers.py runs the script",
    ("compose/README.md", None, "export DOCKER_HOST=unix:///run/podman/podman.sock"):
        "what compose/podman-setup.sh prints, not a command to copy",
    ("compose/README.md", None, "podman run -d --name bascule -p 127.0.0.1:9292:9292 -p 127.0.0.1:4222:4222 "
     "localhost/bascule"): "needs podman and the image; tests/integration/test_containers.py runs the image",
    ("compose/README.md", None, 'eval "$(compose/podman-setup.sh --compose)"    # images, podman-compose, and '
     "BASCULE_RAFT_PASSWORD (below)"): "needs podman-compose, which the suite does not run",
    ("compose/README.md", None, 'export BASCULE_RAFT_PASSWORD="$(head -c 24 /dev/urandom | base64)"'):
        "sets the variable podman-compose reads; the suite does not run podman-compose",
}

# Blocks the tests below run, by (document, first line).
TRYING_IT = ("README.md", ".venv/bin/bascule wait                                           # until the node "
             "serves (a few seconds after `make run`)")
PYTHON_CLIENT = ("README.md", "import asyncio")
CLUSTER = ("README.md", 'export BASCULE_RAFT_PASSWORD="$(head -c 24 /dev/urandom | base64)"')
CLUSTER_STOP = ("README.md", "nodes=$(jobs -p | tail -n +2)   # the nodes' process ids")
PROMETHEUS_RULE_FILES = ("docs/operations.md", "rule_files:")
RUN_HERE = {TRYING_IT, PYTHON_CLIENT, CLUSTER, CLUSTER_STOP, PROMETHEUS_RULE_FILES}


@dataclass(frozen=True)
class Block:
    document: str
    line: int  # of the opening fence, 1-based
    language: str
    section: str  # the last "## " heading before it
    source: str
    not_run: str | None  # the reason of a "<!-- not run: ... -->" line just before it

    @property
    def first_line(self) -> str:
        return self.source.split("\n", 1)[0]

    def __str__(self) -> str:
        return f"{self.document}:{self.line} ```{self.language} {self.first_line[:60]!r}"


def blocks_of(document: str, text: str | None = None) -> list[Block]:
    lines = ((ROOT / document).read_text() if text is None else text).split("\n")
    found, section, index = [], "", 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("## "):
            section = line
        fence = re.fullmatch(r"```(\S*)\s*", line)
        if fence:
            end = lines.index("```", index + 1)
            before = next((lines[i] for i in range(index - 1, -1, -1) if lines[i].strip()), "")
            marker = NOT_RUN.fullmatch(before.strip())
            found.append(Block(document, index + 1, fence.group(1), section, "\n".join(lines[index + 1 : end]) + "\n",
                               marker.group(1) if marker else None))
            index = end
        index += 1
    return found


ALL_BLOCKS = [block for document in DOCUMENTS for block in blocks_of(document)]


def elsewhere(block: Block) -> str | None:
    for (document, section, first), reason in ELSEWHERE.items():
        if block.document == document and section in (None, block.section) and first in (None, block.first_line):
            return reason
    return None


def the_block(key: tuple[str, str]) -> Block:
    (block,) = [b for b in ALL_BLOCKS if (b.document, b.first_line) == key and b.not_run is None]
    return block


def unaccounted(blocks: list[Block]) -> list[str]:
    """Blocks no test runs and no marker excuses (YAML and nats-server configuration blocks are all run)."""
    return [
        str(block) for block in blocks
        if block.language not in OUTPUT and block.not_run is None and elsewhere(block) is None
        and block.language not in ("yaml", "conf") and (block.document, block.first_line) not in RUN_HERE
    ]


def test_a_new_unmarked_block_is_caught_and_a_marked_one_is_not():
    text = "## New\n\n```sh\nmake deploy\n```\n\n<!-- not run: needs a cloud -->\n```sh\nmake cloud\n```\n"
    new, marked = blocks_of("README.md", text)
    assert (new.line, new.section, new.not_run, marked.not_run) == (3, "## New", None, "needs a cloud")
    assert unaccounted([new, marked]) == [str(new)]


def test_every_block_is_run_or_marked():
    missing = unaccounted(ALL_BLOCKS)
    assert not missing, (
        "blocks neither run by a test nor marked '<!-- not run: <reason> -->' on the line before them:\n"
        + "\n".join(missing)
    )


def test_every_block_this_file_names_is_there_once():
    for key in RUN_HERE:
        assert len([b for b in ALL_BLOCKS if (b.document, b.first_line) == key]) == 1, key
    for (document, section, first) in ELSEWHERE:
        assert any(b.document == document and section in (None, b.section) and first in (None, b.first_line)
                   for b in ALL_BLOCKS), (document, section, first)
    for reason in {elsewhere(b) for b in ALL_BLOCKS} - {None}:
        named = re.search(r"tests/\S+\.(?:py|sh)", reason or "")
        assert named is None or (ROOT / named.group(0)).exists(), reason


# ---- configuration blocks -----------------------------------------------------------------------------------

YAML_BLOCKS = [b for b in ALL_BLOCKS if b.language == "yaml" and b.not_run is None and elsewhere(b) is None
               and (b.document, b.first_line) not in RUN_HERE]
CONF_BLOCKS = [b for b in ALL_BLOCKS if b.language == "conf" and b.not_run is None and elsewhere(b) is None]


@pytest.mark.parametrize("block", YAML_BLOCKS, ids=str)
def test_yaml_blocks_are_configurations_bascule_loads(block, tmp_path):
    path = tmp_path / "bascule.yaml"
    path.write_text(block.source)
    load_config(path, {})  # raises ConfigError naming the key, as `bascule server -c` would exit with


@pytest.mark.parametrize("block", CONF_BLOCKS, ids=str)
def test_nats_configuration_blocks_pass_nats_servers_check(block, tmp_path):
    path = tmp_path / "nats.conf"
    path.write_text(block.source)
    variables = dict.fromkeys(re.findall(r"\$([A-Z_]+)", block.source), "secret")
    done = subprocess.run([nats_server_path(), "-t", "-c", str(path)], capture_output=True, text=True,
                          timeout=30, env={**os.environ, **variables})
    assert done.returncode == 0, f"{block}: {done.stdout}{done.stderr}"


def test_the_prometheus_rule_files_are_those_of_compose_prometheus_yml():
    """docs/operations.md: "Load the rules with Prometheus' `rule_files`, as `compose/prometheus.yml` does"."""
    shown = yaml.safe_load(the_block(PROMETHEUS_RULE_FILES).source)
    compose = yaml.safe_load((ROOT / "compose" / "prometheus.yml").read_text())
    assert shown["rule_files"] == compose["rule_files"] and (ROOT / "compose" / shown["rule_files"][0]).exists()


def test_yaml_and_conf_blocks_are_found():
    assert {"README.md", "docs/operations.md"} <= {b.document for b in YAML_BLOCKS}
    assert [b.document for b in CONF_BLOCKS] == ["README.md"]
    assert load_config(ROOT / "compose" / "bascule.yaml", {}) is not None  # compose's file, loaded alike


# ---- running shell and Python snippets ------------------------------------------------------------------------


@dataclass
class Workdir:
    path: Path
    env: dict[str, str]


def workdir(tmp_path: Path, **env: str) -> Workdir:
    """A directory where `.venv/bin/...` is the checkout's, and an environment without $BASCULE_ADDRESS."""
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    base = {k: v for k, v in os.environ.items() if k not in ("BASCULE_ADDRESS", "BASCULE_RAFT_PASSWORD")}
    return Workdir(tmp_path, {**base, **env})


def run_shell(source: str, where: Workdir, timeout: float = 60) -> str:
    """`source` through bash -e, in its own process group, which is killed afterwards whatever happened
    (servers the snippet left running in the background included); returns what it printed."""
    process = subprocess.Popen(["bash", "-e", "-c", source], cwd=where.path, env=where.env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"still running after {timeout} s:\n{source}\n{out}\n{err}")
    finally:
        stop_group(process)
    assert process.returncode == 0, f"exit status {process.returncode}:\n{source}\nstdout:\n{out}\nstderr:\n{err}"
    return out


def stop_group(leader: subprocess.Popen) -> None:
    """SIGTERM to the process group `leader` leads (a node hands its partitions over, then stops), SIGKILL to
    what is left after 10 s."""
    pgid = leader.pid
    for signum, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(pgid, signum)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            leader.poll()  # reaped, or its zombie would keep the group alive
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def make_run_command() -> list[str]:
    """The command of the Makefile's `run` target, with $(VENV) as the Makefile sets it."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^run:.*\n\t(.+)$", makefile, re.M)
    assert recipe, "no `run` target in the Makefile"
    venv = re.search(r"^VENV \?= (\S+)$", makefile, re.M)
    assert venv
    return shlex.split(recipe.group(1).replace("$(VENV)", venv.group(1)))


@dataclass
class MakeRun:
    where: Workdir
    address: str
    nats: str

    def local(self, source: str) -> str:
        return source.replace("127.0.0.1:9292", self.address).replace("127.0.0.1:4222", self.nats)


@pytest.fixture(scope="module")
def make_run(tmp_path_factory) -> Iterator[MakeRun]:
    """`make run`'s node, as its recipe starts it, on free ports in a temporary directory."""
    command = make_run_command()
    assert command[command.index("--port") + 1] == "9292", command
    port, nats_port = free_port(), free_port()
    command[command.index("--port") + 1] = str(port)
    where = workdir(tmp_path_factory.mktemp("make-run"))
    (where.path / "nats.conf").write_text(f"listen: 127.0.0.1:{nats_port}\n")
    command += ["--embedded-nats-config", "nats.conf"]
    address = f"127.0.0.1:{port}"
    with open(where.path / "server.log", "wb") as log:
        server = subprocess.Popen(command, cwd=where.path, env=where.env, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)

    def alive() -> None:
        assert server.poll() is None, (where.path / "server.log").read_text()[-3000:]

    try:
        last = wait_for_brokers(address, set(), 30, alive)
        assert last is None, last
        yield MakeRun(Workdir(where.path, {**where.env, "BASCULE_ADDRESS": address}), address,
                      f"127.0.0.1:{nats_port}")
    finally:
        stop_group(server)
    assert (where.path / "data").is_dir()  # -d ./data, in the directory it ran in


def test_trying_it_reads_back_what_plain_nats_publishes(make_run):
    out = run_shell(make_run.local(the_block(TRYING_IT).source), make_run.where)
    lines = out.splitlines()
    orders = [line for line in lines if "order " in line]
    assert [line.split()[-1] for line in orders] == ["0", "1", "2", "2", "1", "0"], out  # forwards, then reverse
    assert any(line.startswith("brokers: ") for line in lines) and any(" orders.in " in line for line in lines), out


def test_the_python_client_snippet_prints_what_its_comment_says(make_run):
    script = make_run.where.path / "client_snippet.py"
    script.write_text(make_run.local(the_block(PYTHON_CLIENT).source))
    done = subprocess.run([".venv/bin/python", script.name], cwd=make_run.where.path, env=make_run.where.env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "0 b'hello'\n"


def test_the_one_machine_cluster_snippet_forms_a_cluster_of_three_and_stops(tmp_path):
    """As written but for its ports, each replaced by a free one; then the block that stops it, in the same
    shell. `bascule wait --brokers 3` must see the joiners within its 30 s, and each node must exit with
    status 0 (`wait $nodes` under bash -e: the last one's)."""
    source = the_block(CLUSTER).source + the_block(CLUSTER_STOP).source
    ports = sorted(set(re.findall(r"(?:127\.0\.0\.1:|-p )(\d{4,5})\b", source)))
    assert len(ports) == 7, ports  # NATS, three gRPC APIs, three Raft transports
    for port in ports:
        source = re.sub(rf"\b{port}\b", str(free_port()), source)
    started = time.monotonic()
    out = run_shell(source, workdir(tmp_path), timeout=90)
    took = time.monotonic() - started
    brokers = out.split("\n", 1)[0]
    assert re.fullmatch(r"brokers: a \(127\.0\.0\.1:\d+\), b \(127\.0\.0\.1:\d+\), c \(127\.0\.0\.1:\d+\)",
                        brokers), out
    roles = re.findall(r"^[abc] +127\.0\.0\.1:\d+ +127\.0\.0\.1:\d+ +(leader|voter) ", out, re.M)
    assert sorted(roles) == ["leader", "voter", "voter"], out
    replicas = re.findall(r"^orders +0 +[abc] .* ([abc]) +(yes|no) ", out, re.M)
    assert sorted(replicas) == [("a", "yes"), ("b", "yes"), ("c", "yes")], out
    assert all((tmp_path / "cluster" / name).is_dir() and (tmp_path / f"{name}.log").exists() for name in "abc")
    assert took < 40, f"the snippet took {took:.0f} s"
    assert "Traceback" not in "".join((tmp_path / f"{name}.log").read_text() for name in "abc")

