"""bascule's api.proto against the descriptor compiled into gufo-liftbridge.

Importing both modules in one process also checks that bascule's private
descriptor pool keeps them from clashing over "api.proto".
"""

from collections.abc import Iterator

import pytest
from google.protobuf import descriptor_pb2, json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from bascule.wire.pb import api_pb2, api_pb2_grpc

liftbridge_pb2 = pytest.importorskip("gufo.liftbridge.api_pb2")
liftbridge_pb2_grpc = pytest.importorskip("gufo.liftbridge.api_pb2_grpc")

FieldShape = tuple[str, int, int, int, str]


def _file_proto(module) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(proto)
    return proto


def _all_messages(
    messages, prefix: str
) -> Iterator[tuple[str, descriptor_pb2.DescriptorProto]]:
    for message in messages:
        full_name = f"{prefix}.{message.name}"
        yield full_name, message
        yield from _all_messages(message.nested_type, full_name)


def _all_enums(file: descriptor_pb2.FileDescriptorProto) -> dict[str, dict[str, int]]:
    enums = {f"{file.package}.{enum.name}": enum for enum in file.enum_type}
    for full_name, message in _all_messages(file.message_type, file.package):
        enums.update({f"{full_name}.{enum.name}": enum for enum in message.enum_type})
    return {name: {v.name: v.number for v in enum.value} for name, enum in enums.items()}


def _message_shapes(
    file: descriptor_pb2.FileDescriptorProto,
) -> dict[str, tuple[bool, list[FieldShape]]]:
    """Everything about each message that affects the wire or the generated API."""
    return {
        full_name: (
            message.options.map_entry,
            sorted((f.name, f.number, f.type, f.label, f.type_name) for f in message.field),
        )
        for full_name, message in _all_messages(file.message_type, file.package)
    }


BASCULE_FILE = _file_proto(api_pb2)
LIFTBRIDGE_FILE = _file_proto(liftbridge_pb2)
BASCULE_MESSAGES = _message_shapes(BASCULE_FILE)
LIFTBRIDGE_MESSAGES = _message_shapes(LIFTBRIDGE_FILE)


def test_package_and_syntax():
    assert (BASCULE_FILE.package, BASCULE_FILE.syntax) == ("proto", "proto3")
    assert (LIFTBRIDGE_FILE.package, LIFTBRIDGE_FILE.syntax) == ("proto", "proto3")


def test_same_message_names():
    assert sorted(BASCULE_MESSAGES) == sorted(LIFTBRIDGE_MESSAGES)


# Fields of liftbridge-api v2 that bascule has beyond v1.9.0 (which gufo-liftbridge compiles in),
# and bascule's own (numbered from 100, away from Liftbridge's).
_NULLABLE_INT64 = (FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.LABEL_OPTIONAL, ".proto.NullableInt64")
V2_FIELDS: dict[str, list[FieldShape]] = {
    "proto.SubscribeRequest": [("reverse", 12, FieldDescriptor.TYPE_BOOL, FieldDescriptor.LABEL_OPTIONAL, "")],
    "proto.CreateStreamRequest": [("dedupMaxMessages", 101, *_NULLABLE_INT64), ("dedupWindow", 100, *_NULLABLE_INT64)],
}


@pytest.mark.parametrize("full_name", sorted(LIFTBRIDGE_MESSAGES))
def test_same_fields(full_name: str):
    map_entry, fields = BASCULE_MESSAGES[full_name]
    v1_fields = [field for field in fields if field not in V2_FIELDS.get(full_name, [])]
    assert (map_entry, v1_fields) == LIFTBRIDGE_MESSAGES[full_name]


def test_the_v2_fields_are_there_and_new_to_liftbridge_v1():
    for full_name, added in V2_FIELDS.items():
        assert set(added) <= set(BASCULE_MESSAGES[full_name][1])
        assert not {number for _, number, *_ in added} & {f[1] for f in LIFTBRIDGE_MESSAGES[full_name][1]}


def test_same_enums():
    assert _all_enums(BASCULE_FILE) == _all_enums(LIFTBRIDGE_FILE)


def _methods(file: descriptor_pb2.FileDescriptorProto) -> dict[str, tuple]:
    (service,) = file.service
    return {
        f"{file.package}.{service.name}/{method.name}": (
            method.input_type,
            method.output_type,
            method.client_streaming,
            method.server_streaming,
        )
        for method in service.method
    }


def test_same_service_methods():
    assert _methods(BASCULE_FILE) == _methods(LIFTBRIDGE_FILE)


class _RecordingChannel:
    """Stands in for a grpc.Channel and records which calls a stub sets up."""

    def __init__(self) -> None:
        self.calls: dict[str, str] = {}

    def __getattr__(self, kind: str):
        def make_call(path: str, **_kwargs):
            self.calls[path] = kind

        return make_call


def test_stub_method_paths_and_kinds():
    bascule_channel, liftbridge_channel = _RecordingChannel(), _RecordingChannel()
    api_pb2_grpc.APIStub(bascule_channel)
    liftbridge_pb2_grpc.APIStub(liftbridge_channel)
    assert bascule_channel.calls == liftbridge_channel.calls
    assert bascule_channel.calls["/proto.API/PublishAsync"] == "stream_stream"


# --- bytes written by one side decode identically on the other ---

_MAX_DEPTH = 3


def _sample_scalar(field: FieldDescriptor):
    cpp = FieldDescriptor
    if field.type == cpp.TYPE_ENUM:
        return field.enum_type.values[-1].number  # the highest, never the default
    return {
        cpp.CPPTYPE_INT32: -(field.number + 1),
        cpp.CPPTYPE_INT64: -(2**40 + field.number),
        cpp.CPPTYPE_UINT32: 2**31 + field.number,
        cpp.CPPTYPE_UINT64: 2**63 + field.number,
        cpp.CPPTYPE_BOOL: True,
        cpp.CPPTYPE_STRING: (
            b"\x00\xff" + field.name.encode()
            if field.type == cpp.TYPE_BYTES
            else f"{field.name}-é"
        ),
    }[field.cpp_type]


def _fill(message: Message, depth: int = 0) -> Message:
    """Set every field of message to a non-default value, recursing into submessages."""
    descriptor: Descriptor = message.DESCRIPTOR
    for field in descriptor.fields:
        value = getattr(message, field.name)
        if _is_map(field):
            _fill_map(value, field.message_type, depth)
        elif field.message_type is None and field.is_repeated:
            sample = _sample_scalar(field)
            value.extend([sample, type(sample)()])  # a default element must survive too
        elif field.message_type is None:
            setattr(message, field.name, _sample_scalar(field))
        elif depth < _MAX_DEPTH and field.is_repeated:
            _fill(value.add(), depth + 1)
            _fill(value.add(), depth + 1)
        elif depth < _MAX_DEPTH:
            _fill(value, depth + 1)
    return message


def _fill_map(entries, entry_type: Descriptor, depth: int) -> None:
    key = _sample_scalar(entry_type.fields_by_name["key"])
    value_field = entry_type.fields_by_name["value"]
    if value_field.message_type is None:
        entries[key] = _sample_scalar(value_field)
    elif depth < _MAX_DEPTH:
        _fill(entries[key], depth + 1)


def _is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


TOP_LEVEL_MESSAGES = sorted(LIFTBRIDGE_FILE.message_type, key=lambda m: m.name)


@pytest.mark.parametrize("name", [m.name for m in TOP_LEVEL_MESSAGES])
def test_liftbridge_bytes_decode_in_bascule(name: str):
    sent = _fill(getattr(liftbridge_pb2, name)())
    received = getattr(api_pb2, name).FromString(sent.SerializeToString())
    assert json_format.MessageToDict(received) == json_format.MessageToDict(sent)
    assert received.SerializeToString(deterministic=True) == sent.SerializeToString(
        deterministic=True
    )


@pytest.mark.parametrize("name", [m.name for m in TOP_LEVEL_MESSAGES])
def test_bascule_bytes_decode_in_liftbridge(name: str):
    sent = _fill(getattr(api_pb2, name)())
    received = getattr(liftbridge_pb2, name).FromString(sent.SerializeToString())
    expected = json_format.MessageToDict(sent)
    for field_name, *_ in V2_FIELDS.get(f"proto.{name}", []):  # unknown to v1: kept, not shown
        expected.pop(field_name, None)
    assert json_format.MessageToDict(received) == expected


def test_unset_wrapper_is_distinguishable_from_zero():
    request = api_pb2.CreateStreamRequest.FromString(
        liftbridge_pb2.CreateStreamRequest(
            name="s", minIsr=liftbridge_pb2.NullableInt32(value=0)
        ).SerializeToString()
    )
    assert request.HasField("minIsr") and request.minIsr.value == 0
    assert not request.HasField("retentionMaxAge")
