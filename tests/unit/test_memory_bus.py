"""The in-memory bus (bascule.testing.bus): NATS subjects as the replication shells use them, and
seeded faults that replay."""

from __future__ import annotations

import asyncio
import random

import pytest

from bascule.natsio.transport import Transport
from bascule.testing.bus import BusMessage, Faults, MemoryBus

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(10)]


class Inbox:
    """A subscription's handler that keeps what it got."""

    def __init__(self) -> None:
        self.messages: list[BusMessage] = []

    async def __call__(self, message: BusMessage) -> None:
        self.messages.append(message)

    @property
    def data(self) -> list[bytes]:
        return [m.data for m in self.messages]


async def settle(seconds: float = 0.02) -> None:
    await asyncio.sleep(seconds)


async def echo_on(transport: Transport, subject: str) -> None:
    async def answer(message) -> None:
        await transport.publish(message.reply, b"echo " + message.data)

    await transport.subscribe(subject, answer)


async def test_a_message_goes_to_every_subscription_of_exactly_its_subject() -> None:
    bus = MemoryBus(seed=1)
    on_a_at_l, on_a_at_f, on_ab = Inbox(), Inbox(), Inbox()
    await bus.node("L").subscribe("a", on_a_at_l)
    await bus.node("F").subscribe("a", on_a_at_f)
    await bus.node("F").subscribe("a.b", on_ab)
    await bus.node("L").publish("a", b"one", reply="r")
    await settle()
    assert on_a_at_l.messages == on_a_at_f.messages == [BusMessage("a", b"one", "r")]
    assert on_ab.messages == []


async def test_a_request_gets_the_first_reply_on_an_inbox_of_its_own() -> None:
    bus = MemoryBus(seed=1)
    await echo_on(bus.node("L"), "fetch")
    reply = await bus.node("F").request("fetch", b"hello", timeout=1.0)
    assert reply.data == b"echo hello"
    assert reply.subject.startswith("_INBOX.F.")
    assert bus.pending == 0 and bus.subscription_count == 1  # the inbox went with the request


async def test_a_request_nobody_answers_times_out() -> None:
    bus = MemoryBus(seed=1)
    with pytest.raises(TimeoutError):
        await bus.node("F").request("nobody", b"?", timeout=0.05)
    assert bus.tally.unrouted == 1
    assert bus.subscription_count == 0


async def test_a_subscription_takes_its_messages_one_at_a_time_in_order_and_outlives_a_failing_handler() -> None:
    bus = MemoryBus(seed=1)
    running, seen = 0, []

    async def slow(message: BusMessage) -> None:
        nonlocal running
        running += 1
        assert running == 1
        await asyncio.sleep(0.001)
        seen.append(message.data)
        running -= 1
        if message.data == b"2":
            raise RuntimeError("a handler's bug")

    await bus.node("L").subscribe("s", slow)
    for i in range(5):
        await bus.node("F").publish("s", b"%d" % i)
    await settle(0.05)
    assert seen == [b"0", b"1", b"2", b"3", b"4"]


async def test_unsubscribed_nothing_more_arrives() -> None:
    bus = MemoryBus(seed=1, faults=Faults(delay=(0.01, 0.01)))
    inbox = Inbox()
    subscription = await bus.node("L").subscribe("s", inbox)
    await bus.node("F").publish("s", b"in flight")
    await subscription.unsubscribe()
    await bus.node("F").publish("s", b"after")
    await settle()
    assert inbox.messages == [] and bus.pending == 0


async def test_garbage_payloads_pass_through_untouched() -> None:
    bus = MemoryBus(seed=1)
    inbox = Inbox()
    await bus.node("L").subscribe("s", inbox)
    rng = random.Random(3)
    payloads = [b"", b"\x00" * 100, bytes(rng.randrange(256) for _ in range(5000)), bytes(range(256))]
    for payload in payloads:
        await bus.node("F").publish("s", payload)
    await settle()
    assert inbox.data == payloads


async def test_a_payload_over_the_maximum_is_refused() -> None:
    bus = MemoryBus(seed=1, max_payload=10)
    assert bus.node("F").max_payload == 10
    with pytest.raises(ValueError):
        await bus.node("F").publish("s", b"x" * 11)


async def faulty_run(seed: int) -> tuple[list, list[bytes]]:
    bus = MemoryBus(seed, Faults(drop=0.3, duplicate=0.3, delay=(0.0, 0.01)))
    inbox = Inbox()
    await bus.node("L").subscribe("s", inbox)
    for i in range(300):
        await bus.node("F").publish("s", b"%d" % i)
    await settle(0.05)
    return list(bus.trace), sorted(inbox.data)


async def test_the_same_seed_gives_the_same_fates_and_deliveries() -> None:
    first_trace, first_arrivals = await faulty_run(seed=42)
    again_trace, again_arrivals = await faulty_run(seed=42)
    other_trace, _ = await faulty_run(seed=43)
    assert first_trace == again_trace and first_arrivals == again_arrivals
    assert other_trace != first_trace
    outcomes = {fate.outcome for fate in first_trace}
    assert outcomes == {"sent", "dropped"}
    assert len(first_arrivals) == sum(fate.outcome == "sent" for fate in first_trace)


async def test_drops_and_duplicates_come_at_their_rates() -> None:
    bus = MemoryBus(seed=5, faults=Faults(drop=0.2, duplicate=0.25))
    inbox = Inbox()
    await bus.node("L").subscribe("s", inbox)
    for i in range(2000):
        await bus.node("F").publish("s", b"%d" % i)
    await settle()
    assert 300 < bus.tally.dropped < 500
    assert 300 < bus.tally.duplicated < 500  # a quarter of the 1600 left
    assert len(inbox.messages) == 2000 - bus.tally.dropped + bus.tally.duplicated == bus.tally.delivered
    assert all(inbox.data.count(b"%d" % i) <= 2 for i in range(0, 2000, 97))


async def test_delays_reorder_and_without_them_order_holds() -> None:
    for faults, reordered in ((Faults(delay=(0.0, 0.02)), True), (Faults(), False)):
        bus = MemoryBus(seed=9, faults=faults)
        inbox = Inbox()
        await bus.node("L").subscribe("s", inbox)
        sent = [b"%d" % i for i in range(100)]
        for payload in sent:
            await bus.node("F").publish("s", payload)
        await settle(0.05)
        assert sorted(inbox.data) == sorted(sent)
        assert (inbox.data != sent) == reordered


async def two_way_traffic(bus: MemoryBus) -> tuple[list[bytes], list[bytes]]:
    """What L and F each hear of one message from the other."""
    at_l, at_f = Inbox(), Inbox()
    subscriptions = [await bus.node("L").subscribe("to-l", at_l), await bus.node("F").subscribe("to-f", at_f)]
    await bus.node("F").publish("to-l", b"from F")
    await bus.node("L").publish("to-f", b"from L")
    await settle()
    for subscription in subscriptions:
        await subscription.unsubscribe()
    return at_l.data, at_f.data


async def test_a_partition_cuts_both_ways_a_one_way_cut_one_and_heal_restores_both() -> None:
    bus = MemoryBus(seed=1)
    bus.partition({"L"}, {"F", "G"})
    assert await two_way_traffic(bus) == ([], [])
    await echo_on(bus.node("L"), "fetch")
    with pytest.raises(TimeoutError):
        await bus.node("F").request("fetch", b"?", timeout=0.05)
    bus.heal()
    bus.cut_one_way("L", "F")
    assert await two_way_traffic(bus) == ([b"from F"], [])
    with pytest.raises(TimeoutError):  # the request arrives; its reply does not
        await bus.node("F").request("fetch", b"?", timeout=0.05)
    bus.heal()
    assert await two_way_traffic(bus) == ([b"from F"], [b"from L"])
    assert (await bus.node("F").request("fetch", b"?", timeout=1.0)).data == b"echo ?"


async def test_a_cut_drops_what_is_in_flight() -> None:
    bus = MemoryBus(seed=1, faults=Faults(delay=(0.02, 0.02)))
    inbox = Inbox()
    await bus.node("L").subscribe("s", inbox)
    await bus.node("F").publish("s", b"in flight")
    bus.partition({"L"}, {"F"})
    await settle(0.05)
    bus.heal()
    assert inbox.messages == [] and bus.pending == 0
    assert [fate.outcome for fate in bus.trace] == ["sent", "cut"]


async def test_deliveries_over_the_bound_are_dropped_and_counted_and_the_trace_is_bounded() -> None:
    bus = MemoryBus(seed=1, faults=Faults(delay=(0.01, 0.01)), max_pending=10, trace_size=15)
    inbox = Inbox()
    await bus.node("L").subscribe("s", inbox)
    for i in range(20):
        await bus.node("F").publish("s", b"%d" % i)
    assert bus.pending == 10 and bus.tally.overflowed == 10
    await settle()
    assert inbox.data == [b"%d" % i for i in range(10)] and bus.pending == 0
    assert len(bus.trace) == 15


def test_faults_out_of_range_are_refused() -> None:
    for faults in ({"drop": 1.5}, {"duplicate": -0.1}, {"delay": (0.2, 0.1)}, {"delay": (-1.0, 0.0)}):
        with pytest.raises(ValueError):
            Faults(**faults)
