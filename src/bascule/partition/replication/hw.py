"""High-watermark rules, leader side and follower side.

Offsets follow Liftbridge's convention:

- the high watermark (HW) is the offset of the *last committed* message, ``-1`` when none is;
- a replica's log end offset (LEO) is the offset its *next* message will get (last offset + 1).

So with every ISR member's LEO known, the committed boundary is ``min(LEO) - 1``.
"""

from __future__ import annotations

from collections.abc import Collection

NO_HW = -1


def leader_high_watermark(current_hw: int, isr_log_ends: Collection[int | None], min_isr: int) -> int:
    """The leader's new HW from the LEOs of the whole ISR (the leader's own included).

    ``None`` stands for an ISR member whose LEO the leader does not know yet (it has not fetched
    since this leader took over): the HW then stays where it is. The HW moves only while the ISR
    has at least ``min_isr`` members and never moves backwards.
    """
    if not isr_log_ends or len(isr_log_ends) < min_isr:
        return current_hw
    known = [log_end for log_end in isr_log_ends if log_end is not None]
    if len(known) < len(isr_log_ends):
        return current_hw
    return max(current_hw, min(known) - 1)


def follower_high_watermark(current_hw: int, leader_hw: int, log_end_offset: int) -> int:
    """A follower's new HW after a valid response: the leader's HW, capped at its own last offset.

    It does not move backwards either: a new leader may still report an older HW than the one this
    follower learned from the previous leader, and what this follower knew committed stays
    committed (the new leader, chosen from the ISR, holds it). Only a truncation lowers it (see
    :func:`clamp_high_watermark`).
    """
    return max(current_hw, min(leader_hw, log_end_offset - 1))


def clamp_high_watermark(hw: int, log_end_offset: int) -> int:
    """The HW after the log was cut to ``log_end_offset``: never beyond the last offset kept."""
    return min(hw, log_end_offset - 1)
