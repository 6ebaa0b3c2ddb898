"""Incremental fetch session rounds (bascule.partition.replication.session): what a follower's round
carries (SessionRounds), which rounds a leader takes (HeldSessions), and, over a network that loses,
repeats, delays and reorders every message, that the items a leader holds after taking a round are
exactly those parked when the follower sent it: it never counts a position the follower did not
stand at as the round left (the ISR and the lease count each held item as a fetch)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bascule.partition.replication.session import HeldSessions, SessionRounds
from bascule.wire.sessions import MAX_ITEMS, ParkedItem, SessionRound, item_size, items_budget


def item(partition: int, offset: int = 5) -> ParkedItem:
    return ParkedItem("s", partition, 1, offset, offset - 1)


def rounds(session: int = 1) -> SessionRounds:
    return SessionRounds("F", session, items_budget(1 << 20))


def send(follower: SessionRounds) -> SessionRound:
    round_ = follower.next_round(0.0)
    assert round_ is not None
    return round_


def test_the_first_round_carries_every_item_and_later_ones_only_what_changed():
    follower = rounds()
    slots = [follower.park(item(p)) for p in range(3)]
    first = follower.next_round(0.0)
    assert first is not None and first.number == 0 and first.removals == []
    assert sorted(first.upserts) == sorted(zip(slots, [item(0), item(1), item(2)]))
    follower.answered([])
    idle = follower.next_round(1.0)
    assert idle == SessionRound("F", 1, 1, 1.0, [], [])  # still sent: it renews every item
    follower.answered([])
    follower.unpark(slots[0])  # fetched on its own
    follower.unpark(slots[1])
    again = follower.park(item(1, offset=9))  # parked again, further on, in the slot it left
    follower.unpark(slots[2])
    follower.park(item(2))  # parked again where it was: nothing to say
    changed = follower.next_round(2.0)
    assert changed is not None and changed.number == 2
    assert changed.upserts == [(again, item(1, offset=9))] and changed.removals == [slots[0]]


def test_nothing_parked_and_nothing_held_sends_nothing():
    follower = rounds()
    assert follower.next_round(0.0) is None
    slot = follower.park(item(0))
    follower.next_round(0.0)
    follower.answered([])
    follower.unpark(slot)
    emptied = follower.next_round(0.0)
    assert emptied is not None and emptied.removals == [slot]
    follower.answered([])
    assert follower.next_round(0.0) is None


def test_one_round_at_a_time_and_an_answer_names_only_its_round_s_slots():
    follower = rounds()
    follower.park(item(0))
    follower.next_round(0.0)
    with pytest.raises(RuntimeError):
        follower.next_round(0.0)
    with pytest.raises(ValueError):
        follower.answered([17])
    with pytest.raises(RuntimeError):
        follower.answered([])


def test_an_ended_session_starts_again_full_under_its_new_id():
    follower = rounds(session=1)
    for p in range(3):
        follower.park(item(p))
    follower.next_round(0.0)
    follower.answered([])
    follower.next_round(0.0)
    follower.end(2)  # no answer
    full = follower.next_round(0.0)
    assert full is not None and (full.session, full.number) == (2, 0) and len(full.upserts) == 3


def test_a_session_holds_at_most_its_slots_and_a_round_s_bytes():
    follower = rounds()
    for p in range(MAX_ITEMS):
        follower.park(item(p))
    assert not follower.fits(item(MAX_ITEMS))
    with pytest.raises(ValueError):
        follower.park(item(MAX_ITEMS))
    small = SessionRounds("F", 1, max_bytes=item_size("s") * 2)
    small.park(item(0))
    small.park(item(1))
    assert not small.fits(item(2))


def full(session: int, *items: ParkedItem, follower: str = "F") -> SessionRound:
    return SessionRound(follower, session, 0, 0.0, list(enumerate(items)), [])


def test_a_leader_takes_a_session_s_rounds_in_order_and_refuses_any_other_unchanged():
    leader = HeldSessions()
    assert leader.take(full(1, item(0), item(1))) == {0: item(0), 1: item(1)}
    assert leader.take(full(1, item(5))) is None  # round 0 again: a late copy
    assert leader.take(SessionRound("F", 1, 2, 0.0, [], [0])) is None  # skips round 1
    assert leader.take(SessionRound("F", 1, 1, 0.0, [], [3])) is None  # empties a slot it does not hold
    assert leader.take(SessionRound("F", 2, 1, 0.0, [], [])) is None  # a session it does not hold
    assert leader.take(SessionRound("F", 2, 0, 0.0, [], [0])) is None  # a full round empties nothing
    assert leader.take(SessionRound("F", 1, 1, 0.0, [(1, item(1, 8))], [0])) == {1: item(1, 8)}
    assert leader.take(SessionRound("F", 1, 1, 0.0, [], [1])) is None  # round 1 again
    assert leader.take(SessionRound("F", 1, 2, 0.0, [], [])) == {1: item(1, 8)}
    assert len(leader) == 1


def test_a_leader_holds_at_most_its_bounds_of_sessions_dropping_the_least_recently_used():
    leader = HeldSessions(max_sessions=3, max_per_follower=2)
    leader.take(full(1, item(0)))
    leader.take(full(2, item(0)))
    leader.take(SessionRound("F", 1, 1, 0.0, [], []))  # 1 used after 2
    leader.take(full(3, item(0)))  # F's third: 2, its least recently used, goes
    assert leader.take(SessionRound("F", 2, 1, 0.0, [], [])) is None
    assert leader.take(SessionRound("F", 1, 2, 0.0, [], [])) is not None
    leader.take(full(1, item(0), follower="G"))
    leader.take(full(2, item(0), follower="G"))  # the fourth in all: F's 3 goes (1 was used since)
    assert len(leader) == 3
    assert leader.take(SessionRound("F", 3, 1, 0.0, [], [])) is None
    assert leader.take(SessionRound("F", 1, 3, 0.0, [], [])) is not None


def test_a_late_copy_of_a_round_of_an_ended_session_never_applies_to_the_new_one():
    """Why a session starts again under a new id: round 1 was taken but its answer lost; had the
    follower started again as round 0 of the same id, the late round 1 would follow it."""
    follower, leader = rounds(session=1), HeldSessions()
    a, b = follower.park(item(0)), follower.park(item(1))
    leader.take(send(follower))
    follower.answered([])
    follower.unpark(a)
    late = send(follower)  # empties a's slot: taken, its answer lost
    assert leader.take(late) == {b: item(1)}
    follower.end(2)
    follower.unpark(b)
    follower.park(item(0, offset=3))  # a is parked again, in the slot b left
    restart = send(follower)
    assert leader.take(restart) == {b: item(0, offset=3)}
    follower.answered([])
    assert leader.take(late) is None  # repeated: session 1 is past round 1


# ---- the protocol against a network that loses, repeats, delays and reorders --------------------

PARTITIONS = 5


@dataclass
class Model:
    """One follower node's lanes (sessions) to one leader node, with their parked partitions, and
    the messages on their way either side."""

    ids: itertools.count = field(default_factory=lambda: itertools.count(1))
    lanes: list[SessionRounds] = field(default_factory=list)
    slots: dict[int, tuple[int, int]] = field(default_factory=dict)  # partition -> (lane, slot) while parked
    offsets: dict[int, int] = field(default_factory=lambda: dict.fromkeys(range(PARTITIONS), 1))
    # Rounds sent, each with what was parked as it left: (round, snapshot).
    requests: list[tuple[SessionRound, dict[int, ParkedItem]]] = field(default_factory=list)
    answers: list[tuple[int, int, int, list[int] | None]] = field(default_factory=list)  # (lane, session, round, news)
    in_flight: dict[int, SessionRound] = field(default_factory=dict)  # lane -> its round on its way
    taken: int = 0

    def new_lane(self) -> None:
        self.lanes.append(SessionRounds("F", next(self.ids), items_budget(1 << 20)))


# The next step: weighted towards the ones the others wait for.
STEPS = st.sampled_from(
    ["park"] * 4 + ["unpark"] * 3 + ["send"] * 4 + ["deliver"] * 4 + ["answer"] * 4 + ["repeat"] * 3
    + ["drop_request", "drop_answer", "time_out", "leader_restarts"]
)


@settings(max_examples=300, deadline=None)
@given(st.data(), st.integers(1, 3), st.integers(2, 6))
def test_a_leader_holds_exactly_what_was_parked_as_the_round_it_took_was_sent(data, per_follower, max_sessions):
    model = Model()
    model.new_lane()
    model.new_lane()
    leader = HeldSessions(max_sessions=max_sessions, max_per_follower=per_follower)
    for _ in range(data.draw(st.integers(1, 150))):
        step = data.draw(STEPS)
        if step == "park":
            partition = data.draw(st.integers(0, PARTITIONS - 1))
            if partition not in model.slots:
                model.offsets[partition] += data.draw(st.integers(0, 2))  # it may have fetched meanwhile
                lane = data.draw(st.integers(0, len(model.lanes) - 1))
                slot = model.lanes[lane].park(item(partition, model.offsets[partition]))
                model.slots[partition] = (lane, slot)
        elif step == "unpark" and model.slots:
            partition = data.draw(st.sampled_from(sorted(model.slots)))
            lane, slot = model.slots.pop(partition)
            model.lanes[lane].unpark(slot)
        elif step == "send":
            lane = data.draw(st.integers(0, len(model.lanes) - 1))
            if lane not in model.in_flight:
                round_ = model.lanes[lane].next_round(float(len(model.requests)))
                if round_ is not None:
                    model.in_flight[lane] = round_
                    model.requests.append((round_, dict(model.lanes[lane].parked)))
        elif step in ("deliver", "repeat") and model.requests:
            index = data.draw(st.integers(0, len(model.requests) - 1))
            round_, snapshot = model.requests[index] if step == "repeat" else model.requests.pop(index)
            held = leader.take(round_)
            if held is not None:
                model.taken += 1
                assert dict(held) == snapshot, "the leader holds what was not parked as this round left"
                news = sorted(data.draw(st.sets(st.sampled_from(sorted(held)))) if held else [])
            else:
                news = None
            lane = next((i for i, lane in enumerate(model.lanes) if lane.session == round_.session), -1)
            model.answers.append((lane, round_.session, round_.number, news))
        elif step == "drop_request" and model.requests:
            model.requests.pop(data.draw(st.integers(0, len(model.requests) - 1)))
        elif step == "answer" and model.answers:
            lane, session, number, news = model.answers.pop(data.draw(st.integers(0, len(model.answers) - 1)))
            sent = model.in_flight.get(lane)
            # A request's answer reaches its own inbox: the one on its way, nothing else.
            if sent is not None and (sent.session, sent.number) == (session, number):
                del model.in_flight[lane]
                if news is None:
                    model.lanes[lane].end(next(model.ids))
                else:
                    model.lanes[lane].answered(news)
        elif step == "drop_answer" and model.answers:
            model.answers.pop(data.draw(st.integers(0, len(model.answers) - 1)))
        elif step == "time_out" and model.in_flight:
            lane = data.draw(st.sampled_from(sorted(model.in_flight)))
            del model.in_flight[lane]
            model.lanes[lane].end(next(model.ids))
        elif step == "leader_restarts":
            leader = HeldSessions(max_sessions=max_sessions, max_per_follower=per_follower)
