"""Where a publish goes when the metadata names this node the partition's leader before its replica
is open here: a restarted node serves its API (and the metadata, replayed) a moment before its reconcile
has opened its partitions. Nothing captures the partition's subject until this node leads it, so a
publish sent through NATS then was lost, and its client waited out its deadline (the flake of
tests/integration/test_power_cut.py: the ack-ALL marker published right after the restart)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from bascule.api.publish import PublishRPCs, _AsyncCall
from bascule.api.status import PublishError
from bascule.config import Config
from bascule.h2grpc import Status
from bascule.h2grpc.messages import frame
from bascule.metadata.state import MetadataState
from bascule.partition.replica import NotLeader
from bascule.wire.commands import command_from_map
from bascule.wire.pb import api_pb2

pytestmark = pytest.mark.anyio
LEADER_TIMEOUT = 0.3


def apply(state: MetadataState, op: str, **fields) -> MetadataState:
    state, result = state.apply(command_from_map({"op": op, **fields}))
    assert result is None
    return state


def one_partition_led_by(here: str) -> MetadataState:
    state = MetadataState()
    for broker in ("a", "b"):
        state = apply(state, "register_broker", id=broker, host="h", port=1, raft=f"h:{broker}")
    return apply(state, "create_stream", name="s", subject="foo", group="", created=1, settings={},
                 replicas=[[here, "b" if here == "a" else "a"]])


class Node:
    """Node "a": its metadata, its replicas (none open until `open_leading`) and its publishing, with
    `until_leading` as `node.partitions.Partitions` waits (the metadata names another leader, or the
    replica leads, or a leader timeout passes)."""

    server_id = "a"

    def __init__(self, state: MetadataState) -> None:
        self.state = state
        self.stream_defaults = Config().stream_defaults
        self.local: SimpleNamespace | None = None
        self.changed = asyncio.Event()
        self.appended: list[bytes] = []
        self.through_nats: list[api_pb2.PublishRequest] = []
        self.forwarded: list[tuple[str, api_pb2.PublishRequest]] = []
        self.max_message_bytes = self.max_forwarded_bytes = 1 << 20

    # Cluster
    async def catch_up(self) -> None:
        pass

    def set_state(self, state: MetadataState) -> None:
        self.state = state
        self.changed.set()

    # Replicas
    def get(self, stream: str, partition: int) -> SimpleNamespace | None:
        return self.local

    def open_leading(self) -> None:
        self.local = SimpleNamespace(replica=SimpleNamespace(is_leader=True, concurrency_control=False),
                                     subject="foo")
        self.changed.set()

    async def until_leading(self, stream: str, partition: int) -> SimpleNamespace | None:
        deadline = asyncio.get_running_loop().time() + LEADER_TIMEOUT
        while True:
            if self.state.partition(stream, partition).leader != self.server_id:
                return None
            if self.local is not None and self.local.replica.is_leader:
                return self.local
            self.changed.clear()
            try:
                async with asyncio.timeout(deadline - asyncio.get_running_loop().time()):
                    await self.changed.wait()
            except TimeoutError:
                return self.local

    # Publishing
    def new_ack_inbox(self) -> str:
        return "inbox"

    async def publish(self, replica, subject, record, policy, correlation_id, expected_offset=-1, inbox=""):
        self.appended.append(record.value)
        return api_pb2.Ack(stream="s", offset=len(self.appended) - 1, correlationId=correlation_id)

    async def publish_remote(self, request: api_pb2.PublishRequest, wait: bool) -> api_pb2.Ack | None:
        self.through_nats.append(request)
        if wait:
            await asyncio.Event().wait()  # nobody captures the subject: no ack ever comes
        return None

    def forward_burst(self, leader, stream, partition, requests, on_acks, inbox=""):
        self.forwarded.extend((leader, request) for request in requests)
        response = api_pb2.PublishResponse(ack=api_pb2.Ack(stream="s", offset=7), correlationId="1")
        on_acks([0], frame([response.SerializeToString()]), None)


def rpcs_of(node: Node) -> PublishRPCs:
    return PublishRPCs(node, node, node)


def request(ack_policy: int = api_pb2.AckPolicy.ALL) -> api_pb2.PublishRequest:
    return api_pb2.PublishRequest(stream="s", partition=0, value=b"marker", correlationId="1", ackPolicy=ack_policy)


async def test_a_publish_named_here_before_the_replica_opens_waits_for_it_to_lead():
    """Before the fix it went through NATS (publish_remote) and was never acked."""
    node = Node(one_partition_led_by("a"))
    publishing = asyncio.create_task(rpcs_of(node).publish(request(), wait=True))
    await asyncio.sleep(0.05)  # the reconcile opening the replica is slow (a loaded machine)
    assert not publishing.done()
    node.open_leading()
    ack = await asyncio.wait_for(publishing, 1.0)
    assert (ack.offset, node.appended, node.through_nats) == (0, [b"marker"], [])


async def test_an_ack_none_publish_named_here_waits_too():
    node = Node(one_partition_led_by("a"))
    node.open_leading()
    node.local = None  # opened after the publish came
    publishing = asyncio.create_task(rpcs_of(node).publish(request(api_pb2.AckPolicy.NONE), wait=False))
    await asyncio.sleep(0.05)
    node.open_leading()
    node.local.replica.submit = lambda records, **_: node.appended.extend(r.value for r in records)
    assert await asyncio.wait_for(publishing, 1.0) is None
    assert (node.appended, node.through_nats) == ([b"marker"], [])


async def test_a_replica_that_does_not_open_within_a_leader_timeout_is_unavailable_not_sent_through_nats():
    node = Node(one_partition_led_by("a"))
    with pytest.raises(NotLeader):
        await asyncio.wait_for(rpcs_of(node).publish(request(), wait=True), 1.0)
    assert node.through_nats == []


async def test_a_leader_elected_elsewhere_meanwhile_gets_the_publish_forwarded():
    node = Node(one_partition_led_by("a"))
    publishing = asyncio.create_task(rpcs_of(node).publish(request(), wait=True))
    await asyncio.sleep(0.05)
    node.set_state(apply(node.state, "change_leader", name="s", partition=0, leader="b", leader_epoch=0,
                         isr=["b"]))
    ack = await asyncio.wait_for(publishing, 1.0)
    assert ack.offset == 7
    assert [leader for leader, _ in node.forwarded] == ["b"] and node.through_nats == []


async def test_a_publish_naming_an_ack_inbox_still_goes_through_nats():
    """Liftbridge's contract: the leader acks to that inbox, from what it captures."""
    node = Node(one_partition_led_by("a"))
    named = request()
    named.ackInbox = "my.inbox"
    publishing = asyncio.create_task(rpcs_of(node).publish(named, wait=True))
    await asyncio.sleep(0.05)
    assert [r.ackInbox for r in node.through_nats] == ["my.inbox"]
    publishing.cancel()


async def test_a_deleted_stream_is_not_found_as_before():
    node = Node(one_partition_led_by("a"))
    node.set_state(apply(node.state, "delete_stream", name="s"))
    with pytest.raises(PublishError) as refused:
        await rpcs_of(node).publish(request(), wait=True)
    assert refused.value.status == Status.NOT_FOUND


# ---- PublishAsync: a refusal from metadata this node has not caught up on ----------------------------


def readonly(state: MetadataState, value: bool) -> MetadataState:
    return apply(state, "set_readonly", name="s", partitions=[0], readonly=value, at=1)


class LaggingNode(Node):
    """Node "a", following the partition led by "b": its metadata lags the metadata leader's
    (``leader_state``) until it catches up."""

    def __init__(self, state: MetadataState) -> None:
        super().__init__(state)
        self.leader_state = state
        self.catch_ups = 0

    async def catch_up(self) -> None:
        self.catch_ups += 1
        await asyncio.sleep(0)
        self.set_state(self.leader_state)


def async_call(node: Node) -> _AsyncCall:
    return _AsyncCall(rpcs_of(node), context=None)


def answers(call: _AsyncCall) -> list[str]:
    """The call's responses so far: "ack" or the refusal's message, in order."""
    found = []
    for framed in call.ready:
        response = api_pb2.PublishResponse.FromString(framed[5:])
        found.append(response.asyncError.message or "ack")
    call.ready.clear()
    return found


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_publish_after_the_partition_was_made_writable_again_is_taken_though_one_was_refused_before():
    """lbtool's ro.publish_after_unset on three nodes: a call's publish was refused while the
    partition was readonly (the node caught up, and refused it rightly); the partition was made
    writable again through another node, whose answer came back before the next publish was sent;
    this node had not yet applied that change. Refused at once as caught up before, the publish is
    now refused only after a catch-up that asked after it came."""
    node = LaggingNode(readonly(one_partition_led_by("b"), True))
    call = async_call(node)
    call.take([(request(), None)])
    await settle()
    assert answers(call) == ["Partition is readonly"] and node.catch_ups == 1

    node.leader_state = readonly(node.state, False)  # applied by the metadata leader, not yet here
    call.take([(request(), None)])
    await settle()
    assert answers(call) == ["ack"] and node.catch_ups == 2
    assert [leader for leader, _ in node.forwarded] == ["b"]


async def test_publishes_held_for_one_catch_up_are_refused_after_it_without_another():
    """Requests that come while a catch-up is on its way wait for it; those it answers for (held
    when it asked) are refused on its outcome, and only a later one asks again: a flood of publishes
    to a readonly partition costs a catch-up per round trip, not one per publish."""
    node = LaggingNode(readonly(one_partition_led_by("b"), True))
    call = async_call(node)
    call.take([(request(), None), (request(), None), (request(), None)])
    await settle()
    assert answers(call) == ["Partition is readonly"] * 3 and node.catch_ups == 1
