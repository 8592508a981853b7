"""The Alertmanager sink against a local stand-in that checks the API v2 schema."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from llm_watchdog.alerts import AlertConfigError, AlertEvent, AlertManager, MemoryAlertLog
from llm_watchdog.alerts.alertmanager import AlertmanagerSink, alert_name
from llm_watchdog.alerts.config import sinks_from_config
from llm_watchdog.daemon.judge import alert_for
from llm_watchdog.drift.values import DriftEvent

LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
ALERT_KEYS = {"labels", "annotations", "startsAt", "endsAt", "generatorURL"}


def rfc3339(text: Any) -> datetime:
    assert isinstance(text, str) and text.endswith("Z"), text
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def schema_problems(body: Any) -> list[str]:
    """What Alertmanager's openapi `postableAlerts` would reject in `body`."""
    if not isinstance(body, list):
        return ["the body must be a JSON array of alerts"]
    problems = []
    for i, alert in enumerate(body):
        if not isinstance(alert, dict):
            problems.append(f"[{i}] not an object")
            continue
        if set(alert) - ALERT_KEYS:
            problems.append(f"[{i}] unknown keys {sorted(set(alert) - ALERT_KEYS)}")
        labels = alert.get("labels")
        if not isinstance(labels, dict) or not labels:
            problems.append(f"[{i}] labels is required and must be a non-empty object")
            continue
        for k, v in labels.items():
            if not LABEL_NAME.match(k) or not isinstance(v, str) or not v:
                problems.append(f"[{i}] bad label {k}={v!r}")
        for k, v in (alert.get("annotations") or {}).items():
            if not isinstance(v, str):
                problems.append(f"[{i}] annotation {k} must be a string")
        try:
            starts = rfc3339(alert["startsAt"]) if "startsAt" in alert else None
            ends = rfc3339(alert["endsAt"]) if "endsAt" in alert else None
        except (AssertionError, ValueError) as exc:
            problems.append(f"[{i}] bad time: {exc}")
            continue
        if starts and ends and ends < starts:
            problems.append(f"[{i}] endsAt before startsAt")
    return problems


@dataclass
class StandIn:
    posts: list[list[dict[str, Any]]] = field(default_factory=list)
    fail_next: int = 0
    got: threading.Event = field(default_factory=threading.Event)

    def start(self) -> StandIn:
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path != "/api/v2/alerts":
                    self._answer(404, {"message": "not found"})
                    return
                if stand_in.fail_next:
                    stand_in.fail_next -= 1
                    self._answer(503, {"message": "try later"})
                    return
                data = json.loads(body)
                problems = schema_problems(data)
                if problems:
                    self._answer(400, {"code": 400, "message": "; ".join(problems)})
                    return
                stand_in.posts.append(data)
                stand_in.got.set()
                self._answer(200, None)

            def _answer(self, status: int, obj: Any) -> None:
                data = b"" if obj is None else json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def am() -> Iterator[StandIn]:
    stand_in = StandIn().start()
    yield stand_in
    stand_in.server.shutdown()
    stand_in.server.server_close()


def drift_event(change: str, end_ts: float | None = None) -> DriftEvent:
    return DriftEvent(
        id="latency-1796100000000",
        serial=1,
        kind="latency",
        change=change,
        start_ts=1796100000.0,
        end_ts=end_ts,
        cause="thermal",
        baseline_p95_ms=800.0,
        peak_p95_ms=1900.0,
        message="Chat slowed under heat: p95 TTFT 1.9 s vs 0.8 s baseline",
        ts=end_ts or 1796100000.0,
    )


def test_the_stand_in_rejects_what_alertmanager_would() -> None:
    assert schema_problems({"labels": {}}) == ["the body must be a JSON array of alerts"]
    assert schema_problems([{"labels": {"bad-name": "x"}}])
    assert schema_problems([{"labels": {"a": "b"}, "startsAt": "yesterday"}])
    assert schema_problems([{"labels": {"a": "b"}, "extra": 1}])
    assert not schema_problems([{"labels": {"a": "b"}, "endsAt": "2026-12-01T00:00:00.000Z"}])


def test_drift_events_fire_and_resolve_in_alertmanager(am: StandIn) -> None:
    now = [1796100030.0]
    sink = AlertmanagerSink(am.url, labels={"team": "ml"}, host="box1", clock=lambda: now[0])
    log = MemoryAlertLog()
    with AlertManager([sink], log) as manager:
        firing = alert_for(drift_event("opened"))
        assert firing is not None
        manager.submit(firing)
        assert manager.flush(5)
        now[0] = 1796100600.0
        resolved = alert_for(drift_event("closed", end_ts=1796100500.0))
        assert resolved is not None
        manager.submit(resolved)
        assert manager.flush(5)
    assert [row["ok"] for row in log.rows] == [1, 1], log.rows
    (fire,), (end,) = am.posts
    assert fire["labels"] == {
        "alertname": "ChatSlowed",
        "kind": "chat_slowed",
        "severity": "critical",
        "cause": "thermal",
        "instance": "box1",
        "job": "llm-watchdog",
        "team": "ml",
    }
    assert fire["annotations"]["summary"] == "Chat slowed"
    assert fire["annotations"]["description"].startswith("Chat slowed under heat")
    assert rfc3339(fire["startsAt"]).timestamp() == 1796100000.0
    # Firing: endsAt a few resend intervals ahead, so a dead daemon's alert lapses.
    assert rfc3339(fire["endsAt"]).timestamp() == pytest.approx(1796100030.0 + 180.0)
    assert end["labels"] == fire["labels"]
    assert rfc3339(end["endsAt"]).timestamp() == 1796100500.0


def test_firing_alerts_are_posted_again_until_resolved(am: StandIn) -> None:
    sink = AlertmanagerSink(am.url, resend_interval_s=3600)
    try:
        event = AlertEvent(
            key="k1", kind="heat_warning", state="firing", ts=1.0, title="t", message="m"
        )
        sink.send(event)
        assert sink.resend() == 1
        sink.send(
            AlertEvent(
                key="k1", kind="heat_warning", state="resolved", ts=2.0, title="t", message="m"
            )
        )
        assert sink.resend() == 0
    finally:
        sink.close()
    assert len(am.posts) == 3


def test_alertmanager_down_or_busy_is_a_retryable_failure(am: StandIn) -> None:
    from llm_watchdog.alerts import DeliveryError

    am.fail_next = 1
    sink = AlertmanagerSink(am.url)
    event = AlertEvent(
        key="k", kind="probes_failing", state="firing", ts=1.0, title="t", message="m"
    )
    with pytest.raises(DeliveryError) as info:
        sink.send(event)
    assert info.value.retryable and "503" in str(info.value)
    sink.close()
    gone = AlertmanagerSink("http://127.0.0.1:9", timeout_s=2)
    with pytest.raises(DeliveryError, match="is Alertmanager up"):
        gone.send(event)
    gone.close()


def test_config_builds_the_sink_and_names_bad_keys(am: StandIn) -> None:
    table = [
        {"type": "alertmanager", "url": am.url, "labels": {"team": "ml"}, "resend_interval": "30s"}
    ]
    (sink,) = sinks_from_config(table, env={})
    assert isinstance(sink, AlertmanagerSink)
    assert sink.endpoint == am.url + "/api/v2/alerts" and sink.resend_interval_s == 30.0
    sink.close()
    with pytest.raises(AlertConfigError, match=r"sink\[1\]\.url"):
        sinks_from_config([{"type": "alertmanager", "url": "localhost:9093"}], env={})
    with pytest.raises(AlertConfigError, match="label name"):
        sinks_from_config([{"type": "alertmanager", "url": am.url, "labels": {"a-b": "x"}}], env={})
    with pytest.raises(AlertConfigError, match="unknown key"):
        sinks_from_config([{"type": "alertmanager", "url": am.url, "shape": "slack"}], env={})


def test_alert_names_are_camel_case() -> None:
    assert alert_name("control_not_effective") == "ControlNotEffective"
