"""The embedded nats-server dies with its node, and a start stops one that a crashed run left behind.

Real processes throughout: `bascule server --embedded-nats` killed by SIGKILL, nats-servers orphaned
by killing their starter and its watchdog, and pid files naming processes that are not the server.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from bascule.natsio.server import PID_FILE_NAME, EmbeddedNats, EmbeddedNatsError
from bascule.testing import free_port
from bascule.testing.readiness import wait_for_brokers

BASCULE = Path(sys.executable).with_name("bascule")
SERVER_ID = "lifetime"
READY_TIMEOUT = 15.0
EXIT_TIMEOUT = 5.0
LAUNCHER_LOGGER = "bascule.natsio.server"

# A node's stand-in for the in-process tests: starts an embedded server for a dir, then waits.
LAUNCHER_SOURCE = """
import asyncio, sys
from bascule.natsio.server import EmbeddedNats

async def main():
    server = EmbeddedNats(log_dir=sys.argv[1])
    await server.start()
    print(server.port, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


# ---- processes, seen through /proc -----------------------------------------------------------------


def stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state, ppid, ...); None once reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may itself hold spaces and parentheses.
    return stat.rpartition(")")[2].split()


def has_exited(pid: int) -> bool:
    fields = stat_fields(pid)
    return fields is None or fields[0] in ("Z", "X")


def wait_until_exited(pid: int, timeout: float = EXIT_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not has_exited(pid):
        assert time.monotonic() < deadline, f"process {pid} still runs {timeout} s on"
        time.sleep(0.02)


def children_of(pid: int) -> set[int]:
    children = set()
    for entry in os.listdir("/proc"):
        fields = stat_fields(int(entry)) if entry.isdigit() else None
        if fields is not None and int(fields[1]) == pid:
            children.add(int(entry))
    return children


def argv_of(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def orphan_nats_server(starter: subprocess.Popen, nats_pid: int) -> None:
    """SIGKILL the server's starter and, first, its watchdog: as after a crash that took both."""
    watchdogs = [pid for pid in children_of(starter.pid) - {nats_pid} if argv_of(pid)[0] == sys.executable]
    assert len(watchdogs) == 1, f"expected one watchdog among the children of {starter.pid}, got {watchdogs}"
    os.kill(watchdogs[0], signal.SIGKILL)
    wait_until_exited(watchdogs[0])
    starter.kill()
    starter.wait()
    time.sleep(0.2)  # long enough for a watchdog, had one survived, to act
    assert not has_exited(nats_pid), "the nats-server did not outlive its starter"


def read_pid_file(data_dir: Path) -> int:
    return int((data_dir / PID_FILE_NAME).read_text())


def kill_groups(processes: list[subprocess.Popen]) -> None:
    """SIGKILL each process's group: it and whatever it started and left behind."""
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


async def round_trip(url: str) -> bytes:
    connection = await nats.connect(url, connect_timeout=2, max_reconnect_attempts=0)
    try:
        subscription = await connection.subscribe("lifetime")
        await connection.publish("lifetime", b"hello")
        return (await subscription.next_msg(timeout=2)).data
    finally:
        await connection.close()


# ---- bascule server ------------------------------------------------------------------------------


class ServerRuns:
    """`bascule server --embedded-nats` on one data dir and fixed loopback ports, run again and again."""

    def __init__(self, base: Path) -> None:
        self.data_dir = base / "data"
        self.log_path = base / "server.log"
        self.api_port, self.raft_port, self.nats_port = free_port(), free_port(), free_port()
        self.nats_config = base / "nats.conf"
        self.nats_config.write_text(f'listen: "127.0.0.1:{self.nats_port}"\n')
        self.processes: list[subprocess.Popen] = []

    def start(self) -> subprocess.Popen:
        """A new run, once it serves; in a session of its own, for `kill_groups` to clean up."""
        command = [
            str(BASCULE), "server", "--id", SERVER_ID, "--embedded-nats", "--raft-bootstrap-seed",
            "--embedded-nats-config", str(self.nats_config), "-d", str(self.data_dir),
            "--port", str(self.api_port), "--raft-listen", f"127.0.0.1:{self.raft_port}",
        ]
        with open(self.log_path, "ab") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.processes.append(process)

        def check_alive() -> None:
            assert process.poll() is None, f"exited with status {process.returncode}:\n{self.log_tail()}"

        last = wait_for_brokers(f"127.0.0.1:{self.api_port}", {SERVER_ID}, READY_TIMEOUT, check_alive)
        assert last is None, f"not ready after {READY_TIMEOUT} s: {last}\n{self.log_tail()}"
        return process

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]


@pytest.fixture
def server_runs(tmp_path: Path) -> Iterator[ServerRuns]:
    runs = ServerRuns(tmp_path)
    try:
        yield runs
    finally:
        kill_groups(runs.processes)


def test_a_killed_node_takes_its_nats_server_down_and_starts_again(server_runs: ServerRuns) -> None:
    node = server_runs.start()
    nats_pid = read_pid_file(server_runs.data_dir)
    assert os.path.basename(argv_of(nats_pid)[0]) == "nats-server"
    node.kill()  # the node alone, not its process group
    node.wait()
    wait_until_exited(nats_pid)
    server_runs.start()
    assert read_pid_file(server_runs.data_dir) != nats_pid


def test_a_nats_server_left_by_a_crashed_node_is_stopped_at_the_next_start(server_runs: ServerRuns) -> None:
    node = server_runs.start()
    nats_pid = read_pid_file(server_runs.data_dir)
    orphan_nats_server(node, nats_pid)
    server_runs.start()  # on the port the orphan held
    assert has_exited(nats_pid)
    assert f"stopping nats-server {nats_pid}, left running by an earlier run" in server_runs.log_tail()


# ---- the launcher in this process --------------------------------------------------------------------


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen]]:
    """Processes a test starts, each in a session of its own; their groups are killed at the end."""
    processes: list[subprocess.Popen] = []
    try:
        yield processes
    finally:
        kill_groups(processes)


def launch_for(data_dir: Path, started: list[subprocess.Popen]) -> tuple[subprocess.Popen, int]:
    """A process that started an embedded server for `data_dir`, and that server's port."""
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER_SOURCE, str(data_dir)], stdout=subprocess.PIPE, start_new_session=True
    )
    started.append(launcher)
    assert launcher.stdout is not None
    port = launcher.stdout.readline()
    assert port, f"the launcher exited with status {launcher.wait()}"
    return launcher, int(port)


@pytest.mark.anyio
@pytest.mark.parametrize("paused", [False, True], ids=["running", "paused"])
async def test_an_orphaned_nats_server_of_the_dir_is_stopped_and_its_port_taken_again(
    tmp_path: Path, started: list[subprocess.Popen], caplog: pytest.LogCaptureFixture, paused: bool
) -> None:
    caplog.set_level(logging.INFO, logger=LAUNCHER_LOGGER)
    launcher, port = launch_for(tmp_path, started)
    orphan_pid = read_pid_file(tmp_path)
    orphan_nats_server(launcher, orphan_pid)
    if paused:
        os.kill(orphan_pid, signal.SIGSTOP)
    async with EmbeddedNats(port=port, log_dir=tmp_path) as server:
        assert has_exited(orphan_pid)
        assert read_pid_file(tmp_path) != orphan_pid
        assert await round_trip(server.url) == b"hello"
    assert f"stopping nats-server {orphan_pid}" in caplog.text
    assert not (tmp_path / PID_FILE_NAME).exists()


GARBAGE = {
    "empty": b"",
    "blank": b" \n",
    "words": b"not a pid\n",
    "negative": b"-12\n",
    "zero": b"0\n",
    "beyond any pid": b"4194305\n",
    "huge": b"9" * 40 + b"\n",
    "binary": b"\xff\xfe\x00\x01",
    "long": b"1" * 100_000,
}


@pytest.mark.anyio
@pytest.mark.parametrize("content", GARBAGE.values(), ids=GARBAGE.keys())
async def test_a_garbage_pid_file_is_reported_and_replaced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes
) -> None:
    (tmp_path / PID_FILE_NAME).write_bytes(content)
    async with EmbeddedNats(log_dir=tmp_path) as server:
        assert read_pid_file(tmp_path) > 0
        assert await round_trip(server.url) == b"hello"
    assert f"ignoring {tmp_path / PID_FILE_NAME}: " in caplog.text
    assert "is not a process id" in caplog.text


@pytest.mark.anyio
async def test_a_pid_file_naming_a_process_gone_is_passed_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LAUNCHER_LOGGER)
    gone = subprocess.Popen(["true"])
    gone.wait()
    (tmp_path / PID_FILE_NAME).write_text(f"{gone.pid}\n")
    async with EmbeddedNats(log_dir=tmp_path):
        pass
    assert f"nats-server {gone.pid} of an earlier run of {tmp_path} has exited" in caplog.text


@pytest.mark.anyio
@pytest.mark.parametrize("owner", ["an unrelated process", "another dir's nats-server", "this test"])
async def test_a_pid_reused_by_another_process_is_left_alone(
    tmp_path: Path, started: list[subprocess.Popen], caplog: pytest.LogCaptureFixture, owner: str
) -> None:
    caplog.set_level(logging.INFO, logger=LAUNCHER_LOGGER)
    if owner == "an unrelated process":
        sleeper = subprocess.Popen(["sleep", "30"], start_new_session=True)
        started.append(sleeper)
        pid = sleeper.pid
    elif owner == "another dir's nats-server":
        launch_for(tmp_path / "other", started)
        pid = read_pid_file(tmp_path / "other")
    else:
        pid = os.getpid()
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / PID_FILE_NAME).write_text(f"{pid}\n")
    async with EmbeddedNats(log_dir=data_dir) as server:
        assert await round_trip(server.url) == b"hello"
    assert not has_exited(pid)
    assert f"pid {pid}, named by {PID_FILE_NAME}, is not this dir's nats-server now: left alone" in caplog.text


@pytest.mark.anyio
async def test_a_second_server_for_a_dir_in_use_is_refused_and_the_first_keeps_running(tmp_path: Path) -> None:
    async with EmbeddedNats(log_dir=tmp_path) as first:
        first_pid = read_pid_file(tmp_path)
        with pytest.raises(EmbeddedNatsError, match="runs already"):
            await EmbeddedNats(log_dir=tmp_path).start()
        assert read_pid_file(tmp_path) == first_pid
        assert await round_trip(first.url) == b"hello"
