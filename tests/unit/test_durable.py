"""bascule.durable: small files replaced atomically and durably, and the node's identity files;
files and directories private to the server's user, and the data dir's checks.

"Atomic" is checked on a child process SIGKILLed while it rewrites a file over and over: the file
always holds one whole version. "Durable" is checked the ways a unit test can: the fsync of the
contents, the rename and the fsync of the directory were made, in that order, before the call
returned; and when an fsync fails, the call raises and the old contents stay. "Private" is checked
by the modes of what was made under umask 000 (or one that takes owner bits away).
"""

from __future__ import annotations

import errno
import logging
import os
import pwd
import signal
import stat
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import not_private

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


# ---- private files and directories -----------------------------------------------------------------


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture(params=[0o000, 0o022, 0o777], ids=["umask-000", "umask-022", "umask-777"])
def any_umask(request):
    """000 lets every bit through, 777 none (not even the owner's): the modes must not depend on it."""
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def test_a_written_file_is_private_whatever_the_umask(tmp_path, any_umask):
    durable.write_atomically(tmp_path / "file", "new\n")
    assert mode(tmp_path / "file") == 0o600
    durable.write_atomically(tmp_path / "file", "newer\n")
    assert mode(tmp_path / "file") == 0o600
    assert (tmp_path / "file").read_text() == "newer\n"


def test_the_temporary_file_is_private_before_any_data_is_written(tmp_path, monkeypatch, permissive_umask):
    """Also when a crash left an open one behind: a reader must not catch the data in it."""
    leftover = tmp_path / "file.tmp"
    leftover.write_bytes(b"left by a crash")
    os.chmod(leftover, 0o666)
    modes_at_write: list[int] = []

    def write(fd: int, data, real=os.write) -> int:
        modes_at_write.append(stat.S_IMODE(os.fstat(fd).st_mode))
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)
    durable.write_atomically(tmp_path / "file", b"secret")
    assert modes_at_write and set(modes_at_write) == {0o600}
    assert (tmp_path / "file").read_bytes() == b"secret"
    assert mode(tmp_path / "file") == 0o600


def test_open_private_creates_0600_and_tightens_a_file_already_there(tmp_path, any_umask):
    os.close(durable.open_private(tmp_path / "new", os.O_WRONLY))
    assert mode(tmp_path / "new") == 0o600
    (tmp_path / "old").write_bytes(b"data")
    os.chmod(tmp_path / "old", 0o644)
    fd = durable.open_private(tmp_path / "old", os.O_RDONLY)
    try:
        assert os.read(fd, 10) == b"data"
    finally:
        os.close(fd)
    assert mode(tmp_path / "old") == 0o600
    with open(tmp_path / "by-open", "ab", opener=durable.private_opener) as file:
        file.write(b"x")
    assert mode(tmp_path / "by-open") == 0o600


def test_directories_and_their_missing_parents_are_made_0700_whatever_the_umask(tmp_path, any_umask):
    os.chmod(tmp_path, 0o755)  # there already: left as it is
    durable.make_private_directories(tmp_path / "a" / "b" / "c")
    assert [mode(tmp_path / path) for path in ("a", "a/b", "a/b/c")] == [0o700] * 3
    assert mode(tmp_path) == 0o755
    durable.make_private_directories(tmp_path / "a" / "b" / "c")  # nothing to do
    assert mode(tmp_path / "a/b/c") == 0o700


def test_the_node_identity_files_are_private(tmp_path, permissive_umask):
    identity.server_id(CLUSTERING, tmp_path)
    identity.raft_address(CLUSTERING, tmp_path)
    identity.remember_raft_members(tmp_path, ["127.0.0.1:7001", "127.0.0.1:7002"], "127.0.0.1:7002")
    assert sorted(path.relative_to(tmp_path).as_posix() for path in tmp_path.rglob("*")) == [
        "raft", "raft-address", "raft/peers", "server-id"
    ]
    os.chmod(tmp_path, 0o700)  # pytest's, not the node's
    assert not_private(tmp_path) == {}


# ---- the data dir ------------------------------------------------------------------------------------


def test_a_missing_data_dir_is_made_private_with_its_parents(tmp_path, permissive_umask):
    data_dir = tmp_path / "bascule" / "liftbridge-default"
    durable.prepare_private_directory(data_dir)
    assert mode(tmp_path / "bascule") == mode(data_dir) == 0o700


def test_a_data_dir_open_to_others_is_tightened_with_a_log_line(tmp_path, caplog):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    os.chmod(data_dir, 0o755)
    with caplog.at_level(logging.WARNING, logger="bascule.durable"):
        durable.prepare_private_directory(data_dir)
    assert mode(data_dir) == 0o700
    assert f"{data_dir} was open to other users (mode 0755): now 0700" in caplog.text
    caplog.clear()
    durable.prepare_private_directory(data_dir)  # private already: nothing to say
    assert caplog.text == ""


def nobody() -> int:
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        return 65534


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_a_data_dir_of_another_user_is_refused_and_left_as_it_is(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o755)
    os.chmod(data_dir, 0o755)
    os.chown(data_dir, nobody(), -1)
    with pytest.raises(durable.ForeignDirectory, match=f"{data_dir} belongs to uid {nobody()}"):
        durable.prepare_private_directory(data_dir)
    assert isinstance(durable.ForeignDirectory("x"), PermissionError)
    assert (os.stat(data_dir).st_uid, mode(data_dir)) == (nobody(), 0o755)
    assert os.listdir(data_dir) == []


def test_a_data_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "data").write_text("")
    with pytest.raises(NotADirectoryError, match="is not a directory"):
        durable.prepare_private_directory(tmp_path / "data")


def test_the_clean_shutdown_marker_is_taken_durably_before_the_run_writes_anything(tmp_path, synced):
    assert identity.take_clean_shutdown(tmp_path) is True  # a new data dir: no logs to have lost
    (tmp_path / "streams").mkdir()
    assert identity.take_clean_shutdown(tmp_path) is False
    identity.record_clean_shutdown(tmp_path)
    synced.clear()
    assert identity.take_clean_shutdown(tmp_path) is True
    assert synced == [("fsync", tmp_path.name)] and not (tmp_path / identity.CLEAN_SHUTDOWN).exists()
    assert identity.take_clean_shutdown(tmp_path) is False
