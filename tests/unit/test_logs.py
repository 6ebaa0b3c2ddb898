"""Log output: JSON lines and Liftbridge's per-component switches."""

import io
import json
import logging

import pytest

from bascule import logs
from bascule.config import load_config


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    names = [*(n for group in logs.COMPONENT_LOGGERS.values() for n in group), *logs.VERBATIM_LOGGERS]
    levels = {name: logging.getLogger(name).level for name in names}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, saved in levels.items():
        logging.getLogger(name).setLevel(saved)


def test_json_lines_carry_level_logger_message_context_and_exception(restore_logging):
    out = io.StringIO()
    logs.configure(load_config(None, {"logging.format": "json"}).logging, out)
    logging.getLogger("bascule.test").info("hello %s", "wörld", extra={"stream": "orders", "partition": 2})
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("bascule.test").exception("failed")
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert {k: first[k] for k in ("level", "logger", "message", "stream", "partition")} == {
        "level": "info", "logger": "bascule.test", "message": "hello wörld", "stream": "orders", "partition": 2}
    assert first["time"].endswith("+00:00")
    assert second["level"] == "error" and "ValueError: boom" in second["exception"]


def test_components_log_warnings_only_unless_switched_on(restore_logging):
    out = io.StringIO()
    logs.configure(load_config(None, {"logging.level": "debug", "logging.raft": True}).logging, out)
    logging.getLogger("pysyncobj").info("raft detail")
    logging.getLogger("bascule.natsio.server").info("nats detail")
    logging.getLogger("bascule.natsio.server").warning("nats trouble")
    logging.getLogger("bascule.node").debug("node detail")
    text = out.getvalue()
    assert "raft detail" in text and "node detail" in text and "nats trouble" in text
    assert "nats detail" not in text


def test_header_blocks_are_not_logged_even_at_debug(restore_logging):
    """hpack logs every header block it decodes at debug, a client's authorization token included."""
    import hpack

    out = io.StringIO()
    logs.configure(load_config(None, {"logging.level": "debug"}).logging, out)
    block = hpack.Encoder().encode([(":path", "/proto.API/Publish"), ("authorization", "Bearer s3cret-token")])
    hpack.Decoder().decode(block)
    assert "s3cret-token" not in out.getvalue()


def test_logging_keys_are_checked():
    from bascule.config import ConfigError

    for overrides in ({"logging.format": "xml"}, {"logging.nats": "sometimes"}):
        with pytest.raises(ConfigError):
            load_config(None, overrides)


@pytest.mark.anyio
async def test_a_task_marked_as_concerning_a_partition_tags_its_lines_and_only_its_own(restore_logging):
    import asyncio

    from bascule.logcontext import concerning

    out = io.StringIO()
    logs.configure(load_config(None, {"logging.format": "json"}).logging, out)
    log = logging.getLogger("bascule.test")

    async def follower() -> None:
        concerning("orders", 3)
        log.warning("behind the leader")

    await asyncio.create_task(follower())
    log.warning("the node itself")
    tagged, untagged = (json.loads(line) for line in out.getvalue().splitlines())
    assert (tagged["stream"], tagged["partition"]) == ("orders", 3)
    assert "stream" not in untagged

    text = io.StringIO()
    logs.configure(load_config(None, {}).logging, text)
    await asyncio.create_task(follower())
    assert "bascule.test [orders/3]: behind the leader" in text.getvalue()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def guarded(clock: Clock, lines: int = 3, window: float = 1.0) -> tuple[logging.Logger, io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(logs.FloodGuard(lines, window, clock=clock))
    log = logging.getLogger("bascule.test.flood")
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.INFO)
    return log, out


def test_a_kind_of_line_logged_by_the_thousand_is_cut_short_and_counted():
    """Issue 32: a node with thousands of partitions said each one's failover, and writing it took a
    quarter of its loop."""
    clock = Clock()
    log, out = guarded(clock)
    for partition in range(1000):
        log.warning("s/%d: leader %s is silent, reporting it", partition, "node-0")
        log.info("s/%d: removing %s from the ISR", partition, "node-1")
    assert out.getvalue().splitlines() == [
        line for p in range(3) for line in (f"s/{p}: leader node-0 is silent, reporting it",
                                            f"s/{p}: removing node-1 from the ISR")
    ]
    clock.now = 1.0  # a new window: the next line of any kind says what the last one left out
    log.info("another kind")
    lines = out.getvalue().splitlines()[6:]
    assert lines[:2] == [
        "997 more lines like 's/%d: leader %s is silent, reporting it' left out (3 written within 1 s from "
        + lines[0].rsplit("from ", 1)[1],
        "997 more lines like 's/%d: removing %s from the ISR' left out (3 written within 1 s from "
        + lines[1].rsplit("from ", 1)[1],
    ]
    assert lines[2:] == ["another kind"]
    log.warning("s/%d: leader %s is silent, reporting it", 5, "node-0")  # its own window again
    assert out.getvalue().splitlines()[-1] == "s/5: leader node-0 is silent, reporting it"


def test_kinds_are_remembered_up_to_a_bound():
    clock = Clock()
    out = io.StringIO()
    guard = logs.FloodGuard(1, 1.0, kinds=4, clock=clock)
    handler = logging.StreamHandler(out)
    handler.addFilter(guard)
    log = logging.getLogger("bascule.test.kinds")
    log.handlers[:] = [handler]
    log.propagate = False
    for index in range(100):
        log.warning(f"built anew each time {index}")  # noqa: G004 - the case the bound is for
    assert len(guard._windows) == 4 and len(out.getvalue().splitlines()) == 100
