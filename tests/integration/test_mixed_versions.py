"""A cluster being upgraded (issue 32's gap): one of three nodes runs the code of d5f2fb0, the last
version before batched elections, which refuses ChangeLeaders and ChangeIsrs as unknown commands.

The node of this version that leads the metadata must see from the registrations that a voter states
no metadata level (the oldest), and propose each election and ISR change as its own ChangeLeader and
ChangeIsr: when the node leading a third of the partitions is killed, every survivor's metadata,
the old node's too, agrees on each partition's new leader and ISR, and nothing acked is lost. Without
the gate the old node kept the dead leaders of the partitions elected in batches (and did not lead
those it was elected for).

The old node runs from ``git archive d5f2fb0`` with its C extensions built in place (about 2 s),
started with PYTHONPATH pointing at it; the test skips where the repository's history is not there.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import msgpack
import pytest
from cluster_checks import raft_leader_index, wait_for

from bascule.client import Client, RoundRobin
from bascule.metadata import levels
from bascule.testing.local import LocalCluster
from bascule.wire.commands import RegisterBroker, encode_command

pytestmark = [pytest.mark.anyio, pytest.mark.cluster, pytest.mark.timeout(240)]

OLD_VERSION = "d5f2fb0"  # the last commit without ChangeLeaders and ChangeIsrs
REPOSITORY = Path(__file__).resolve().parents[2]
OLD = 2  # the index of the node that runs the old version
CONFIG = {
    "clustering.replica.max.leader.timeout": "2s",
    "clustering.replica.max.lag.time": "4s",
    "clustering.replica.max.idle.wait": "500ms",
    "clustering.replica.fetch.timeout": "1s",
    "clustering.min.insync.replicas": 2,
}
PARTITIONS = 90  # each node leads about 30
PER_PARTITION = 3
STREAM = "mixed"


@pytest.fixture(scope="module")
def old_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The src directory of d5f2fb0, its C extensions built in place."""
    found = subprocess.run(["git", "-C", str(REPOSITORY), "cat-file", "-e", f"{OLD_VERSION}^{{commit}}"],
                           capture_output=True, check=False)
    if found.returncode != 0:
        pytest.skip(f"commit {OLD_VERSION} is not in this checkout's history (a shallow clone?)")
    tree = tmp_path_factory.mktemp("bascule-" + OLD_VERSION)
    archive = subprocess.run(["git", "-C", str(REPOSITORY), "archive", OLD_VERSION, "pyproject.toml", "src"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    subprocess.run([sys.executable, "-c", "import setuptools; setuptools.setup()", "build_ext", "--inplace", "-q"],
                   cwd=tree, capture_output=True, check=True)
    return tree / "src"


# Run by d5f2fb0's code: its metadata leader's check of a register_broker request and its voters' apply of
# the journaled command, on a registration of this version; and its check of one with a field it does not know.
EARLIER_VERSION_REGISTERS = """
import sys, msgpack, bascule
from bascule.metadata.replicated import apply_command
from bascule.metadata.state import MetadataState
from bascule.wire.commands import CommandError, validate_request
args = msgpack.unpackb(sys.stdin.buffer.read())
command = args.pop("command")
validate_request("register_broker", args)
state, refused = apply_command(MetadataState(), command)
try:
    validate_request("register_broker", {**args, "level": 1})
    extra = "taken"
except CommandError as exc:
    extra = str(exc)
print(bascule.__file__, refused, state.brokers[args["id"]].incarnation, extra, sep="\\n")
"""


def test_an_earlier_version_registers_a_broker_that_states_its_level(old_source: Path) -> None:
    """The level travels in the incarnation because an earlier version refuses a registration with a
    field it does not know; with the level in the incarnation, its metadata leader takes the request
    and its voters apply the command as this version does."""
    registration = {"id": "node-0", "host": "127.0.0.1", "port": 9292, "raft": "127.0.0.1:9293",
                    "incarnation": levels.incarnation(uuid.uuid4().hex), "unclean": True}
    command = encode_command(RegisterBroker(**registration))
    ran = subprocess.run([sys.executable, "-c", EARLIER_VERSION_REGISTERS],
                         input=msgpack.packb({**registration, "command": command}),
                         env={**os.environ, "PYTHONPATH": str(old_source)}, capture_output=True, check=True)
    module, refused, registered, extra = ran.stdout.decode().splitlines()
    assert Path(module).is_relative_to(old_source)
    assert (refused, registered) == ("None", registration["incarnation"])
    assert extra == "register_broker: unexpected fields ['level']"


async def partitions(address: str) -> dict:
    async with Client(address, timeout=5) as client:
        return (await client.fetch_metadata(STREAM)).streams[STREAM].partitions


def summary(view: dict) -> dict[int, tuple[str, tuple[str, ...]]]:
    return {p: (info.leader, tuple(sorted(info.isr))) for p, info in view.items()}


async def test_an_old_voter_agrees_on_every_election_and_isr_change_of_a_mass_failover(old_source: Path) -> None:
    cluster = LocalCluster(3, config=CONFIG)
    cluster.node(OLD).extra_env["PYTHONPATH"] = str(old_source)
    with cluster:
        # The metadata leader must be of this version: the old one journals single commands anyway.
        leader = await wait_for(lambda: raft_leader_index(cluster), 30, "a metadata leader", cluster)
        if leader == OLD:
            await asyncio.to_thread(cluster.restart, OLD)  # its graceful stop hands the leadership on
            leader = await wait_for(lambda: raft_leader_index(cluster), 30, "a metadata leader", cluster)
        assert leader != OLD

        async with Client(cluster.brokers[0], timeout=60) as client:
            await client.create_stream(STREAM, f"{STREAM}.in", replication_factor=3, partitions=PARTITIONS,
                                       min_isr=2)

        async def full_isr() -> dict | None:
            found = await partitions(cluster.brokers[0])
            return found if len(found) == PARTITIONS and all(len(p.isr) == 3 for p in found.values()) else None

        before = await wait_for(full_isr, 60, "every partition with a leader and a full ISR", cluster)
        values = [f"m{i}".encode() for i in range(PARTITIONS * PER_PARTITION)]
        async with Client(cluster.brokers[leader], timeout=60) as client:
            acks = await client.publish_many(STREAM, values, partitioner=RoundRobin(), ack_policy="all")
        acked = {(ack.partition, ack.offset): value for ack, value in zip(acks, values)}
        assert len(acked) == len(values)

        # The victim: the other node of this version, so that the metadata leader stays.
        victim = 3 - OLD - leader
        victim_id = cluster.server_ids[victim]
        led = Counter(p.leader for p in before.values())[victim_id]
        assert led >= 20, f"{victim_id} leads only {led}"
        survivors = [leader, OLD]
        cluster.kill(victim)
        killed_at = time.monotonic()

        async def agreed() -> dict | None:
            views = [summary(view) for view in await asyncio.gather(*(partitions(cluster.brokers[i])
                                                                      for i in survivors))]
            if views[0] != views[1] or len(views[0]) != PARTITIONS:
                return None
            settled = all(leader_id != victim_id and victim_id not in isr for leader_id, isr in views[0].values())
            return views[0] if settled else None

        final = await wait_for(agreed, 60, f"both survivors agreeing on new leaders and ISRs without {victim_id}",
                               cluster, interval=0.2)
        print(f"{led} partitions of {victim_id} re-led, agreed on by the old node {time.monotonic() - killed_at:.2f} s "
              f"after the kill; leaders now {Counter(leader_id for leader_id, _ in final.values())}")
        log = (cluster.node(leader).stored_dir / "bascule.log").read_text()
        assert "elections in one command" not in log
        print(f"the metadata leader proposed {log.count('one by one: a metadata voter does not know')} batches item "
              "by item")

        # Every partition is led for real: what was acked with ALL before the kill reads back.
        async with Client(cluster.brokers[leader], timeout=10) as client:
            semaphore = asyncio.Semaphore(16)

            async def read(partition: int) -> list[tuple[int, bytes]]:
                async with semaphore:
                    return await wait_for(lambda: _complete(client, partition), 30,
                                          f"partition {partition} read back", cluster)

            read_back = await asyncio.gather(*(read(p) for p in range(PARTITIONS)))
        stored = {(p, offset): value for p, found in enumerate(read_back) for offset, value in found}
        lost = {key: value for key, value in acked.items() if stored.get(key) != value}
        assert not lost, f"{len(lost)} acked messages lost or changed, e.g. {sorted(lost.items())[:5]}"


async def _complete(client: Client, partition: int) -> list[tuple[int, bytes]] | None:
    found = []
    async for message in client.subscribe(STREAM, partition, start="earliest", stop_latest=True,
                                          resubscribe_wait=1.0):
        found.append((message.offset, message.value))
        if len(found) >= PER_PARTITION:
            break
    return found if len(found) >= PER_PARTITION else None
