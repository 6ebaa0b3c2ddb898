"""The server imports heavy libraries only where they are used: grpcio (about 10 MiB of resident memory)
never, as the server speaks gRPC through h2grpc; prometheus_client (5 MiB) only for a metrics endpoint;
casbin (3 MiB) only for authorization; cryptography (6.7 MiB) only for the Raft connections' encryptor and
encrypted streams. `bascule server` starts through bascule.cli, which leaves the admin
commands' grpcio and client to bascule.cli.admin. A plain import of either must not pull them back in."""

import os
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



SERVER_IMPORTS = (
    "import sys\n"
    "import bascule.cli\n"
    "bascule.cli.import_server(tls={tls})\n"
    "import asyncio.base_events, nats.aio.client, crc32c\n"
    "real = lambda name: name in sys.modules and '__file__' in vars(sys.modules[name])\n"
    "print(real('_ssl'), real('importlib.metadata'), asyncio.base_events.ssl is sys.modules['ssl'],\n"
    "      nats.aio.client.__version__, crc32c.__version__)\n"
)


@pytest.mark.parametrize("tls", [False, True])
def test_the_server_imports_ssl_only_for_tls_and_never_importlib_metadata(tls):
    from importlib.metadata import version

    printed = subprocess.run([sys.executable, "-c", SERVER_IMPORTS.format(tls=tls)], capture_output=True,
                             text=True, check=True).stdout.split()
    # nats-py sends its version in CONNECT: the installed one, as importlib.metadata says.
    assert printed == [str(tls), "False", str(tls), version("nats-py"), version("crc32c")]


@pytest.mark.parametrize(("flags", "environment", "tls"), [
    ([], {}, False),
    (["--nats-servers", "nats://127.0.0.1:4222"], {}, False),
    (["--nats-servers", "nats://127.0.0.1:4222,tls://127.0.0.1:4223"], {}, True),
    (["--tls-cert", "c.pem", "--tls-key", "k.pem"], {}, True),
    ([], {"LIFTBRIDGE_NATS_TLS_CA": "ca.pem"}, True),
    ([], {"LIFTBRIDGE_NATS_TLS_CERT": "c.pem", "LIFTBRIDGE_NATS_TLS_KEY": "k.pem"}, True),
    (["--tls-cert", "c.pem"], {}, True),  # a configuration error: the server says so, with ssl as ever
])
def test_bascule_server_decides_on_ssl_from_its_configuration_before_the_server_s_imports(
        tmp_path, flags, environment, tls):
    probe = (
        "import sys, bascule.cli as cli\n"
        "def import_server(write_code=None, tls=True):\n"
        "    print(tls, 'asyncio' in sys.modules, '_ssl' in sys.modules)\n"
        "    raise SystemExit(0)\n"
        "cli.import_server = import_server\n"
        f"cli.main(['server', '--data-dir', {str(tmp_path)!r}, *{flags!r}])\n"
    )
    environ = {k: v for k, v in os.environ.items() if not k.startswith("LIFTBRIDGE_")} | environment
    printed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                             env=environ).stdout.split()
    assert printed == [str(tls), "True", "False"]  # asyncio imported already, ssl not (yet)
