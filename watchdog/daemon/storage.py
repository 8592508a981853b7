"""What the daemon does when its database stops taking rows. Pure: time passed in.

A full disk fails every write, several a second; a traceback each would bury the journal
(325 in 35 s when it was tried). `StorageHealth` turns the failures into one log line a
minute with a count, one `storage_failing` alert when they start and its resolution when a
write goes through again.
"""

from __future__ import annotations

from dataclasses import dataclass

from llm_watchdog.alerts import AlertEvent

LOG_EVERY_S = 60.0


@dataclass(frozen=True)
class Say:
    """What to do about one failure or recovery: a log line (or none) and an alert (or none)."""

    log_line: str | None
    alert: AlertEvent | None


class StorageHealth:
    def __init__(self, path: str, log_every_s: float = LOG_EVERY_S) -> None:
        self.path = path
        self.log_every_s = log_every_s
        self.failing_since: float | None = None
        self.failures = 0  # since the last log line
        self.total_failures = 0
        self._last_log_ts: float | None = None
        self._key: str | None = None

    @property
    def failing(self) -> bool:
        return self.failing_since is not None

    def failed(self, job: str, detail: str, now_ts: float) -> Say:
        self.failures += 1
        self.total_failures += 1
        alert = None
        if self.failing_since is None:
            self.failing_since = now_ts
            self._key = f"storage:failing:{now_ts:.0f}"
            alert = AlertEvent(
                key=self._key,
                kind="storage_failing",
                state="firing",
                ts=now_ts,
                title="Database not taking rows",
                message=f"{detail} (first failed: the {job} job); measuring goes on, "
                "rows are lost until it is fixed",
                fields={"database": self.path, "job": job},
            )
        if self._last_log_ts is not None and now_ts - self._last_log_ts < self.log_every_s:
            return Say(None, alert)
        n, self.failures = self.failures, 0
        self._last_log_ts = now_ts
        count = "" if n == 1 else f" ({n} failed writes since the last line)"
        return Say(f"storage failing: {detail}{count}; the next line in a minute", alert)

    def succeeded(self, now_ts: float) -> Say:
        if self.failing_since is None:
            return Say(None, None)
        since, key = self.failing_since, self._key or "storage:failing"
        lost = self.total_failures
        self.failing_since, self._key, self._last_log_ts = None, None, None
        self.failures = self.total_failures = 0
        line = (
            f"storage writes again after {now_ts - since:.0f} s ({lost} failed writes lost)"
        )
        alert = AlertEvent(
            key=key,
            kind="storage_failing",
            state="resolved",
            ts=now_ts,
            title="Database takes rows again",
            message=line,
            fields={"database": self.path},
        )
        return Say(line, alert)

    def file_gone(self, detail: str, now_ts: float) -> Say:
        """The database was deleted or replaced: an alert, and the daemon exits."""
        alert = AlertEvent(
            key=f"storage:file:{now_ts:.0f}",
            kind="storage_failing",
            state="firing",
            ts=now_ts,
            title="Database file gone",
            message=f"{detail}; the watchdog exits so that its service manager restarts it",
            fields={"database": self.path},
        )
        return Say(f"{detail}; exiting so that the service manager restarts the watchdog", alert)
