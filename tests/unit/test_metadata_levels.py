"""metadata.levels: the level a registration states, and the level the cluster runs at (what every
metadata voter supports), which decides whether the metadata leader journals ChangeLeaders and
ChangeIsrs or each item alone."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from bascule.metadata.levels import BATCHES, LEVEL, cluster_level, incarnation, stated_level
from bascule.metadata.replicated import apply_command
from bascule.metadata.state import Broker, MetadataState
from bascule.wire.commands import RegisterBroker, encode_command


def broker(id: str, raft: str, registered: str) -> Broker:
    return Broker(id, "127.0.0.1", 9292, raft, registered)


def test_this_version_states_the_batches_level() -> None:
    assert LEVEL >= BATCHES
    assert stated_level(incarnation(uuid.uuid4().hex)) == LEVEL
    assert stated_level(incarnation("n1.3", 0)) == 0
    assert stated_level(incarnation("n1.3", 7)) == 7


@pytest.mark.parametrize("registered", [
    uuid.uuid4().hex,  # what every earlier version registers
    "",  # journals from before incarnations
    "n1.3",  # the simulator's before levels
    "abc+L", "abc+L-1", "abc+L+1", "abc+L1.0", "abc+L\uff11", "abc+Lone", "abc+l1",
])
def test_an_incarnation_that_states_no_level_is_at_the_oldest(registered: str) -> None:
    assert stated_level(registered) == 0


def test_the_last_mark_counts() -> None:
    assert stated_level("a+L1+L3") == 3


def test_the_cluster_runs_at_the_level_every_voter_supports() -> None:
    voters = ["r0", "r1", "r2"]
    new = [broker(f"n{i}", f"r{i}", incarnation(f"p{i}", BATCHES)) for i in range(3)]
    assert cluster_level(voters, new) == BATCHES
    one_old = [*new[:2], broker("n2", "r2", uuid.uuid4().hex)]
    assert cluster_level(voters, one_old) == 0


def test_a_voter_no_broker_registered_at_counts_as_the_oldest() -> None:
    """A voter that joined the Raft group and has not registered yet (of whichever version)."""
    registered = [broker(f"n{i}", f"r{i}", incarnation(f"p{i}")) for i in range(2)]
    assert cluster_level(["r0", "r1"], registered) == LEVEL
    assert cluster_level(["r0", "r1", "r2"], registered) == 0


def test_brokers_that_are_not_voters_do_not_count() -> None:
    brokers = [broker("n0", "r0", incarnation("p0")), broker("gone", "r9", uuid.uuid4().hex)]
    assert cluster_level(["r0"], brokers) == LEVEL


def test_a_voter_registered_under_two_ids_counts_at_the_lower_level() -> None:
    """Its data directory lost and its server id made anew, say: which registration is its latest is
    not in the metadata, so the older version's counts."""
    brokers = [broker("old-id", "r0", uuid.uuid4().hex), broker("new-id", "r0", incarnation("p"))]
    assert cluster_level(["r0"], brokers) == 0
    assert cluster_level(["r0"], list(reversed(brokers))) == 0


def test_the_cluster_runs_at_most_at_this_versions_level() -> None:
    """A later version's level (its commands unknown here) is run at this version's."""
    later = [broker(f"n{i}", f"r{i}", incarnation(f"p{i}", LEVEL + 5)) for i in range(3)]
    assert cluster_level(["r0", "r1", "r2"], later) == LEVEL
    assert cluster_level([], later) == LEVEL


def test_a_registration_stating_a_level_is_the_command_earlier_versions_journaled() -> None:
    """The level adds no field: the registration has exactly the fields of d5f2fb0's RegisterBroker,
    whose rule keeps the incarnation as it is (tests/integration/test_mixed_versions.py runs that
    version's code on it)."""
    # d5f2fb0 refuses a registration with any other field, as a request and as a journaled command.
    assert [f.name for f in dataclasses.fields(RegisterBroker)] == ["id", "host", "port", "raft", "incarnation",
                                                                     "unclean"]
    stated = incarnation(uuid.uuid4().hex)
    command = RegisterBroker(id="n0", host="h", port=1, raft="r0", incarnation=stated, unclean=False)
    state, refused = apply_command(MetadataState(), encode_command(command))
    assert refused is None
    assert state.brokers["n0"].incarnation == stated
    assert cluster_level(["r0"], state.brokers.values()) == LEVEL
