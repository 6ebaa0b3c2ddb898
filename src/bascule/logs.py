"""Log output as the configuration asks: text lines for people or JSON lines for machines, and
Liftbridge's per-component switches (logging.raft, logging.nats, logging.recovery: off, those
components log warnings and errors only); a kind of line logged by the thousand is cut short
(``FloodGuard``)."""

from __future__ import annotations

import contextvars
import datetime
import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
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
# A kind of line (logger, level, message template) written at most FLOOD_LINES times per FLOOD_WINDOW
# seconds; the rest of the window's are left out and counted in one line. A node with thousands of
# partitions says a failover's per-partition lines (a silent leader reported, an ISR change, a report
# that failed) by the thousand, and writing them took a quarter of its event loop in issue 32's
# storms, when it could least spare it: the more that failed, the more it wrote.
FLOOD_LINES = 10
FLOOD_WINDOW = 1.0
# Kinds remembered: message templates are the code's, but one built with an f-string is new each time.
FLOOD_KINDS = 1024


class Concerns(logging.Filter):
    """Puts the stream and partition the logging task works on (``logcontext``) on each record."""

    def filter(self, record: logging.LogRecord) -> bool:
        fields = record.__dict__
        concerns = CONCERNS.get()
        if concerns is not None and "stream" not in fields:
            fields["stream"], fields["partition"] = concerns
        fields["concerns"] = f" [{fields['stream']}/{fields.get('partition')}]" if "stream" in fields else ""
        return True


@dataclass
class _Window:
    kind: tuple[str, int, str]
    start: float
    written: int = 1
    left_out: int = 0


class FloodGuard(logging.Filter):
    """A handler's filter that writes at most ``lines`` lines of a kind (logger, level, template)
    within ``window`` seconds of the first, and says how many it left out once that window is over
    (with the next line it writes, of any kind). Records come from pysyncobj's threads too."""

    def __init__(self, lines: int = FLOOD_LINES, window: float = FLOOD_WINDOW, kinds: int = FLOOD_KINDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.lines, self.window, self.kinds, self.clock = lines, window, kinds, clock
        self._windows: dict[tuple[str, int, str], _Window] = {}  # oldest window first; at most ``kinds``
        self._cut: dict[tuple[str, int, str], _Window] = {}  # the windows that left lines out
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "flood_summary", False) or not isinstance(record.msg, str):
            return True
        kind, now = (record.name, record.levelno, record.msg), self.clock()
        with self._lock:
            window = self._windows.get(kind)
            if window is not None and now - window.start < self.window:
                if window.written >= self.lines:
                    window.left_out += 1
                    self._cut[kind] = window
                    return False
                window.written += 1
                due = []
            else:
                self._windows.pop(kind, None)
                self._windows[kind] = _Window(kind, now)
                while len(self._windows) > self.kinds:
                    del self._windows[next(iter(self._windows))]
                due = [w for w in self._cut.values() if now - w.start >= self.window]
            for ended in due:
                del self._cut[ended.kind]
        for ended in due:  # outside the lock: the summary comes through this filter too
            _summarize(ended, self.window, now)
        return True


def _summarize(window: _Window, length: float, now: float) -> None:
    """One line for what ``window`` left out, in a context of its own: it concerns no partition."""
    name, level, template = window.kind
    began = datetime.datetime.now() - datetime.timedelta(seconds=now - window.start)
    contextvars.Context().run(
        logging.getLogger(name).log, level, "%d more lines like %r left out (%d written within %g s from %s)",
        window.left_out, template, window.written, length, began.strftime("%H:%M:%S.%f")[:-3],
        extra={"flood_summary": True},
    )


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
    handler.addFilter(FloodGuard())
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
