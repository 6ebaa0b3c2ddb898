"""The seal on node-to-node NATS messages: only the cluster's key opens it, once, in its window."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bascule.wire.seal import REPLAY_WINDOW_MS, SEAL_SIZE, Rejection, Sealer, derive_key

KEY = derive_key("s3cret")
NOW = 1_790_000_000_000


def test_a_sealed_message_opens_once_with_the_same_key():
    sender, receiver = Sealer(KEY), Sealer(KEY)
    sealed = sender.seal("ns.s.0.replicate", b"payload", NOW)
    assert len(sealed) == SEAL_SIZE + len(b"payload")
    assert receiver.open("ns.s.0.replicate", sealed, NOW + 5) == b"payload"
    assert receiver.open("ns.s.0.replicate", sealed, NOW + 6) is Rejection.REPLAYED


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
        lambda sealed: ("x", sealed[:20] + bytes([sealed[20] ^ 1]) + sealed[21:]),  # time changed
        lambda sealed: ("x", bytes([sealed[0] ^ 1]) + sealed[1:]),  # tag changed
        lambda sealed: ("x", sealed + b"more"),  # payload extended
    ],
)
def test_any_change_breaks_the_seal(tamper):
    sealed = Sealer(KEY).seal("x", b"payload", NOW)
    assert Sealer(KEY).open(*tamper(sealed), NOW) is Rejection.BAD_TAG


def test_another_key_does_not_open_it():
    receiver = Sealer(KEY)
    assert receiver.open("x", Sealer(derive_key("guess")).seal("x", b"p", NOW), NOW) is Rejection.BAD_TAG
    assert receiver.rejected[Rejection.BAD_TAG] == 1


def test_a_message_outside_the_window_is_stale_and_a_replay_within_twice_the_window_is_caught():
    sender, receiver = Sealer(KEY), Sealer(KEY)
    assert receiver.open("x", sender.seal("x", b"p", NOW - REPLAY_WINDOW_MS - 1), NOW) is Rejection.STALE
    assert receiver.open("x", sender.seal("x", b"p", NOW + REPLAY_WINDOW_MS + 1), NOW) is Rejection.STALE
    from_the_future = sender.seal("x", b"p", NOW + REPLAY_WINDOW_MS)
    assert receiver.open("x", from_the_future, NOW) == b"p"
    # Still inside its window much later (the sender's clock ran ahead): remembered until then.
    assert receiver.open("x", from_the_future, NOW + 2 * REPLAY_WINDOW_MS) is Rejection.REPLAYED
    assert receiver.open("x", from_the_future, NOW + 2 * REPLAY_WINDOW_MS + 1) is Rejection.STALE


def test_accepted_tags_are_forgotten_once_no_replay_could_open():
    sender, receiver = Sealer(KEY), Sealer(KEY)
    for i in range(100):
        assert receiver.open("x", sender.seal("x", b"%d" % i, NOW + i), NOW + i) == b"%d" % i
    receiver.open("x", sender.seal("x", b"late", NOW + 3 * REPLAY_WINDOW_MS), NOW + 3 * REPLAY_WINDOW_MS)
    assert len(receiver._accepted) == 1


@given(st.binary(max_size=80), st.text(max_size=20))
def test_garbage_is_refused_and_counted(data, subject):
    receiver = Sealer(KEY)
    why = receiver.open(subject, data, NOW)
    assert why in (Rejection.MALFORMED, Rejection.BAD_TAG)
    assert sum(receiver.rejected.values()) == 1


def test_a_short_key_is_refused_and_secrets_give_distinct_keys():
    with pytest.raises(ValueError):
        Sealer(b"short")
    assert derive_key("a") != derive_key("b") and len(derive_key("")) == 32
