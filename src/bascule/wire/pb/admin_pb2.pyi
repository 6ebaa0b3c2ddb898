from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BrokerInfo(_message.Message):
    __slots__ = ("id", "host", "port", "raftAddress")
    ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    RAFTADDRESS_FIELD_NUMBER: _ClassVar[int]
    id: str
    host: str
    port: int
    raftAddress: str
    def __init__(self, id: _Optional[str] = ..., host: _Optional[str] = ..., port: _Optional[int] = ..., raftAddress: _Optional[str] = ...) -> None: ...

class Voter(_message.Message):
    __slots__ = ("address", "brokerId", "matchIndex", "lag", "connected", "leader")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    BROKERID_FIELD_NUMBER: _ClassVar[int]
    MATCHINDEX_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    address: str
    brokerId: str
    matchIndex: int
    lag: int
    connected: bool
    leader: bool
    def __init__(self, address: _Optional[str] = ..., brokerId: _Optional[str] = ..., matchIndex: _Optional[int] = ..., lag: _Optional[int] = ..., connected: _Optional[bool] = ..., leader: _Optional[bool] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("brokers", "raftLeader", "raftLeaderId", "term", "commitIndex", "voters", "answeredBy")
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    RAFTLEADER_FIELD_NUMBER: _ClassVar[int]
    RAFTLEADERID_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    COMMITINDEX_FIELD_NUMBER: _ClassVar[int]
    VOTERS_FIELD_NUMBER: _ClassVar[int]
    ANSWEREDBY_FIELD_NUMBER: _ClassVar[int]
    brokers: _containers.RepeatedCompositeFieldContainer[BrokerInfo]
    raftLeader: str
    raftLeaderId: str
    term: int
    commitIndex: int
    voters: _containers.RepeatedCompositeFieldContainer[Voter]
    answeredBy: str
    def __init__(self, brokers: _Optional[_Iterable[_Union[BrokerInfo, _Mapping]]] = ..., raftLeader: _Optional[str] = ..., raftLeaderId: _Optional[str] = ..., term: _Optional[int] = ..., commitIndex: _Optional[int] = ..., voters: _Optional[_Iterable[_Union[Voter, _Mapping]]] = ..., answeredBy: _Optional[str] = ...) -> None: ...

class PartitionsRequest(_message.Message):
    __slots__ = ("stream", "metadataOnly")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    METADATAONLY_FIELD_NUMBER: _ClassVar[int]
    stream: str
    metadataOnly: bool
    def __init__(self, stream: _Optional[str] = ..., metadataOnly: _Optional[bool] = ...) -> None: ...

class ReplicaStatus(_message.Message):
    __slots__ = ("id", "logEndOffset", "highWatermark", "lag", "inIsr", "reachable", "oldestOffset", "sizeBytes")
    ID_FIELD_NUMBER: _ClassVar[int]
    LOGENDOFFSET_FIELD_NUMBER: _ClassVar[int]
    HIGHWATERMARK_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    INISR_FIELD_NUMBER: _ClassVar[int]
    REACHABLE_FIELD_NUMBER: _ClassVar[int]
    OLDESTOFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZEBYTES_FIELD_NUMBER: _ClassVar[int]
    id: str
    logEndOffset: int
    highWatermark: int
    lag: int
    inIsr: bool
    reachable: bool
    oldestOffset: int
    sizeBytes: int
    def __init__(self, id: _Optional[str] = ..., logEndOffset: _Optional[int] = ..., highWatermark: _Optional[int] = ..., lag: _Optional[int] = ..., inIsr: _Optional[bool] = ..., reachable: _Optional[bool] = ..., oldestOffset: _Optional[int] = ..., sizeBytes: _Optional[int] = ...) -> None: ...

class PartitionStatus(_message.Message):
    __slots__ = ("stream", "partition", "leader", "replicas", "isr", "highWatermark", "partitionEpoch", "leaderEpoch", "replicaStatus", "paused", "readonly", "compacted", "unclean", "oldestOffset", "newestOffset", "messages", "sizeBytes")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ISR_FIELD_NUMBER: _ClassVar[int]
    HIGHWATERMARK_FIELD_NUMBER: _ClassVar[int]
    PARTITIONEPOCH_FIELD_NUMBER: _ClassVar[int]
    LEADEREPOCH_FIELD_NUMBER: _ClassVar[int]
    REPLICASTATUS_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    READONLY_FIELD_NUMBER: _ClassVar[int]
    COMPACTED_FIELD_NUMBER: _ClassVar[int]
    UNCLEAN_FIELD_NUMBER: _ClassVar[int]
    OLDESTOFFSET_FIELD_NUMBER: _ClassVar[int]
    NEWESTOFFSET_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    SIZEBYTES_FIELD_NUMBER: _ClassVar[int]
    stream: str
    partition: int
    leader: str
    replicas: _containers.RepeatedScalarFieldContainer[str]
    isr: _containers.RepeatedScalarFieldContainer[str]
    highWatermark: int
    partitionEpoch: int
    leaderEpoch: int
    replicaStatus: _containers.RepeatedCompositeFieldContainer[ReplicaStatus]
    paused: bool
    readonly: bool
    compacted: bool
    unclean: _containers.RepeatedScalarFieldContainer[str]
    oldestOffset: int
    newestOffset: int
    messages: int
    sizeBytes: int
    def __init__(self, stream: _Optional[str] = ..., partition: _Optional[int] = ..., leader: _Optional[str] = ..., replicas: _Optional[_Iterable[str]] = ..., isr: _Optional[_Iterable[str]] = ..., highWatermark: _Optional[int] = ..., partitionEpoch: _Optional[int] = ..., leaderEpoch: _Optional[int] = ..., replicaStatus: _Optional[_Iterable[_Union[ReplicaStatus, _Mapping]]] = ..., paused: _Optional[bool] = ..., readonly: _Optional[bool] = ..., compacted: _Optional[bool] = ..., unclean: _Optional[_Iterable[str]] = ..., oldestOffset: _Optional[int] = ..., newestOffset: _Optional[int] = ..., messages: _Optional[int] = ..., sizeBytes: _Optional[int] = ...) -> None: ...

class StreamSettings(_message.Message):
    __slots__ = ("segmentMaxBytes", "segmentMaxAge", "retentionMaxBytes", "retentionMaxMessages", "retentionMaxAge", "cleanerInterval", "compactEnabled", "autoPauseTime", "autoPauseDisableIfSubscribers", "minIsr", "optimisticConcurrencyControl", "encryption")
    SEGMENTMAXBYTES_FIELD_NUMBER: _ClassVar[int]
    SEGMENTMAXAGE_FIELD_NUMBER: _ClassVar[int]
    RETENTIONMAXBYTES_FIELD_NUMBER: _ClassVar[int]
    RETENTIONMAXMESSAGES_FIELD_NUMBER: _ClassVar[int]
    RETENTIONMAXAGE_FIELD_NUMBER: _ClassVar[int]
    CLEANERINTERVAL_FIELD_NUMBER: _ClassVar[int]
    COMPACTENABLED_FIELD_NUMBER: _ClassVar[int]
    AUTOPAUSETIME_FIELD_NUMBER: _ClassVar[int]
    AUTOPAUSEDISABLEIFSUBSCRIBERS_FIELD_NUMBER: _ClassVar[int]
    MINISR_FIELD_NUMBER: _ClassVar[int]
    OPTIMISTICCONCURRENCYCONTROL_FIELD_NUMBER: _ClassVar[int]
    ENCRYPTION_FIELD_NUMBER: _ClassVar[int]
    segmentMaxBytes: int
    segmentMaxAge: int
    retentionMaxBytes: int
    retentionMaxMessages: int
    retentionMaxAge: int
    cleanerInterval: int
    compactEnabled: bool
    autoPauseTime: int
    autoPauseDisableIfSubscribers: bool
    minIsr: int
    optimisticConcurrencyControl: bool
    encryption: bool
    def __init__(self, segmentMaxBytes: _Optional[int] = ..., segmentMaxAge: _Optional[int] = ..., retentionMaxBytes: _Optional[int] = ..., retentionMaxMessages: _Optional[int] = ..., retentionMaxAge: _Optional[int] = ..., cleanerInterval: _Optional[int] = ..., compactEnabled: _Optional[bool] = ..., autoPauseTime: _Optional[int] = ..., autoPauseDisableIfSubscribers: _Optional[bool] = ..., minIsr: _Optional[int] = ..., optimisticConcurrencyControl: _Optional[bool] = ..., encryption: _Optional[bool] = ...) -> None: ...

class StreamStatus(_message.Message):
    __slots__ = ("name", "subject", "group", "replicationFactor", "creationTime", "settings")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    REPLICATIONFACTOR_FIELD_NUMBER: _ClassVar[int]
    CREATIONTIME_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    name: str
    subject: str
    group: str
    replicationFactor: int
    creationTime: int
    settings: StreamSettings
    def __init__(self, name: _Optional[str] = ..., subject: _Optional[str] = ..., group: _Optional[str] = ..., replicationFactor: _Optional[int] = ..., creationTime: _Optional[int] = ..., settings: _Optional[_Union[StreamSettings, _Mapping]] = ...) -> None: ...

class PartitionsResponse(_message.Message):
    __slots__ = ("partitions", "streams")
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionStatus]
    streams: _containers.RepeatedCompositeFieldContainer[StreamStatus]
    def __init__(self, partitions: _Optional[_Iterable[_Union[PartitionStatus, _Mapping]]] = ..., streams: _Optional[_Iterable[_Union[StreamStatus, _Mapping]]] = ...) -> None: ...
