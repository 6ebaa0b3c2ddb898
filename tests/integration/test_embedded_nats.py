import asyncio
import os

import nats
import pytest
from nats.errors import TimeoutError as NatsTimeoutError

from bascule.listening import AddressInUse
from bascule.natsio.server import EmbeddedNats, EmbeddedNatsError, nats_server_path

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def round_trip(url: str, payload: bytes = b"hello") -> bytes:
    nc = await nats.connect(url, connect_timeout=2, max_reconnect_attempts=0)
    try:
        subscription = await nc.subscribe("bascule.test")
        await nc.publish("bascule.test", payload)
        message = await subscription.next_msg(timeout=2)
        return message.data
    finally:
        await nc.close()


async def test_nats_server_path_is_the_wheels_binary():
    path = nats_server_path()
    assert os.path.basename(path) == "nats-server" and os.access(path, os.X_OK)


async def test_start_round_trip_stop():
    server = EmbeddedNats()
    await server.start()
    assert server.url.startswith("nats://127.0.0.1:") and server.port > 0
    assert await round_trip(server.url) == b"hello"
    await server.stop()
    assert not server.running
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", server.port)


async def test_a_config_files_max_payload_and_port_are_honoured(tmp_path):
    config = tmp_path / "nats.conf"
    config.write_text("host: 127.0.0.1\nport: -1\nmax_payload: 2097152\n")
    async with EmbeddedNats(config_file=config) as server:
        nc = await nats.connect(server.url)
        try:
            assert nc.max_payload == 2 * 1024 * 1024
        finally:
            await nc.close()


@pytest.mark.parametrize("logs", ["piped", "to a file"])
async def test_a_bad_config_file_reports_nats_servers_message(tmp_path, logs):
    config = tmp_path / "nats.conf"
    config.write_text("port: -1\nno_such_option: 1\n")
    log_dir = tmp_path if logs == "to a file" else None
    server = EmbeddedNats(config_file=config, log_dir=log_dir)
    expected = '(?s)exited with status 1 while starting:.*unknown field "no_such_option"'
    with pytest.raises(EmbeddedNatsError, match=expected):
        await server.start()
    assert not server.running


async def test_logs_go_to_the_log_dir_and_restarts_append(tmp_path):
    server = EmbeddedNats(log_dir=tmp_path / "logs")
    for _ in range(2):
        await server.start()
        await server.stop()
    assert (tmp_path / "logs" / "nats-server.log").read_text().count("Server is ready") == 2


async def test_a_missing_binary_is_reported(monkeypatch):
    monkeypatch.setattr("sysconfig.get_path", lambda name: "/nonexistent")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(EmbeddedNatsError, match="nats-server not found in /nonexistent or on PATH"):
        await EmbeddedNats().start()


async def test_restart_keeps_the_port_and_clients_reconnect():
    server = EmbeddedNats()
    await server.start()
    first_url = server.url
    reconnected = asyncio.Event()

    async def on_reconnect() -> None:
        reconnected.set()

    nc = await nats.connect(first_url, reconnect_time_wait=0.1, max_reconnect_attempts=-1,
                            reconnected_cb=on_reconnect)
    try:
        await server.stop()
        await server.start()
        assert server.url == first_url
        await asyncio.wait_for(reconnected.wait(), timeout=10)
        subscription = await nc.subscribe("after.restart")
        await nc.publish("after.restart", b"again")
        assert (await subscription.next_msg(timeout=2)).data == b"again"
    finally:
        await nc.close()
        await server.stop()


async def test_paused_server_answers_nothing_until_resumed():
    # Raw protocol: nats-py's read loop breaks on a PONG that arrives after its flush timed out.
    async with EmbeddedNats() as server:
        await server.pause()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(reader.readline(), timeout=0.3)
            server.resume()
            info = await asyncio.wait_for(reader.readline(), timeout=2)
            assert info.startswith(b"INFO ")
        finally:
            writer.close()


async def test_stop_ends_a_paused_server():
    server = EmbeddedNats()
    await server.start()
    await server.pause()
    await server.stop(timeout=5)
    assert not server.running


async def test_kill_ends_the_server_at_once():
    server = EmbeddedNats()
    await server.start()
    await server.kill()
    assert not server.running
    await server.start()  # and it can come back
    assert await round_trip(server.url) == b"hello"
    await server.stop()


async def test_starting_twice_is_an_error():
    async with EmbeddedNats() as server:
        with pytest.raises(EmbeddedNatsError, match="already running"):
            await server.start()


async def test_a_taken_port_is_reported():
    async with EmbeddedNats() as first:
        second = EmbeddedNats(port=first.port)
        with pytest.raises(AddressInUse, match=f"the embedded NATS server cannot listen on 127.0.0.1:{first.port}: "
                                               "address already in use"):
            await second.start()


async def test_cluster_of_two_routes_messages():
    async with EmbeddedNats(cluster_name="c", cluster_listen="nats://127.0.0.1:-1") as first:
        async with EmbeddedNats(cluster_name="c", cluster_listen="nats://127.0.0.1:-1",
                                routes=[first.cluster_url]) as second:
            receiver = await nats.connect(first.url)
            sender = await nats.connect(second.url)
            try:
                subscription = await receiver.subscribe("across")
                await receiver.flush()
                for _ in range(100):  # until the route carries the interest
                    await sender.publish("across", b"routed")
                    try:
                        assert (await subscription.next_msg(timeout=0.05)).data == b"routed"
                        break
                    except NatsTimeoutError:
                        continue
                else:
                    pytest.fail("no message crossed the route")
            finally:
                await sender.close()
                await receiver.close()


async def test_jetstream_with_a_store_dir(tmp_path):
    async with EmbeddedNats(jetstream=True, store_dir=tmp_path / "js") as server:
        nc = await nats.connect(server.url)
        try:
            js = nc.jetstream()
            await js.add_stream(name="S", subjects=["s.>"])
            ack = await js.publish("s.1", b"x")
            assert ack.seq == 1
        finally:
            await nc.close()
    assert (tmp_path / "js" / "jetstream").is_dir()
