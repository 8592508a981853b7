"""A chat slowdown pages only when chat breaks its target: drifted but within it, it warns."""

from __future__ import annotations

from typing import Any

import pytest

from llm_watchdog.alerts.events import AlertEvent
from llm_watchdog.alerts.manager import AlertManager
from llm_watchdog.alerts.sinks import BaseSink
from llm_watchdog.config import settings_from_dict
from llm_watchdog.daemon.judge import Judge, alert_for, chat_severity
from llm_watchdog.daemon.service import Daemon
from llm_watchdog.drift import DriftConfig, DriftEvent
from llm_watchdog.store.db import Store
from tests.helpers.builders import FakeClock
from tests.helpers.fakenvml import scenario_basic
from tests.helpers.streamserver import closed_port_url

T0 = 1_796_100_000.0
OPENED = "Chat slowed under heat: p95 TTFT {p95} vs 400 ms baseline; GPU 86 °C"


class MemorySink(BaseSink):
    def __init__(self, name: str, **kw: Any) -> None:
        super().__init__(name, **kw)
        self.sent: list[AlertEvent] = []

    def send(self, alert: AlertEvent) -> None:
        self.sent.append(alert)


def latency_event(p95_ms: float | None, change: str = "opened") -> DriftEvent:
    closed = change == "closed"
    return DriftEvent(
        id="latency-1796100000000",
        serial=1,
        kind="latency",
        change=change,
        start_ts=T0,
        end_ts=T0 + 600 if closed else None,
        cause="thermal",
        baseline_p95_ms=400.0,
        peak_p95_ms=p95_ms,
        message=("Resolved after 10 min: " if closed else "") + OPENED.format(p95=f"{p95_ms} ms"),
        ts=T0 + 600 if closed else T0,
    )


@pytest.mark.parametrize(
    ("p95_ms", "severity", "clause"),
    [
        (820.0, "warning", "; p95 820 ms, within the 1.5 s target"),
        (1500.0, "warning", "; p95 1.5 s, within the 1.5 s target"),
        (1900.0, "critical", "; p95 1.9 s, over the 1.5 s target"),
    ],
)
def test_severity_follows_the_target_not_the_baseline(p95_ms, severity, clause) -> None:
    alert = alert_for(latency_event(p95_ms), target_p95_ms=1500.0)
    assert alert is not None
    assert (alert.kind, alert.key, alert.severity) == (
        "chat_slowed",
        "drift:latency-1796100000000",
        severity,
    )
    assert chat_severity(p95_ms, 1500.0) == (severity, clause)
    # The opening message has said its p95 already: the alert's clause names it, once.
    within = clause.split(", ", 1)[1]
    assert alert.message == OPENED.format(p95=f"{p95_ms} ms") + f"; p95 {within}"
    assert alert.fields["target_p95_ms"] == 1500.0


@pytest.mark.parametrize(("p95_ms", "target_ms"), [(820.0, None), (None, 1500.0)])
def test_without_a_target_or_a_p95_a_slowdown_stays_critical(p95_ms, target_ms) -> None:
    event = latency_event(p95_ms)
    alert = alert_for(event, target_p95_ms=target_ms)
    assert alert is not None
    assert alert.severity == "critical"
    assert alert.message == event.message


def test_a_pager_for_critical_hears_neither_end_of_a_slowdown_within_target() -> None:
    """The resolved alert goes where its firing one went: nowhere, for a warning."""
    pager = MemorySink("pager", min_severity="critical")
    chat = MemorySink("chat")
    with AlertManager([pager, chat], clock=FakeClock(T0)) as manager:
        for change in ("opened", "closed"):
            alert = alert_for(latency_event(820.0, change), target_p95_ms=1500.0)
            assert alert is not None
            manager.submit(alert)
        assert manager.flush(5)
    assert pager.sent == []
    assert [(a.state, a.severity) for a in chat.sent] == [
        ("firing", "warning"),
        ("resolved", "warning"),
    ]


def test_a_slowdown_over_target_pages_and_resolves_on_the_pager() -> None:
    pager = MemorySink("pager", min_severity="critical")
    with AlertManager([pager], clock=FakeClock(T0)) as manager:
        for change in ("opened", "closed"):
            alert = alert_for(latency_event(1900.0, change), target_p95_ms=1500.0)
            assert alert is not None
            manager.submit(alert)
        assert manager.flush(5)
    assert [(a.state, a.severity) for a in pager.sent] == [
        ("firing", "critical"),
        ("resolved", "critical"),
    ]


def test_the_daemon_judges_chat_against_its_configured_target(db_path) -> None:
    settings = settings_from_dict(
        {
            "server": {"url": closed_port_url()},
            "storage": {"path": str(db_path)},
            "control": {"target_p95": "1.5s"},
        },
        "test.toml",
    )
    with Store(db_path) as store:
        daemon = Daemon(settings, store, nvml=scenario_basic())
        assert daemon.judge is not None
        assert daemon.judge.target_p95_ms == 1500.0


class Submitted:
    """The part of AlertManager the judge uses."""

    def __init__(self) -> None:
        self.sent: list[AlertEvent] = []

    def submit(self, alert: AlertEvent) -> None:
        self.sent.append(alert)


def test_a_slowdown_that_opens_within_target_pages_once_it_passes_it(store: Store) -> None:
    # Updates of an event send nothing; a slowdown that opens as a warning and then grows
    # past the target must still reach a pager set to critical, once, and resolve there.
    alerts = Submitted()
    judge = Judge(store, DriftConfig(), alerts, target_p95_ms=1500.0)
    judge._publish([latency_event(820.0)])
    judge._publish([latency_event(1200.0, "updated")])  # still within: nothing
    judge._publish([latency_event(1900.0, "updated")])  # past it: the page
    judge._publish([latency_event(2400.0, "updated")])  # paged already
    judge._publish([latency_event(2400.0, "closed")])
    assert [(a.key.removeprefix("drift:"), a.state) for a in alerts.sent] == [
        ("latency-1796100000000", "firing"),
        ("latency-1796100000000:over_target", "firing"),
        ("latency-1796100000000", "resolved"),
        ("latency-1796100000000:over_target", "resolved"),
    ]
    assert [a.severity for a in alerts.sent[:2]] == ["warning", "critical"]
    assert alerts.sent[1].message.endswith("; now p95 1.9 s, over the 1.5 s target")
    # Two resolutions at once, told apart by their words, not only by their keys.
    said = "The slowdown that passed the 1.5 s target has ended: " + alerts.sent[2].message
    assert alerts.sent[3].message == said
    pager = MemorySink("pager", min_severity="critical")
    with AlertManager([pager], clock=FakeClock(T0)) as manager:
        for alert in alerts.sent:
            manager.submit(alert)
        assert manager.flush(5)
    assert [(a.state, a.severity) for a in pager.sent] == [
        ("firing", "critical"),
        ("resolved", "critical"),
    ]


def test_a_slowdown_opened_over_target_pages_once(store: Store) -> None:
    alerts = Submitted()
    judge = Judge(store, DriftConfig(), alerts, target_p95_ms=1500.0)
    for p95, change in ((1900.0, "opened"), (2500.0, "updated"), (2500.0, "closed")):
        judge._publish([latency_event(p95, change)])
    assert [(a.key, a.state) for a in alerts.sent] == [
        ("drift:latency-1796100000000", "firing"),
        ("drift:latency-1796100000000", "resolved"),
    ]
    assert alerts.sent[0].severity == "critical"


class Carried(Submitted):
    def __init__(self, carried: list[str]) -> None:
        super().__init__()
        self.carried_keys = carried


def test_a_page_past_the_target_from_an_earlier_run_resolves_with_its_slowdown(
    store: Store,
) -> None:
    key = "drift:latency-1796100000000:over_target"
    alerts = Carried([key])
    judge = Judge(store, DriftConfig(), alerts, target_p95_ms=1500.0)
    judge._publish([latency_event(2400.0, "closed")])
    assert [(a.key, a.state) for a in alerts.sent] == [
        ("drift:latency-1796100000000", "resolved"),
        (key, "resolved"),
    ]
