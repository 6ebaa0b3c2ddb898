"""The commit log against a plain list, through random appends, truncations, reopens and crashes."""

import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from bascule.partition.log import CommitLog, LogConfig, Record
from bascule.wire.entry import decode_entries, encode_entries, scan

CONFIG = LogConfig(segment_max_bytes=400, index_interval_bytes=64, retention_max_messages=30)

records = st.builds(
    Record,
    value=st.binary(max_size=40),
    key=st.none() | st.binary(max_size=5),
    headers=st.dictionaries(
        st.sampled_from(["subject", "reply", "x"]), st.binary(max_size=4), max_size=2
    ),
)
batches = st.lists(records, min_size=1, max_size=6)


class CommitLogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="bascule-log-"))
        self.now = 1_000
        self.log = CommitLog.open(self.directory, CONFIG, clock=self.clock)
        # (key, value, headers, epoch) by offset; offsets below self.oldest are gone
        self.model: list[tuple[bytes | None, bytes, dict, int]] = []
        self.oldest = 0
        self.epoch = 1
        self.epoch_checkpoints: list[str] = []  # every one a sync wrote; a crash may leave any

    def clock(self) -> int:
        self.now += 7
        return self.now

    def remember(self, batch: list[Record]) -> None:
        self.model += [(r.key, r.value, r.headers, self.epoch) for r in batch]

    @rule(batch=batches, new_epoch=st.booleans())
    def append(self, batch, new_epoch):
        self.epoch += new_epoch
        first, last = self.log.append(batch, self.epoch)
        assert (first, last) == (len(self.model), len(self.model) + len(batch) - 1)
        self.remember(batch)

    @rule(batch=batches, new_epoch=st.booleans())
    def append_raw(self, batch, new_epoch):
        self.epoch += new_epoch
        data = encode_entries(len(self.model), self.epoch, batch, self.clock())[0]
        assert self.log.append_raw(data) == len(self.model) + len(batch)
        self.remember(batch)

    @rule(data=st.data())
    def truncate(self, data):
        offset = data.draw(st.integers(max(self.oldest - 3, 0), len(self.model)))
        self.log.truncate(offset)
        del self.model[offset:]
        self.oldest = min(self.oldest, offset)

    @rule()
    def commit_and_apply_retention(self):
        self.log.high_watermark = self.log.newest_offset
        self.log.enforce_retention()
        assert self.log.oldest_offset >= self.oldest
        assert self.log.next_offset - self.log.oldest_offset <= max(
            30, self.active_segment_entries()
        )
        self.oldest = self.log.oldest_offset

    def active_segment_entries(self) -> int:
        return len(self.model) - int(max(self.directory.glob("*.log")).stem)

    @rule()
    def sync(self):
        self.log.sync()
        checkpoint = self.directory / "leader-epoch-checkpoint"
        if checkpoint.exists():
            self.epoch_checkpoints.append(checkpoint.read_text())

    @rule(data=st.data())
    def crash_with_a_stale_epoch_checkpoint(self, data):
        """The checkpoint is rewritten after the data it describes, so a power cut can leave an
        older one, written before later appends, truncations or retention."""
        self.log.close()
        checkpoint = self.directory / "leader-epoch-checkpoint"
        stale = data.draw(st.sampled_from([None, *self.epoch_checkpoints]))
        if stale is None:
            checkpoint.unlink(missing_ok=True)
        else:
            checkpoint.write_text(stale)
        self.log = CommitLog.open(self.directory, CONFIG, clock=self.clock)

    @rule()
    def reopen(self):
        self.log.close()
        self.log = CommitLog.open(self.directory, CONFIG, clock=self.clock)

    @rule(data=st.data())
    def crash_with_a_torn_tail(self, data):
        self.log.close()
        active = max(self.directory.glob("*.log"))
        contents = active.read_bytes()
        cut = data.draw(st.integers(0, len(contents)))
        whole_entries = sum(1 for *_, end in scan(contents) if end <= cut)
        os.truncate(active, cut)
        self.log = CommitLog.open(self.directory, CONFIG, clock=self.clock)
        del self.model[int(active.stem) + whole_entries :]

    @rule(data=st.data())
    def read(self, data):
        offset = data.draw(st.integers(self.oldest, len(self.model)))
        max_entries = data.draw(st.integers(1, 20))
        max_bytes = data.draw(st.integers(1, 2_000))
        entries = self.log.read(offset, max_entries=max_entries, max_bytes=max_bytes)
        self.check_entries(offset, entries)
        assert len(entries) <= max_entries
        if offset < len(self.model):
            assert entries

    @rule(data=st.data())
    def read_raw(self, data):
        offset = data.draw(st.integers(self.oldest, len(self.model)))
        max_bytes = data.draw(st.integers(1, 2_000))
        max_entries = data.draw(st.integers(1, 30))
        raw = self.log.read_raw(offset, max_bytes, max_entries=max_entries)
        entries = decode_entries(raw)
        self.check_entries(offset, entries)
        assert len(entries) == 1 or len(raw) <= max_bytes
        assert len(entries) <= max_entries
        if offset < len(self.model):
            assert entries
        # What replication reads (without checking CRCs) is the same.
        assert self.log.read_raw(offset, max_bytes, check_crc=False, max_entries=max_entries) == raw

    def check_entries(self, offset, entries):
        for expected_offset, entry in enumerate(entries, start=offset):
            assert entry.offset == expected_offset
            assert (entry.key, entry.value, entry.headers, entry.leader_epoch) == self.model[
                expected_offset
            ]

    @invariant()
    def offsets_match_the_model(self):
        assert (self.log.oldest_offset, self.log.next_offset) == (self.oldest, len(self.model))

    @invariant()
    def epochs_match_the_entries(self):
        epochs = self.log.epochs
        for offset in range(self.oldest, len(self.model)):
            assert epochs.epoch_at(offset) == self.model[offset][-1]
        if self.oldest < len(self.model):
            assert epochs.entries[0][1] >= self.oldest

    @invariant()
    def timestamps_never_go_backwards(self):
        entries = self.log.read(self.oldest, max_entries=1_000, max_bytes=1 << 20)
        timestamps = [entry.timestamp for entry in entries]
        assert timestamps == sorted(timestamps)

    def teardown(self):
        self.log.close()
        shutil.rmtree(self.directory)


TestCommitLog = CommitLogMachine.TestCase
TestCommitLog.settings = settings(max_examples=150, stateful_step_count=25, deadline=None)
