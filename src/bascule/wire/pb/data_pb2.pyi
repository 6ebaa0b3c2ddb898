from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class BatchSubscribeRequest(_message.Message):
    __slots__ = ("stream", "partition", "startPosition", "startOffset", "startTimestamp", "readISRReplica", "stopPosition", "stopOffset", "stopTimestamp", "maxBytes")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    STARTPOSITION_FIELD_NUMBER: _ClassVar[int]
    STARTOFFSET_FIELD_NUMBER: _ClassVar[int]
    STARTTIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    READISRREPLICA_FIELD_NUMBER: _ClassVar[int]
    STOPPOSITION_FIELD_NUMBER: _ClassVar[int]
    STOPOFFSET_FIELD_NUMBER: _ClassVar[int]
    STOPTIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    MAXBYTES_FIELD_NUMBER: _ClassVar[int]
    stream: str
    partition: int
    startPosition: int
    startOffset: int
    startTimestamp: int
    readISRReplica: bool
    stopPosition: int
    stopOffset: int
    stopTimestamp: int
    maxBytes: int
    def __init__(self, stream: _Optional[str] = ..., partition: _Optional[int] = ..., startPosition: _Optional[int] = ..., startOffset: _Optional[int] = ..., startTimestamp: _Optional[int] = ..., readISRReplica: _Optional[bool] = ..., stopPosition: _Optional[int] = ..., stopOffset: _Optional[int] = ..., stopTimestamp: _Optional[int] = ..., maxBytes: _Optional[int] = ...) -> None: ...

class EntryBatch(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: bytes
    def __init__(self, entries: _Optional[bytes] = ...) -> None: ...
