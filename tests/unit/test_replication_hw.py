from hypothesis import given
from hypothesis import strategies as st

from bascule.partition.replication.hw import (
    NO_HW,
    clamp_high_watermark,
    follower_high_watermark,
    leader_high_watermark,
)


def test_hw_is_the_last_offset_every_isr_member_holds():
    # LEOs are next offsets: a leader with 5 entries and a follower with 3 → offsets 0..2 committed
    assert leader_high_watermark(NO_HW, [5, 3], min_isr=1) == 2
    assert leader_high_watermark(NO_HW, [5], min_isr=1) == 4
    assert leader_high_watermark(NO_HW, [0], min_isr=1) == NO_HW


def test_hw_waits_for_min_isr():
    assert leader_high_watermark(1, [5], min_isr=2) == 1
    assert leader_high_watermark(1, [5, 4], min_isr=2) == 3


def test_hw_waits_for_unknown_isr_members():
    assert leader_high_watermark(1, [5, None], min_isr=1) == 1


def test_hw_never_moves_backwards():
    assert leader_high_watermark(4, [5, 2], min_isr=1) == 4


def test_follower_hw_is_capped_by_its_own_log_and_monotonic():
    assert follower_high_watermark(NO_HW, leader_hw=9, log_end_offset=4) == 3
    assert follower_high_watermark(NO_HW, leader_hw=2, log_end_offset=4) == 2
    assert follower_high_watermark(3, leader_hw=1, log_end_offset=4) == 3  # a new leader lags


def test_clamp_after_truncation():
    assert clamp_high_watermark(7, log_end_offset=3) == 2
    assert clamp_high_watermark(1, log_end_offset=3) == 1
    assert clamp_high_watermark(1, log_end_offset=0) == NO_HW


@given(
    current=st.integers(-1, 50),
    log_ends=st.lists(st.one_of(st.none(), st.integers(0, 60)), max_size=5),
    min_isr=st.integers(1, 4),
)
def test_leader_hw_properties(current, log_ends, min_isr):
    hw = leader_high_watermark(current, log_ends, min_isr)
    assert hw >= current  # never backwards
    if len(log_ends) < min_isr or None in log_ends or not log_ends:
        assert hw == current
    elif hw > current:
        assert all(hw <= log_end - 1 for log_end in log_ends)  # never beyond an ISR member


@given(current=st.integers(-1, 50), leader_hw=st.integers(-1, 80), log_end=st.integers(0, 60))
def test_follower_hw_properties(current, leader_hw, log_end):
    hw = follower_high_watermark(current, leader_hw, log_end)
    assert hw >= current
    assert hw == current or hw <= min(leader_hw, log_end - 1)
