"""AlertManager: decisions wired to background delivery, recording, isolation, shutdown."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import sqlite_utils

from llm_watchdog.alerts.config import AlertConfig
from llm_watchdog.alerts.events import AlertEvent
from llm_watchdog.alerts.manager import AlertManager, MemoryAlertLog, as_recorder, attempt_row
from llm_watchdog.alerts.sinks import BaseSink, DeliveryError
from llm_watchdog.store.db import Store
from llm_watchdog.store.migrations import (
    Migration,
    discover,
    m003_alerts,
    m010_alert_cause,
    migrate,
)
from tests.helpers.builders import FakeClock

T0 = 1_700_000_000.0


class MemorySink(BaseSink):
    """Keeps what it was sent; raises the scripted errors first."""

    def __init__(self, name: str = "memory", errors: list[Exception] | None = None, **kw: Any):
        super().__init__(name, **kw)
        self.sent: list[AlertEvent] = []
        self.errors = list(errors or [])
        self.closed = False

    def send(self, alert: AlertEvent) -> None:
        if self.errors:
            raise self.errors.pop(0)
        self.sent.append(alert)

    def close(self) -> None:
        self.closed = True


class BlockingSink(MemorySink):
    """Hangs inside send() until the test releases it."""

    def __init__(self, name: str = "blocking") -> None:
        super().__init__(name)
        self.entered = threading.Event()
        self.release = threading.Event()

    def send(self, alert: AlertEvent) -> None:
        self.entered.set()
        self.release.wait(10)
        super().send(alert)


def event(key: str, state: str = "firing", ts: float = T0, **kw: Any) -> AlertEvent:
    values: dict[str, Any] = {
        "key": key,
        "kind": "chat_slowed",
        "state": state,
        "ts": ts,
        "title": "Chat slowed (thermal)",
        "message": "" if state == "resolved" else f"Chat slowed under heat ({key})",
        "cause": "thermal",
    }
    values.update(kw)
    return AlertEvent(**values)


def make(sinks: list[Any], log: Any = None, sleeps: list[float] | None = None, **cfg: Any):
    config = AlertConfig(tick_interval_s=None, **cfg)
    sleep = (sleeps if sleeps is not None else []).append
    return AlertManager(sinks, log, config, clock=FakeClock(T0), sleep=sleep)


def test_fires_once_and_resolves_end_to_end() -> None:
    sink, log = MemorySink(), MemoryAlertLog()
    with make([sink], log) as manager:
        for _ in range(5):
            manager.submit(event("drift:1"))
        manager.submit(event("drift:1", "resolved", ts=T0 + 420))
        assert manager.flush(5)
    assert [(a.state, a.message) for a in sink.sent] == [
        ("firing", "Chat slowed under heat (drift:1)"),
        ("resolved", "Resolved after 7 min: Chat slowed (thermal)"),
    ]
    assert [(r["state"], r["ok"], r["final"], r["attempts"]) for r in log.rows] == [
        ("firing", 1, 1, 1),
        ("resolved", 1, 1, 1),
    ]
    assert sink.closed  # the manager owns its sinks


def test_submit_never_waits_for_a_hung_sink_and_other_sinks_carry_on() -> None:
    hung, fine = BlockingSink(), MemorySink("log")
    manager = make([hung, fine], MemoryAlertLog())
    try:
        manager.submit(event("a"))
        assert hung.entered.wait(5)
        started = time.monotonic()
        for key in "bcd":
            manager.submit(event(key))
        elapsed = time.monotonic() - started
        assert not hung.release.is_set() and hung.sent == []  # still stuck in send()
        assert elapsed < 1.0
        # The other sink's worker is not held up by the hung one.
        deadline = time.monotonic() + 5
        while len(fine.sent) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [a.key for a in fine.sent] == ["a", "b", "c", "d"]
    finally:
        hung.release.set()
        manager.close()
    assert [a.key for a in hung.sent] == ["a", "b", "c", "d"]


def test_resolved_goes_only_where_the_firing_alert_got_through() -> None:
    broken = MemorySink("broken", errors=[DeliveryError("401 bad token", retryable=False)])
    fine, log = MemorySink("fine"), MemoryAlertLog()
    with make([broken, fine], log) as manager:
        manager.submit(event("e"))
        manager.submit(event("e", "resolved", ts=T0 + 60))
        assert manager.flush(5)
    assert [a.state for a in fine.sent] == ["firing", "resolved"]
    assert broken.sent == []
    rows = [(r["sink"], r["state"], r["ok"], r["attempts"], r["error"]) for r in log.rows]
    assert ("broken", "firing", 0, 1, "401 bad token") in rows
    assert ("broken", "resolved", 0, 0, "skipped: the firing alert never reached this sink") in rows


def test_per_sink_filter() -> None:
    pager = MemorySink("pager", min_severity="critical", kinds=frozenset({"chat_slowed"}))
    everything = MemorySink("everything")
    with make([pager, everything]) as manager:
        manager.submit(event("slow"))
        manager.submit(event("heat", kind="heat_warning"))
        manager.submit(event("minor", severity="warning"))
        assert manager.flush(5)
    assert [a.key for a in pager.sent] == ["slow"]
    assert [a.key for a in everything.sent] == ["slow", "heat", "minor"]


def test_rate_limit_summary_is_delivered_on_tick() -> None:
    sink = MemorySink()
    manager = make([sink], max_per_window=1, window_s=60)
    clock = manager.clock
    assert isinstance(clock, FakeClock)
    with manager:
        manager.submit(event("a"))
        manager.submit(event("b"))
        assert manager.tick() == []
        clock.now += 61
        (summary,) = manager.tick()
        assert manager.flush(5)
    assert [a.state for a in sink.sent] == ["firing", "summary"]
    assert summary.message.startswith("1 more chat slowed alert held back by the rate limit")


def test_unexpected_sink_exception_is_recorded_and_retried() -> None:
    sink, log, sleeps = MemorySink(errors=[RuntimeError("bug")]), MemoryAlertLog(), []
    with make([sink], log, sleeps, backoff_s=0.5) as manager:
        manager.submit(event("a"))
        assert manager.flush(5)
    assert [(r["attempts"], r["ok"], r["error"]) for r in log.rows] == [
        (1, 0, "RuntimeError: bug"),
        (2, 1, None),
    ]
    assert sleeps == [0.5]


def test_full_queue_drops_and_records() -> None:
    hung, log = BlockingSink(), MemoryAlertLog()
    manager = make([hung], log, queue_size=1)
    try:
        manager.submit(event("a"))
        assert hung.entered.wait(5)  # "a" is in flight
        manager.submit(event("b"))  # queued
        manager.submit(event("c"))  # no room
        (dropped,) = log.rows
        assert dropped["key"] == "c" and dropped["attempts"] == 0
        assert dropped["error"] == "dropped: this sink's queue is full (is the receiver down?)"
    finally:
        hung.release.set()
        manager.close()


def test_close_interrupts_a_retry_wait_and_records_why() -> None:
    sink, log = MemorySink(errors=[DeliveryError("503")] * 5), MemoryAlertLog()
    # Real sleep (the stop event): a 60 s backoff that close() must cut short.
    manager = AlertManager(
        [sink], log, AlertConfig(backoff_s=60, tick_interval_s=None), clock=FakeClock(T0)
    )
    manager.submit(event("a"))
    deadline = time.monotonic() + 5
    while not log.rows and time.monotonic() < deadline:
        time.sleep(0.01)
    started = time.monotonic()
    manager.close(timeout_s=5)
    assert time.monotonic() - started < 2
    assert [(r["attempts"], r["final"], r["error"]) for r in log.rows] == [
        (1, 0, "503"),
        (1, 1, "not retried, stopping: 503"),
    ]
    assert manager.submit(event("late")) == []


def test_close_records_what_was_never_sent() -> None:
    hung, log = BlockingSink(), MemoryAlertLog()
    manager = make([hung], log)
    manager.submit(event("a"))
    assert hung.entered.wait(5)
    manager.submit(event("b"))
    manager.close(timeout_s=0.2)
    assert [(r["key"], r["error"]) for r in log.rows] == [("b", "not sent: llm-watchdog stopped")]
    assert not hung.closed  # still busy: not closed under its feet
    hung.release.set()
    for w in manager._workers:
        w.thread.join(5)
        assert not w.thread.is_alive()


def test_disabled_config_sends_nothing() -> None:
    sink = MemorySink()
    with make([sink], enabled=False) as manager:
        assert manager.submit(event("a")) == []


# -- recording ---------------------------------------------------------------------------


class FakeStore:
    def __init__(self) -> None:
        self.rows: list[tuple[str, dict[str, Any]]] = []

    def insert(self, table: str, row: dict[str, Any]) -> None:
        self.rows.append((table, row))


def test_recorder_forms() -> None:
    store, got = FakeStore(), []
    as_recorder(store)({"a": 1})
    as_recorder(got.append)({"b": 2})
    as_recorder(None)({"c": 3})
    assert store.rows == [("alerts", {"a": 1})] and got == [{"b": 2}]
    with pytest.raises(TypeError, match="recorder must be callable"):
        as_recorder(42)


def test_a_failing_recorder_does_not_stop_delivery(caplog: pytest.LogCaptureFixture) -> None:
    def broken(row: dict[str, Any]) -> None:
        raise OSError("database is locked")

    sink = MemorySink()
    with make([sink], broken) as manager:
        manager.submit(event("a"))
        assert manager.flush(5)
    assert [a.key for a in sink.sent] == ["a"]
    assert "cannot record alert attempt for memory: database is locked" in caplog.text


def test_memory_log_drain_hands_rows_over_once() -> None:
    log = MemoryAlertLog()
    log.record({"x": 1})
    assert log.drain() == [{"x": 1}] and log.drain() == [] and log.rows == []


def test_rows_fit_the_alerts_table(db: sqlite_utils.Database) -> None:
    names = [m.name for m in discover()]
    assert "m003_alerts" in names and "m010_alert_cause" in names
    migrate(
        db,
        [
            Migration(3, "m003_alerts", m003_alerts.up),
            Migration(10, "m010_alert_cause", m010_alert_cause.up),
        ],
    )
    ok = attempt_row(event("a"), "ops-slack", T0, ok=True, attempts=1)
    failed = attempt_row(event("a"), "ops-slack", T0 + 1, ok=False, attempts=5, error="503")
    for row in (ok, failed):
        db.table("alerts").insert(row, alter=False)  # a column the table lacks would fail
    got = list(db.query("SELECT sink, ok, attempts, final, error, cause FROM alerts ORDER BY ts"))
    cause = event("a").cause
    assert got == [
        {"sink": "ops-slack", "ok": 1, "attempts": 1, "final": 1, "error": None, "cause": cause},
        {"sink": "ops-slack", "ok": 0, "attempts": 5, "final": 1, "error": "503", "cause": cause},
    ]
    assert {"idx_alerts_ts", "idx_alerts_key"} <= {i.name for i in db.table("alerts").indexes}


def test_workers_record_through_the_store(store: Store) -> None:
    sink = MemorySink("ops", errors=[DeliveryError("503")])
    with make([sink], store) as manager:
        manager.submit(event("drift:1"))
        assert manager.flush(5)
    rows = store.rows("SELECT key, sink, ok, attempts, final FROM alerts ORDER BY id")
    assert rows == [
        {"key": "drift:1", "sink": "ops", "ok": 0, "attempts": 1, "final": 0},
        {"key": "drift:1", "sink": "ops", "ok": 1, "attempts": 2, "final": 1},
    ]
