"""The seal on node-to-node NATS messages: only the cluster's key opens it, once, whatever the clocks say."""

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bascule.wire.seal import (
    FIRST_SIGHTING_S,
    MAX_INCARNATIONS,
    SEAL_SIZE,
    TAG_SIZE,
    WINDOW,
    Rejection,
    Sealer,
    _mac,
    derive_key,
)

KEY = derive_key("s3cret")
NOW = 1_790_000_000
HOUR = 3600


def sealed_as(incarnation: bytes, sequence: int, sent_s: int, subject: str = "x", payload: bytes = b"p") -> bytes:
    """What a sender with the key would send: any stamp it likes, properly tagged."""
    stamp = struct.pack(">8sII", incarnation, sequence, sent_s)
    mac = _mac(KEY, subject)
    mac.update(stamp + payload)
    return mac.digest() + stamp + payload


def test_a_sealed_message_opens_once_with_the_same_key():
    sender, receiver = Sealer(KEY), Sealer(KEY)
    sealed = sender.seal("ns.s.0.replicate", b"payload", NOW)
    assert len(sealed) == SEAL_SIZE + len(b"payload") and SEAL_SIZE == 32
    assert receiver.open("ns.s.0.replicate", sealed, NOW) == b"payload"
    assert receiver.open("ns.s.0.replicate", sealed, NOW + 1) is Rejection.REPLAYED
    assert receiver.rejected[Rejection.REPLAYED] == 1


def test_the_same_payload_sealed_twice_opens_twice():
    """Identical requests (a caught-up follower asking again) are not replays of each other."""
    sender, receiver = Sealer(KEY), Sealer(KEY)
    first, second = sender.seal("x", b"same", NOW), sender.seal("x", b"same", NOW)
    assert first != second
    assert receiver.open("x", first, NOW) == receiver.open("x", second, NOW) == b"same"


@pytest.mark.parametrize(
    "tamper",
    [
        lambda sealed: ("other.subject", sealed),  # replayed onto another partition or node
        lambda sealed: ("x", sealed[:-1] + bytes([sealed[-1] ^ 1])),  # payload changed
        lambda sealed: ("x", sealed[:20] + bytes([sealed[20] ^ 1]) + sealed[21:]),  # incarnation changed
        lambda sealed: ("x", sealed[:27] + bytes([sealed[27] ^ 1]) + sealed[28:]),  # sequence changed
        lambda sealed: ("x", sealed[:31] + bytes([sealed[31] ^ 1]) + sealed[32:]),  # time changed
        lambda sealed: ("x", bytes([sealed[0] ^ 1]) + sealed[1:]),  # tag changed
        lambda sealed: ("x", sealed + b"more"),  # payload extended
    ],
)
def test_any_change_breaks_the_seal(tamper):
    sealed = Sealer(KEY).seal("x", b"payload", NOW)
    receiver = Sealer(KEY)
    assert receiver.open(*tamper(sealed), NOW) is Rejection.BAD_TAG
    assert not receiver._windows  # nothing unauthenticated reaches the tables


def test_another_key_does_not_open_it():
    receiver = Sealer(KEY)
    assert receiver.open("x", Sealer(derive_key("guess")).seal("x", b"p", NOW), NOW) is Rejection.BAD_TAG
    assert receiver.rejected[Rejection.BAD_TAG] == 1


@pytest.mark.parametrize("step", [-12 * HOUR, -5 * 60, -11, 11, 5 * 60, 12 * HOUR, 10 * 24 * HOUR])
def test_clock_steps_on_either_side_change_nothing_between_running_processes(step):
    """Once a receiver knows a sender's incarnation, no wall clock is compared: either clock may
    step, by seconds or days, forward or back."""
    sender, receiver = Sealer(KEY), Sealer(KEY)
    assert receiver.open("x", sender.seal("x", b"before", NOW), NOW) == b"before"
    assert receiver.open("x", sender.seal("x", b"sender stepped", NOW + step), NOW) == b"sender stepped"
    assert receiver.open("x", sender.seal("x", b"receiver stepped", NOW), NOW + step) == b"receiver stepped"
    assert receiver.open("y", sender.seal("y", b"both", NOW + step), NOW - step) == b"both"


@pytest.mark.parametrize("disagreement", [-FIRST_SIGHTING_S, -11, 0, 11, 5 * 60, 14 * HOUR, FIRST_SIGHTING_S])
def test_a_new_incarnation_is_heard_when_the_clocks_agree_within_a_day(disagreement):
    assert Sealer(KEY).open("x", Sealer(KEY).seal("x", b"p", NOW + disagreement), NOW) == b"p"


@pytest.mark.parametrize("disagreement", [-FIRST_SIGHTING_S - 1, FIRST_SIGHTING_S + 1, -NOW])
def test_a_new_incarnation_far_from_the_receivers_clock_is_untimely_and_not_remembered(disagreement):
    sender, receiver = Sealer(KEY), Sealer(KEY)
    untimely = sender.seal("x", b"p", NOW + disagreement)
    assert receiver.open("x", untimely, NOW) is Rejection.UNTIMELY
    assert not receiver._windows
    # Once the sender's clock is put right, its next message is a first sighting like any other.
    assert receiver.open("x", sender.seal("x", b"q", NOW), NOW) == b"q"


def test_clock_readings_outside_the_stamp_are_clamped():
    sender, receiver = Sealer(KEY), Sealer(KEY)
    assert receiver.open("x", sender.seal("x", b"p", -5), 0) == b"p"
    assert receiver.open("x", Sealer(KEY).seal("x", b"p", 1 << 40), 0xFFFF_FFFF) == b"p"


def test_out_of_order_delivery_within_the_window_is_accepted_once():
    sender, receiver = Sealer(KEY), Sealer(KEY)
    sealed = [sender.seal("x", b"%d" % i, NOW) for i in range(10)]
    order = [0, 5, 2, 9, 1, 3, 8, 4, 7, 6]
    assert [receiver.open("x", sealed[i], NOW) for i in order] == [b"%d" % i for i in order]
    assert all(receiver.open("x", sealed[i], NOW) is Rejection.REPLAYED for i in range(10))


def test_a_message_trailing_its_sender_by_the_window_is_refused_and_just_inside_it_accepted():
    incarnation = b"I" * 8
    receiver = Sealer(KEY)
    newest = 3 * WINDOW + 17
    assert receiver.open("x", sealed_as(incarnation, newest, NOW), NOW) == b"p"
    assert receiver.open("x", sealed_as(incarnation, newest - WINDOW, NOW), NOW) is Rejection.BEHIND_WINDOW
    assert receiver.open("x", sealed_as(incarnation, 1, NOW), NOW) is Rejection.BEHIND_WINDOW
    assert receiver.open("x", sealed_as(incarnation, newest - WINDOW + 1, NOW), NOW) == b"p"
    assert receiver.open("x", sealed_as(incarnation, newest - WINDOW + 1, NOW), NOW) is Rejection.REPLAYED


@pytest.mark.parametrize("jump", [1, 2, WINDOW // 2, WINDOW - 1, WINDOW, WINDOW + 1, 5 * WINDOW + 3])
def test_a_jump_ahead_forgets_what_fell_below_the_window_and_keeps_the_rest(jump):
    """Slots reused by the ring must not make a new number look seen (lost messages), nor an old
    one unseen (replays)."""
    incarnation = b"J" * 8
    receiver = Sealer(KEY)
    start = WINDOW - 5  # the gap wraps around the ring for most jumps
    for sequence in range(start - 3, start + 1):
        assert receiver.open("x", sealed_as(incarnation, sequence, NOW), NOW) == b"p"
    assert receiver.open("x", sealed_as(incarnation, start + jump, NOW), NOW) == b"p"
    for sequence in range(start + 1, start + jump):
        if sequence > start + jump - WINDOW:
            assert receiver.open("x", sealed_as(incarnation, sequence, NOW), NOW) == b"p", sequence
    for sequence in range(start - 3, start + 1):
        expected = Rejection.REPLAYED if sequence > start + jump - WINDOW else Rejection.BEHIND_WINDOW
        assert receiver.open("x", sealed_as(incarnation, sequence, NOW), NOW) is expected


@given(st.lists(st.integers(1, 4 * WINDOW), max_size=60))
def test_each_sequence_number_opens_at_most_once_and_never_below_the_window(sequences):
    """Against a model: accepted iff never accepted before and above the newest less the window."""
    receiver = Sealer(KEY)
    accepted: set[int] = set()
    for sequence in sequences:
        newest = max(accepted, default=0)
        expected = sequence not in accepted and (not accepted or sequence > newest - WINDOW)
        opened = receiver.open("x", sealed_as(b"H" * 8, sequence, NOW), NOW)
        assert (opened == b"p") is expected, (sequence, newest)
        if expected:
            accepted.add(sequence)


def test_a_restarted_sender_is_a_new_incarnation_heard_from_its_first_message():
    receiver = Sealer(KEY)
    for _ in range(3):
        sender = Sealer(KEY)  # a process that starts again: its sequence starts again too
        assert receiver.open("x", sender.seal("x", b"p", NOW), NOW) == b"p"
    assert len(receiver._windows) == 3


def test_a_sender_whose_sequence_runs_out_draws_a_new_incarnation():
    sender, receiver = Sealer(KEY), Sealer(KEY)
    sender._sequence = 0xFFFF_FFFF - 1
    last, after = sender.seal("x", b"last", NOW), sender.seal("x", b"after", NOW)
    assert last[TAG_SIZE:24] != after[TAG_SIZE:24]
    assert receiver.open("x", last, NOW) == b"last" and receiver.open("x", after, NOW) == b"after"


def test_a_restarted_receiver_accepts_a_replay_once_within_a_day_and_never_again():
    """The replay this seal lets through, stated in wire.seal: a receiver with no memory of an
    incarnation, for messages sealed within a day of its clock; it then remembers them."""
    sender = Sealer(KEY)
    captured = sender.seal("x", b"p", NOW)
    assert Sealer(KEY).open("x", captured, NOW) == b"p"
    restarted = Sealer(KEY)
    assert restarted.open("x", captured, NOW + HOUR) == b"p"
    assert restarted.open("x", captured, NOW + HOUR) is Rejection.REPLAYED
    assert Sealer(KEY).open("x", captured, NOW + FIRST_SIGHTING_S + 1) is Rejection.UNTIMELY


def test_once_a_restarted_receiver_hears_a_live_sender_its_old_messages_are_refused():
    sender, restarted = Sealer(KEY), Sealer(KEY)
    captured = sender.seal("x", b"old", NOW)
    for _ in range(WINDOW):
        sender.seal("x", b"unseen", NOW)
    assert restarted.open("x", sender.seal("x", b"live", NOW), NOW) == b"live"
    assert restarted.open("x", captured, NOW) is Rejection.BEHIND_WINDOW


def test_the_incarnation_table_is_bounded_and_evicts_the_least_recently_heard():
    live, receiver = Sealer(KEY), Sealer(KEY)
    assert receiver.open("x", live.seal("x", b"p", NOW), NOW) == b"p"
    for index in range(2 * MAX_INCARNATIONS):
        assert receiver.open("x", Sealer(KEY).seal("x", b"p", NOW), NOW) == b"p"
        if index % 16 == 0:
            assert receiver.open("x", live.seal("x", b"p", NOW), NOW) == b"p"  # heard often: kept
        assert len(receiver._windows) <= MAX_INCARNATIONS
    assert live._incarnation in receiver._windows
    # An evicted sender is not silenced: its next message is a first sighting.
    evicted = Sealer(KEY)
    assert receiver.open("x", evicted.seal("x", b"p", NOW), NOW) == b"p"
    for _ in range(MAX_INCARNATIONS):
        receiver.open("x", Sealer(KEY).seal("x", b"p", NOW), NOW)
    assert evicted._incarnation not in receiver._windows
    assert receiver.open("x", evicted.seal("x", b"again", NOW), NOW) == b"again"


@given(st.binary(max_size=80), st.text(max_size=20))
def test_garbage_is_refused_and_counted(data, subject):
    receiver = Sealer(KEY)
    why = receiver.open(subject, data, NOW)
    assert why in (Rejection.MALFORMED, Rejection.BAD_TAG)
    assert sum(receiver.rejected.values()) == 1
    assert not receiver._windows


@given(st.binary(min_size=16, max_size=16), st.integers(0, 0xFFFF_FFFF), st.integers(0, 0xFFFF_FFFF))
def test_any_stamp_with_a_wrong_tag_is_refused_before_it_is_read(tag, sequence, sent_s):
    receiver = Sealer(KEY)
    data = tag + struct.pack(">8sII", b"G" * 8, sequence, sent_s) + b"payload"
    assert receiver.open("x", data, NOW) is Rejection.BAD_TAG
    assert not receiver._windows


@given(st.binary(min_size=8, max_size=8), st.integers(0, 0xFFFF_FFFF), st.integers(0, 0xFFFF_FFFF))
def test_any_authentic_stamp_opens_at_most_once(incarnation, sequence, sent_s):
    """Stamps a sender with the key could choose (sequence 0, the largest, any time) break nothing."""
    receiver = Sealer(KEY)
    sealed = sealed_as(incarnation, sequence, sent_s)
    first = receiver.open("x", sealed, NOW)
    assert first == b"p" if abs(sent_s - NOW) <= FIRST_SIGHTING_S else first is Rejection.UNTIMELY
    assert receiver.open("x", sealed, NOW) in (Rejection.REPLAYED, Rejection.UNTIMELY)


def test_a_short_key_is_refused_and_secrets_give_distinct_keys():
    with pytest.raises(ValueError):
        Sealer(b"short")
    assert derive_key("a") != derive_key("b") and len(derive_key("")) == 32
