"""Log output as the configuration asks: text lines for people or JSON lines for machines, and
Liftbridge's per-component switches (logging.raft, logging.nats, logging.recovery: off, those
components log warnings and errors only)."""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import TextIO

from bascule.config.model import LoggingConfig
from bascule.logcontext import CONCERNS

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s%(concerns)s: %(message)s"
COMPONENT_LOGGERS = {
    "raft": ("pysyncobj", "bascule.metadata.raft", "bascule.metadata.journal"),
    "nats": ("nats", "bascule.natsio"),
    "recovery": ("bascule.partition.log",),
}
# Libraries whose debug lines hold what a client sent byte for byte (hpack: every header block,
# authorization tokens included): never below INFO, whatever the level.
VERBATIM_LOGGERS = ("hpack",)
# Fields that say what a line concerns: from the logging task (logcontext) or extra=...
CONTEXT_FIELDS = ("stream", "partition")


class Concerns(logging.Filter):
    """Puts the stream and partition the logging task works on (``logcontext``) on each record."""

    def filter(self, record: logging.LogRecord) -> bool:
        fields = record.__dict__
        concerns = CONCERNS.get()
        if concerns is not None and "stream" not in fields:
            fields["stream"], fields["partition"] = concerns
        fields["concerns"] = f" [{fields['stream']}/{fields.get('partition')}]" if "stream" in fields else ""
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, and the exception
    and context fields when there are any."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for field in CONTEXT_FIELDS:
            if hasattr(record, field):
                entry[field] = getattr(record, field)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure(config: LoggingConfig, stream: TextIO = sys.stderr) -> None:
    handler = logging.StreamHandler(stream)
    handler.addFilter(Concerns())
    handler.setFormatter(JsonFormatter() if config.format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(config.level.upper())
    for component, names in COMPONENT_LOGGERS.items():
        level = logging.NOTSET if getattr(config, component) else logging.WARNING
        for name in names:
            logging.getLogger(name).setLevel(level)
    for name in VERBATIM_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO)
