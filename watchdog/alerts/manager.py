"""Alert delivery: decisions from `AlertPolicy`, sent by one background worker per sink.

`AlertManager.submit(event)` decides under a lock (microseconds) and queues the alerts; it
never waits on a sink, so the daemon's probe loop is never blocked by a slow or dead
receiver. Each sink has its own worker thread and bounded queue, so a hung Slack does not
hold back the log line. A worker retries a failed delivery with exponential backoff, up to
`max_attempts`, and records every attempt through the recorder: a callable taking one row
(the daemon passes `lambda row: store.insert("alerts", row)`), an object with
`record(row)`, or an object with `insert(table, row)`. Failures are logged and recorded,
never raised.

A restarted daemon carries on the drift events its previous run left open, so the manager
carries on their alerts: built over a store (a recorder with `rows` and `insert`), it reads
back from the `alerts` table the firing alerts of events still open that reached a sink
without a resolved one since (`resume`). Such an event that is still firing sends nothing
again; when it ends, or is closed at start-up as "daemon restarted", its resolved alert goes
once to each sink that got the firing one, as an Alertmanager-like tool would send it.

The recorder is called from the worker threads. A store whose SQLite connection belongs to
one thread can take rows through `MemoryAlertLog` instead and write `drain()` on its own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from llm_watchdog.alerts.config import AlertConfig
from llm_watchdog.alerts.events import AlertEvent
from llm_watchdog.alerts.policy import AlertPolicy
from llm_watchdog.alerts.sinks import DeliveryError, Sink

ALERTS_TABLE = "alerts"
_DELIVERED_MEMORY = 10_000  # firing keys remembered per sink, for "resolved only if sent"

Recorder = Callable[[dict[str, Any]], None]
log = logging.getLogger("llm_watchdog.alerts")


class AlertLog(Protocol):
    def record(self, row: dict[str, Any]) -> None: ...


class MemoryAlertLog:
    """Thread-safe rows in memory: for tests, and as a hand-off to a single-thread store."""

    def __init__(self) -> None:
        self._rows: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def record(self, row: dict[str, Any]) -> None:
        with self._lock:
            self._rows.append(dict(row))

    @property
    def rows(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._rows)

    def drain(self) -> list[dict[str, Any]]:
        with self._lock:
            rows, self._rows = self._rows, []
        return rows


def as_recorder(target: Any) -> Recorder:
    """A row callable from None, an AlertLog, a store with insert(table, row), or a callable."""
    if target is None:
        return lambda row: None
    if hasattr(target, "record"):
        return target.record
    if hasattr(target, "insert"):
        return lambda row: target.insert(ALERTS_TABLE, row)
    if callable(target):
        return target
    raise TypeError("recorder must be callable, have record(row), or have insert(table, row)")


def attempt_row(
    alert: AlertEvent,
    sink: str,
    ts: float,
    *,
    ok: bool,
    attempts: int,
    final: bool = True,
    error: str | None = None,
) -> dict[str, Any]:
    """One row of the `alerts` table (migration m003_alerts)."""
    return {
        "ts": ts,
        "key": alert.key,
        "kind": alert.kind,
        "state": alert.state,
        "severity": alert.level,
        "sink": sink,
        "ok": int(ok),
        "attempts": attempts,
        "final": int(final),
        "error": error,
        "title": alert.title,
        "message": alert.message,
        "cause": alert.cause,  # migration m010_alert_cause
    }


class _SinkWorker:
    def __init__(self, sink: Sink, manager: AlertManager) -> None:
        self.sink = sink
        self._m = manager
        self._items: deque[AlertEvent] = deque()
        self._cond = threading.Condition()
        self._busy = False
        self._stopping = False
        self._delivered: OrderedDict[str, None] = OrderedDict()
        self.thread = threading.Thread(target=self._run, name=f"alerts:{sink.name}", daemon=True)

    def offer(self, alert: AlertEvent) -> bool:
        with self._cond:
            if self._stopping or len(self._items) >= self._m.config.queue_size:
                return False
            self._items.append(alert)
            self._cond.notify_all()
            return True

    def carry(self, key: str) -> None:
        """`key`'s firing alert reached this sink before a restart: its resolved one is owed."""
        with self._cond:
            self._delivered[key] = None
            while len(self._delivered) > _DELIVERED_MEMORY:
                self._delivered.popitem(last=False)

    def wait_idle(self, timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: not self._items and not self._busy, timeout_s)

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def leftovers(self) -> list[AlertEvent]:
        with self._cond:
            items, self._items = list(self._items), deque()
        return items

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._items or self._stopping)
                if not self._items:
                    return
                alert = self._items.popleft()
                self._busy = True
            try:
                self._deliver(alert)
            except Exception:  # never let one alert kill the worker
                log.exception("alert delivery to %s crashed", self.sink.name)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _deliver(self, alert: AlertEvent) -> None:
        m, name = self._m, self.sink.name
        if alert.state == "resolved" and alert.key not in self._delivered:
            m.note(
                alert, name, attempts=0, error="skipped: the firing alert never reached this sink"
            )
            return
        cfg = m.config
        for attempt in range(1, cfg.max_attempts + 1):
            error, retryable, retry_after = None, True, None
            try:
                self.sink.send(alert)
            except DeliveryError as exc:
                error, retryable, retry_after = str(exc), exc.retryable, exc.retry_after_s
            except Exception as exc:  # a sink bug must not stop alerting
                scrub = getattr(self.sink, "scrub", lambda s: s)
                error = scrub(f"{type(exc).__name__}: {exc}")
            ok = error is None
            final = ok or not retryable or attempt == cfg.max_attempts or self._stopping
            m.note(alert, name, attempts=attempt, final=final, error=error)
            if ok:
                self._remember(alert)
                log.debug("alert %s %s sent to %s", alert.state, alert.key, name)
                return
            if final:
                log.warning(
                    "alert %s %s not delivered to %s (attempt %d): %s",
                    *(alert.state, alert.key, name, attempt, error),
                )
                return
            delay = min(cfg.backoff_max_s, cfg.backoff_s * 2 ** (attempt - 1))
            if retry_after is not None:
                delay = max(delay, min(retry_after, cfg.backoff_max_s))
            m.sleep(delay)
            if self._stopping:
                m.note(alert, name, attempts=attempt, error=f"not retried, stopping: {error}")
                return

    def _remember(self, alert: AlertEvent) -> None:
        if alert.state == "firing":
            self._delivered[alert.key] = None
            while len(self._delivered) > _DELIVERED_MEMORY:
                self._delivered.popitem(last=False)
        elif alert.state == "resolved":
            self._delivered.pop(alert.key, None)


class AlertManager:
    """Decides which events alert (policy) and delivers them in the background (workers).

    `clock` gives wall time for stamps and the rate-limit window; `sleep` waits between
    retries (default: a wait that `close()` interrupts). Tests pass a fake clock and a
    sleep that only records the delay.
    """

    def __init__(
        self,
        sinks: Sequence[Sink],
        recorder: Any = None,
        config: AlertConfig | None = None,
        clock: Callable[[], float] = time.time,
        *,
        sleep: Callable[[float], None] | None = None,
        start: bool = True,
    ) -> None:
        self.config = config or AlertConfig()
        self.clock = clock
        self.policy = AlertPolicy(self.config.rules)
        self._record = as_recorder(recorder)
        self._stop = threading.Event()
        self.sleep = sleep or (lambda s: self._stop.wait(s) and None)
        self._lock = threading.Lock()
        self._workers = [_SinkWorker(s, self) for s in sinks]
        self._deliveries: dict[tuple[str, str], int] = {}  # (sink, ok|failed) -> count
        self._ticker: threading.Thread | None = None
        self._started = self._closed = False
        self._carried: list[str] = []  # keys of the alerts `resume` carried on
        if hasattr(recorder, "rows") and hasattr(recorder, "insert"):
            self.resume_from(recorder)
        if start:
            self.start()

    @property
    def sinks(self) -> list[Sink]:
        return [w.sink for w in self._workers]

    @property
    def carried_keys(self) -> list[str]:
        """Keys of the alerts carried on from before the restart that still fire."""
        with self._lock:
            active = set(self.policy.active_keys)
        return [k for k in self._carried if k in active]

    def start(self) -> None:
        if self._started:
            return
        self._started = True
        for w in self._workers:
            w.thread.start()
        if self.config.tick_interval_s:
            self._ticker = threading.Thread(target=self._tick_loop, name="alerts:tick", daemon=True)
            self._ticker.start()

    def resume_from(self, store: Any) -> list[AlertEvent]:
        """`resume` the firing alerts the store says an earlier run sent and still owes a
        resolved alert for; none when the store cannot be read (alerting goes on)."""
        # Imported here: only a manager built over a store reads it, and the alerts package
        # stays importable without the store's SQLite stack.
        from llm_watchdog.store.records import owed_resolves

        try:
            rows = list(owed_resolves(store))
        except Exception as exc:
            log.warning("cannot read which alerts an earlier run sent: %s", exc)
            return []
        return self.resume(rows)

    def resume(self, rows: Iterable[Mapping[str, Any]]) -> list[AlertEvent]:
        """Carry on firing alerts sent before a restart, from rows as `owed_resolves` reads
        them (key, kind, severity, sink, title, message, sent_ts; start_ts and cause when
        known): the policy counts each as sent, and each named sink that is configured
        now gets the resolved alert when its event ends. Returns the alerts carried on."""
        found: dict[str, tuple[AlertEvent, set[str]]] = {}
        for row in rows:
            key = row["key"]
            if key not in found:
                start = row.get("start_ts")
                try:
                    alert = AlertEvent(
                        key=key,
                        kind=row["kind"],
                        state="firing",
                        ts=float(start if start is not None else row["sent_ts"]),
                        title=row["title"],
                        message=row["message"],
                        cause=row.get("cause"),
                        severity=row.get("severity"),
                    )
                except (KeyError, TypeError, ValueError) as exc:
                    log.warning("cannot carry on alert %s sent before a restart: %s", key, exc)
                    continue
                found[key] = (alert, set())
            found[key][1].add(row["sink"])
        carried = []
        with self._lock:
            for alert, _ in found.values():
                self.policy.restore(alert)
                carried.append(alert)
                self._carried.append(alert.key)
        for w in self._workers:
            for alert, sinks in found.values():
                if w.sink.name in sinks:
                    w.carry(alert.key)
        if carried:
            log.info(
                "carrying on %d firing alert%s sent before the restart: %s",
                len(carried),
                "" if len(carried) == 1 else "s",
                ", ".join(a.key for a in carried),
            )
        return carried

    def submit(self, event: AlertEvent) -> list[AlertEvent]:
        """Decide and queue; returns the alerts queued (possibly none). Never blocks on I/O."""
        if self._closed:
            log.warning("alert %s %s after close: not sent", event.state, event.key)
            return []
        with self._lock:
            alerts = self.policy.decide(event, self.clock())
        self._dispatch(alerts)
        return alerts

    def tick(self) -> list[AlertEvent]:
        """Send summaries of rate-limited alerts that are due (also runs on a timer)."""
        if self._closed:
            return []
        with self._lock:
            alerts = self.policy.due(self.clock())
        self._dispatch(alerts)
        return alerts

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every queued alert is delivered or given up; False on timeout."""
        deadline = time.monotonic() + timeout_s
        return all(w.wait_idle(max(0.0, deadline - time.monotonic())) for w in self._workers)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop: workers finish what is queued (no more retry waits) within `timeout_s`."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        for w in self._workers:
            w.stop()
        deadline = time.monotonic() + timeout_s
        for w in self._workers:
            if w.thread.is_alive():
                w.thread.join(max(0.0, deadline - time.monotonic()))
            for alert in w.leftovers():
                self.note(alert, w.sink.name, attempts=0, error="not sent: llm-watchdog stopped")
            if w.thread.is_alive():
                log.warning("alert sink %s still busy at shutdown", w.sink.name)
            else:
                w.sink.close()
        if self._ticker is not None:
            self._ticker.join(timeout=1.0)

    def note(
        self,
        alert: AlertEvent,
        sink: str,
        *,
        attempts: int,
        final: bool = True,
        error: str | None = None,
    ) -> None:
        """Record one attempt (ok when there is no error)."""
        row = attempt_row(
            alert, sink, self.clock(), ok=error is None, attempts=attempts, final=final, error=error
        )
        if final:
            key = (sink, "ok" if error is None else "failed")
            with self._lock:
                self._deliveries[key] = self._deliveries.get(key, 0) + 1
        self.record(row)

    def delivery_counts(self) -> dict[str, dict[str, int]]:
        """Final outcomes per sink ("ok", "failed") since start: one per alert and sink."""
        counts = {w.sink.name: {"ok": 0, "failed": 0} for w in self._workers}
        with self._lock:
            for (sink, outcome), n in self._deliveries.items():
                counts.setdefault(sink, {"ok": 0, "failed": 0})[outcome] = n
        return counts

    def record(self, row: dict[str, Any]) -> None:
        try:
            self._record(row)
        except Exception as exc:  # the record of an alert must not break alerting
            log.warning("cannot record alert attempt for %s: %s", row.get("sink"), exc)

    def __enter__(self) -> AlertManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _dispatch(self, alerts: list[AlertEvent]) -> None:
        for alert in alerts:
            for w in self._workers:
                if w.sink.accepts(alert) and not w.offer(alert):
                    error = "dropped: this sink's queue is full (is the receiver down?)"
                    self.note(alert, w.sink.name, attempts=0, error=error)

    def _tick_loop(self) -> None:
        interval = float(self.config.tick_interval_s or 0)
        while not self._stop.wait(interval):
            try:
                self.tick()
            except Exception:
                log.exception("alert tick failed")


@dataclass(frozen=True)
class SendResult:
    sink: str
    ok: bool
    error: str | None
    elapsed_ms: float


def send_test(
    sinks: Sequence[Sink],
    *,
    recorder: Any = None,
    clock: Callable[[], float] = time.time,
    host: str | None = None,
) -> list[SendResult]:
    """Send one test alert to every sink, once each, now; for `llm-watchdog alerts test`."""
    import socket

    record = as_recorder(recorder)
    where = host or socket.gethostname()
    results = []
    for sink in sinks:
        now = clock()
        alert = AlertEvent(
            key=f"test:{now:.0f}",
            kind="test",
            state="test",
            ts=now,
            title="llm-watchdog test alert",
            message=f"Test alert from llm-watchdog on {where}: this sink ({sink.name}) works.",
            severity="info",
        )
        started = time.monotonic()
        error = None
        try:
            sink.send(alert)
        except DeliveryError as exc:
            error = str(exc)
        except Exception as exc:
            error = getattr(sink, "scrub", lambda s: s)(f"{type(exc).__name__}: {exc}")
        elapsed_ms = (time.monotonic() - started) * 1000
        results.append(SendResult(sink.name, error is None, error, round(elapsed_ms, 1)))
        try:
            record(
                attempt_row(alert, sink.name, clock(), ok=error is None, attempts=1, error=error)
            )
        except Exception as exc:
            log.warning("cannot record test alert for %s: %s", sink.name, exc)
    return results
