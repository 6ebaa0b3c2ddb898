"""Opening a follower's active segment that holds its compacted leader's gaps after a crash: damage
followed by intact entries far past it is moved aside and reported, never cut as a torn tail."""

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bascule.partition.log import CommitLog, LogConfig, Record
from bascule.wire.entry import ENTRY_HEADER, HEADER_SIZE, encode_entries, scan

# No index points: opening walks, and so checks, the whole active segment.
UNINDEXED = LogConfig(segment_max_bytes=1 << 20, index_interval_bytes=1 << 20)
INDEXED = LogConfig(segment_max_bytes=1 << 20, index_interval_bytes=512)
SEGMENT = "00000000000000000000.log"
# Offsets as a compacted leader leaves them: runs and jumps, the last ones far past anything the
# bytes after them could count (an entry is at least a header long).
GAPPED = [0, 1, 2, 3, 500, 501, 502, 503, 70_000, 70_001, 3_000_000, 3_000_001, 0xFFFF_FFF0]


def entry(offset: int) -> bytes:
    return encode_entries(offset, 1, [Record(f"value {offset}".encode(), key=b"k")], 1_000 + offset)[0]


def follower_log(directory: Path, offsets: list[int], config: LogConfig = UNINDEXED) -> list[tuple[int, int, int]]:
    """A log holding entries at ``offsets``, appended as a follower stores what it fetches;
    (offset, start, end) of each in the active segment."""
    with CommitLog.open(directory, config) as log:
        log.append_raw(b"".join(entry(offset) for offset in offsets))
        log.high_watermark = log.newest_offset
    return [(offset, start, end) for offset, _, _, start, end in scan((directory / SEGMENT).read_bytes())]


def change(directory: Path, at: int, data: bytes | None = None) -> None:
    """Flip the byte at ``at`` of the segment, or put ``data`` there and cut what follows it."""
    path = directory / SEGMENT
    content = bytearray(path.read_bytes())
    if data is None:
        content[at] ^= 0x5A
    else:
        content[at:] = data
    path.write_bytes(bytes(content))


def quarantine_files(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.glob("*.corrupt-*"))


def stored_offsets(log: CommitLog) -> list[int]:
    return [stored.offset for stored in log.read(0, max_entries=1 << 40)]


def expected_next(offsets: list[int], damaged: int) -> int:
    """Where the log goes on after losing entry ``damaged`` of ``offsets``: after the last entry
    kept (the offsets of a gap before the damage are not there to lose anyway)."""
    return offsets[damaged - 1] + 1 if damaged else 0


@pytest.mark.parametrize("damaged", [4, 7, 9, 10])
def test_damage_followed_by_intact_entries_far_past_it_is_moved_aside(tmp_path, damaged):
    bounds = follower_log(tmp_path, GAPPED)
    _, start, _ = bounds[damaged]
    change(tmp_path, start + HEADER_SIZE + 2)  # in the body: the CRC catches it
    lost_bytes = (tmp_path / SEGMENT).read_bytes()[start:]
    first_lost = expected_next(GAPPED, damaged)
    with CommitLog.open(tmp_path, UNINDEXED) as log:
        assert (log.damaged_from, log.next_offset) == (first_lost, first_lost)
        assert stored_offsets(log) == GAPPED[:damaged]
    assert quarantine_files(tmp_path) == [f"{SEGMENT}.corrupt-{first_lost}"]
    assert (tmp_path / f"{SEGMENT}.corrupt-{first_lost}").read_bytes() == lost_bytes
    assert (tmp_path / SEGMENT).stat().st_size == start


def index_positions(directory: Path) -> list[int]:
    data = (directory / SEGMENT).with_suffix(".index").read_bytes()
    return [int.from_bytes(data[at + 4:at + 8], "big") for at in range(0, len(data) - 7, 8)]


def test_damage_after_the_last_index_point_of_a_gapped_segment_is_moved_aside(tmp_path):
    """Opening walks from the last index point, whose entry is past a gap, to the end."""
    offsets = [*range(0, 90, 3), *GAPPED[4:]]
    bounds = follower_log(tmp_path, offsets, INDEXED)
    last_point = index_positions(tmp_path)[-1]
    damaged = next(at for at, (_, start, _) in enumerate(bounds) if start > last_point)
    assert offsets[damaged - 1] + 1 < offsets[damaged + 1] - 1000, "intact entries far past the damage"
    _, start, _ = bounds[damaged]
    change(tmp_path, start + HEADER_SIZE + 2)
    with CommitLog.open(tmp_path, INDEXED) as log:
        assert (log.damaged_from, log.next_offset) == (offsets[damaged - 1] + 1,) * 2
        assert stored_offsets(log) == offsets[:damaged]
        assert index_positions(tmp_path)[-1] == last_point  # the points before the damage stay
    assert quarantine_files(tmp_path) == [f"{SEGMENT}.corrupt-{offsets[damaged - 1] + 1}"]


def test_damage_right_after_a_gap_is_reported_from_the_gap_and_repaired_by_fetching_again(tmp_path):
    """The damaged entry's own offset may be what the damage hit: the log reports the first offset
    it may have lost (the gap's offsets are not on the leader either) and fetches from there."""
    bounds = follower_log(tmp_path, GAPPED)
    damaged = GAPPED.index(70_000)
    _, start, _ = bounds[damaged]
    change(tmp_path, start + 3)  # in the offset itself
    with CommitLog.open(tmp_path, UNINDEXED) as log:
        assert (log.damaged_from, log.next_offset) == (504, 504)
        log.append_raw(b"".join(entry(offset) for offset in GAPPED[damaged:]))  # what the leader serves from 504
        assert log.damaged_from is None
        assert stored_offsets(log) == GAPPED
    assert quarantine_files(tmp_path) == [f"{SEGMENT}.corrupt-504"]


@pytest.mark.parametrize("last", [3_000_001, 0xFFFF_FFF0])
def test_a_torn_tail_after_a_gap_is_still_cut_without_a_report(tmp_path, last):
    offsets = GAPPED[: GAPPED.index(last) + 1]
    bounds = follower_log(tmp_path, offsets)
    _, start, end = bounds[-1]
    whole = (tmp_path / SEGMENT).read_bytes()
    for torn_at in range(start, end):
        (tmp_path / SEGMENT).write_bytes(whole[:torn_at])
        with CommitLog.open(tmp_path, UNINDEXED) as log:
            assert (log.damaged_from, log.next_offset) == (None, offsets[-2] + 1), f"torn at byte {torn_at}"
            assert stored_offsets(log) == offsets[:-1]
        assert quarantine_files(tmp_path) == []


def test_an_entry_past_what_a_segment_can_hold_is_not_taken_for_one_after_the_damage(tmp_path):
    """A segment holds offsets up to 2**32 - 1 past its base (its index's relative offsets): an
    intact entry beyond that is not one of its own, so the damage before it is a torn tail."""
    bounds = follower_log(tmp_path, GAPPED[:4])
    _, start, _ = bounds[2]
    change(tmp_path, start + HEADER_SIZE + 2)
    change(tmp_path, bounds[3][1], entry(1 << 32))
    with CommitLog.open(tmp_path, UNINDEXED) as log:
        assert (log.damaged_from, log.next_offset) == (None, 2)
    assert quarantine_files(tmp_path) == []


# Bytes that follow damage: runs of zeros (a page never written), random bytes, and headers whose
# offsets a segment could hold but whose CRCs, body sizes or bodies are wrong.
zeros = st.integers(0, 5000).map(bytes)
lookalike_headers = st.builds(
    lambda offset, body_size, body: ENTRY_HEADER.pack(offset, 5, 1, body_size, 0) + body,
    st.integers(0, 0xFFFF_FFFF),
    st.integers(0, 300) | st.integers(0, 0xFFFF_FFFF),
    st.binary(max_size=300),
)
garbage = st.lists(st.one_of(zeros, st.binary(max_size=500), lookalike_headers), max_size=8).map(b"".join)


@settings(max_examples=150, deadline=None)
@given(
    damaged=st.integers(0, len(GAPPED) - 1),
    flip_at=st.integers(0, 1000),
    tail=garbage,
    jump=st.none() | st.integers(0, 0xFFFF_FFFF),
)
def test_garbage_after_damage_is_moved_aside_only_before_an_intact_entry(damaged, flip_at, tail, jump):
    """Whatever follows the damage, the entries before it stay and opening raises nothing; the
    damage is moved aside and reported exactly when an intact entry the segment could hold (any
    offset from the first one lost up to 2**32 - 1 past its base) comes after it."""
    with tempfile.TemporaryDirectory() as temporary:
        directory = Path(temporary)
        bounds = follower_log(directory, GAPPED)
        _, start, end = bounds[damaged]
        change(directory, start + flip_at % (end - start))
        damaged_entry = (directory / SEGMENT).read_bytes()[start:end]
        first_lost = expected_next(GAPPED, damaged)
        after = tail if jump is None else tail + entry(first_lost + jump % ((1 << 32) - first_lost))
        change(directory, end, after)
        with CommitLog.open(directory, UNINDEXED) as log:
            assert log.next_offset == first_lost
            assert stored_offsets(log) == GAPPED[:damaged]
            if jump is None:
                assert log.damaged_from is None
                assert quarantine_files(directory) == []
            else:
                assert log.damaged_from == first_lost
                moved = (directory / f"{SEGMENT}.corrupt-{first_lost}").read_bytes()
                assert moved == damaged_entry + after
        assert (directory / SEGMENT).stat().st_size == start
