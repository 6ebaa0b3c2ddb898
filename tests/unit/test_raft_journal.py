"""The metadata Raft's durable journal (bascule.metadata.journal) on real files.

"On disk" is checked the two ways a unit test can: a fresh journal opened on the same files reads the
change back, and the fsync/fdatasync/rename calls that make it durable were made, in the right order,
before the call returned. A child process SIGKILLed half-way through a change checks what a reopened
journal replays.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pysyncobj.serializer
import pysyncobj.syncobj
import pytest
from conftest import not_private
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.journal import FileJournal
from pysyncobj.pickle import dumps

from bascule import durable
from bascule.metadata.journal import CorruptJournal, DurableFileJournal, install_durable_storage, replace_durably
from bascule.metadata.raft import raft_conf
from bascule.testing import free_port

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names synced files through /proc")


@pytest.fixture
def path(tmp_path: Path) -> str:
    (tmp_path / "raft").mkdir()
    return str(tmp_path / "raft" / "journal")


@pytest.fixture
def journal(path: str):
    journal = DurableFileJournal(path)
    yield journal
    journal._destroy()


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every fsync, fdatasync and rename made from now on, in order, as (call, file name)."""
    calls: list[tuple[str, str]] = []
    for name in ("fsync", "fdatasync"):
        real_sync = getattr(os, name)

        def record(fd: int, name: str = name, real=real_sync) -> None:
            calls.append((name, os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
            real(fd)

        monkeypatch.setattr(os, name, record)

    def replace(source: str, target: str, real=os.replace) -> None:
        calls.append(("replace", f"{os.path.basename(source)} -> {os.path.basename(target)}"))
        real(source, target)

    monkeypatch.setattr(os, "replace", replace)
    return calls


def on_disk(path: str) -> tuple[list, int, object]:
    """Entries, term and vote as a journal opened afresh on the files reads them."""
    fresh = DurableFileJournal(path)
    try:
        return [fresh[i] for i in range(len(fresh))], fresh.getCurrentTerm(), fresh.getVotedForNodeId()
    finally:
        fresh._destroy()


def entries_on_disk(path: str) -> list:
    return on_disk(path)[0]


def fill(journal: DurableFileJournal, count: int, term: int = 1) -> list:
    for idx in range(1, count + 1):
        journal.add(b"command-%d" % idx, idx, term)
    return [(b"command-%d" % idx, idx, term) for idx in range(1, count + 1)]


# ---- entries ----------------------------------------------------------------------------------------


def test_an_added_entry_is_on_disk_when_add_returns(journal, path, monkeypatch) -> None:
    fill(journal, 2)
    seen_at_sync = []

    def fdatasync(fd: int, real=os.fdatasync) -> None:
        seen_at_sync.append(len(entries_on_disk(path)))
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    journal.add(b"third", 3, 1)
    # The record is synced while the header still ends before it, then the header that takes it in.
    assert seen_at_sync == [2, 3]
    assert entries_on_disk(path)[-1] == (b"third", 3, 1)


def test_the_directory_of_a_new_journal_is_synced(path, synced) -> None:
    DurableFileJournal(path)._destroy()
    assert synced == [("fsync", "journal.tmp"), ("replace", "journal.tmp -> journal"), ("fsync", "raft"),
                      ("fsync", os.path.basename(os.path.dirname(os.path.dirname(path))))]
    assert on_disk(path) == ([], 0, None)


def test_a_truncation_is_on_disk_before_the_next_entry(journal, path, synced) -> None:
    written = fill(journal, 5)
    synced.clear()
    journal.deleteEntriesFrom(2)
    assert synced == [("fdatasync", "journal")]
    assert entries_on_disk(path) == written[:2]
    journal.add(b"new-3", 3, 2)
    assert entries_on_disk(path) == [*written[:2], (b"new-3", 3, 2)]


def test_deleting_past_the_end_writes_nothing(journal, path, synced) -> None:
    written = fill(journal, 2)
    synced.clear()
    journal.deleteEntriesFrom(2)
    assert synced == [] and entries_on_disk(path) == written


def test_clear_is_on_disk(journal, path) -> None:
    fill(journal, 3)
    journal.clear()
    assert entries_on_disk(path) == []
    journal.add(b"after", 7, 3)
    assert entries_on_disk(path) == [(b"after", 7, 3)]


def test_a_compaction_replaces_the_journal_in_one_durable_rename(journal, path, synced) -> None:
    written = fill(journal, 5)
    synced.clear()
    journal.deleteEntriesTo(3)
    assert synced == [("fsync", "journal.tmp"), ("replace", "journal.tmp -> journal"), ("fsync", "raft")]
    assert [journal[i] for i in range(len(journal))] == written[3:]
    journal.add(b"command-6", 6, 1)
    assert entries_on_disk(path) == [*written[3:], (b"command-6", 6, 1)]


# ---- term, vote, commit index -----------------------------------------------------------------------


def test_term_and_vote_are_on_disk_when_set_current_term_returns(journal, path, synced) -> None:
    journal.setCurrentTerm(4, "node-b")
    assert synced == [("fsync", "journal.meta.tmp"), ("replace", "journal.meta.tmp -> journal.meta"),
                      ("fsync", "raft")]
    assert on_disk(path)[1:] == (4, "node-b")


def test_the_commit_index_is_saved_durably_by_the_timer(journal, path, synced) -> None:
    journal.setRaftCommitIndex(7)
    assert synced == []
    journal.onOneSecondTimer()
    journal.onOneSecondTimer()  # nothing new: nothing written
    assert [call for call, _ in synced] == ["fsync", "replace", "fsync"]
    reopened = DurableFileJournal(path)
    assert reopened.getRaftCommitIndex() == 7
    reopened._destroy()


# ---- a process killed half-way ----------------------------------------------------------------------

CHILD = textwrap.dedent("""
    import os, signal, sys
    from bascule.metadata.journal import DurableFileJournal

    path, last_step, killed_in = sys.argv[1:]
    journal = DurableFileJournal(path)
    for idx in (1, 2, 3):
        journal.add(b"first-%d" % idx, idx, 1)
    journal.setCurrentTerm(2, "node-b")
    journal.deleteEntriesFrom(2)
    journal.add(b"second-3", 3, 2)

    def die(*args):
        os.kill(os.getpid(), signal.SIGKILL)

    setattr(os, killed_in, die)
    if last_step == "add":
        journal.add(b"never-4", 4, 2)
    elif last_step == "compact":
        journal.deleteEntriesTo(1)
    else:
        journal.setCurrentTerm(3, "node-c")
""")


@pytest.mark.parametrize("last_step, killed_in", [
    ("add", "fdatasync"),  # its record written, the header not yet pointing past it
    ("compact", "replace"),  # the new journal written, not yet renamed over the old one
    ("vote", "replace"),  # the new meta file written, not yet renamed
])
def test_a_journal_killed_half_way_replays_what_was_done_before(path, last_step, killed_in) -> None:
    child = subprocess.run([sys.executable, "-c", CHILD, path, last_step, killed_in], timeout=60)
    assert child.returncode == -signal.SIGKILL
    before = [(b"first-1", 1, 1), (b"first-2", 2, 1), (b"second-3", 3, 2)]
    assert on_disk(path) == (before, 2, "node-b")
    journal = DurableFileJournal(path)
    journal.add(b"after-4", 4, 2)
    journal._destroy()
    assert entries_on_disk(path) == [*before, (b"after-4", 4, 2)]


# ---- pysyncobj ----------------------------------------------------------------------------------------


def test_files_written_by_pysyncobj_file_journal_open_as_they_are(path) -> None:
    theirs = FileJournal(path)
    for idx in (1, 2, 3):
        theirs.add(b"command-%d" % idx, idx, 1)
    theirs.setCurrentTerm(5, "node-c")
    theirs._destroy()
    ours = DurableFileJournal(path)
    ours.add(b"command-4", 4, 5)
    ours._destroy()
    expected = [(b"command-%d" % idx, idx, 1 if idx < 4 else 5) for idx in (1, 2, 3, 4)]
    assert on_disk(path) == (expected, 5, "node-c")
    theirs = FileJournal(path)
    assert [theirs[i] for i in range(len(theirs))] == expected
    theirs._destroy()


@pytest.fixture
def installed(monkeypatch):
    """install_durable_storage, which patches pysyncobj for the process: put back after the test."""
    monkeypatch.setattr(pysyncobj.syncobj, "createJournal", pysyncobj.syncobj.createJournal)
    monkeypatch.setattr(pysyncobj.serializer, "atomicReplace", pysyncobj.serializer.atomicReplace)
    monkeypatch.setattr(pysyncobj.serializer, "open", open, raising=False)  # the builtin, until installed
    install_durable_storage()


def test_installed_syncobj_journals_durably(path, installed) -> None:
    assert pysyncobj.serializer.atomicReplace is replace_durably
    sync = SyncObj(f"127.0.0.1:{free_port()}", [], SyncObjConf(journalFile=path, autoTick=False))
    try:
        assert isinstance(sync._SyncObj__raftLog, DurableFileJournal)
        assert len(entries_on_disk(path)) == 1  # the no-op SyncObj journals into a new log
    finally:
        sync.destroy()


def test_a_durable_replace_syncs_the_content_then_the_rename(tmp_path, synced) -> None:
    (tmp_path / "dump.tmp").write_bytes(b"state")
    replace_durably(str(tmp_path / "dump.tmp"), str(tmp_path / "dump"))
    assert synced == [("fsync", "dump.tmp"), ("replace", "dump.tmp -> dump"), ("fsync", tmp_path.name)]
    assert (tmp_path / "dump").read_bytes() == b"state"


# ---- garbage on disk ------------------------------------------------------------------------------------


def _valid_journal(path: str) -> bytes:
    journal = DurableFileJournal(path)
    fill(journal, 3)
    journal._destroy()
    return Path(path).read_bytes()


@pytest.mark.parametrize("damage", [
    lambda data: b"",
    lambda data: b"garbage" * 10,
    lambda data: data[:20],
    lambda data: data[:-5],  # the header names an end past the file
    lambda data: data[:40] + b"\xff" * 4 + data[44:],  # the first record's size
    lambda data: data[:-1] + bytes([data[-1] ^ 0xFF]),  # the last record's trailing size
])
def test_a_damaged_journal_is_refused_with_a_clear_error(path, damage) -> None:
    data = _valid_journal(path)
    Path(path).write_bytes(damage(data))
    with pytest.raises(CorruptJournal, match="journal|record|end of records"):
        DurableFileJournal(path)


def test_a_damaged_term_and_vote_file_is_refused_with_a_clear_error(path) -> None:
    _valid_journal(path)
    for garbage in (b"\x80\x04garbage", b"not pickle at all", dumps([1, 2])):
        Path(path + ".meta").write_bytes(garbage)
        with pytest.raises(CorruptJournal, match="term/vote file"):
            DurableFileJournal(path)


# ---- private files --------------------------------------------------------------------------------------


def test_the_journal_and_its_term_and_vote_file_are_private(path, permissive_umask) -> None:
    journal = DurableFileJournal(path)
    fill(journal, 3)
    journal.setCurrentTerm(2, "node-b")
    journal.deleteEntriesTo(1)  # a compaction rewrites the journal
    journal._destroy()
    raft_dir = Path(path).parent
    assert sorted(os.listdir(raft_dir)) == ["journal", "journal.meta"]
    os.chmod(raft_dir, 0o700)  # the test's: raft_conf makes the node's (the next test)
    assert not_private(raft_dir) == {}


def test_raft_conf_makes_the_raft_directory_private(tmp_path, permissive_umask) -> None:
    conf = raft_conf(tmp_path / "data", "127.0.0.1:0", None)
    assert Path(conf.journalFile).parent == tmp_path / "data" / "raft"
    assert not_private(tmp_path / "data") == {}


def test_the_full_dump_pysyncobj_writes_is_private(tmp_path, installed, permissive_umask) -> None:
    """Both ways pysyncobj's serializer writes it: its own dump, and one received from the leader."""
    dump = tmp_path / "dump"
    created: list[tuple[str, int]] = []

    def opener(file: str, flags: int, real=durable.private_opener) -> int:
        fd = real(file, flags)
        created.append((os.path.basename(file), stat.S_IMODE(os.fstat(fd).st_mode)))
        return fd

    serializer = pysyncobj.serializer.Serializer(str(dump), 1024, False, None, None, None)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(durable, "private_opener", opener)
        serializer.serialize((b"state", 7, 1), 7)
        assert serializer.checkSerializing()[0] == SERIALIZER_STATE.SUCCESS
        assert created == [("dump.tmp", 0o600)]  # private before the serializer wrote to it
        assert stat.S_IMODE(dump.stat().st_mode) == 0o600
        dump.unlink()
        assert serializer.setTransmissionData((b"from the leader", True, True))
        assert created[1:] == [("dump.1.tmp", 0o600)]
    assert dump.read_bytes() == b"from the leader"
    assert not_private(tmp_path) == {}
