"""Log compaction by key: the pure rule, the crash-safe rewrite of segments, and every reader of a
log with gaps (reads from an offset compacted away, Subscribe's walk, retention, timestamps, the
leader-epoch history, damage checks, a follower replicating a compacted leader)."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from bascule.partition.log import CommitLog, CorruptEntry, LogConfig, Record
from bascule.partition.log.compaction import (
    CLEANER_CHECKPOINT,
    latest_offsets,
    read_cleaned_to,
    recover,
    survives,
)
from bascule.partition.replication.follower import Append, Follower, FollowerConfig, RestartLog, Truncate
from bascule.wire.entry import decode_entries, encode_entries, intact_prefix, scan, stored_prefix
from bascule.wire.messages import MessageEncoder
from bascule.wire.pb import api_pb2

SMALL = LogConfig(segment_max_bytes=400, index_interval_bytes=64)


def keyed(key: str | None, value: str) -> Record:
    return Record(value.encode(), key=None if key is None else key.encode())


def mixed(count: int, prefix: str = "v") -> list[Record]:
    """Entries of three keys, every fourth without a key: compaction leaves gaps between them."""
    return [keyed(None if i % 4 == 0 else f"k{i % 3}", f"{prefix}{i}") for i in range(count)]


def fill(log: CommitLog, records: list[Record], epoch: int = 1, per_append: int = 1) -> None:
    """Append ``records`` a few at a time (segments roll) and commit them all."""
    for at in range(0, len(records), per_append):
        log.append(records[at:at + per_append], epoch)
    log.high_watermark = log.newest_offset


def compact(log: CommitLog) -> None:
    job = log.begin_compaction()
    if job is not None:
        job.prepare()
        log.finish_compaction(job)()


def offsets_and_values(log: CommitLog, start: int | None = None) -> list[tuple[int, bytes | None, bytes]]:
    entries = log.read(log.oldest_offset if start is None else start, max_entries=10**6, max_bytes=1 << 30)
    return [(entry.offset, entry.key, entry.value) for entry in entries]


def temp_files(directory: Path) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.endswith((".cleaned", ".swap", ".tmp")))


# --- the rule ---------------------------------------------------------------------------------------


log_entries = st.lists(st.sampled_from([None, b"", b"a", b"b", b"c", b"d"]), max_size=60).flatmap(
    lambda keys: st.tuples(
        st.just(keys),
        st.lists(st.integers(1, 3), min_size=len(keys), max_size=len(keys)),  # the gaps before each entry
        st.integers(-1, 80),  # the HW
    )
)


@settings(max_examples=300, deadline=None)
@given(log_entries)
def test_survivors_are_the_latest_committed_entry_of_each_key_and_every_keyless_or_uncommitted_one(case):
    keys, steps, high_watermark = case
    offsets = [sum(steps[: i + 1]) for i in range(len(keys))]  # rising, with gaps (a log compacted before)
    entries = list(zip(offsets, keys))
    latest = latest_offsets(entries, high_watermark)
    kept = [offset for offset, key in entries if survives(offset, key, latest, high_watermark)]

    committed = [(offset, key) for offset, key in entries if offset <= high_watermark]
    last_of_key = {key: offset for offset, key in committed if key is not None}
    expected = [
        offset for offset, key in entries
        if key is None or offset >= high_watermark or last_of_key[key] == offset
    ]
    assert kept == expected
    assert all(a < b for a, b in zip(kept, kept[1:]))
    # compacting again changes nothing, and every key keeps its latest committed value
    kept_entries = [(offset, key) for offset, key in entries if offset in set(kept)]
    again = latest_offsets(kept_entries, high_watermark)
    assert again == latest
    assert [o for o, k in kept_entries if survives(o, k, again, high_watermark)] == kept


def test_the_rule_on_a_small_log():
    entries = [(0, b"a"), (1, b"b"), (2, None), (3, b"a"), (4, b""), (5, b""), (6, b"b"), (7, b"a")]
    latest = latest_offsets(entries, high_watermark=6)
    assert latest == {b"a": 3, b"b": 6, b"": 5}
    assert [o for o, k in entries if survives(o, k, latest, 6)] == [2, 3, 5, 6, 7]


# --- compacting a log -------------------------------------------------------------------------------


def test_compaction_keeps_the_latest_entry_of_each_key_at_its_offset(tmp_path):
    records = mixed(30) + [keyed(None, "plain")]
    with CommitLog.open(tmp_path, SMALL) as log:
        fill(log, records)
        assert log.read(0, 1)[0].value == b"v0"
        before = offsets_and_values(log)
        compact(log)
        after = offsets_and_values(log)
        assert temp_files(tmp_path) == []
    # the active segment is never compacted: what it holds stays; below it, the latest per key
    with CommitLog.open(tmp_path, SMALL) as log:
        assert offsets_and_values(log) == after
        active_base = max(int(p.stem) for p in tmp_path.glob("*.log"))
    latest = {key: offset for offset, key, _ in before}
    assert after == [e for e in before if e[0] >= active_base or e[1] is None or latest[e[1]] == e[0]]
    assert len(after) < len(before)
    assert after[-1] == (30, None, b"plain")
    assert read_cleaned_to(tmp_path) > 0


def test_entries_above_the_high_watermark_and_in_the_active_segment_stay(tmp_path):
    with CommitLog.open(tmp_path, SMALL) as log:
        fill(log, [keyed("k", f"v{i}") for i in range(20)])
        log.high_watermark = 5
        compact(log)
        offsets = [offset for offset, _, _ in offsets_and_values(log)]
        assert offsets == [5] + list(range(6, 20))  # 0..4 superseded by 5, the HW; nothing above it goes


def test_segments_that_keep_nothing_are_deleted_and_the_log_starts_later(tmp_path):
    with CommitLog.open(tmp_path, SMALL) as log:
        fill(log, [keyed("k", "x" * 60) for _ in range(20)])
        bases = sorted(int(path.stem) for path in tmp_path.glob("*.log"))
        log.epochs.assign(2, log.next_offset)  # a later epoch: the first one's start must follow the log
        compact(log)
        assert sorted(int(path.stem) for path in tmp_path.glob("*.log")) == bases[-1:]
        assert [offset for offset, _, _ in offsets_and_values(log)] == list(range(bases[-1], 20))
        assert log.oldest_offset == bases[-1] and log.epochs.entries == [(1, bases[-1]), (2, 20)]
    with CommitLog.open(tmp_path, SMALL) as log:
        assert log.oldest_offset == bases[-1]
        assert [offset for offset, _, _ in offsets_and_values(log)] == list(range(bases[-1], 20))


def test_nothing_new_to_compact_costs_nothing(tmp_path):
    with CommitLog.open(tmp_path, SMALL) as log:
        fill(log, [keyed("k", f"v{i}") for i in range(20)])
        compact(log)
        assert log.begin_compaction() is None
        fill(log, [keyed(None, "more")])  # committed, but in the active segment: nothing to compact
        assert log.begin_compaction() is None
        fill(log, [keyed("k", "more" * 30) for _ in range(10)])  # sealed segments again
        assert log.begin_compaction() is not None


def test_a_log_that_changed_meanwhile_drops_the_prepared_compaction(tmp_path):
    with CommitLog.open(tmp_path, SMALL) as log:
        fill(log, mixed(20))
        before = offsets_and_values(log)
        job = log.begin_compaction()
        job.prepare()
        assert temp_files(tmp_path)
        log.truncate(15)  # a follower cutting its log
        log.finish_compaction(job)()
        assert temp_files(tmp_path) == []
        assert offsets_and_values(log) == before[:15]


def test_the_leader_epoch_history_is_kept_as_it_was(tmp_path):
    with CommitLog.open(tmp_path, SMALL) as log:
        fill(log, mixed(10, "a"), epoch=1)
        fill(log, mixed(10, "b"), epoch=4)
        fill(log, mixed(10, "c"), epoch=6)
        history = log.epochs.entries
        compact(log)
        assert log.epochs.entries == history == [(1, 0), (4, 10), (6, 20)]
        assert log.epochs.end_offset_for(4, log.next_offset) == (4, 20)
        log.sync()
    with CommitLog.open(tmp_path, SMALL) as log:  # the checkpoint holds against the gapped entries
        assert log.epochs.entries == history


def test_the_epoch_history_rebuilt_from_a_gapped_log_starts_each_epoch_after_the_entry_before(tmp_path):
    with CommitLog.open(tmp_path, SMALL) as log:
        fill(log, [keyed("k", f"a{i}") for i in range(10)], epoch=1)
        fill(log, [keyed("k", f"b{i}") for i in range(10)], epoch=4)
        fill(log, [keyed("j", f"c{i}") for i in range(10)], epoch=6)
        compact(log)
        kept = offsets_and_values(log)
        log.sync()
    (tmp_path / "leader-epoch-checkpoint").unlink()
    with CommitLog.open(tmp_path, SMALL) as log:
        rebuilt = log.epochs.entries
        # epoch 1 has no entry left; 4's first survivor is 19 (the latest of k), and the history
        # starts at the log's start; each epoch starts no later than it really did (10, 20) and
        # after the survivor before it
        assert kept[0][0] == 19 and rebuilt[0] == (4, log.oldest_offset)
        assert dict(rebuilt)[6] <= 20 and dict(rebuilt)[6] > 19


def test_retention_and_timestamps_on_a_compacted_log(tmp_path):
    now = [1_000]
    config = LogConfig(segment_max_bytes=400, index_interval_bytes=64, retention_max_age=5)
    with CommitLog.open(tmp_path, config, clock=lambda: now[0] * 1_000_000_000) as log:
        for i in range(30):
            now[0] += 1
            log.append(mixed(i + 1)[i:], 1)
        log.high_watermark = log.newest_offset
        compact(log)
        kept = offsets_and_values(log)
        assert log.offset_for_timestamp(1_001 * 1_000_000_000) == kept[0][0]
        gap = next(offset for offset in range(kept[0][0], 30) if offset not in {k[0] for k in kept})
        assert log.offset_for_timestamp((1_001 + gap) * 1_000_000_000) > gap
        now[0] += 100
        assert log.enforce_retention() > 0
        assert offsets_and_values(log) == [k for k in kept if k[0] >= log.oldest_offset]


# --- reading across gaps ----------------------------------------------------------------------------


def test_reads_from_an_offset_compacted_away_start_at_the_next_entry(tmp_path):
    with CommitLog.open(tmp_path, SMALL) as log:
        fill(log, mixed(40))
        compact(log)
        kept = [offset for offset, _, _ in offsets_and_values(log)]
        gone = [offset for offset in range(log.oldest_offset, 40) if offset not in kept]
        assert gone
        for offset in gone:
            following = [k for k in kept if k > offset]
            assert [e.offset for e in log.read(offset, 1000)] == following
            assert decode_entries(log.read_raw(offset, 1 << 20))[0].offset == following[0]
        # a range that holds nothing but gaps is read as done: the reader moves past it
        first_gap = gone[0]
        span = next(k for k in kept if k > first_gap) - first_gap
        made, reach = log.read_through(first_gap, 1 << 20, max_entries=span)
        assert (made, reach) == (b"", span)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 400), st.integers(1, 50))
def test_reading_in_small_pieces_sees_each_survivor_once_in_order(max_bytes, max_entries):
    with tempfile.TemporaryDirectory() as directory, CommitLog.open(Path(directory), SMALL) as log:
        fill(log, [keyed(f"k{i % 5}" if i % 7 else None, f"v{i}") for i in range(60)])
        compact(log)
        expected = [offset for offset, _, _ in offsets_and_values(log)]
        seen, offset = [], log.oldest_offset
        while offset <= log.newest_offset:
            made, reach = log.read_through(offset, max_bytes, max_entries)
            assert reach > 0
            seen += [entry.offset for entry in decode_entries(made)]
            offset += reach
        assert seen == expected


def test_subscribes_walk_encodes_the_survivors_with_their_own_offsets(tmp_path):
    with CommitLog.open(tmp_path, SMALL) as log:
        fill(log, mixed(30))
        compact(log)
        kept = offsets_and_values(log)
        framed, reach = log.read_through(log.oldest_offset, 1 << 20, walk=MessageEncoder("s", 0).walk)
        assert reach == log.next_offset - log.oldest_offset
        messages, position = [], 0
        while position < len(framed):
            length = int.from_bytes(framed[position + 1:position + 5], "big")
            messages.append(api_pb2.Message.FromString(framed[position + 5:position + 5 + length]))
            position += 5 + length
        assert [(m.offset, m.key, m.value) for m in messages] == [(o, k or b"", v) for o, k, v in kept]


def test_the_walks_stop_at_a_stop_offset_inside_a_gap():
    data = b"".join(encode_entries(offset, 1, [Record(b"x")], 1)[0] for offset in (3, 4, 9, 12))
    assert intact_prefix(data, 3, 4) == (len(data) // 4 * 2, 4, None)  # 3, 4; then 9 is past 3 + 4
    from_nine = data[len(data) // 2:]
    assert intact_prefix(from_nine, 5, 3) == (0, 3, None)  # from 5 up to 7: nothing there, all read
    assert intact_prefix(from_nine, 5, 10) == (len(from_nine), 8, None)
    length, reach, error, framed = MessageEncoder("s", 0).walk(data, 3, 100)
    assert (length, reach, error) == (len(data), 10, None)
    assert stored_prefix(data, 0, 13)[1] == 13


def test_a_damaged_offset_does_not_pass_for_a_gap():
    entries = [encode_entries(offset, 1, [Record(b"x")], 1)[0] for offset in (0, 1, 2)]
    damaged = bytearray(entries[1])
    damaged[0] ^= 0x40  # offset 1 becomes a huge one: an entry that would end the read
    data = entries[0] + bytes(damaged) + entries[2]
    length, reach, error = intact_prefix(data, 0, 3)
    assert (length, reach) == (len(entries[0]), 1) and isinstance(error, CorruptEntry)
    length, reach, error, _ = MessageEncoder("s", 0).walk(data, 0, 3)
    assert (length, reach) == (len(entries[0]), 1) and isinstance(error, CorruptEntry)
    # an offset going back is never a gap either
    length, reach, error = intact_prefix(entries[0] + entries[2] + entries[1], 0, 10)
    assert (length, reach) == (len(entries[0]) + len(entries[2]), 3) and isinstance(error, CorruptEntry)


# --- damage is still found --------------------------------------------------------------------------


def test_a_lost_tail_of_a_segment_that_was_never_compacted_is_still_damage(tmp_path):
    with CommitLog.open(tmp_path, SMALL) as log:
        fill(log, [keyed(None, f"v{i}") for i in range(30)])
    first = sorted(tmp_path.glob("*.log"))[0]
    entries = decode_entries(first.read_bytes())
    last_size = len(encode_entries(entries[-1].offset, 1, [Record(entries[-1].value)], entries[-1].timestamp)[0])
    os.truncate(first, first.stat().st_size - last_size)  # a crash lost its last entry
    (tmp_path / (first.stem + ".index")).unlink()
    with CommitLog.open(tmp_path, SMALL) as log:
        with pytest.raises(CorruptEntry):
            log.read(entries[-1].offset, 10)
        assert log.damaged_from == entries[-1].offset
        assert log.find_damage() == entries[-1].offset


def test_a_compacted_segment_that_ends_early_is_whole(tmp_path):
    with CommitLog.open(tmp_path, SMALL) as log:
        fill(log, [keyed(f"k{i % 2}", "x" * 30) for i in range(12)] + [keyed("k0", "last"), keyed("k1", "last")])
        compact(log)
    with CommitLog.open(tmp_path, SMALL) as log:
        assert log.find_damage() is None
        assert [v for _, _, v in offsets_and_values(log)][-2:] == [b"last", b"last"]


# --- crashes --------------------------------------------------------------------------------------


def crash_at(monkeypatch, step: int) -> None:
    """Let ``step`` renames happen, then fail the next one as a crash would stop the process."""
    renames = []

    def rename(source, target, real=os.rename):
        if len(renames) == step:
            raise SystemExit("crash")
        renames.append((source, target))
        real(source, target)

    monkeypatch.setattr(os, "rename", rename)


@pytest.mark.parametrize("step", range(7))
def test_a_crash_at_any_step_of_the_swap_leaves_old_or_new_never_a_mix(tmp_path, monkeypatch, step):
    """Each segment is either as it was or compacted, with its index leading to its entries; no
    entry the rule keeps is ever lost."""
    records = mixed(30)
    with CommitLog.open(tmp_path / "reference", SMALL) as reference:
        fill(reference, records)
        old = offsets_and_values(reference)
        compact(reference)
        new = offsets_and_values(reference)
    log = CommitLog.open(tmp_path / "log", SMALL)
    fill(log, records)
    log.sync()
    job = log.begin_compaction()
    job.prepare()
    crash_at(monkeypatch, step)
    with pytest.raises(SystemExit):
        log.finish_compaction(job)
    monkeypatch.undo()
    for segment in log._segments:  # the process is gone: its descriptors with it
        segment.close()
    with CommitLog.open(tmp_path / "log", SMALL) as reopened:
        assert temp_files(tmp_path / "log") == []
        after = offsets_and_values(reopened)
        assert set(new) <= set(after) <= set(old)
        first_next = sorted(int(path.stem) for path in (tmp_path / "log").glob("*.log"))[1]
        first = [entry for entry in after if entry[0] < first_next]
        assert first == [entry for entry in (old if step == 0 else new) if entry[0] < first_next]
        assert reopened.find_damage() is None
        for offset, _, _ in offsets_and_values(reopened):  # every index leads to its entry
            assert reopened.read(offset, 1)[0].offset == offset


def test_a_crash_while_preparing_leaves_the_old_segments(tmp_path, monkeypatch):
    with CommitLog.open(tmp_path, SMALL) as log:
        fill(log, mixed(30))
        before = offsets_and_values(log)
        job = log.begin_compaction()
        fsyncs = []

        def fsync(fd, real=os.fsync):
            if len(fsyncs) == 1:
                raise SystemExit("crash")
            fsyncs.append(fd)
            real(fd)

        monkeypatch.setattr(os, "fsync", fsync)
        with pytest.raises(SystemExit):
            job.prepare()
        monkeypatch.undo()
        assert temp_files(tmp_path) == []  # an error (not a crash) cleans up at once
        assert offsets_and_values(log) == before


@pytest.mark.parametrize(
    "leftovers",
    [
        {"{base}.log.3.cleaned": b"garbage", "{base}.index.3.cleaned": b"\x00" * 13},
        {"{base}.log.1.cleaned": b""},
        {"{base}.index.7.cleaned": b"\xff" * 16},
        {"{base}.log.2.cleaned": b"x" * 5000, "{base}.index": b"\x00\x00\x00\x05\x00\x00\x00\x07"},
    ],
)
def test_leftover_compaction_files_at_open_are_dropped_and_the_old_segment_is_intact(tmp_path, leftovers):
    with CommitLog.open(tmp_path, SMALL) as log:
        fill(log, mixed(30))
        before = offsets_and_values(log)
    base = sorted(tmp_path.glob("*.log"))[0].stem
    for name, data in leftovers.items():
        (tmp_path / name.format(base=base)).write_bytes(data)
    with CommitLog.open(tmp_path, SMALL) as log:
        assert temp_files(tmp_path) == []
        assert offsets_and_values(log) == before
        assert log.find_damage() is None


def test_recover_commits_a_swap_file_and_rebuilds_its_index(tmp_path):
    with CommitLog.open(tmp_path / "a", SMALL) as log:
        fill(log, mixed(30))
        compact(log)
        compacted = offsets_and_values(log)
    first = sorted((tmp_path / "a").glob("*.log"))[0]
    with CommitLog.open(tmp_path / "b", SMALL) as log:
        fill(log, mixed(30))
    (tmp_path / "b" / CLEANER_CHECKPOINT).write_bytes((tmp_path / "a" / CLEANER_CHECKPOINT).read_bytes())
    os.replace(first, tmp_path / "b" / (first.name + ".9.swap"))  # committed, not yet in place; old index beside
    recover(tmp_path / "b")
    assert not (tmp_path / "b" / (first.stem + ".index")).exists()
    second = sorted(int(path.stem) for path in (tmp_path / "b").glob("*.log"))[1]
    with CommitLog.open(tmp_path / "b", SMALL) as log:
        assert [e for e in offsets_and_values(log) if e[0] < second] == [e for e in compacted if e[0] < second]
        assert log.find_damage() is None


@pytest.mark.parametrize("text", ["", "garbage", "-5", "12\n13"])
def test_a_damaged_cleaner_checkpoint_takes_every_segment_as_compacted(tmp_path, text):
    (tmp_path / CLEANER_CHECKPOINT).write_text(text)
    assert read_cleaned_to(tmp_path) >= 0


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=300), st.sampled_from([".log.1.cleaned", ".index.2.cleaned", ".log.3.swap"]))
def test_garbage_compaction_files_never_stop_a_log_from_opening(garbage, suffix):
    with tempfile.TemporaryDirectory() as name:
        directory = Path(name)
        with CommitLog.open(directory, SMALL) as log:
            fill(log, mixed(30))
        base = sorted(directory.glob("*.log"))[0].stem
        (directory / (base + suffix)).write_bytes(garbage)
        with CommitLog.open(directory, SMALL) as log:
            assert temp_files(directory) == []
            # a garbage swap file (a disk that lost what was fsynced) is a damaged segment, found as such
            if log.find_damage() is None:
                log.read(log.oldest_offset, 1000)


# --- replication ------------------------------------------------------------------------------------


def replicate(leader: CommitLog, follower: CommitLog, follower_id: str = "F", max_bytes: int = 300) -> None:
    """A follower machine fetching from ``leader`` until caught up, as the follower loop does."""
    machine = Follower(
        follower_id, "L", 5, follower.epochs, follower.next_offset, follower.high_watermark, 0.0,
        log_start_offset=follower.oldest_offset, config=FollowerConfig(),
    )
    actions = machine.start()
    if follower.epochs.latest_epoch >= 0:
        actions = machine.on_epoch_answer(
            *leader.epochs.end_offset_for(follower.epochs.latest_epoch, leader.next_offset), 0.0
        )
    for action in actions:
        if isinstance(action, Truncate):
            follower.truncate(action.end_offset)
    for _ in range(1000):
        if follower.next_offset == leader.next_offset:
            return
        data = leader.read_raw(max(follower.next_offset, leader.oldest_offset), max_bytes)  # as serve_fetch
        walked = [(offset, epoch) for offset, epoch, *_ in scan(data)]
        for action in machine.on_replicate(5, leader.high_watermark, walked, 1.0):
            if isinstance(action, RestartLog):
                follower.restart_at(action.start_offset)
            elif isinstance(action, Append):
                follower.append_raw(data)
    raise AssertionError("the follower did not catch up")


def test_a_follower_replicating_a_compacted_leader_stores_its_gaps_as_they_are(tmp_path):
    with (
        CommitLog.open(tmp_path / "leader", SMALL) as leader,
        CommitLog.open(tmp_path / "follower", SMALL) as follower,
    ):
        fill(leader, mixed(30, "a"), epoch=1)
        fill(leader, mixed(30, "b"), epoch=3)
        compact(leader)
        replicate(leader, follower)
        assert offsets_and_values(follower) == offsets_and_values(leader)
        follower.high_watermark = leader.high_watermark
        # epochs: the follower's start where its gaps start, never later than the leader's
        assert [epoch for epoch, _ in follower.epochs.entries] == [epoch for epoch, _ in leader.epochs.entries]
        for (_, start), (_, leader_start) in zip(follower.epochs.entries[1:], leader.epochs.entries[1:]):
            assert start <= leader_start
        # the follower compacts on its own: here, nothing more to remove
        before = offsets_and_values(follower)
        compact(follower)
        assert offsets_and_values(follower) == before
    with CommitLog.open(tmp_path / "follower", SMALL) as follower:
        assert offsets_and_values(follower) == before
        assert follower.find_damage() is None


def test_a_follower_behind_a_compaction_keeps_what_it_has_and_fetches_across_the_gaps(tmp_path):
    with (
        CommitLog.open(tmp_path / "leader", SMALL) as leader,
        CommitLog.open(tmp_path / "follower", SMALL) as follower,
    ):
        fill(leader, mixed(20, "a"), epoch=1)
        replicate(leader, follower)
        fill(leader, mixed(40, "b"), epoch=2)
        compact(leader)
        replicate(leader, follower)
        assert offsets_and_values(follower, 20) == [e for e in offsets_and_values(leader) if e[0] >= 20]
        assert [o for o, _, _ in offsets_and_values(follower, 0)][:20] == list(range(20))
        assert follower.epochs.entries == [(1, 0), (2, 20)]  # epoch 2 starts where the gap does


def test_a_job_that_outlived_its_log_leaves_the_next_ones_files_alone(tmp_path):
    log = CommitLog.open(tmp_path, SMALL)
    fill(log, mixed(30))
    stale = log.begin_compaction()
    stale.prepare()
    log.close()
    with CommitLog.open(tmp_path, SMALL) as reopened:  # its files are dropped at open
        assert temp_files(tmp_path) == []
        job = reopened.begin_compaction()
        job.prepare()
        stale.prepare()  # still running in its thread when the log was opened again
        log.finish_compaction(stale)()  # its log is closed: it only removes its own files
        reopened.finish_compaction(job)()
        assert reopened.failure is None and temp_files(tmp_path) == []
        assert reopened.find_damage() is None


# --- the compacted log against a model, through random appends, compactions, truncations, reopens ---


model_records = st.builds(
    Record, value=st.binary(max_size=30), key=st.none() | st.sampled_from([b"a", b"b", b"c", b"d", b"e"]),
)


class CompactedLogMachine(RuleBasedStateMachine):
    """Each step's log must hold exactly what the model holds: compaction may remove only entries
    the rule allows (a later committed entry of their key exists, they are below the HW, not in the
    active segment), and must keep every other; reads from any offset see the model's entries."""

    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="bascule-compaction-"))
        self.log = CommitLog.open(self.directory, SMALL)
        self.model: dict[int, tuple[bytes | None, bytes]] = {}
        self.epoch = 1

    @rule(batch=st.lists(model_records, min_size=1, max_size=5), new_epoch=st.booleans())
    def append(self, batch, new_epoch):
        self.epoch += new_epoch
        first, _ = self.log.append(batch, self.epoch)
        for offset, record in enumerate(batch, start=first):
            self.model[offset] = (record.key, record.value)

    @rule(back=st.integers(0, 10))
    def commit(self, back):
        self.log.high_watermark = max(self.log.high_watermark, self.log.newest_offset - back)

    @rule()
    def compact(self):
        hw = self.log.high_watermark
        latest = latest_offsets(sorted((o, k) for o, (k, _) in self.model.items()), hw)
        active_base = self.log._segments[-1].base_offset
        compact(self.log)
        kept = {entry.offset for entry in self.log.read(self.log.oldest_offset, 10**6, 1 << 30)}
        for offset, (key, _) in self.model.items():
            must_stay = offset >= active_base or survives(offset, key, latest, hw)
            assert offset in kept or not must_stay, offset
        self.model = {offset: entry for offset, entry in self.model.items() if offset in kept}

    @rule(data=st.data())
    def truncate(self, data):
        if self.log.next_offset <= self.log.oldest_offset:
            return
        offset = data.draw(st.integers(self.log.oldest_offset, self.log.next_offset))
        self.log.truncate(offset)
        self.model = {o: e for o, e in self.model.items() if o < offset}

    @rule()
    def reopen(self):
        self.log.close()
        self.log = CommitLog.open(self.directory, SMALL)
        assert self.log.find_damage() is None
        assert self.log.epochs.latest_epoch <= self.epoch

    @invariant()
    def reads_see_the_model(self):
        oldest = self.log.oldest_offset
        assert all(offset >= oldest for offset in self.model)
        expected = sorted(self.model.items())
        entries = self.log.read(oldest, 10**6, 1 << 30)
        assert [(e.offset, (e.key, e.value)) for e in entries] == expected
        for start in range(oldest, self.log.next_offset, 3):
            assert [e.offset for e in self.log.read(start, 7)] == [o for o, _ in expected if start <= o < start + 7]

    def teardown(self):
        self.log.close()
        shutil.rmtree(self.directory, ignore_errors=True)


TestCompactedLog = CompactedLogMachine.TestCase
TestCompactedLog.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
