"""`bascule server` as a user starts it: a config file, embedded NATS, Raft seed; driven by gufo-liftbridge."""

import asyncio
import os
import pwd
import socket
import subprocess
import sys
import time

import nats
import pytest
from gufo.liftbridge.client import LiftbridgeClient
from gufo.liftbridge.error import ErrorNotFound
from gufo.liftbridge.types import StartPosition

from bascule.client import Client
from bascule.testing import free_port

pytestmark = pytest.mark.anyio


def port_or_free(port: int) -> int:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return free_port()
    return port


async def take(iterator, count):
    out = []
    async for item in iterator:
        out.append(item)
        if len(out) == count:
            return out


async def test_gufo_against_server_started_from_config_file(tmp_path):
    api_port, nats_port = port_or_free(9292), port_or_free(4222)
    config = tmp_path / "bascule.yaml"
    config.write_text(f"listen: 127.0.0.1:{api_port}\ncursors: {{stream.partitions: 1}}\n")
    command = [sys.executable, "-m", "bascule.cli", "server", "-c", str(config), "-d", str(tmp_path / "data"),
               "--embedded-nats", "--raft-bootstrap-seed"]
    if nats_port != 4222:
        (tmp_path / "nats.conf").write_text(f"listen: 127.0.0.1:{nats_port}\n")
        command += ["--nc", str(tmp_path / "nats.conf")]
    log = open(tmp_path / "server.log", "wb")
    started = time.monotonic()
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        address = f"127.0.0.1:{api_port}"
        async with Client(address) as client:
            await client.wait_ready(deadline=15)
        ready_after = time.monotonic() - started
        assert ready_after < 5, f"ready only after {ready_after:.1f} s"
        async with LiftbridgeClient([address]) as lb:
            await lb.create_stream("orders", subject="orders.in", partitions=1, wait_for_stream=True)
            meta = await lb.get_metadata()
            assert [p.leader for s in meta.metadata if s.name == "orders" for p in s.partitions.values()] == [
                meta.brokers[0].id
            ]
            nc = await nats.connect(f"nats://127.0.0.1:{nats_port}")
            await nc.publish("orders.in", b"plain")
            await nc.drain()
            await lb.publish(b"enveloped", stream="orders", headers={"trace": b"t1"}, key=b"k")
            await asyncio.sleep(0.3)
            got = await asyncio.wait_for(take(lb.subscribe("orders", start_position=StartPosition.EARLIEST), 2), 10)
            assert [(m.offset, m.value) for m in got] == [(0, b"plain"), (1, b"enveloped")]
            assert got[1].headers["trace"] == b"t1" and got[1].key == b"k"
            again = await asyncio.wait_for(take(lb.subscribe("orders", start_offset=1), 1), 10)
            assert again[0].value == b"enveloped"
            await lb.set_cursor(stream="orders", partition=0, cursor_id="reader", offset=1)
            assert await lb.get_cursor(stream="orders", partition=0, cursor_id="reader") == 2
            with pytest.raises(ErrorNotFound):
                await lb.delete_stream("never-created")
    finally:
        server.terminate()
        assert server.wait(15) == 0, (tmp_path / "server.log").read_text()[-3000:]


async def test_bad_config_stops_the_server_with_a_message_naming_the_key(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("clustering:\n  replica.max.lag.time: soon\n")
    done = subprocess.run([sys.executable, "-m", "bascule.cli", "server", "-c", str(config)],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "clustering.replica.max.lag.time" in done.stderr


def run_server(*flags: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bascule.cli", "server", *flags], capture_output=True, text=True,
                          timeout=30, env={**os.environ, **(env or {})})


async def test_a_raft_address_beyond_loopback_without_a_password_stops_the_server_at_start(tmp_path):
    done = run_server("-d", str(tmp_path / "data"), "--embedded-nats", "--raft-bootstrap-seed",
                      "--raft-listen", "10.99.99.99:9393", env={"BASCULE_RAFT_PASSWORD": ""})
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("bascule server: clustering.raft.listen, clustering.raft.password: the Raft "
                                  "address 10.99.99.99:9393 is not a loopback address")
    assert "remote code execution" in done.stderr
    assert not (tmp_path / "data").exists()  # refused before anything was made


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
async def test_a_data_dir_of_another_user_stops_the_server_at_start(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    nobody = pwd.getpwnam("nobody").pw_uid
    os.chown(data_dir, nobody, -1)
    done = run_server("-d", str(data_dir), "--embedded-nats", "--raft-bootstrap-seed")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"bascule server: data.dir: {data_dir} belongs to uid {nobody} (nobody)")
    assert os.listdir(data_dir) == [] and os.stat(data_dir).st_uid == nobody
