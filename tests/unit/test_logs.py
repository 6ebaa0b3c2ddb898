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
