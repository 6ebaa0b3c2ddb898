"""Opening a log after a crash or with damaged files."""

import errno
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bascule.partition.log import CommitLog, CorruptEntry, LogConfig, Record
from bascule.wire.entry import HEADER_SIZE, scan

CONFIG = LogConfig(segment_max_bytes=1024, index_interval_bytes=256)
FIRST_LOG = "00000000000000000000.log"
FIRST_INDEX = "00000000000000000000.index"


def values(count: int, prefix: str = "m") -> list[Record]:
    return [Record(f"{prefix}{i}".encode() * 4, key=b"k") for i in range(count)]


def build_log(
    directory: Path, batches: int = 12, per_batch: int = 3, config: LogConfig = CONFIG
) -> list:
    with CommitLog.open(directory, config) as log:
        for batch in range(batches):
            log.append(values(per_batch, prefix=f"{batch}-"), 1 + batch // 4)
        log.high_watermark = log.newest_offset
        return log.read(0, max_entries=10_000)


def segment_paths(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))


def entry_bounds(path: Path) -> list[tuple[int, int, int]]:
    """(offset, start, end) of each entry in a segment file."""
    return [(offset, start, end) for offset, _, _, start, end in scan(path.read_bytes())]


def flip_byte(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0x5A
    path.write_bytes(bytes(data))


# --- torn and corrupt tails -----------------------------------------------------------------


def test_torn_tail_at_every_byte_is_cut_to_the_last_whole_entry(tmp_path, caplog):
    original = tmp_path / "original"
    expected = build_log(original)
    last_segment = segment_paths(original)[-1]
    last_offset, last_start, last_end = entry_bounds(last_segment)[-1]
    for cut in range(last_start, last_end):
        work = tmp_path / f"cut{cut}"
        shutil.copytree(original, work)
        os.truncate(work / last_segment.name, cut)
        with caplog.at_level(logging.WARNING), CommitLog.open(work, CONFIG) as log:
            assert log.next_offset == last_offset
            assert log.read(0, max_entries=10_000) == expected[:-1]
            assert log.high_watermark == last_offset - 1  # clamped: the HW entry is gone
            assert (work / last_segment.name).stat().st_size == last_start
            log.append([Record(b"after")], 9)
            assert log.read(last_offset)[0].value == b"after"
        if cut > last_start:
            assert f"cutting {cut - last_start} bytes" in caplog.text
            assert str(work / last_segment.name) in caplog.text
        caplog.clear()
        shutil.rmtree(work)


def test_flipped_byte_in_the_last_entry_is_cut(tmp_path):
    original = tmp_path / "original"
    expected = build_log(original)
    last_segment = segment_paths(original)[-1]
    last_offset, last_start, last_end = entry_bounds(last_segment)[-1]
    for position in range(last_start, last_end):
        work = tmp_path / f"flip{position}"
        shutil.copytree(original, work)
        flip_byte(work / last_segment.name, position)
        with CommitLog.open(work, CONFIG) as log:
            assert log.next_offset == last_offset
            assert log.read(0, max_entries=10_000) == expected[:-1]
        shutil.rmtree(work)


def test_garbage_after_the_last_entry_is_cut(tmp_path):
    expected = build_log(tmp_path)
    with open(segment_paths(tmp_path)[-1], "ab") as file:
        file.write(os.urandom(100))
    with CommitLog.open(tmp_path, CONFIG) as log:
        assert log.read(0, max_entries=10_000) == expected


def test_torn_tail_of_a_fresh_segment_empties_it(tmp_path):
    build_log(tmp_path)
    last_segment = segment_paths(tmp_path)[-1]
    os.truncate(last_segment, HEADER_SIZE - 1)
    with CommitLog.open(tmp_path, CONFIG) as log:
        assert log.next_offset == int(last_segment.stem)
        assert last_segment.stat().st_size == 0


# --- damage followed by intact entries: moved aside and reported, never cut silently ---------


def index_positions(path: Path) -> list[int]:
    data = path.read_bytes()
    return [int.from_bytes(data[i + 4 : i + 8], "big") for i in range(0, len(data) - 7, 8)]


def damage_in_active_segment(directory: Path, index: str) -> tuple[Path, int, int, int]:
    """(segment, offset, start, end) of an entry of the active segment with intact entries after
    it, that opening the log walks over: after the last index point, or anywhere without index."""
    segment = segment_paths(directory)[-1]
    bounds = entry_bounds(segment)
    if index == "lost":
        segment.with_suffix(".index").unlink()
        return (segment, *bounds[len(bounds) // 2])
    last_point = max(index_positions(segment.with_suffix(".index")), default=0)
    after = [bound for bound in bounds if bound[1] >= last_point]
    assert len(after) >= 2, "the entry must have intact entries after it"
    return (segment, *after[0])


def quarantine_files(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.glob("*.corrupt-*"))


@pytest.mark.parametrize("index", ["kept", "lost"])
def test_a_damaged_entry_followed_by_intact_ones_is_moved_aside_and_reported(
    tmp_path, caplog, index, permissive_umask
):
    original = tmp_path / "original"
    expected = build_log(original)
    work = tmp_path / "work"
    shutil.copytree(original, work)
    segment, offset, start, _ = damage_in_active_segment(work, index)
    flip_byte(segment, start + HEADER_SIZE + 2)  # in the body: the CRC catches it
    damaged_bytes = segment.read_bytes()[start:]
    with caplog.at_level(logging.ERROR), CommitLog.open(work, CONFIG) as log:
        assert log.damaged_from == offset
        assert log.next_offset == offset
        assert log.high_watermark == offset - 1
        assert log.read(0, max_entries=10_000) == expected[:offset]
    name = f"{segment.name}.corrupt-{offset}"
    assert quarantine_files(work) == [name]
    assert (work / name).read_bytes() == damaged_bytes
    assert stat.S_IMODE((work / name).stat().st_mode) == 0o600  # private, as every file of the log
    assert segment.stat().st_size == start
    assert name in caplog.text and str(offset) in caplog.text
    assert all(record.levelno == logging.ERROR for record in caplog.records if name in record.getMessage())


def test_a_flipped_byte_anywhere_in_a_middle_entry_is_never_cut_silently(tmp_path):
    original = tmp_path / "original"
    build_log(original)
    segment = segment_paths(original)[-1]
    bounds = entry_bounds(segment)
    offset, start, end = bounds[len(bounds) // 2]
    for position in range(start, end):
        work = tmp_path / f"flip{position}"
        shutil.copytree(original, work)
        (work / segment.with_suffix(".index").name).unlink()  # opening walks the whole segment
        flip_byte(work / segment.name, position)
        with CommitLog.open(work, CONFIG) as log:
            assert (log.next_offset, log.damaged_from) == (offset, offset), f"byte {position}"
        assert quarantine_files(work) == [f"{segment.name}.corrupt-{offset}"]
        shutil.rmtree(work)


def test_the_log_is_whole_again_once_it_fetched_what_it_lost(tmp_path):
    original = tmp_path / "original"
    expected = build_log(original)
    work = tmp_path / "work"
    shutil.copytree(original, work)
    segment, offset, start, _ = damage_in_active_segment(work, "lost")
    flip_byte(segment, start + HEADER_SIZE + 2)
    with CommitLog.open(original, CONFIG) as leader:
        lost = leader.read_raw(offset, 1 << 20)
    with CommitLog.open(work, CONFIG) as log:
        assert log.damaged_from == offset
        log.append_raw(lost)  # what a follower fetches from its leader
        assert log.damaged_from is None
        assert log.read(0, max_entries=10_000) == expected
    with CommitLog.open(work, CONFIG) as log:  # the quarantine file stays, never read
        assert log.damaged_from is None
        assert log.read(0, max_entries=10_000) == expected
    assert quarantine_files(work) == [f"{segment.name}.corrupt-{offset}"]


def test_zeros_followed_by_intact_entries_are_moved_aside(tmp_path):
    """A power cut can leave a page of the file unwritten (zeros) and a later page written."""
    build_log(tmp_path)
    segment, offset, start, end = damage_in_active_segment(tmp_path, "lost")
    data = bytearray(segment.read_bytes())
    data[start:end] = bytes(end - start)
    segment.write_bytes(bytes(data))
    with CommitLog.open(tmp_path, CONFIG) as log:
        assert (log.next_offset, log.damaged_from) == (offset, offset)
    assert quarantine_files(tmp_path) == [f"{segment.name}.corrupt-{offset}"]


@pytest.mark.parametrize("tail", ["zeros after the end", "last entries zeroed", "garbage after zeros"])
def test_a_torn_tail_of_zeros_or_garbage_is_cut_without_a_report(tmp_path, tail):
    expected = build_log(tmp_path)
    segment = segment_paths(tmp_path)[-1]
    bounds = entry_bounds(segment)
    data = segment.read_bytes()
    if tail == "zeros after the end":
        kept, data = len(expected), data + bytes(50_000)
    elif tail == "last entries zeroed":
        kept, cut = bounds[-2][0], bounds[-2][1]
        data = data[:cut] + bytes(len(data) - cut)
    else:
        kept, data = len(expected), data + bytes(3000) + os.urandom(3000)
    segment.write_bytes(data)
    with CommitLog.open(tmp_path, CONFIG) as log:
        assert log.next_offset == kept
        assert log.damaged_from is None
        assert log.read(0, max_entries=10_000) == expected[:kept]
    assert quarantine_files(tmp_path) == []


def test_a_full_disk_while_moving_damage_aside_leaves_the_segment_as_it_was(tmp_path, monkeypatch):
    build_log(tmp_path)
    segment, offset, start, _ = damage_in_active_segment(tmp_path, "lost")
    flip_byte(segment, start + HEADER_SIZE + 2)
    damaged = segment.read_bytes()

    def write(fd, data, real=os.write):
        if ".corrupt-" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)
    with pytest.raises(OSError, match="No space"):
        CommitLog.open(tmp_path, CONFIG)
    assert segment.read_bytes() == damaged
    assert quarantine_files(tmp_path) == []


# --- corruption that must not be served -----------------------------------------------------


@pytest.mark.parametrize("segment_number", [0, -1])
def test_flipped_byte_in_an_older_entry_is_never_served(tmp_path, segment_number):
    expected = build_log(tmp_path)
    segment = segment_paths(tmp_path)[segment_number]
    offset, start, _ = entry_bounds(segment)[1]  # well before the last index point
    flip_byte(segment, start + HEADER_SIZE + 3)  # in the body
    with CommitLog.open(tmp_path, CONFIG) as log:
        with pytest.raises(CorruptEntry, match="CRC"):
            log.read(offset)
        with pytest.raises(CorruptEntry, match=f"CRC.*{segment.name}|{segment.name}.*CRC"):
            log.read_raw(offset, 10)
        # A read that reaches the damaged entry stops just before it: the next one raises.
        assert log.read(offset - 1, max_entries=5) == [expected[offset - 1]]
        assert scan_offsets(log.read_raw(offset - 1, 10_000)) == [offset - 1]
        assert log.read(offset + 1, max_entries=3) == expected[offset + 1 : offset + 4]


def test_damaged_first_entry_of_a_segment_ends_a_read_from_the_previous_one(tmp_path):
    expected = build_log(tmp_path)
    second = segment_paths(tmp_path)[1]
    flip_byte(second, HEADER_SIZE + 1)
    first_of_second = int(second.stem)
    with CommitLog.open(tmp_path, CONFIG) as log:
        assert log.read(0, max_entries=1000) == expected[:first_of_second]
        assert scan_offsets(log.read_raw(0, 100_000)) == list(range(first_of_second))
        with pytest.raises(CorruptEntry):
            log.read(first_of_second)


def scan_offsets(raw: bytes) -> list[int]:
    return [offset for offset, *_ in scan(raw)]


@pytest.mark.parametrize("field", ["body", "body size"])
def test_a_read_that_meets_damage_in_an_older_segment_reports_its_first_offset(tmp_path, field):
    expected = build_log(tmp_path)
    segment = segment_paths(tmp_path)[0]
    offset, start, _ = entry_bounds(segment)[2]
    flip_byte(segment, start + (HEADER_SIZE + 3 if field == "body" else 25))
    with CommitLog.open(tmp_path, CONFIG) as log:
        assert log.damaged_from is None  # opening does not read older segments
        assert log.read(0, max_entries=2) == expected[:2]
        with pytest.raises(CorruptEntry):
            log.read(offset + 1 if field == "body size" else offset)  # a header no longer lines up
        assert log.damaged_from == offset
        # Repaired the way a follower is: truncated to the damage, then fetching from the leader.
        log.truncate(offset)
        assert log.damaged_from == offset
        log.append_raw(b"".join(entry_bytes(expected[offset:])))
        assert log.damaged_from is None
        assert log.read(0, max_entries=10_000) == expected


def entry_bytes(entries: list) -> list[bytes]:
    from bascule.wire.entry import encode_entries

    return [
        encode_entries(e.offset, e.leader_epoch, [Record(e.value, e.key, e.headers, e.timestamp)], e.timestamp)[0]
        for e in entries
    ]


def test_find_damage_checks_every_entry_of_every_segment(tmp_path):
    build_log(tmp_path)
    with CommitLog.open(tmp_path, CONFIG) as log:
        assert log.find_damage() is None
        assert log.damaged_from is None
    segment = segment_paths(tmp_path)[1]
    offset, start, _ = entry_bounds(segment)[1]
    flip_byte(segment, start + HEADER_SIZE + 1)
    with CommitLog.open(tmp_path, CONFIG) as log:
        assert log.find_damage() == offset
        assert log.damaged_from == offset


@pytest.mark.parametrize("damage", ["lost its last entries", "emptied"])
def test_an_older_segment_missing_entries_is_reported_not_served(tmp_path, damage):
    expected = build_log(tmp_path)
    segment = segment_paths(tmp_path)[0]
    bounds = entry_bounds(segment)
    missing_from, cut, _ = bounds[-2] if damage == "lost its last entries" else bounds[0]
    os.truncate(segment, cut)
    with CommitLog.open(tmp_path, CONFIG) as log:
        if missing_from:
            assert log.read(0, max_entries=10_000) == expected[:missing_from]
        with pytest.raises(CorruptEntry):
            log.read(missing_from)
        assert log.damaged_from == missing_from
    with CommitLog.open(tmp_path, CONFIG) as log:
        assert log.find_damage() == missing_from


def test_damaged_header_of_an_older_entry_is_never_served(tmp_path):
    build_log(tmp_path)
    segment = segment_paths(tmp_path)[0]
    offset, start, _ = entry_bounds(segment)[2]
    flip_byte(segment, start + 25)  # the body size
    with CommitLog.open(tmp_path, CONFIG) as log:
        for reader in (lambda: log.read(offset), lambda: log.read_raw(offset, 10_000)):
            with pytest.raises(CorruptEntry):
                reader()


# --- damaged index --------------------------------------------------------------------------


def test_index_of_the_active_segment_is_rebuilt(tmp_path):
    config = LogConfig(index_interval_bytes=256)
    expected = build_log(tmp_path, config=config)
    index = tmp_path / FIRST_INDEX
    good_index = index.read_bytes()
    assert len(good_index) > 8
    damages = {
        "deleted": lambda: index.unlink(),
        "emptied": lambda: index.write_bytes(b""),
        "short": lambda: index.write_bytes(good_index[:-8]),
        "partial point": lambda: index.write_bytes(good_index[:-3]),
        "garbage": lambda: index.write_bytes(os.urandom(len(good_index))),
        "beyond the data": lambda: index.write_bytes(good_index + (10_000).to_bytes(4, "big") * 2),
        "between entries": lambda: index.write_bytes(
            good_index[:-4] + (int.from_bytes(good_index[-4:], "big") + 1).to_bytes(4, "big")
        ),
    }
    for damage in damages.values():
        damage()
        with CommitLog.open(tmp_path, config) as log:
            assert log.read(0, max_entries=1000) == expected
            for entry in expected:
                assert log.read(entry.offset, max_entries=1) == [entry]
        assert index.read_bytes() == good_index


def test_index_of_an_older_segment_is_rebuilt_when_used(tmp_path):
    expected = build_log(tmp_path)
    index = tmp_path / FIRST_INDEX
    good_index = index.read_bytes()
    assert len(segment_paths(tmp_path)) > 1 and len(good_index) > 8
    for damage in (
        b"",
        os.urandom(len(good_index)),
        good_index + b"\xff" * 8,  # a point past the log
        good_index[:-8],  # truncated
        good_index[:-3],  # a partial point
    ):
        index.write_bytes(damage)
        with CommitLog.open(tmp_path, CONFIG) as log:
            for entry in expected:
                assert log.read(entry.offset, max_entries=1) == [entry]
        assert index.read_bytes() == good_index


def test_misplaced_point_in_the_middle_of_an_index_is_repaired(tmp_path):
    config = LogConfig(index_interval_bytes=64)
    expected = build_log(tmp_path, config=config)
    index = tmp_path / FIRST_INDEX
    good_index = index.read_bytes()
    damaged = bytearray(good_index)
    damaged[4:8] = (int.from_bytes(good_index[4:8], "big") + 1).to_bytes(4, "big")
    index.write_bytes(bytes(damaged))
    with CommitLog.open(tmp_path, config) as log:
        for entry in expected:
            assert log.read(entry.offset, max_entries=1) == [entry]
    assert index.read_bytes() == good_index


# --- checkpoints and leftovers --------------------------------------------------------------


def test_garbage_epoch_checkpoint_is_rebuilt_from_entries(tmp_path):
    build_log(tmp_path)
    with CommitLog.open(tmp_path, CONFIG) as log:
        epochs = log.epochs.entries
    assert len(epochs) == 3
    for garbage in ("nonsense\n", "3 0\n1 5\n", "\x00\xff", "1 2 3\n"):
        (tmp_path / "leader-epoch-checkpoint").write_text(garbage, encoding="latin-1")
        with CommitLog.open(tmp_path, CONFIG) as log:
            assert log.epochs.entries == epochs
    (tmp_path / "leader-epoch-checkpoint").unlink()
    with CommitLog.open(tmp_path, CONFIG) as log:
        assert log.epochs.entries == epochs
    assert (tmp_path / "leader-epoch-checkpoint").read_text() == "end 36\n" + "".join(
        f"{e} {s}\n" for e, s in epochs
    )


def test_garbage_high_watermark_checkpoint_means_nothing_committed(tmp_path):
    build_log(tmp_path)
    for garbage in ("", "twelve", "-7", "\xff"):
        (tmp_path / "replication-offset-checkpoint").write_text(garbage, encoding="latin-1")
        with CommitLog.open(tmp_path, CONFIG) as log:
            assert log.high_watermark == -1
    (tmp_path / "replication-offset-checkpoint").unlink()
    with CommitLog.open(tmp_path, CONFIG) as log:
        assert log.high_watermark == -1


def test_epoch_checkpoint_ahead_of_the_data_is_cut(tmp_path):
    build_log(tmp_path, batches=4)  # epoch 1 only, offsets 0..11
    (tmp_path / "leader-epoch-checkpoint").write_text("1 0\n2 12\n3 20\n")
    with CommitLog.open(tmp_path, CONFIG) as log:
        assert log.epochs.entries == [(1, 0)]


def test_entries_of_an_epoch_the_checkpoint_missed_are_recorded(tmp_path):
    build_log(tmp_path, batches=6, config=LogConfig())  # epoch 2 starts at offset 12
    for stale in ("1 0\n", "1 0\n2 10\n", "1 0\n2 13\n", ""):
        (tmp_path / "leader-epoch-checkpoint").write_text(stale)
        with CommitLog.open(tmp_path) as log:
            assert log.epochs.entries == [(1, 0), (2, 12)]


def test_an_epoch_checkpoint_describing_replaced_entries_is_rebuilt(tmp_path):
    """A truncation replaced epoch 1's tail with epoch 2's entries, and the power cut left the
    checkpoint written before it: it covers offsets 0..11 as epoch 1."""
    build_log(tmp_path, batches=6, config=LogConfig())  # epoch 2 starts at offset 12
    for stale in ("end 14\n1 0\n", "end 18\n1 0\n2 15\n"):
        (tmp_path / "leader-epoch-checkpoint").write_text(stale)
        with CommitLog.open(tmp_path) as log:
            assert log.epochs.entries == [(1, 0), (2, 12)]


def test_an_epoch_checkpoint_written_before_appends_is_extended_from_the_entries(tmp_path, caplog):
    build_log(tmp_path, batches=6, config=LogConfig())  # epoch 2 starts at offset 12
    (tmp_path / "leader-epoch-checkpoint").write_text("end 7\n1 0\n")
    with caplog.at_level(logging.WARNING), CommitLog.open(tmp_path) as log:
        assert log.epochs.entries == [(1, 0), (2, 12)]
    assert "rebuilding" not in caplog.text


def test_an_epoch_checkpoint_missing_the_oldest_entries_is_rebuilt(tmp_path):
    """Retention's unlinks were lost in the power cut, its checkpoint was not."""
    build_log(tmp_path, batches=6, config=LogConfig())
    (tmp_path / "leader-epoch-checkpoint").write_text("end 18\n2 12\n")
    with CommitLog.open(tmp_path) as log:
        assert log.epochs.entries == [(1, 0), (2, 12)]


def test_leftover_files_are_removed(tmp_path):
    expected = build_log(tmp_path)
    (tmp_path / "leader-epoch-checkpoint.tmp").write_text("half")
    (tmp_path / "replication-offset-checkpoint.tmp").write_text("1")
    (tmp_path / "00000000000000099999.index").write_bytes(b"\x00" * 8)
    (tmp_path / "notes.txt").write_text("kept")
    (tmp_path / f"{FIRST_LOG}.corrupt-3").write_bytes(b"moved aside earlier")
    (tmp_path / f"{FIRST_LOG}.corrupt-5.tmp").write_bytes(b"a quarantine cut short")
    with CommitLog.open(tmp_path, CONFIG) as log:
        assert log.read(0, max_entries=1000) == expected
        assert log.damaged_from is None
    assert not (tmp_path / "leader-epoch-checkpoint.tmp").exists()
    assert not (tmp_path / "replication-offset-checkpoint.tmp").exists()
    assert not (tmp_path / "00000000000000099999.index").exists()
    assert not (tmp_path / f"{FIRST_LOG}.corrupt-5.tmp").exists()
    assert (tmp_path / "notes.txt").exists()
    assert (tmp_path / f"{FIRST_LOG}.corrupt-3").read_bytes() == b"moved aside earlier"


def test_high_watermark_checkpoint_past_the_log_end_is_lowered(tmp_path, caplog):
    build_log(tmp_path, batches=2)  # offsets 0..5
    (tmp_path / "replication-offset-checkpoint").write_text("40\n")
    with caplog.at_level(logging.WARNING), CommitLog.open(tmp_path, CONFIG) as log:
        assert log.high_watermark == 5
    assert "past the log's end" in caplog.text


# --- restart speed and a real crash -------------------------------------------------------


def test_opening_a_million_entries_is_fast(tmp_path):
    """Only the tail after the last index point is read at open."""
    batch = [Record(b"x" * 100) for _ in range(1000)]
    with CommitLog.open(tmp_path) as log:
        for _ in range(1000):
            log.append(batch, 1)
    started = time.perf_counter()
    with CommitLog.open(tmp_path) as log:
        opened_in = time.perf_counter() - started
        assert log.next_offset == 1_000_000
        assert log.read(999_999)[0].offset == 999_999
        assert log.read(123_456)[0].offset == 123_456
    assert opened_in < 0.5


WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from bascule.partition.log import CommitLog, LogConfig, Record

    config = LogConfig(segment_max_bytes=200_000, index_interval_bytes=512)
    log = CommitLog.open(Path(sys.argv[1]), config)
    batch = 0
    while True:
        log.append([Record(b"%d-%d" % (batch, i) * 50) for i in range(100)], 1 + batch // 50)
        if batch == 5:
            print("writing", flush=True)
        batch += 1
    """
)


def test_sigkill_while_appending_leaves_a_readable_log(tmp_path):
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert writer.stdout.readline() == "writing\n"
        time.sleep(0.3)
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    with CommitLog.open(
        tmp_path, LogConfig(segment_max_bytes=200_000, index_interval_bytes=512)
    ) as log:
        assert log.next_offset >= 600
        offset = 0
        while offset < log.next_offset:
            for entry in log.read(offset, max_entries=1000):
                batch, number = divmod(entry.offset, 100)
                assert entry.value == b"%d-%d" % (batch, number) * 50
                assert entry.leader_epoch == 1 + batch // 50
                offset = entry.offset + 1
        assert log.epochs.entries == [
            (1 + b // 50, b * 100)
            for b in range(0, log.next_offset // 100 + 1, 50)
            if b * 100 < log.next_offset
        ]
        log.append([Record(b"after")], 1_000)
