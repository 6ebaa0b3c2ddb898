"""Cluster formation (seed + join over NATS, bootstrap peers, Raft password) and the admin CLI."""

import asyncio
import json
import subprocess
import sys
import time

import pytest

from bascule.client import Client
from bascule.testing.local import LocalCluster, LocalNatsServer, LocalNode

pytestmark = [pytest.mark.anyio, pytest.mark.cluster]


def cli(*args: str) -> dict | list:
    done = subprocess.run([sys.executable, "-m", "bascule.cli", *args, "--json"], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def test_status_and_partitions_describe_the_cluster():
    with LocalCluster(3, config={"clustering.raft.password": "s3cret"}) as cluster:
        async with Client(cluster.brokers[0]) as client:
            await client.create_stream("described", "described", replication_factor=3, partitions=2)
            await client.publish_many("described", [b"x"] * 50, ack_policy="all")
        status = cli("status", "-a", cluster.brokers[1])
        assert {b["id"] for b in status["brokers"]} == set(cluster.server_ids)
        assert status["raftLeaderId"] in cluster.server_ids and status["term"] >= 1
        assert len(status["voters"]) == 3 and all(v["matchIndex"] >= 0 for v in status["voters"])
        assert sum(v["leader"] for v in status["voters"]) == 1
        partitions = cli("partitions", "described", "-a", cluster.brokers[2])
        assert [p["partition"] for p in partitions] == [0, 1]
        first = partitions[0]
        assert first["highWatermark"] == 49 and sorted(first["isr"]) == sorted(cluster.server_ids)
        assert [r["logEndOffset"] for r in first["replicaStatus"]] == [50, 50, 50]
        assert all(r["lag"] == 0 and r["reachable"] for r in first["replicaStatus"])


SHARED_SECRET = {"BASCULE_RAFT_PASSWORD": "the cluster's secret"}


async def _metadata(address: str):
    async with Client(address) as client:
        return await client.fetch_metadata()


async def test_nodes_join_a_seed_over_nats_and_rejoin_after_restart(tmp_path):
    nats_server = LocalNatsServer(tmp_path / "nats.log")
    nats_server.start()
    try:
        seed = LocalNode(tmp_path / "seed", server_id="seed", nats_servers=nats_server.url, raft_bootstrap_seed=True,
                         env=SHARED_SECRET)
        joiners = [LocalNode(tmp_path / f"j{i}", server_id=f"j{i}", nats_servers=nats_server.url, env=SHARED_SECRET)
                   for i in range(2)]
        # With another secret than the cluster's, a node's join request is dropped: it never becomes a voter.
        stranger = LocalNode(tmp_path / "stranger", server_id="stranger", nats_servers=nats_server.url,
                             env={"BASCULE_RAFT_PASSWORD": "not the cluster's"})
        nodes = [seed, *joiners, stranger]
        try:
            seed.start()
            stranger.start(wait=False)
            for node in joiners:
                node.start()
            for node in (seed, *joiners):
                node.wait_ready(brokers=["seed", "j0", "j1"])
            async with Client(joiners[1].address) as client:
                await client.create_stream("joined", "joined", replication_factor=3)
                acks = await client.publish_many("joined", [b"a", b"b"], ack_policy="all")
                assert [a.offset for a in acks] == [0, 1]
            joiners[0].kill()
            joiners[0].start()
            status = cli("status", "-a", joiners[0].address)
            assert len(status["voters"]) == 3
            assert "stranger" not in (await _metadata(seed.address)).brokers
            async with Client(joiners[0].address) as client:
                for _ in range(100):
                    isr = (await client.fetch_metadata("joined")).streams["joined"].partitions[0].isr
                    if len(isr) == 3:
                        break
                    await asyncio.sleep(0.1)
                assert len(isr) == 3
        finally:
            for node in nodes:
                node.kill()
    finally:
        nats_server.kill()


async def test_two_nodes_joining_at_once_both_become_voters(tmp_path):
    """Both joiners' membership changes go in (pysyncobj 0.3 does not hold a second change back until
    the first commits), and every node ends up counting three voters."""
    nats_server = LocalNatsServer(tmp_path / "nats.log")
    nats_server.start()
    try:
        seed = LocalNode(tmp_path / "seed", server_id="seed", nats_servers=nats_server.url, raft_bootstrap_seed=True,
                         env=SHARED_SECRET)
        joiners = [LocalNode(tmp_path / f"j{i}", server_id=f"j{i}", nats_servers=nats_server.url, env=SHARED_SECRET)
                   for i in range(2)]
        nodes = [seed, *joiners]
        try:
            seed.start()
            for node in joiners:
                node.start(wait=False)
            for node in nodes:
                await asyncio.to_thread(node.wait_ready, 30, ["seed", "j0", "j1"])
            for node in nodes:
                for _ in range(50):
                    voters = cli("status", "-a", node.address)["voters"]
                    if len(voters) == 3:
                        break
                    await asyncio.sleep(0.2)
                assert len(voters) == 3, (node.server_id, voters)
            async with Client(joiners[1].address) as client:
                await client.create_stream("both", "both", replication_factor=3)
                acks = await client.publish_many("both", [b"a", b"b"], ack_policy="all")
                assert [a.offset for a in acks] == [0, 1]
        finally:
            for node in nodes:
                node.kill()
    finally:
        nats_server.kill()



async def test_a_rogue_nats_responder_does_not_block_metadata_changes_through_a_follower():
    """A plain NATS client answering every request in the cluster's namespace with garbage, faster
    than any node: CreateStream through a node that is not the metadata leader still succeeds, the
    forwarded request waiting for the leader's sealed reply and ignoring the rogue's."""
    import nats

    with LocalCluster(3, config={"clustering.raft.password": "s3cret"}) as cluster:
        rogue = await nats.connect(cluster.nats_url)
        answered = 0

        async def answer_garbage(message) -> None:
            nonlocal answered
            if message.reply:
                answered += 1
                await message.respond(b"x")

        await rogue.subscribe("liftbridge-default.>", cb=answer_garbage)
        try:
            async with Client(cluster.brokers[0]) as client:
                leader = (await client.status())["raftLeaderId"]
            follower = next(address for server_id, address in zip(cluster.server_ids, cluster.brokers, strict=True)
                            if server_id != leader)
            async with Client(follower) as client:
                await client.create_stream("rogue-proof", "rogue-proof", replication_factor=3)
                await client.publish("rogue-proof", b"kept", ack_policy="all")
                metadata = await client.fetch_metadata("rogue-proof")
            assert "rogue-proof" in metadata.streams
            assert answered > 0
        finally:
            await rogue.close()


def test_a_node_that_must_join_without_a_secret_to_share_exits_at_once_naming_the_fix(tmp_path):
    """A Liftbridge configuration (no password) for a node that is no seed: it could never join, so it
    says why at start instead of waiting for a join that never comes."""
    nats_server = LocalNatsServer(tmp_path / "nats.log")
    nats_server.start()
    joiner = LocalNode(tmp_path / "joiner", nats_servers=nats_server.url)
    try:
        joiner.start(wait=False)
        deadline = time.monotonic() + 15
        while joiner.running and time.monotonic() < deadline:
            time.sleep(0.1)
        assert joiner.returncode not in (None, 0)
        log = joiner.log_tail(20)
        assert "clustering.raft.password: empty" in log and "BASCULE_RAFT_PASSWORD" in log, log
        assert "clustering.raft.insecure: true" in log
    finally:
        joiner.kill()
        nats_server.kill()


def test_nodes_with_the_insecure_development_secret_form_a_cluster_on_one_machine(tmp_path):
    nats_server = LocalNatsServer(tmp_path / "nats.log")
    nats_server.start()
    insecure = {"clustering.raft.insecure": True}
    seed = LocalNode(tmp_path / "seed", server_id="seed", nats_servers=nats_server.url, raft_bootstrap_seed=True,
                     config=insecure)
    joiner = LocalNode(tmp_path / "joiner", server_id="joiner", nats_servers=nats_server.url, config=insecure)
    try:
        seed.start()
        joiner.start()
        for node in (seed, joiner):
            node.wait_ready(brokers=["seed", "joiner"])
        status = cli("status", "-a", joiner.address)
        assert len(status["voters"]) == 2
    finally:
        for node in (seed, joiner):
            node.kill()
        nats_server.kill()
