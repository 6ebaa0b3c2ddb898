"""A partition's commit log: segments, sparse index, leader-epoch history, checkpoints."""

from bascule.partition.log.commitlog import CommitLog, LogConfig, LogFailed, OffsetOutOfRange
from bascule.partition.log.epochs import EpochHistory
from bascule.wire.entry import CorruptEntry, Entry, Record

__all__ = [
    "CommitLog",
    "CorruptEntry",
    "Entry",
    "EpochHistory",
    "LogConfig",
    "LogFailed",
    "OffsetOutOfRange",
    "Record",
]
