import asyncio
import contextlib
import datetime
import ipaddress
import os
import stat
import time

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from bascule.config import load_config
from bascule.server import run


async def until(predicate, timeout: float = 15.0, what: str = "the condition") -> None:
    """Return once ``predicate()`` holds, polled every few milliseconds; fail the test when it has not
    within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def permissive_umask():
    """umask 000 for the test: whatever bascule creates is as open as the modes it passes allow."""
    old = os.umask(0)
    yield
    os.umask(old)


def not_private(root) -> dict[str, str]:
    """Everything under ``root`` (itself included) that is not its user's alone: each path, relative
    to ``root``, with its mode. Private is 0700 for a directory, 0600 for a file."""
    found = {}
    for directory, _, files in os.walk(root):
        for path in [directory, *(os.path.join(directory, name) for name in files)]:
            status = os.lstat(path)
            wanted = 0o700 if stat.S_ISDIR(status.st_mode) else 0o600
            if stat.S_IMODE(status.st_mode) != wanted:
                found[os.path.relpath(path, root)] = oct(stat.S_IMODE(status.st_mode))
    return found


@contextlib.asynccontextmanager
async def running_node(data_dir, metrics_servers=None, **settings):
    """An in-process bascule node with embedded NATS on free loopback ports; yields (node, address).
    ``metrics_servers``, a list, receives the node's metrics endpoint when the settings configure one."""
    nats_config = data_dir / "nats.conf"
    nats_config.write_text("listen: 127.0.0.1:-1\n")
    overrides = {
        "nats.embedded.config": str(nats_config),
        "data.dir": str(data_dir),
        "port": 0,
        "nats.embedded": True,
        "clustering.raft.bootstrap.seed": True,
        "clustering.raft.listen": "127.0.0.1:0",
        "cursors.stream.partitions": 1,
        **settings,
    }
    config = load_config(None, overrides)
    ready, stop = asyncio.Event(), asyncio.Event()
    node_task = asyncio.create_task(
        run(config, ready=ready, stop=stop, nodes=(nodes := []), metrics_servers=metrics_servers)
    )
    ready_wait = asyncio.create_task(ready.wait())
    done, _ = await asyncio.wait({node_task, ready_wait}, timeout=20, return_when=asyncio.FIRST_COMPLETED)
    if node_task in done:
        node_task.result()
    assert ready.is_set(), "node did not become ready"
    node = nodes[0]
    try:
        yield node, f"127.0.0.1:{node.api_port}"
    finally:
        stop.set()
        await asyncio.wait_for(node_task, 20)


def rot_entry(directory, value: bytes) -> None:
    """Flip a byte of the stored entry holding ``value``, as a disk that rots would."""
    segment = next(directory.glob("*.log"))
    data = bytearray(segment.read_bytes())
    data[data.index(value)] ^= 0xFF
    segment.write_bytes(bytes(data))


def issue(directory, name: str, ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None):
    """A certificate for ``name`` (and localhost, 127.0.0.1) signed by ``ca``, or a CA when ``ca`` is
    None: (certificate, key, cert file, key file)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(ca[0].subject if ca else subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca is None, path_length=None), critical=True)
    )
    if ca is not None:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    certificate = builder.sign(ca[1] if ca else key, hashes.SHA256())
    cert_file, key_file = directory / f"{name}.pem", directory / f"{name}.key"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return certificate, key, cert_file, key_file
