"""A node's batched requests to the metadata leader (bascule.node.reports): what goes in one batch,
what each caller hears, and the bounds of a batch."""

import asyncio

import pytest

from bascule.metadata.raft import MetadataError, NoMetadataLeader
from bascule.node.reports import Batcher, MetadataBatches

pytestmark = pytest.mark.anyio


def spawn(work, name):
    return asyncio.ensure_future(work)


class Recorder:
    """A send that records each batch and answers each item with its "n", or fails."""

    def __init__(self, fail=None):
        self.batches = []
        self.fail = fail

    async def __call__(self, items):
        self.batches.append(list(items))
        await asyncio.sleep(0)
        if self.fail is not None:
            raise self.fail
        return [item["n"] * 10 for item in items]


async def test_requests_within_the_window_go_as_one_batch_and_each_hears_its_own_outcome():
    send = Recorder()
    batcher = Batcher("t", send, spawn, lambda: 10**6, window=0.01)
    outcomes = await asyncio.gather(*(batcher.submit({"n": n}) for n in range(50)))
    assert outcomes == [n * 10 for n in range(50)]
    assert [len(batch) for batch in send.batches] == [50]
    # Requests within the window of that batch wait for it, and go as one.
    loop = asyncio.get_running_loop()
    started = loop.time()
    later = [asyncio.ensure_future(batcher.submit({"n": n})) for n in range(3)]
    await asyncio.sleep(0.002)
    later.append(asyncio.ensure_future(batcher.submit({"n": 3})))
    assert await asyncio.gather(*later) == [0, 10, 20, 30]
    assert loop.time() - started >= 0.01
    assert [len(batch) for batch in send.batches] == [50, 4]


async def test_a_request_after_a_quiet_window_goes_at_once():
    send = Recorder()
    batcher = Batcher("t", send, spawn, lambda: 10**6, window=10.0)
    assert await asyncio.wait_for(batcher.submit({"n": 1}), 1.0) == 10
    batcher._last_batch -= 10.0  # the window since that batch has passed
    assert await asyncio.wait_for(batcher.submit({"n": 2}), 1.0) == 20
    assert send.batches == [[{"n": 1}], [{"n": 2}]]


async def test_a_request_withdrawn_before_its_batch_goes_leaves_it():
    send = Recorder()
    batcher = Batcher("t", send, spawn, lambda: 10**6, window=0.05)
    assert await batcher.submit({"n": 0}) == 0
    kept = asyncio.ensure_future(batcher.submit({"n": 1}))
    withdrawn = asyncio.ensure_future(batcher.submit({"n": 2}))
    await asyncio.sleep(0.01)
    withdrawn.cancel()
    assert await kept == 10
    assert send.batches == [[{"n": 0}], [{"n": 1}]]


async def test_batches_are_cut_at_the_item_limit_and_at_the_byte_limit():
    send = Recorder()
    by_count = Batcher("t", send, spawn, lambda: 10**6, window=0.01, max_items=4)
    await asyncio.gather(*(by_count.submit({"n": n}) for n in range(10)))
    assert [len(batch) for batch in send.batches] == [4, 4, 2]
    send.batches.clear()
    by_bytes = Batcher("t", send, spawn, lambda: 100, window=0.01)
    await asyncio.gather(*(by_bytes.submit({"n": n, "pad": "x" * 30}) for n in range(10)))
    assert [len(batch) for batch in send.batches] == [2] * 5


async def test_a_failed_batch_fails_every_request_in_it():
    batcher = Batcher("t", Recorder(fail=NoMetadataLeader("none")), spawn, lambda: 10**6, window=0.01)
    outcomes = await asyncio.gather(*(batcher.submit({"n": n}) for n in range(3)), return_exceptions=True)
    assert all(isinstance(o, NoMetadataLeader) for o in outcomes)


async def test_a_closing_node_sends_nothing():
    send = Recorder()
    batcher = Batcher("t", send, lambda work, name: work.close(), lambda: 10**6, window=0.01)
    with pytest.raises(NoMetadataLeader):
        await batcher.submit({"n": 1})
    assert send.batches == []


async def test_each_kind_goes_as_its_plural_request_and_isr_outcomes_come_back_per_item():
    calls = []

    async def call(op, **args):
        calls.append((op, args))
        if op == "change_isrs":
            return [None, ["FAILED_PRECONDITION", "ISR change refused: stale leader"],
                    ["NOT_FOUND", "no such partition"]]
        return None

    batches = MetadataBatches(call, lambda: 1024 * 1024, spawn, window=0.01)
    await asyncio.gather(
        batches.report_leader("s", 0, "a", 3, "b"), batches.report_leader("s", 1, "a", 3, "b"),
        batches.leader_returned("s", 2, "b", 4, 3, 10),
    )
    assert calls == [
        ("report_leaders", {"items": [
            {"stream": "s", "partition": 0, "leader": "a", "leader_epoch": 3, "reporter": "b"},
            {"stream": "s", "partition": 1, "leader": "a", "leader_epoch": 3, "reporter": "b"},
        ]}),
        ("leaders_returned", {"items": [
            {"stream": "s", "partition": 2, "leader": "b", "leader_epoch": 4, "last_epoch": 3, "log_end_offset": 10},
        ]}),
    ]
    outcomes = await asyncio.gather(
        *(batches.change_isr("s", p, "c", False, "a", 3, 7) for p in range(3)), return_exceptions=True,
    )
    assert outcomes[0] is None
    assert isinstance(outcomes[1], MetadataError) and outcomes[1].code == "FAILED_PRECONDITION"
    assert isinstance(outcomes[2], MetadataError) and outcomes[2].code == "NOT_FOUND"
    assert calls[-1][0] == "change_isrs" and [item["partition"] for item in calls[-1][1]["items"]] == [0, 1, 2]


async def test_an_isr_answer_of_the_wrong_length_is_no_outcome():
    async def call(op, **args):
        return [None]

    batches = MetadataBatches(call, lambda: 1024 * 1024, spawn, window=0.01)
    outcomes = await asyncio.gather(
        *(batches.change_isr("s", p, "c", False, "a", 3, 7) for p in range(2)), return_exceptions=True,
    )
    assert all(isinstance(o, NoMetadataLeader) for o in outcomes)


async def test_a_metadata_leader_that_does_not_know_batches_gets_each_item_alone():
    """A rolling upgrade: an earlier version refuses the plural request as an unknown op."""
    calls = []

    async def call(op, **args):
        calls.append(op)
        if op in ("report_leaders", "change_isrs"):
            raise MetadataError("INVALID_ARGUMENT", f"unknown command op {op!r}")
        if op == "change_isr" and args["partition"] == 1:
            raise MetadataError("FAILED_PRECONDITION", "ISR change refused: stale leader")
        return None

    batches = MetadataBatches(call, lambda: 1024 * 1024, spawn, window=0.01)
    await asyncio.gather(batches.report_leader("s", 0, "a", 3, "b"), batches.report_leader("s", 1, "a", 3, "b"))
    assert calls == ["report_leaders", "report_leader", "report_leader"]
    outcomes = await asyncio.gather(
        *(batches.change_isr("s", p, "c", False, "a", 3, 7) for p in range(2)), return_exceptions=True,
    )
    assert outcomes[0] is None and isinstance(outcomes[1], MetadataError)
    assert outcomes[1].code == "FAILED_PRECONDITION"
    calls.clear()

    async def refusing(op, **args):  # any other refusal of a batch is every item's
        raise MetadataError("INVALID_ARGUMENT", "report_leaders.items: partitions repeat")

    batches = MetadataBatches(refusing, lambda: 1024 * 1024, spawn, window=0.01)
    with pytest.raises(MetadataError, match="repeat"):
        await batches.report_leader("s", 0, "a", 3, "b")


def test_elections_are_cut_into_commands_by_count_and_by_encoded_size():
    from bascule.metadata.service import COMMAND_BUDGET, _chunks
    from bascule.wire.commands import MAX_BATCH_ITEMS

    keys = [("s", p) for p in range(2500)]
    assert [len(c) for c in _chunks(keys, [10] * 2500)] == [MAX_BATCH_ITEMS, MAX_BATCH_ITEMS, 452]
    big = COMMAND_BUDGET // 3 + 1  # say, ISRs of 64 long broker ids
    chunks = _chunks(keys[:7], [big] * 7)
    assert [len(c) for c in chunks] == [2, 2, 2, 1] and sum(chunks, []) == keys[:7]
