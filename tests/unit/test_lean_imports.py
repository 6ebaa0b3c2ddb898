"""The server imports heavy libraries only where they are used: grpcio (about 10 MiB of resident memory)
never, as the server speaks gRPC through h2grpc; prometheus_client (5 MiB) only for a metrics endpoint;
casbin (3 MiB) only for authorization; cryptography (6.7 MiB) only for the Raft connections' encryptor and
encrypted streams. `bascule server` starts through bascule.cli, which leaves the admin
commands' grpcio and client to bascule.cli.admin. A plain import of either must not pull them back in."""

import subprocess
import sys

import pytest

LEFT_OUT = ("grpc", "prometheus_client", "casbin", "bascule.client", "cryptography")


@pytest.mark.parametrize("module", ["bascule.server", "bascule.cli"])
def test_the_server_starts_without_grpcio_prometheus_client_casbin_or_cryptography(module):
    probe = f"import sys, {module}; print(sorted(m for m in {LEFT_OUT!r} if m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


def test_the_server_defers_nats_js_and_protobuf_s_python_messages_until_used():
    probe = (
        "import sys\n"
        "from bascule.deferred_imports import defer_submodules\n"
        "defer_submodules()\n"
        "import bascule.server\n"
        "from bascule.wire.pb import api_pb2\n"
        "python_messages = sys.modules['google.protobuf.internal.python_message']\n"
        "message = api_pb2.Message.FromString(api_pb2.Message(value=b'x', headers={'h': b'v'}).SerializeToString())\n"
        "loaded_at_start = ['nats.js.api' in sys.modules, '_AttachFieldHelpers' in vars(python_messages)]\n"
        "import nats\n"
        "status = nats.js.api.Header.STATUS.value\n"  # what nats-py reads for a no-responders status
        "text = str(message).split()\n"  # the text format: python_message loads
        "print(*loaded_at_start, status, sys.modules['nats.js'] is nats.js, text[:2])\n"
    )
    printed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert printed.strip().split(maxsplit=4) == ["False", "False", "Status", "True", "['value:', '\"x\"']"]
