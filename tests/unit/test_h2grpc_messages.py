"""gRPC's message framing and header values (bascule.h2grpc.messages): pure functions, no I/O."""

from __future__ import annotations

import gzip
import struct
import tracemalloc
import zlib
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bascule.h2grpc.messages import (
    MAX_STATUS_MESSAGE,
    PREFIX_SIZE,
    FramingError,
    MessageReader,
    accepts_gzip,
    decode_status_message,
    encode_status_message,
    frame,
    frame_gzip,
    gunzip,
    parse_timeout,
)
from bascule.h2grpc.status import Status

MAX = 1 << 20

messages_strategy = st.lists(st.binary(max_size=300), max_size=20)


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at the (sorted, deduplicated) positions ``cuts`` taken modulo its length."""
    if not data:
        return [data]
    points = sorted({cut % (len(data) + 1) for cut in cuts} | {0, len(data)})
    return [data[start:end] for start, end in zip(points, points[1:])]


def read_all(reader: MessageReader, chunks: list[bytes]) -> list[bytes]:
    out: list[bytes] = []
    for chunk in chunks:
        out.extend(reader.feed(chunk))
    return out


def prefix(flag: int, length: int) -> bytes:
    return struct.pack(">BI", flag, length)


# --- framing round trips ---------------------------------------------------------------------------


def test_frame_layout():
    assert frame([b"abc", b""]) == b"\x00\x00\x00\x00\x03abc" + b"\x00\x00\x00\x00\x00"
    assert frame([]) == b""
    assert PREFIX_SIZE == 5


@settings(max_examples=200, deadline=None)
@given(messages=messages_strategy, cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=30))
def test_frame_then_read_in_any_chunking_gives_the_messages_back(messages, cuts):
    reader = MessageReader(MAX)
    assert read_all(reader, chunked(frame(messages), cuts)) == messages
    assert not reader.pending


@settings(max_examples=100, deadline=None)
@given(messages=messages_strategy)
def test_frame_read_byte_by_byte(messages):
    data = frame(messages)
    reader = MessageReader(MAX)
    assert read_all(reader, [data[i:i + 1] for i in range(len(data))]) == messages
    assert not reader.pending


def test_one_whole_message_per_feed_fast_path_and_types():
    reader = MessageReader(MAX)
    out = reader.feed(frame([b"hello"]))
    assert out == [b"hello"]
    assert all(type(message) is bytes for message in out)
    out = reader.feed(bytearray(frame([b"a", b"b"])))
    assert out == [b"a", b"b"] and all(type(message) is bytes for message in out)


def test_pending_reports_a_partial_message():
    reader = MessageReader(MAX)
    data = frame([b"0123456789"])
    assert reader.feed(data[:3]) == []
    assert reader.pending
    assert reader.feed(data[3:8]) == []
    assert reader.pending
    assert reader.feed(data[8:]) == [b"0123456789"]
    assert not reader.pending


def test_empty_feed_is_harmless():
    reader = MessageReader(MAX)
    assert reader.feed(b"") == []
    assert not reader.pending


# --- size limit --------------------------------------------------------------------------------------


def test_message_at_the_limit_is_accepted():
    reader = MessageReader(10)
    assert reader.feed(frame([b"x" * 10])) == [b"x" * 10]


def test_prefix_announcing_more_than_max_is_refused_before_the_body():
    reader = MessageReader(10)
    with pytest.raises(FramingError) as caught:
        reader.feed(prefix(0, 11))  # the prefix alone: the body never needs to arrive
    assert caught.value.status == Status.RESOURCE_EXHAUSTED


def test_prefix_announcing_more_than_max_split_over_feeds():
    reader = MessageReader(1000)
    data = prefix(0, 1 << 31)
    assert reader.feed(data[:2]) == []
    with pytest.raises(FramingError) as caught:
        reader.feed(data[2:])
    assert caught.value.status == Status.RESOURCE_EXHAUSTED


def test_oversized_message_after_good_ones_in_the_same_feed():
    reader = MessageReader(10)
    with pytest.raises(FramingError) as caught:
        reader.feed(frame([b"ok"]) + prefix(0, 4096))
    assert caught.value.status == Status.RESOURCE_EXHAUSTED


def test_compressed_length_above_max_is_refused():
    reader = MessageReader(10, compression="gzip")
    with pytest.raises(FramingError) as caught:
        reader.feed(prefix(1, 11))
    assert caught.value.status == Status.RESOURCE_EXHAUSTED


# --- compression -------------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", [None, "identity", "deflate"])
def test_compressed_flag_without_gzip_encoding_is_internal(compression):
    reader = MessageReader(MAX, compression=compression)
    with pytest.raises(FramingError) as caught:
        reader.feed(frame_gzip([b"hello"]))
    assert caught.value.status == Status.INTERNAL


def test_frame_gzip_sets_the_compressed_flag():
    data = frame_gzip([b"hello" * 100])
    flag, length = struct.unpack_from(">BI", data)
    assert flag == 1
    assert len(data) == PREFIX_SIZE + length
    assert gzip.decompress(data[PREFIX_SIZE:]) == b"hello" * 100


@settings(max_examples=50, deadline=None)
@given(messages=messages_strategy, cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=20))
def test_gzip_round_trip(messages, cuts):
    reader = MessageReader(MAX, compression="gzip")
    assert read_all(reader, chunked(frame_gzip(messages), cuts)) == messages
    assert not reader.pending


def test_gzip_reader_also_takes_uncompressed_messages():
    reader = MessageReader(MAX, compression="gzip")
    assert reader.feed(frame([b"plain"]) + frame_gzip([b"packed"])) == [b"plain", b"packed"]


def test_decompressed_size_above_max_is_resource_exhausted():
    reader = MessageReader(100, compression="gzip")
    data = frame_gzip([b"a" * 101])
    assert len(data) < 100
    with pytest.raises(FramingError) as caught:
        reader.feed(data)
    assert caught.value.status == Status.RESOURCE_EXHAUSTED


def test_gunzip_exactly_at_the_limit():
    assert gunzip(gzip.compress(b"a" * 100), 100) == b"a" * 100
    assert gunzip(gzip.compress(b""), 0) == b""


@pytest.fixture(scope="module")
def gzip_bomb() -> bytes:
    """100 MiB of zeros as one valid gzip member (about 100 KB), built without compressing 100 MiB: a raw
    deflate segment for 1 MiB of zeros that ends in a full flush (byte-aligned, no reference to what came
    before) repeated 100 times, a final empty block, and the gzip trailer (CRC-32 and size)."""
    zeros = bytes(1 << 20)
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    segment = compressor.compress(zeros) + compressor.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(100):
        crc = zlib.crc32(zeros, crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
    bomb = header + segment * 100 + b"\x03\x00" + struct.pack("<II", crc, 100 << 20)
    assert len(bomb) < 200_000
    # Valid gzip: the first MiB inflates to zeros.
    assert zlib.decompressobj(31).decompress(bomb, 1 << 20) == zeros
    return bomb


def test_gzip_bomb_is_refused_without_allocating_it(gzip_bomb):
    tracemalloc.start()
    try:
        with pytest.raises(FramingError) as caught:
            gunzip(gzip_bomb, 64 << 10)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert caught.value.status == Status.RESOURCE_EXHAUSTED
    assert peak < 4 << 20, f"gunzip allocated {peak} bytes for a 64 KiB limit"


def test_gzip_bomb_through_the_reader(gzip_bomb):
    reader = MessageReader(1 << 20, compression="gzip")
    with pytest.raises(FramingError) as caught:
        reader.feed(prefix(1, len(gzip_bomb)) + gzip_bomb)
    assert caught.value.status == Status.RESOURCE_EXHAUSTED


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(gzip.compress(b"hello world" * 50)[:-10], id="truncated"),
        pytest.param(gzip.compress(b"hello world" * 50)[:12], id="header-only"),
        pytest.param(b"", id="empty"),
        pytest.param(b"this is not gzip at all", id="garbage"),
        pytest.param(zlib.compress(b"zlib, not gzip"), id="zlib-wrapper"),
        pytest.param(gzip.compress(b"x")[:-8] + b"\xde\xad\xbe\xef\x01\x00\x00\x00", id="bad-crc"),
    ],
)
def test_bad_gzip_is_a_framing_error(data):
    with pytest.raises(FramingError) as caught:
        gunzip(data, MAX)
    assert caught.value.status == Status.INTERNAL


def test_bad_gzip_through_the_reader_is_internal():
    reader = MessageReader(MAX, compression="gzip")
    with pytest.raises(FramingError) as caught:
        reader.feed(prefix(1, 5) + b"nope!")
    assert caught.value.status == Status.INTERNAL


@pytest.mark.parametrize(
    "data, whole",
    [
        pytest.param(gzip.compress(b"first,") + gzip.compress(b"second"), b"first,second", id="two-members"),
        pytest.param(gzip.compress(b"first,") + b"trailing garbage", None, id="trailing-garbage"),
    ],
)
def test_gunzip_does_not_drop_what_follows_the_first_member(data, whole):
    try:
        result = gunzip(data, MAX)
    except FramingError:
        return  # refusing it is fine too
    assert result == whole


# --- grpc-timeout ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, seconds",
    [
        ("1H", 3600.0),
        ("2M", 120.0),
        ("5S", 5.0),
        ("100m", 0.1),
        ("250u", 250e-6),
        ("7n", 7e-9),
        ("0S", 0.0),
        ("99999999S", 99999999.0),
        ("00000001m", 1e-3),
    ],
)
def test_parse_timeout_units(value, seconds):
    assert parse_timeout(value) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "value",
    ["", "5", "S", "123456789S", "5x", "-1S", "1.5S", "+1S", " 5S", "5S ", "5s", "5 S", "1e3S", "0x10S", "٣"],
)
def test_parse_timeout_rejects(value):
    with pytest.raises(ValueError):
        parse_timeout(value)


def test_parse_timeout_rejects_non_ascii_digits():
    with pytest.raises(ValueError):
        parse_timeout("\u0661S")


# --- grpc-message ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, encoded",
    [
        ("plain text", "plain text"),
        ("100%", "100%25"),
        ("naïve", "na%C3%AFve"),
        ("a\nb", "a%0Ab"),
        ("tab\there", "tab%09here"),
        ("~!@#$^&*()_+{}|:\"<>?`-=[]\\;',./", "~!@#$^&*()_+{}|:\"<>?`-=[]\\;',./"),
        ("", ""),
    ],
)
def test_encode_status_message_examples(text, encoded):
    assert encode_status_message(text) == encoded
    assert decode_status_message(encoded) == text


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=300) | st.sampled_from(["%", "%%", "%25", "%zz", "é\n%", "\x00\x7f\u2028", "😀"]))
def test_status_message_round_trip(text):
    """Any text up to the size limit (300 characters encode to at most 3600)."""
    encoded = encode_status_message(text)
    assert all(0x20 <= ord(char) <= 0x7E for char in encoded), encoded
    assert decode_status_message(encoded) == text


@settings(max_examples=100, deadline=None)
@given(text=st.text(min_size=300, max_size=5000).map(lambda text: text * (1 + 5000 // len(text))))
def test_long_status_messages_are_cut_to_the_limit(text):
    encoded = encode_status_message(text)
    assert len(encoded) <= MAX_STATUS_MESSAGE
    assert len(encoded) >= MAX_STATUS_MESSAGE - 12  # at most one cut character (4 bytes, 12 chars) dropped
    full = quote(text, safe="".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%"))
    assert full.startswith(encoded)
    assert "%" not in encoded[-2:]  # never half an escape
    assert all(0x20 <= ord(char) <= 0x7E for char in encoded)


def test_status_message_at_the_limit_is_not_cut():
    text = "a" * MAX_STATUS_MESSAGE
    assert encode_status_message(text) == text
    assert encode_status_message(text + "b") == text
    assert encode_status_message("a" * (MAX_STATUS_MESSAGE - 2) + "%") == "a" * (MAX_STATUS_MESSAGE - 2)


def test_long_status_message_is_cut_at_a_character_boundary():
    text = "é" * 3000
    decoded = decode_status_message(encode_status_message(text))
    assert text.startswith(decoded), f"ends in {decoded[-3:]!r}, encoded {encode_status_message(text)[-9:]!r}"


def test_decode_status_message_tolerates_bad_escapes():
    assert decode_status_message("50%zz") == "50%zz"
    assert decode_status_message("%FF") == "\ufffd"


# --- grpc-accept-encoding ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, expected",
    [
        (None, False),
        ("", False),
        ("gzip", True),
        ("identity,gzip", True),
        ("identity, gzip ,deflate", True),
        ("identity", False),
        ("gzipx", False),
        ("deflate,x-gzip", False),
    ],
)
def test_accepts_gzip(value, expected):
    assert accepts_gzip(value) is expected


# --- garbage -----------------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    chunks=st.lists(
        st.binary(max_size=64)
        | st.builds(lambda flag, length, body: prefix(flag, length) + body,
                    st.integers(0, 255), st.integers(0, 80), st.binary(max_size=80))
        | st.builds(lambda body: frame_gzip([body]), st.binary(max_size=40)),
        max_size=10,
    ),
    max_bytes=st.integers(min_value=0, max_value=100),
    compression=st.sampled_from([None, "gzip", "identity"]),
)
def test_garbage_only_ever_raises_framing_error(chunks, max_bytes, compression):
    reader = MessageReader(max_bytes, compression=compression)
    for chunk in chunks:
        try:
            messages = reader.feed(chunk)
        except FramingError as error:
            assert isinstance(error.status, Status)
            assert error.status in (Status.RESOURCE_EXHAUSTED, Status.INTERNAL)
            return
        assert all(isinstance(message, bytes) and len(message) <= max_bytes for message in messages)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=200), max_bytes=st.integers(min_value=0, max_value=1000))
def test_gunzip_of_garbage_only_raises_framing_error(data, max_bytes):
    try:
        result = gunzip(data, max_bytes)
    except FramingError:
        return
    assert len(result) <= max_bytes
