"""Child processes for tests, each in its own process group (`LocalProcess`), the base of `LocalNatsServer`
and `LocalNode` (`bascule.testing.local`).

A process's own children (the nats-server of a node's ``--embedded-nats``) are signalled with it and never
outlive it. Output goes to a log file, never to a pipe that could fill up and stall the process; every
timeout error quotes the end of that log. Whatever is still running when the interpreter exits is killed.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

__all__ = ["LocalProcess", "LocalProcessError"]


class LocalProcessError(RuntimeError):
    """A local process did not start, exited early, or did not get ready in time."""


# Every process started here and not yet reaped (strong references: a LocalNode dropped without
# stop must still be found), so that an interpreter exiting without cleanup leaves nothing behind.
_live: set[LocalProcess] = set()


@atexit.register
def _kill_leftovers() -> None:
    for process in list(_live):
        try:
            process.kill()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


def _group_members(pgid: int, states: bool = False) -> list[Any]:
    """Live (not zombie) processes in process group `pgid`, or (pid, state) pairs; Linux only, else []."""
    members: list[Any] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return members
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            stat = Path("/proc", entry, "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append((int(entry), fields[0]) if states else int(entry))
    return members


class LocalProcess:
    """One subprocess in its own process group, its output appended to a log file."""

    name = "process"

    def __init__(self, log_path: Path, stop_grace: float) -> None:
        self.log_path = Path(log_path)
        self.stop_grace = stop_grace
        self._popen: subprocess.Popen[bytes] | None = None
        self._starts = 0

    # -- subclasses --
    def command(self) -> list[str]:
        raise NotImplementedError

    def _cwd(self) -> str | None:
        return None

    def _env(self) -> dict[str, str] | None:
        return None

    # -- state --
    @property
    def pid(self) -> int | None:
        """The pid of the current (or last) process; None before the first start."""
        return self._popen.pid if self._popen is not None else None

    @property
    def running(self) -> bool:
        """Started and not exited (a paused process is running)."""
        return self._popen is not None and self._popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return self._popen.poll() if self._popen is not None else None

    def pids(self) -> list[int]:
        """Every live process of this one's group: the process itself and any children it started."""
        if self._popen is None:
            return []
        members = _group_members(self._popen.pid)
        if self.running and self._popen.pid not in members:
            members.append(self._popen.pid)
        return sorted(members)

    def log_tail(self, lines: int = 40) -> str:
        """The last `lines` lines of the log (all starts of the process, separated by marker lines)."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(0, os.SEEK_END)
                size = log.tell()
                log.seek(max(0, size - 256 * 1024))
                data = log.read()
        except OSError as exc:
            return f"(no log at {self.log_path}: {exc.strerror})"
        return "\n".join(data.decode(errors="replace").splitlines()[-lines:])

    def _describe(self) -> str:
        return f"{self.name} (pid {self.pid})"

    def _error(self, message: str, lines: int = 40) -> LocalProcessError:
        return LocalProcessError(
            f"{message}\n--- last {lines} lines of {self.log_path} ---\n{self.log_tail(lines)}"
        )

    # -- lifecycle --
    def _spawn(self) -> None:
        if self.running:
            raise LocalProcessError(f"{self._describe()} is already running")
        self._reap_group()
        command = self.command()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._starts += 1
        with open(self.log_path, "ab") as log:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            log.write(f"==== start {self._starts} at {stamp}: {' '.join(command)}\n".encode())
            log.flush()
            try:
                self._popen = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self._cwd(),
                    env=self._env(),
                    start_new_session=True,  # own process group: signals reach its children too
                )
            except OSError as exc:
                raise LocalProcessError(f"cannot start {self.name}: {command[0]}: {exc}") from exc
        _live.add(self)

    def _signal_group(self, signum: int) -> None:
        if self._popen is None:
            return
        try:
            os.killpg(self._popen.pid, signum)
        except (ProcessLookupError, PermissionError):
            # The group is gone; the leader may still be an unreaped zombie.
            if self._popen.poll() is None:
                self._popen.send_signal(signum)

    def _reap_group(self, timeout: float = 2.0) -> None:
        """After the leader exited: kill anything left in its group and wait (briefly) until it is gone."""
        if self._popen is None:
            return
        deadline = time.monotonic() + timeout
        while True:
            members = _group_members(self._popen.pid)
            if not members:
                break
            for pid in members:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        _live.discard(self)

    def kill(self) -> None:
        """SIGKILL the process and its group, and wait until they are gone. No-op when not running."""
        if self._popen is None:
            return
        if self._popen.poll() is None:
            self._signal_group(signal.SIGKILL)
            self._popen.wait()
        self._reap_group()

    def stop(self, grace: float | None = None) -> None:
        """SIGTERM, then SIGKILL (to the whole group) if it has not exited after `grace` seconds."""
        self._terminate()
        self._finish_stop(time.monotonic() + (self.stop_grace if grace is None else grace))

    def _terminate(self) -> None:
        if self._popen is not None and self._popen.poll() is None:
            self._popen.send_signal(signal.SIGTERM)
            # A paused process would only see SIGTERM once continued.
            self._signal_group(signal.SIGCONT)

    def _finish_stop(self, deadline: float) -> None:
        if self._popen is None:
            return
        try:
            self._popen.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self._signal_group(signal.SIGKILL)
            self._popen.wait()
        self._reap_group()

    def pause(self) -> None:
        """SIGSTOP the process group, and wait until it has stopped: it stays alive but answers
        nothing until `resume`."""
        if not self.running:
            raise LocalProcessError(f"cannot pause {self._describe()}: not running")
        self._signal_group(signal.SIGSTOP)
        self._wait_stopped(True)

    def resume(self) -> None:
        """SIGCONT the process group, and wait until it runs again."""
        if not self.running:
            raise LocalProcessError(f"cannot resume {self._describe()}: not running")
        self._signal_group(signal.SIGCONT)
        self._wait_stopped(False)

    def _wait_stopped(self, stopped: bool, timeout: float = 5.0) -> None:
        # Signals are delivered asynchronously; without this a test could look at a process that
        # was paused but has not stopped yet.
        assert self._popen is not None
        deadline = time.monotonic() + timeout
        while True:
            states = [state for _, state in _group_members(self._popen.pid, states=True)]
            if all((state in "Tt") == stopped for state in states):
                return
            if time.monotonic() > deadline:
                word = "stop" if stopped else "continue"
                raise self._error(f"{self._describe()} did not {word} within {timeout:.1f} s (states {states})")
            time.sleep(0.005)

    def _check_alive(self, doing: str) -> None:
        if self._popen is not None and self._popen.poll() is not None:
            raise self._error(f"{self._describe()} exited with status {self._popen.returncode} {doing}")
