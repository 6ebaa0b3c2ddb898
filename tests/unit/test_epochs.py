import pytest
from hypothesis import given
from hypothesis import strategies as st

from bascule.partition.log.epochs import EpochHistory


def test_empty_history():
    history = EpochHistory()
    assert history.entries == []
    assert history.latest_epoch == -1
    assert history.epoch_at(0) == -1
    assert history.end_offset_for(3, 10) == (-1, -1)


def test_constructor_rejects_out_of_order_entries():
    with pytest.raises(ValueError):
        EpochHistory([(2, 0), (1, 5)])
    with pytest.raises(ValueError):
        EpochHistory([(1, 5), (2, 4)])
    with pytest.raises(ValueError):
        EpochHistory([(-1, 0)])


def test_entries_is_a_copy():
    history = EpochHistory([(1, 0)])
    history.entries.append((9, 9))
    assert history.entries == [(1, 0)]


def test_assign_appends_new_epochs_only():
    history = EpochHistory()
    assert history.assign(1, 0)
    assert history.assign(3, 10)
    assert not history.assign(3, 12)
    assert not history.assign(2, 12)
    assert history.entries == [(1, 0), (3, 10)]
    assert history.latest_epoch == 3


def test_assign_with_equal_start_keeps_the_empty_epoch():
    history = EpochHistory([(1, 0), (2, 5)])
    assert history.assign(3, 5)
    assert history.entries == [(1, 0), (2, 5), (3, 5)]


def test_assign_below_latest_start_drops_entries_at_or_after_it():
    history = EpochHistory([(1, 0), (2, 5), (3, 9)])
    assert history.assign(4, 5)
    assert history.entries == [(1, 0), (4, 5)]


def test_epoch_at():
    history = EpochHistory([(1, 3), (2, 5), (4, 5), (6, 9)])
    assert history.epoch_at(2) == -1
    assert history.epoch_at(3) == 1
    assert history.epoch_at(4) == 1
    assert history.epoch_at(5) == 4  # epoch 2 holds no entries
    assert history.epoch_at(8) == 4
    assert history.epoch_at(9) == 6
    assert history.epoch_at(1000) == 6


def test_end_offset_for_follows_kafka_rule():
    history = EpochHistory([(1, 0), (3, 10), (5, 20)])
    assert history.end_offset_for(0, 30) == (-1, -1)
    assert history.end_offset_for(1, 30) == (1, 10)
    assert history.end_offset_for(2, 30) == (1, 10)  # largest epoch <= 2 is 1
    assert history.end_offset_for(3, 30) == (3, 20)
    assert history.end_offset_for(4, 30) == (3, 20)
    assert history.end_offset_for(5, 30) == (5, 30)
    assert history.end_offset_for(9, 30) == (5, 30)


def test_truncate_from_end():
    history = EpochHistory([(1, 0), (3, 10), (5, 20)])
    history.truncate_from_end(20)
    assert history.entries == [(1, 0), (3, 10)]
    history.truncate_from_end(11)
    assert history.entries == [(1, 0), (3, 10)]
    history.truncate_from_end(0)
    assert history.entries == []


def test_truncate_from_start():
    history = EpochHistory([(1, 0), (3, 10), (5, 20)])
    history.truncate_from_start(5)
    assert history.entries == [(1, 5), (3, 10), (5, 20)]
    history.truncate_from_start(10)
    assert history.entries == [(3, 10), (5, 20)]
    history.truncate_from_start(25)
    assert history.entries == [(5, 25)]


def test_truncate_from_start_skips_empty_epochs():
    history = EpochHistory([(1, 0), (2, 4), (3, 4), (4, 8)])
    history.truncate_from_start(4)
    assert history.entries == [(3, 4), (4, 8)]


def test_equality_and_len():
    assert EpochHistory([(1, 0)]) == EpochHistory([(1, 0)])
    assert EpochHistory([(1, 0)]) != EpochHistory([(1, 1)])
    assert len(EpochHistory([(1, 0), (2, 3)])) == 2


# --- properties against a naive model -------------------------------------------------------

operations = st.lists(
    st.one_of(
        st.tuples(st.just("assign"), st.integers(0, 20), st.integers(0, 50)),
        st.tuples(st.just("truncate_from_end"), st.integers(0, 60)),
        st.tuples(st.just("truncate_from_start"), st.integers(0, 60)),
    ),
    max_size=30,
)


def apply(history: EpochHistory, operation: tuple) -> None:
    name, *args = operation
    getattr(history, name)(*args)


def assert_well_formed(entries: list[tuple[int, int]]) -> None:
    for (epoch_a, start_a), (epoch_b, start_b) in zip(entries, entries[1:]):
        assert epoch_a < epoch_b
        assert start_a <= start_b


def naive_epoch_at(entries: list[tuple[int, int]], offset: int) -> int:
    candidates = [epoch for epoch, start in entries if start <= offset]
    return candidates[-1] if candidates else -1


def naive_end_offset_for(entries: list[tuple[int, int]], epoch: int, leo: int) -> tuple[int, int]:
    at_or_below = [entry for entry in entries if entry[0] <= epoch]
    if not at_or_below:
        return -1, -1
    found_epoch = at_or_below[-1][0]
    later_starts = [start for e, start in entries if e > epoch]
    return found_epoch, (later_starts[0] if later_starts else leo)


@given(operations)
def test_operations_keep_history_well_formed(ops):
    history = EpochHistory()
    for operation in ops:
        apply(history, operation)
        assert_well_formed(history.entries)
    assert EpochHistory(history.entries) == history


@given(operations, st.integers(0, 60), st.integers(0, 25), st.integers(0, 80))
def test_lookups_match_naive_model(ops, offset, epoch, leo):
    history = EpochHistory()
    for operation in ops:
        apply(history, operation)
    entries = history.entries
    assert history.epoch_at(offset) == naive_epoch_at(entries, offset)
    assert history.end_offset_for(epoch, leo) == naive_end_offset_for(entries, epoch, leo)


@given(operations, st.integers(0, 20), st.integers(0, 50))
def test_assign_of_new_epoch_makes_it_latest(ops, epoch, start):
    history = EpochHistory()
    for operation in ops:
        apply(history, operation)
    before = history.entries
    assigned = history.assign(epoch, start)
    if assigned:
        assert history.latest_epoch == epoch
        assert history.entries[-1] == (epoch, start)
        assert all(s <= start for _, s in history.entries)
    else:
        assert history.entries == before


@given(operations, st.integers(0, 60))
def test_truncate_from_end_keeps_only_earlier_starts(ops, end):
    history = EpochHistory()
    for operation in ops:
        apply(history, operation)
    before = history.entries
    history.truncate_from_end(end)
    assert history.entries == [entry for entry in before if entry[1] < end]


@given(operations, st.integers(0, 60))
def test_truncate_from_start_preserves_epochs_of_retained_offsets(ops, start):
    history = EpochHistory()
    for operation in ops:
        apply(history, operation)
    before = EpochHistory(history.entries)
    history.truncate_from_start(start)
    if len(before):
        assert history.entries[0][1] >= start
        for offset in range(start, start + 20):
            assert history.epoch_at(offset) == before.epoch_at(offset)
