"""The cleaner's schedule: each partition cleaned at its stream's interval, counted from when it
was first seen and then from each clean."""

from hypothesis import given
from hypothesis import strategies as st

from bascule.node.maintenance import CleanerSchedule

A, B = ("a", 0), ("b", 0)


def due(schedule, intervals, now):
    return schedule.due(intervals.keys(), intervals.__getitem__, now)


def test_each_partition_is_due_an_interval_after_it_was_first_seen_then_after_each_clean():
    schedule = CleanerSchedule()
    assert due(schedule, {A: 1.0, B: 5.0}, 0.0) == []
    assert due(schedule, {A: 1.0, B: 5.0}, 0.9) == []
    assert due(schedule, {A: 1.0, B: 5.0}, 1.0) == [A]
    assert due(schedule, {A: 1.0, B: 5.0}, 1.5) == []
    assert due(schedule, {A: 1.0, B: 5.0}, 5.0) == [A, B]


def test_a_partition_gone_and_back_starts_again():
    schedule = CleanerSchedule()
    due(schedule, {A: 1.0}, 0.0)
    assert due(schedule, {}, 0.5) == []
    assert due(schedule, {A: 1.0}, 1.2) == []  # seen again at 1.2: due at 2.2
    assert due(schedule, {A: 1.0}, 2.2) == [A]


def test_an_interval_of_zero_is_due_once_a_tick():
    schedule = CleanerSchedule()
    assert due(schedule, {A: 0.0}, 0.0) == [A]
    assert due(schedule, {A: 0.0}, 0.0) == [A]


def test_a_tick_asks_only_for_the_intervals_of_partitions_new_or_due():
    """What a tick costs does not grow with the partitions that are neither (issue 32: 10,000 a node)."""
    schedule, asked = CleanerSchedule(), []
    partitions = {("s", p): 60.0 for p in range(10_000)}

    def interval(key):
        asked.append(key)
        return partitions[key]

    schedule.due(partitions.keys(), interval, 0.0)
    asked.clear()
    for now in range(1, 60):
        assert schedule.due(partitions.keys(), interval, float(now)) == []
    assert asked == []
    partitions[("t", 0)] = 1.0
    assert schedule.due(partitions.keys(), interval, 60.0) == list(partitions)[:-1]
    assert len(asked) == 10_001  # the new one, and each due one rescheduled


def test_gone_and_back_partitions_leave_no_heap_behind():
    schedule = CleanerSchedule()
    for now in range(1_000):
        due(schedule, {A: 1e6} if now % 2 else {}, float(now))
    assert len(schedule._heap) <= 2 * len(schedule._next) + 64


@given(st.lists(st.tuples(st.sampled_from([A, B]), st.floats(0.001, 100)), max_size=5),
       st.lists(st.floats(0, 10), max_size=30))
def test_never_cleaned_more_often_than_its_interval(partitions, steps):
    intervals = dict(partitions)
    schedule, now, last = CleanerSchedule(), 0.0, {}
    due(schedule, intervals, now)
    for step in steps:
        now += step
        for key in due(schedule, intervals, now):
            assert key not in last or now - last[key] >= intervals[key] - 1e-9  # float sums
            last[key] = now
