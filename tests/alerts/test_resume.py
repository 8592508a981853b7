"""Alerts across a daemon restart: the firing alerts an earlier run sent are read back from
the store, so their events' ends are told once, where the firing alert went."""

from __future__ import annotations

from typing import Any

import pytest

from llm_watchdog.alerts.config import AlertConfig
from llm_watchdog.alerts.events import AlertEvent
from llm_watchdog.alerts.manager import AlertManager, attempt_row
from llm_watchdog.alerts.policy import AlertPolicy
from llm_watchdog.drift import DriftEvent
from llm_watchdog.store.db import Store
from llm_watchdog.store.records import owed_resolves, save_event
from tests.alerts.test_manager import MemorySink
from tests.helpers.builders import FakeClock

T0 = 1_700_000_000.0


def firing(key: str, kind: str = "probes_failing", ts: float = T0) -> AlertEvent:
    return AlertEvent(
        key=key,
        kind=kind,
        state="firing",
        ts=ts,
        title="Canary probes failing",
        message=f"probes failing ({key})",
        cause="connect_refused",
    )


def resolved(key: str, ts: float, message: str = "", kind: str = "probes_failing") -> AlertEvent:
    return AlertEvent(
        key=key,
        kind=kind,
        state="resolved",
        ts=ts,
        title="Canary probes failing",
        message=message,
    )


def drift_event(event_id: str, start_ts: float, end_ts: float | None = None) -> DriftEvent:
    return DriftEvent(
        id=event_id,
        serial=1,
        kind="probes_failing",
        change="closed" if end_ts else "opened",
        start_ts=start_ts,
        end_ts=end_ts,
        cause="unknown",
        baseline_p95_ms=None,
        peak_p95_ms=None,
        message="probes failing",
        ts=end_ts or start_ts,
    )


def sent(store: Store, alert: AlertEvent, sink: str, ts: float, ok: bool = True) -> None:
    error = None if ok else "401 bad token"
    store.insert("alerts", attempt_row(alert, sink, ts, ok=ok, attempts=1, error=error))


def make(sinks: list[Any], store: Store) -> AlertManager:
    config = AlertConfig(tick_interval_s=None)
    return AlertManager(sinks, store, config, clock=FakeClock(T0 + 600), sleep=lambda s: None)


def test_policy_restore_counts_the_alert_as_sent_and_resolves_it_once() -> None:
    policy = AlertPolicy()
    assert policy.restore(firing("drift:a"))
    assert not policy.restore(firing("drift:a"))
    assert policy.decide(firing("drift:a"), T0 + 60) == []  # no second firing alert
    (out,) = policy.decide(resolved("drift:a", T0 + 120, "Resolved after 2 min"), T0 + 120)
    assert (out.state, out.key, out.message) == ("resolved", "drift:a", "Resolved after 2 min")
    assert out.fields["started_ts"] == T0
    assert policy.decide(resolved("drift:a", T0 + 130), T0 + 130) == []
    with pytest.raises(ValueError, match="firing"):
        policy.restore(resolved("drift:b", T0))


def test_owed_resolves_reads_delivered_firing_alerts_of_open_events(store: Store) -> None:
    save_event(store, drift_event("probes_failing-1", T0), "fp")
    save_event(store, drift_event("probes_failing-2", T0 + 10), "fp")
    save_event(store, drift_event("probes_failing-3", T0 + 20, end_ts=T0 + 30), "fp")
    sent(store, firing("drift:probes_failing-1"), "log", T0 + 1)
    sent(store, firing("drift:probes_failing-1"), "hook", T0 + 1, ok=False)  # never got it
    sent(store, firing("drift:probes_failing-2"), "log", T0 + 11)
    sent(store, resolved("drift:probes_failing-2", T0 + 15), "log", T0 + 15)  # told already
    sent(store, firing("drift:probes_failing-3"), "log", T0 + 21)  # its event is over
    # GPU telemetry lost has no drift event: owed until that GPU's resolved alert got through.
    sent(store, firing("telemetry:0", kind="telemetry_lost"), "log", T0 + 2)
    sent(store, firing("telemetry:1", kind="telemetry_lost"), "log", T0 + 3)
    sent(store, resolved("telemetry:1", T0 + 4, kind="telemetry_lost"), "log", T0 + 4)
    rows = owed_resolves(store)
    assert [(r["key"], r["sink"], r["start_ts"], r["sent_ts"]) for r in rows] == [
        ("drift:probes_failing-1", "log", T0, T0 + 1),
        ("telemetry:0", "log", None, T0 + 2),
    ]
    assert rows[0]["title"] == "Canary probes failing"
    assert rows[0]["severity"] == "critical"


def test_a_manager_over_the_store_resolves_what_an_earlier_run_sent(store: Store) -> None:
    key = "drift:probes_failing-1"
    save_event(store, drift_event("probes_failing-1", T0), "fp")
    sent(store, firing(key), "log", T0 + 1)
    log, hook = MemorySink("log"), MemorySink("hook")
    manager = make([log, hook], store)
    try:
        assert manager.policy.active_keys == [key]
        assert manager.submit(firing(key)) == []  # the carried-over event still fires
        message = "Resolved after 5 min (daemon restarted): probes failing"
        (out,) = manager.submit(resolved(key, T0 + 300, message))
        assert manager.flush(5)
    finally:
        manager.close()
    assert [(a.state, a.key, a.message) for a in log.sent] == [("resolved", key, message)]
    assert hook.sent == []  # this sink never got the firing alert
    rows = store.rows(
        "SELECT sink, state, ok, error FROM alerts WHERE ts > ? ORDER BY sink", (T0 + 1,)
    )
    assert [(r["sink"], r["state"], r["ok"]) for r in rows] == [
        ("hook", "resolved", 0),
        ("log", "resolved", 1),
    ]
    # The next start owes nothing more.
    assert owed_resolves(store) == []


def test_a_store_that_cannot_be_read_leaves_alerting_as_it_was(store: Store) -> None:
    store.execute("DROP TABLE alerts")
    manager = make([MemorySink()], store)
    try:
        assert manager.policy.active_keys == []
    finally:
        manager.close()
