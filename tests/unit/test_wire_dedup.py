"""Message ids as every write path reads them (bascule.wire.dedup)."""

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from bascule.wire import capture
from bascule.wire.dedup import (
    MESSAGE_ID_HEADER,
    headers_with_id,
    message_id,
    message_ids,
    stored_message_ids,
    window_key,
)
from bascule.wire.entry import Record, decode_entries, encode_entries, encode_headers


def test_an_absent_or_empty_header_is_no_id():
    assert message_id({}) is None and message_id({MESSAGE_ID_HEADER: b""}) is None
    assert message_id({"nats-msg-id": b"a"}) is None  # names are exact, as JetStream's
    assert message_id({MESSAGE_ID_HEADER: b"a"}) == b"a"


def test_a_batch_without_ids_costs_a_none():
    assert message_ids([Record(b"v"), Record(b"w")]) is None
    assert message_ids([Record(b"v"), Record(b"w", headers={MESSAGE_ID_HEADER: b"x"})]) == [None, b"x"]


def test_long_ids_are_kept_by_their_digest():
    assert window_key(b"a" * 64) == b"a" * 64
    assert window_key(b"a" * 65) == hashlib.sha256(b"a" * 65).digest()


@given(st.binary(min_size=1, max_size=300), st.text(max_size=40), st.text(max_size=10))
def test_the_id_in_front_of_a_shared_block_encodes_as_encode_headers_would(raw_id, subject, reply):
    shared, block = capture.stored_headers(subject, reply)
    headers, encoded = headers_with_id(raw_id, shared, block)
    assert headers == {MESSAGE_ID_HEADER: raw_id, **shared}
    assert encoded == encode_headers(headers)


_HEADER_NAMES = st.sampled_from([MESSAGE_ID_HEADER, "subject", "reply", "h", "Nats-Msg-Id-x", "nats-msg-id"])


@st.composite
def records(draw):
    headers = draw(st.dictionaries(_HEADER_NAMES, st.binary(max_size=20), max_size=4))
    if draw(st.booleans()) and MESSAGE_ID_HEADER in headers:  # first, as bascule's writers put it
        headers = {MESSAGE_ID_HEADER: headers.pop(MESSAGE_ID_HEADER), **headers}
    value = draw(st.one_of(st.binary(max_size=30), st.just(MESSAGE_ID_HEADER.encode())))
    return Record(value, draw(st.none() | st.binary(max_size=5)), headers)


@given(st.lists(records(), max_size=12))
def test_stored_ids_are_what_decoding_the_entries_finds(batch):
    data, _ = encode_entries(7, 1, batch, 10**18)
    expected = [(entry.offset, entry.timestamp, message_id(entry.headers)) for entry in decode_entries(data)
                if message_id(entry.headers)]
    assert list(stored_message_ids(data)) == expected
