"""The forwarded batch and its reply (wire.forwarding): round trips, and garbage refused with a
clear error, never half read."""

from __future__ import annotations

import random
import struct

import pytest

from bascule.wire.forwarding import (
    ErrorKind,
    ForwardingError,
    ReplyPart,
    decode_batch,
    decode_reply,
    encode_entry,
    encode_header,
    encode_refusal,
    encode_reply,
    entry_size,
)


def batch_bytes(entries: list[tuple[int, int, str, bytes, bytes, dict[str, bytes] | None]],
                stream: str = "orders", partition: int = 3, inbox: str = "") -> bytes:
    return encode_header(stream, partition, len(entries), inbox=inbox) + b"".join(
        encode_entry(policy, offset, cid.encode(), key, value, headers)
        for policy, offset, cid, key, value, headers in entries
    )


ENTRIES = [
    (1, -1, "c-1", b"", b"value one", None),
    (0, 7, "", b"key", b"", {"h": b"v", "ünï": b"\x00\xff"}),
    (2, 1 << 62, "c-3" * 100, b"k" * 300, b"x" * 70_000, None),
]


def framed(*payloads: bytes) -> bytes:
    return b"".join(b"\x00" + struct.pack(">I", len(p)) + p for p in payloads)


def test_a_batch_round_trips() -> None:
    batch = decode_batch(batch_bytes(ENTRIES, inbox="liftbridge-default.ack.0f3c"))
    assert (batch.stream, batch.partition, batch.inbox) == ("orders", 3, "liftbridge-default.ack.0f3c")
    assert batch.policies == [1, 0, 2]
    assert batch.expected_offsets == [-1, 7, 1 << 62]
    assert batch.correlation_ids == ["c-1", "", "c-3" * 100]
    assert batch.keys == [b"", b"key", b"k" * 300]
    assert batch.values == [b"value one", b"", b"x" * 70_000]
    assert batch.headers == [None, {"h": b"v", "ünï": b"\x00\xff"}, None]


def test_entry_size_is_what_an_entry_takes() -> None:
    for _, offset, cid, key, value, headers in ENTRIES:
        assert entry_size(key, value, cid.encode(), headers) == len(encode_entry(0, offset, cid.encode(), key, value,
                                                                                 headers))


def test_every_truncation_of_a_batch_is_refused() -> None:
    data = batch_bytes(ENTRIES[:2])
    for cut in range(len(data)):
        with pytest.raises(ForwardingError):
            decode_batch(data[:cut])


def test_bytes_after_the_last_publish_are_refused() -> None:
    with pytest.raises(ForwardingError, match="after the batch's last publish"):
        decode_batch(batch_bytes(ENTRIES[:1]) + b"\x00")


@pytest.mark.parametrize(("at", "replacement", "problem"), [
    (0, b"\x09", "version 9"),
    (5, struct.pack(">I", 1_000_000), "claims 1000000 publishes"),
    (11, b"\xff\xfe", "stream name is not UTF-8"),
    (13, b"\xff\xff", "ack inbox runs past the end"),
    (15, b"\xff", "ack inbox is not UTF-8"),
    (16, b"\x07", "unknown ack policy 7"),  # the first publish's ack policy
])
def test_a_mangled_batch_says_what_is_wrong(at: int, replacement: bytes, problem: str) -> None:
    # A header of 11 bytes, then "ab", the inbox's length (2) and "i", then the publish.
    data = batch_bytes([ENTRIES[0]], stream="ab", inbox="i")
    with pytest.raises(ForwardingError, match=problem):
        decode_batch(data[:at] + replacement + data[at + len(replacement):])


def test_random_garbage_never_decodes_to_a_half_batch() -> None:
    chooser = random.Random(28)
    valid = batch_bytes(ENTRIES[:2])
    for _ in range(3000):
        if chooser.random() < 0.5:
            data = bytes(chooser.randrange(256) for _ in range(chooser.randrange(64)))
        else:  # one byte of a valid batch changed
            at = chooser.randrange(len(valid))
            data = valid[:at] + bytes([chooser.randrange(256)]) + valid[at + 1:]
        try:
            batch = decode_batch(data)
        except ForwardingError:
            continue
        # What decodes is whole: every list as long as the count, everything consumed.
        count = len(batch.policies)
        assert all(len(column) == count for column in (batch.expected_offsets, batch.correlation_ids, batch.keys,
                                                       batch.values, batch.headers))


def test_a_reply_round_trips() -> None:
    parts = [
        ReplyPart([0, 2], framed(b"\x0a\x02\x20\x01", b"")),
        ReplyPart([1], error=ErrorKind.INCORRECT_OFFSET, message="incorrect expected offset"),
    ]
    assert decode_reply(encode_reply(parts), 3) == parts
    assert decode_reply(encode_reply([]), 0) == []


def test_a_refusal_answers_every_publish() -> None:
    (part,) = decode_reply(encode_refusal(ErrorKind.NOT_LEADER, "not the leader of orders/3"), 4)
    assert part.indices == [0, 1, 2, 3]
    assert (part.error, part.message) == (ErrorKind.NOT_LEADER, "not the leader of orders/3")


@pytest.mark.parametrize(("parts", "count", "problem"), [
    ([ReplyPart([0], framed(b"a")), ReplyPart([0], error=ErrorKind.TIMEOUT)], 2, "answered twice"),
    ([ReplyPart([0, 0], framed(b"a", b"b"))], 2, "answered twice"),
    ([ReplyPart([5], framed(b"a"))], 2, "beyond the batch"),
    ([ReplyPart([0, 1], framed(b"a"))], 2, "not gRPC-framed"),  # one response for two
    ([ReplyPart([0], framed(b"a", b"b"))], 2, "other than 1 responses"),
    ([ReplyPart([0], b"\x01\x00\x00\x00\x00")], 1, "not gRPC-framed"),
])
def test_a_bad_reply_says_what_is_wrong(parts: list[ReplyPart], count: int, problem: str) -> None:
    with pytest.raises(ForwardingError, match=problem):
        decode_reply(encode_reply(parts), count)


def test_every_truncation_of_a_reply_is_refused() -> None:
    data = encode_reply([ReplyPart([0], framed(b"ack")), ReplyPart([1], error=ErrorKind.STORE, message="full")])
    for cut in range(len(data)):
        with pytest.raises(ForwardingError):
            decode_reply(data[:cut], 2)


@pytest.mark.parametrize("data", [
    b"\x01\x01\x63oops",  # a refusal of an unknown kind
    b"\x01\x07",  # an unknown status
    b"\x02\x00\x00\x00\x00\x00",  # another version
    b"\x01\x00" + b"\xff" * 4,  # more parts than there are bytes
])
def test_unknown_statuses_kinds_and_counts_are_refused(data: bytes) -> None:
    with pytest.raises(ForwardingError):
        decode_reply(data, 2)


def test_random_garbage_replies_are_refused_or_whole() -> None:
    chooser = random.Random(2828)
    for _ in range(3000):
        data = bytes(chooser.randrange(256) for _ in range(chooser.randrange(40)))
        try:
            parts = decode_reply(data, 3)
        except ForwardingError:
            continue
        indices = [index for part in parts for index in part.indices]
        assert len(indices) == len(set(indices)) and all(0 <= index < 3 for index in indices)
