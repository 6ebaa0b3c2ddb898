"""A partition's commit log: segments, sparse index, leader-epoch history, checkpoints. Outside
``bascule.partition`` it is used through these names only (pyproject.toml's contracts): a replica's
log through ``PartitionLog``."""

from bascule.partition.log.commitlog import CommitLog, LogConfig, LogFailed, OffsetOutOfRange
from bascule.partition.log.epochs import EpochHistory
from bascule.partition.log.fsync_times import fsync_seconds
from bascule.partition.log.interface import PartitionLog
from bascule.wire.entry import CorruptEntry, Entry, Record

__all__ = [
    "CommitLog",
    "CorruptEntry",
    "Entry",
    "EpochHistory",
    "LogConfig",
    "LogFailed",
    "OffsetOutOfRange",
    "PartitionLog",
    "Record",
    "fsync_seconds",
]
