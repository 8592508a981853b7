"""What the daemon does when its database stops taking rows. Pure: time passed in.

A full disk fails every write, several a second; a traceback each would bury the journal
(325 in 35 s when it was tried). `StorageHealth` turns the failures into one log line a
minute with a count, one `storage_failing` alert when they start and its resolution when a
write goes through again.

That alert cannot be kept where the others are: its rows in the `alerts` table fail to be
written, or go to a deleted file. `OwedAlerts` keeps it in a small file beside the database
(`<database>.storage-alert`) until its resolved alert is sent, so that a restart in between
carries it on: the next run resolves it at its first write that goes through, and writes its
firing rows into the history first.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llm_watchdog.alerts import AlertEvent

LOG_EVERY_S = 60.0
OWED_SUFFIX = ".storage-alert"

log = logging.getLogger("llm_watchdog.daemon.storage")


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
        self._carried = False  # the failure began before a restart

    @property
    def failing(self) -> bool:
        return self.failing_since is not None

    def carry(self, alert: AlertEvent) -> None:
        """Take on a storage alert an earlier run fired and never resolved: failing since
        then, until a write goes through (that resolves it), with no new alert meanwhile."""
        if self.failing_since is not None:
            return
        self.failing_since, self._key, self._carried = alert.ts, alert.key, True

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
        lost, carried = self.total_failures, self._carried
        self.failing_since, self._key, self._last_log_ts = None, None, None
        self.failures = self.total_failures = 0
        self._carried = False
        lasted = f"storage writes again after {now_ts - since:.0f} s"
        # A failure carried over a restart: the earlier run's count of lost rows went with it.
        line = (
            f"{lasted} (failing since before a restart)"
            if carried
            else f"{lasted} ({lost} failed writes lost)"
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


class OwedAlerts:
    """Storage alerts that fired and await their resolved alert, with the sinks each was
    queued to, kept in a file beside the database (None: in memory only).

    The file is JSON, rewritten whole by rename, gone when nothing is owed. Writing it can
    fail where the database fails (a full disk): that is logged, and the alert is then
    owed in memory only, for this run.
    """

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path is not None else None
        self.owed: list[tuple[AlertEvent, list[str]]] = []
        self._lock = threading.Lock()  # jobs fail and recover on several threads

    @classmethod
    def beside(cls, database: str) -> OwedAlerts:
        return cls(None if database in ("", ":memory:") else database + OWED_SUFFIX)

    def load(self) -> list[tuple[AlertEvent, list[str]]]:
        """What an earlier run left owed; none when there is no file or it cannot be read."""
        if self.path is None:
            return []
        try:
            entries = json.loads(self.path.read_text(encoding="utf-8"))
            self.owed = [(AlertEvent(**e["alert"]), [str(s) for s in e["sinks"]]) for e in entries]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.warning(
                "cannot read the storage alerts owed by an earlier run from %s (%s): "
                "they are not resolved; delete the file if it is in the way",
                self.path,
                exc,
            )
            return []
        return list(self.owed)

    def add(self, alert: AlertEvent, sinks: list[str]) -> None:
        with self._lock:
            self.owed.append((alert, sinks))
            self._save()

    def clear(self) -> list[tuple[AlertEvent, list[str]]]:
        """Forget every owed alert (their resolved ones go out now); returns them."""
        with self._lock:
            owed, self.owed = self.owed, []
            self._save()
        return owed

    def _save(self) -> None:
        if self.path is None:
            return
        try:
            if not self.owed:
                self.path.unlink(missing_ok=True)
                return
            entries = [{"alert": _alert_dict(a), "sinks": sinks} for a, sinks in self.owed]
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(json.dumps(entries), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning(
                "cannot keep the storage alert in %s (%s): if the watchdog restarts before "
                "storage recovers, that alert is not resolved",
                self.path,
                exc,
            )


def _alert_dict(alert: AlertEvent) -> dict[str, Any]:
    d = alert.to_dict()
    d["fields"] = {k: v for k, v in d["fields"].items() if isinstance(v, (str, int, float))}
    return d
