from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor as F

from bascule.wire.generate import PB_DIR, generate
from bascule.wire.pb import internal_pb2

pytest.importorskip("grpc_tools")


def test_committed_pb_modules_match_the_protos(tmp_path: Path):
    written = generate(tmp_path)
    names = sorted(path.name for path in written)
    committed = sorted(path.name for path in PB_DIR.iterdir() if path.is_file())
    assert committed == names, "run `python -m bascule.wire.generate`"
    for name in names:
        assert (PB_DIR / name).read_text() == (tmp_path / name).read_text(), (
            f"{name} is stale: run `python -m bascule.wire.generate`"
        )


def test_generated_code_uses_package_relative_imports():
    grpc_source = (PB_DIR / "api_pb2_grpc.py").read_text()
    assert "from . import api_pb2 as" in grpc_source
    assert "\nimport api_pb2" not in grpc_source


def _field_shapes(message) -> dict[str, tuple[int, int]]:
    return {field.name: (field.number, field.type) for field in message.DESCRIPTOR.fields}


def test_internal_messages():
    assert _field_shapes(internal_pb2.ReplicationRequest) == {
        "replicaID": (1, F.TYPE_STRING),
        "offset": (2, F.TYPE_INT64),
        "leaderEpoch": (3, F.TYPE_UINT64),
        "fragmentStart": (4, F.TYPE_INT64),  # bascule's: pieces of entries bigger than a NATS message
        "leaderTime": (5, F.TYPE_DOUBLE),  # bascule's: the echo that renews the leader's lease
    }
    assert _field_shapes(internal_pb2.PartitionNotification) == {
        "stream": (1, F.TYPE_STRING),
        "partition": (2, F.TYPE_INT32),
    }
    assert _field_shapes(internal_pb2.LeaderEpochOffsetRequest) == {
        "leaderEpoch": (1, F.TYPE_UINT64),
        "currentLeaderEpoch": (2, F.TYPE_UINT64),
    }
    assert _field_shapes(internal_pb2.LeaderEpochOffsetResponse) == {
        "endOffset": (1, F.TYPE_INT64),
        "leaderEpoch": (2, F.TYPE_UINT64),
    }
    assert internal_pb2.DESCRIPTOR.package == "bascule.internal"
