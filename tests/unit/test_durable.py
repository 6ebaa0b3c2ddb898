"""bascule.durable: small files replaced atomically and durably, and the node's identity files.

"Atomic" is checked on a child process SIGKILLed while it rewrites a file over and over: the file
always holds one whole version. "Durable" is checked the ways a unit test can: the fsync of the
contents, the rename and the fsync of the directory were made, in that order, before the call
returned; and when an fsync fails, the call raises and the old contents stay.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from bascule import durable
from bascule.config import ClusteringConfig
from bascule.node import identity

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names synced files through /proc")


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every fsync and rename made from now on, in order, as (call, file name)."""
    calls: list[tuple[str, str]] = []

    def fsync(fd: int, real=os.fsync) -> None:
        calls.append(("fsync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
        real(fd)

    def replace(source, target, real=os.replace) -> None:
        calls.append(("replace", f"{os.path.basename(source)} -> {os.path.basename(target)}"))
        real(source, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return calls


def failing_fsync(monkeypatch: pytest.MonkeyPatch, error: int = errno.EIO) -> None:
    def fsync(fd: int) -> None:
        raise OSError(error, os.strerror(error))

    monkeypatch.setattr(os, "fsync", fsync)


# ---- the helper ------------------------------------------------------------------------------------


def test_a_write_is_synced_renamed_and_its_directory_synced_before_it_returns(tmp_path, synced):
    durable.write_atomically(tmp_path / "file", "new\n")
    assert synced == [("fsync", "file.tmp"), ("replace", "file.tmp -> file"), ("fsync", tmp_path.name)]
    assert (tmp_path / "file").read_text() == "new\n"
    assert sorted(os.listdir(tmp_path)) == ["file"]


@pytest.mark.parametrize("error", [errno.EIO, errno.ENOSPC])
def test_a_failed_fsync_raises_and_keeps_the_old_contents(tmp_path, monkeypatch, error):
    path = tmp_path / "file"
    durable.write_atomically(path, b"old")
    failing_fsync(monkeypatch, error)
    with pytest.raises(OSError) as raised:
        durable.write_atomically(path, b"new")
    assert raised.value.errno == error
    assert path.read_bytes() == b"old"
    assert sorted(os.listdir(tmp_path)) == ["file"]  # no temporary file left behind


def test_a_short_disk_raises_and_keeps_the_old_contents(tmp_path, monkeypatch):
    path = tmp_path / "file"
    durable.write_atomically(path, b"old")

    def write(fd: int, data, real=os.write) -> int:
        real(fd, bytes(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", write)
    with pytest.raises(OSError, match="No space"):
        durable.write_atomically(path, b"new contents")
    assert path.read_bytes() == b"old"
    assert sorted(os.listdir(tmp_path)) == ["file"]


REWRITER = textwrap.dedent(
    """
    import sys
    from bascule.durable import write_atomically

    path = sys.argv[1]
    versions = [bytes([65 + n]) * (2 << 20) for n in range(3)]  # 2 MiB each: a write takes a while
    write_atomically(path, versions[0])
    print("writing", flush=True)
    n = 0
    while True:
        n += 1
        write_atomically(path, versions[n % 3])
    """
)


def test_a_sigkill_mid_write_leaves_one_whole_version(tmp_path):
    """Killed at random points of a rewrite loop, the file is never empty or half written."""
    path = tmp_path / "server-id"
    versions = {bytes([65 + n]) * (2 << 20) for n in range(3)}
    for delay in (0.0, 0.003, 0.011, 0.029, 0.05, 0.1):
        writer = subprocess.Popen([sys.executable, "-c", REWRITER, str(path)], stdout=subprocess.PIPE, text=True)
        try:
            assert writer.stdout.readline() == "writing\n"
            time.sleep(delay)
        finally:
            writer.send_signal(signal.SIGKILL)
            writer.wait()
            writer.stdout.close()
        assert path.read_bytes() in versions


# ---- the node's identity files ---------------------------------------------------------------------


CLUSTERING = ClusteringConfig(raft_listen="127.0.0.1:0")


def test_the_generated_server_id_is_on_disk_before_it_is_used(tmp_path, synced):
    server_id = identity.server_id(CLUSTERING, tmp_path)
    assert synced == [
        ("fsync", "server-id.tmp"), ("replace", "server-id.tmp -> server-id"), ("fsync", tmp_path.name)
    ]
    assert identity.server_id(CLUSTERING, tmp_path) == server_id


def test_the_raft_address_is_on_disk_before_it_is_used(tmp_path, synced):
    address = identity.raft_address(CLUSTERING, tmp_path)
    assert synced == [
        ("fsync", "raft-address.tmp"), ("replace", "raft-address.tmp -> raft-address"), ("fsync", tmp_path.name)
    ]
    assert identity.raft_address(CLUSTERING, tmp_path) == address


def test_the_joined_peers_are_on_disk_before_they_are_used(tmp_path, synced):
    assert identity.known_raft_peers(CLUSTERING, tmp_path, "127.0.0.1:7002") is None  # must join first
    peers = identity.remember_raft_members(tmp_path, ["127.0.0.1:7001", "127.0.0.1:7002"], "127.0.0.1:7002")
    assert peers == ["127.0.0.1:7001"]
    assert synced == [("fsync", "peers.tmp"), ("replace", "peers.tmp -> peers"), ("fsync", "raft")]
    assert identity.known_raft_peers(CLUSTERING, tmp_path, "127.0.0.1:7002") == peers


def test_a_failed_fsync_of_the_server_id_leaves_no_id_file(tmp_path, monkeypatch):
    """Starting must fail rather than run under an id the disk may forget (or keep empty)."""
    failing_fsync(monkeypatch)
    with pytest.raises(OSError):
        identity.server_id(CLUSTERING, tmp_path)
    assert os.listdir(tmp_path) == []
