"""Controlled shutdown's choices: which partitions move, and to whom."""

from bascule.metadata.state import MetadataState, Partition, Stream
from bascule.node.handoff import partitions_to_hand_off, successor


def state_with(*partitions: Partition) -> MetadataState:
    streams = {}
    for p in partitions:
        stream = streams.get(p.stream) or Stream(p.stream, p.stream, "", 1, {}, {})
        streams[p.stream] = Stream(stream.name, stream.subject, "", 1, {}, {**stream.partitions, p.id: p})
    return MetadataState(streams=streams)


def test_only_partitions_led_here_with_another_isr_member_move():
    led = Partition("s", 0, ("a", "b", "c"), "a", ("a", "b"))
    alone = Partition("s", 1, ("a", "b", "c"), "a", ("a",))
    elsewhere = Partition("t", 0, ("a", "b"), "b", ("a", "b"))
    assert partitions_to_hand_off(state_with(led, alone, elsewhere), "a") == [led]


def test_the_successor_is_the_best_placed_isr_member_that_reported():
    partition = Partition("s", 0, ("a", "b", "c", "d"), "a", ("a", "b", "c"))
    reports = {
        "b": {"s/0": (10, 9, 3)},  # (log end, HW, last epoch)
        "c": {"s/0": (12, 9, 3)},  # furthest: wins
        "d": {"s/0": (20, 9, 3)},  # not in the ISR
    }
    assert successor(partition, "a", reports) == "c"
    assert successor(partition, "a", {"d": reports["d"]}) is None
    assert successor(partition, "a", {"a": {"s/0": (30, 9, 3)}}) is None  # never itself


def test_a_stopping_follower_leaves_the_isrs_it_is_in():
    from bascule.node.handoff import partitions_to_leave

    followed = Partition("s", 0, ("a", "b", "c"), "b", ("a", "b", "c"))
    lagging = Partition("s", 1, ("a", "b", "c"), "b", ("b", "c"))
    led = Partition("t", 0, ("a", "b"), "a", ("a", "b"))
    assert partitions_to_leave(state_with(followed, lagging, led), "a") == [followed]
