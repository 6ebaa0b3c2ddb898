from typing import Any

def parse_frames(
    buffer: bytes, position: int, frames: dict[bytes, Any], batches: dict[int, list[Any]], /,
) -> tuple[int, int, int]: ...
