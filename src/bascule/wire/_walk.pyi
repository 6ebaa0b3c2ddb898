from collections.abc import Callable
from typing import Any, TypeVar

_T = TypeVar("_T")
_R = TypeVar("_R")

def intact_prefix(
    buf: bytes | memoryview, first_offset: int, max_entries: int, check_crc: bool, /
) -> tuple[int, int, bool]: ...
def walked_entries(
    buf: bytes | bytearray | memoryview, check_crc: bool, /
) -> tuple[list[tuple[int, int, int, int, int]], bool]: ...
def encode_messages(
    chunk: bytes | memoryview,
    first_offset: int,
    max_entries: int,
    check_crc: bool,
    shared_for: Callable[[bytes, int], bytes],
    /,
) -> tuple[int, int, bool, bytes]: ...
def crc32c(data: bytes, value: int = 0, /) -> int: ...
def use_sse42(on: bool, /) -> bool: ...
def encode_entries(
    records: list[Any], first_offset: int, leader_epoch: int, timestamp: int, floor: int | None,
    encode_headers: Callable[[dict[str, bytes]], bytes], record_type: type, /,
) -> tuple[bytes, list[tuple[int, int, int, int, int]]]: ...
def capture_records(
    deliveries: list[tuple[str, str, bytes] | tuple[str, str, bytes, bytes]], record_type: type,
    headers_of: Callable[[str, str], tuple[dict[str, bytes], bytes]],
    envelope_record: Callable[[bytes, str, dict[str, bytes], bytes, bytes | None], tuple[Any, Any]], magic: bytes, /,
) -> tuple[list[Any], list[tuple[int, Any]], list[bytes | None] | None]: ...
def publish_responses(first_offset: int, indices: list[int], correlation_ids: list[str], shared: bytes, /) -> bytes: ...
def split_message_id(data: bytes, /) -> tuple[bytes, bytes] | None: ...
def decode_with_id(decode: Callable[[bytes], _T], data: bytes, /) -> tuple[_T, bytes | None]: ...
def record_with_id(
    record_type: type[_R], value: bytes, key: bytes | None, message_id: bytes, shared: dict[str, bytes],
    block: bytes, /,
) -> _R: ...
