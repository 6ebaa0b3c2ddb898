from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class ReplicationRequest(_message.Message):
    __slots__ = ("replicaID", "offset", "leaderEpoch", "fragmentStart", "leaderTime")
    REPLICAID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LEADEREPOCH_FIELD_NUMBER: _ClassVar[int]
    FRAGMENTSTART_FIELD_NUMBER: _ClassVar[int]
    LEADERTIME_FIELD_NUMBER: _ClassVar[int]
    replicaID: str
    offset: int
    leaderEpoch: int
    fragmentStart: int
    leaderTime: float
    def __init__(self, replicaID: _Optional[str] = ..., offset: _Optional[int] = ..., leaderEpoch: _Optional[int] = ..., fragmentStart: _Optional[int] = ..., leaderTime: _Optional[float] = ...) -> None: ...

class PartitionNotification(_message.Message):
    __slots__ = ("stream", "partition")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    stream: str
    partition: int
    def __init__(self, stream: _Optional[str] = ..., partition: _Optional[int] = ...) -> None: ...

class LeaderEpochOffsetRequest(_message.Message):
    __slots__ = ("leaderEpoch", "currentLeaderEpoch")
    LEADEREPOCH_FIELD_NUMBER: _ClassVar[int]
    CURRENTLEADEREPOCH_FIELD_NUMBER: _ClassVar[int]
    leaderEpoch: int
    currentLeaderEpoch: int
    def __init__(self, leaderEpoch: _Optional[int] = ..., currentLeaderEpoch: _Optional[int] = ...) -> None: ...

class LeaderEpochOffsetResponse(_message.Message):
    __slots__ = ("endOffset", "leaderEpoch")
    ENDOFFSET_FIELD_NUMBER: _ClassVar[int]
    LEADEREPOCH_FIELD_NUMBER: _ClassVar[int]
    endOffset: int
    leaderEpoch: int
    def __init__(self, endOffset: _Optional[int] = ..., leaderEpoch: _Optional[int] = ...) -> None: ...

class Cursor(_message.Message):
    __slots__ = ("stream", "partition", "cursorId", "offset")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    CURSORID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    stream: str
    partition: int
    cursorId: str
    offset: int
    def __init__(self, stream: _Optional[str] = ..., partition: _Optional[int] = ..., cursorId: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...
