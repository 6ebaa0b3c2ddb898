"""Small checkpoint files of a partition: the leader-epoch history and the high watermark.

Both are text, rewritten whole through ``bascule.durable`` (a temporary file, fsync, rename) so
that a crash leaves either the old or the new contents, never a mix. The epoch checkpoint names
the log end it was written for: the log checks it against its entries when it opens, and reads
the entries past that end.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from bascule.durable import write_atomically
from bascule.partition.log.epochs import EpochHistory

EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
HIGH_WATERMARK_CHECKPOINT = "replication-offset-checkpoint"

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EpochCheckpoint:
    history: EpochHistory
    end_offset: int | None  # the log end it describes; None in checkpoints that predate the field


# --- pure formats ---------------------------------------------------------------------------


def format_epochs(history: EpochHistory, end_offset: int) -> str:
    return f"end {end_offset}\n" + "".join(f"{epoch} {start_offset}\n" for epoch, start_offset in history.entries)


def parse_epochs(text: str) -> EpochCheckpoint:
    """Raises ValueError unless ``text`` is an optional ``end offset`` line followed by
    well-formed, ordered ``epoch start_offset`` lines."""
    lines = text.splitlines()
    end_offset = None
    if lines and lines[0].startswith("end "):
        end_offset = int(lines.pop(0).removeprefix("end "))
        if end_offset < 0:
            raise ValueError(f"end offset {end_offset} is negative")
    entries = []
    for number, line in enumerate(lines, start=1):
        fields = line.split()
        if len(fields) != 2:
            raise ValueError(f"line {number}: expected 'epoch start_offset', got {line!r}")
        entries.append((int(fields[0]), int(fields[1])))
    return EpochCheckpoint(EpochHistory(entries), end_offset)


def format_high_watermark(high_watermark: int) -> str:
    return f"{high_watermark}\n"


def parse_high_watermark(text: str) -> int:
    high_watermark = int(text.strip())
    if high_watermark < -1:
        raise ValueError(f"high watermark {high_watermark} is below -1")
    return high_watermark


# --- files ----------------------------------------------------------------------------------


def read_epochs(directory: Path) -> EpochCheckpoint | None:
    """The saved epoch history; None, with a warning if it was damaged, when there is none."""
    path = directory / EPOCH_CHECKPOINT
    try:
        return parse_epochs(path.read_text(encoding="ascii"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        logger.warning("unreadable leader-epoch checkpoint %s: %s", path, error)
        return None


def write_epochs(directory: Path, history: EpochHistory, end_offset: int) -> None:
    write_atomically(directory / EPOCH_CHECKPOINT, format_epochs(history, end_offset))


def read_high_watermark(directory: Path) -> int | None:
    """The saved high watermark; None if there is none, -1 (nothing known to be committed),
    with a warning, if it was damaged."""
    path = directory / HIGH_WATERMARK_CHECKPOINT
    try:
        return parse_high_watermark(path.read_text(encoding="ascii"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        logger.warning("unreadable high-watermark checkpoint %s, using -1: %s", path, error)
        return -1


def write_high_watermark(directory: Path, high_watermark: int) -> None:
    write_atomically(directory / HIGH_WATERMARK_CHECKPOINT, format_high_watermark(high_watermark))
