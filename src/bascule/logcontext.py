"""What a log line concerns: the stream and partition a task works on, for every line it logs.

Set by the partition shells (a follower loop for its whole life, a leader's request handlers per
request); read by the handler ``bascule.logs`` installs, which writes it as JSON fields or as a
``[stream/partition]`` tag. Standard library only: the lowest layers set it.
"""

from __future__ import annotations

from contextvars import ContextVar

CONCERNS: ContextVar[tuple[str, int] | None] = ContextVar("bascule_log_concerns", default=None)


def concerning(stream: str, partition: int) -> None:
    """Mark the current task's log lines as concerning ``stream``/``partition`` (a task's context
    is its own: this does not leak into the task that created it)."""
    CONCERNS.set((stream, partition))
