"""Logging set-up: journald-friendly lines under systemd, plain timestamped lines elsewhere.

Every line is escaped with `printable` (defined with the error tree, which needs it too), so
a control character in a message cannot fake a log line.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from llm_watchdog.errors import printable


class _PrintableMixin(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
        # The message is escaped; a traceback appended after it keeps its lines.
        record.message = printable(record.message)
        return super().formatMessage(record)


class TextFormatter(_PrintableMixin, logging.Formatter):
    pass


# sd-daemon(3): a "<N>" prefix on a line written to stderr sets its journal priority.
_SD_PRIORITY = {
    logging.DEBUG: 7,
    logging.INFO: 6,
    logging.WARNING: 4,
    logging.ERROR: 3,
    logging.CRITICAL: 2,
}


class JournalFormatter(_PrintableMixin, logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        level = _SD_PRIORITY.get(record.levelno, 6)
        return f"<{level}>{record.name}: {super().format(record)}"


def setup_logging(level: str = "info", fmt: str = "auto", stream: Any = None) -> None:
    if fmt == "auto":
        # systemd sets JOURNAL_STREAM when stderr is connected to the journal.
        fmt = "journal" if os.environ.get("JOURNAL_STREAM") else "text"
    handler = logging.StreamHandler(stream or sys.stderr)
    if fmt == "journal":
        handler.setFormatter(JournalFormatter("%(message)s"))
    else:
        handler.setFormatter(
            TextFormatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # apscheduler logs every job run at INFO, and a skipped run (a probe that outlasted its
    # interval) at WARNING: both expected, both noise at a 1 s GPU interval.
    logging.getLogger("apscheduler").setLevel(max(logging.ERROR, root.level))
    logging.getLogger("httpx").setLevel(max(logging.WARNING, root.level))


__all__ = ["printable", "setup_logging"]
