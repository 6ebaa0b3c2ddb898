"""The cleaner's schedule: each partition cleaned at its stream's interval, counted from when it
was first seen and then from each clean."""

from hypothesis import given
from hypothesis import strategies as st

from bascule.node.maintenance import CleanerSchedule

A, B = ("a", 0), ("b", 0)


def test_each_partition_is_due_an_interval_after_it_was_first_seen_then_after_each_clean():
    schedule = CleanerSchedule()
    assert schedule.due({A: 1.0, B: 5.0}, 0.0) == []
    assert schedule.due({A: 1.0, B: 5.0}, 0.9) == []
    assert schedule.due({A: 1.0, B: 5.0}, 1.0) == [A]
    assert schedule.due({A: 1.0, B: 5.0}, 1.5) == []
    assert schedule.due({A: 1.0, B: 5.0}, 5.0) == [A, B]


def test_a_partition_gone_and_back_starts_again():
    schedule = CleanerSchedule()
    schedule.due({A: 1.0}, 0.0)
    assert schedule.due({}, 0.5) == []
    assert schedule.due({A: 1.0}, 1.2) == []  # seen again at 1.2: due at 2.2
    assert schedule.due({A: 1.0}, 2.2) == [A]


@given(st.lists(st.tuples(st.sampled_from([A, B]), st.floats(0.001, 100)), max_size=5),
       st.lists(st.floats(0, 10), max_size=30))
def test_never_cleaned_more_often_than_its_interval(partitions, steps):
    intervals = dict(partitions)
    schedule, now, last = CleanerSchedule(), 0.0, {}
    schedule.due(intervals, now)
    for step in steps:
        now += step
        for key in schedule.due(intervals, now):
            assert key not in last or now - last[key] >= intervals[key] - 1e-9  # float sums
            last[key] = now
