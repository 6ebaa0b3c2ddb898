"""Liftbridge's optimistic concurrency control (OCC): a publish names the offset it expects its
message to get, and the leader of a partition under OCC appends it only at that offset.

Liftbridge reads the expectation from the published Message's ``offset`` field (the
PublishRequest's ``expectedOffset``); -1 expects nothing, any other value (0 included, which is
what a client that never sets it sends, and what a plain NATS message counts as) must be the
offset the message would get. A refused message takes no offset, so the next one may take it.
The check belongs where the leader sequences appends: two publishers expecting the same offset
then get one append and one refusal, whatever the order they arrive in.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

NO_EXPECTATION = -1


class IncorrectOffset(Exception):
    """A publish expected an offset other than the one its message would get (Liftbridge's
    INCORRECT_OFFSET); nothing of it was appended."""


def admitted(next_offset: int, groups: Iterable[Sequence[int]]) -> list[bool]:
    """Which of ``groups`` a leader whose log ends at ``next_offset`` appends, in order. A group is
    a run of records appended as one, all or none (a write with one outcome), given as each
    record's expected offset. It is admitted when every expectation in it is NO_EXPECTATION or
    the offset that record gets after the groups admitted before it; a refused group takes none."""
    verdicts = []
    for expectations in groups:
        verdict = all(
            expected == NO_EXPECTATION or expected == next_offset + index
            for index, expected in enumerate(expectations)
        )
        verdicts.append(verdict)
        if verdict:
            next_offset += len(expectations)
    return verdicts
