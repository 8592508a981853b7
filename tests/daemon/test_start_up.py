"""What a daemon finds when it starts.

Drift events a stopped run left open: the next run carries them on or closes them, so
`drift --open` and `status` list one open event per condition, not one per restart. An engine
that is not up yet (the daemon boots before vLLM has loaded): its model is read as soon as it
answers, not at the next fingerprint job a minute later."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from llm_watchdog.alerts import AlertConfig, AlertEvent, AlertManager
from llm_watchdog.alerts.sinks import BaseSink
from llm_watchdog.config import settings_from_dict
from llm_watchdog.daemon.service import Daemon
from llm_watchdog.drift import DriftEvent
from llm_watchdog.store.db import Store
from llm_watchdog.store.records import save_event
from tests.helpers import fakenvml
from tests.helpers.streamserver import StreamServer, closed_port_url


def settings_for(url: str, db: Path):
    return settings_from_dict(
        {
            "server": {"url": url, "model": "auto"},
            "probe": {"interval": "1s", "jitter": "0s"},
            "gpu": {"enabled": False},
            "storage": {"path": str(db)},
            "api": {"listen": ""},
        },
        "test.toml",
    )


def run_daemon(url: str, db: Path, store: Store, probes: int) -> list:
    daemon = Daemon(settings_for(url, db), store)
    daemon.startup()
    try:
        return [daemon.probe_once() for _ in range(probes)]
    finally:
        daemon.shutdown(timeout_s=2)


def failing_rows(store: Store) -> list[dict]:
    return store.rows(
        "SELECT id, start_ts, end_ts, message FROM drift_events "
        "WHERE kind = 'probes_failing' ORDER BY start_ts"
    )


def test_a_restarted_daemon_carries_on_the_failing_event_and_resolves_it(db_path):
    dead = closed_port_url()
    with Store(db_path) as store:
        assert not any(r.ok for r in run_daemon(dead, db_path, store, 4))
        (first,) = failing_rows(store)
        assert first["end_ts"] is None
        # Restarted while the server is still down: the same event stays open.
        assert not any(r.ok for r in run_daemon(dead, db_path, store, 4))
        assert failing_rows(store) == [first]
        # Restarted against a server that answers: the event resolves once probes pass.
        with StreamServer(answer="Paris", engine="vllm") as srv:
            assert all(r.ok for r in run_daemon(srv.url, db_path, store, 5))
        (row,) = failing_rows(store)
    assert row["id"] == first["id"] and row["end_ts"] is not None
    assert row["message"].startswith("Resolved after")


def event(kind: str, start_ts: float, cause: str = "unknown") -> DriftEvent:
    return DriftEvent(
        id=f"{kind}-{round(start_ts * 1000)}",
        serial=1,
        kind=kind,
        change="opened",
        start_ts=start_ts,
        end_ts=None,
        cause=cause,
        baseline_p95_ms=800.0,
        peak_p95_ms=2400.0 if kind == "latency" else None,
        message=f"{kind} opened",
        ts=start_ts,
    )


def test_events_a_restart_cannot_carry_on_end_with_daemon_restarted(db_path):
    with Store(db_path) as store:
        # What older versions left: one failing event per restart, and a latency event.
        for ev in (
            event("probes_failing", 1_700_000_000.0),
            event("probes_failing", 1_700_000_600.0),
            event("latency", 1_700_000_100.0, "thermal"),
        ):
            save_event(store, ev, "fp-old")
        run_daemon(closed_port_url(), db_path, store, 1)
        rows = {r["id"]: r for r in store.rows("SELECT id, end_ts, message FROM drift_events")}
    assert len(rows) == 3, "no history row is lost"
    older, newer = rows["probes_failing-1700000000000"], rows["probes_failing-1700000600000"]
    latency = rows["latency-1700000100000"]
    assert newer["end_ts"] is None, "the newest failing event is carried on"
    for closed in (older, latency):
        assert closed["end_ts"] is not None
        assert "(daemon restarted)" in closed["message"]


class LateEngine:
    """A vLLM-like engine behind a MockTransport: connection refused until `up`, then
    /v1/models lists its model and a chat for any other model name is HTTP 404."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.up = False
        self.chat_models: list[str] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        if not self.up:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        path = request.url.path
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": self.model, "owned_by": "vllm"}]})
        if path == "/version":
            return httpx.Response(200, json={"version": "0.9.1"})
        if path == "/v1/chat/completions":
            asked = json.loads(request.content)["model"]
            self.chat_models.append(asked)
            if asked != self.model:
                error = {"message": f"The model `{asked}` does not exist.", "code": 404}
                return httpx.Response(404, json={"error": error})
            chunk = {"choices": [{"index": 0, "delta": {"content": "Paris"}}]}
            body = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n"
            return httpx.Response(
                200, content=body.encode(), headers={"content-type": "text/event-stream"}
            )
        return httpx.Response(404, json={"error": "no such path"})


def daemon_on(engine: LateEngine, db: Path, store: Store) -> Daemon:
    settings = settings_for("http://127.0.0.1:9", db)
    daemon = Daemon(settings, store, transport=httpx.MockTransport(engine.handler))
    daemon.startup()
    return daemon


def test_an_engine_that_comes_up_after_the_daemon_is_probed_at_its_next_probe(db_path):
    engine = LateEngine("Qwen/Qwen3-8B")
    with Store(db_path) as store:
        daemon = daemon_on(engine, db_path, store)  # the daemon starts first: nothing listens
        try:
            down = [daemon.probe_once() for _ in range(3)]
            engine.up = True  # the engine finished loading
            up = [daemon.probe_once() for _ in range(5)]
        finally:
            daemon.shutdown(timeout_s=2)
        fingerprint = store.latest_fingerprint()
        (failing,) = failing_rows(store)
    assert [r.error_class for r in down] == ["connect_refused"] * 3
    # The first probe after the engine is up already names its model and passes.
    assert [r.ok for r in up] == [True] * 5, [r.error_detail for r in up]
    assert engine.chat_models == ["Qwen/Qwen3-8B"] * 5
    assert daemon.model == "Qwen/Qwen3-8B" and fingerprint["model"] == "Qwen/Qwen3-8B"
    assert failing["end_ts"] is not None


def test_an_engine_restarted_with_another_model_is_followed_after_one_refused_probe(db_path):
    engine = LateEngine("Qwen/Qwen3-8B")
    engine.up = True
    with Store(db_path) as store:
        daemon = daemon_on(engine, db_path, store)
        try:
            assert daemon.probe_once().ok
            engine.model = "meta-llama/Llama-3.1-8B-Instruct"  # restarted with another model
            refused = daemon.probe_once()
            after = daemon.probe_once()
        finally:
            daemon.shutdown(timeout_s=2)
    assert refused.error_class == "http_status" and refused.http_status == 404
    assert after.ok, after.error_detail
    assert daemon.model == "meta-llama/Llama-3.1-8B-Instruct"


class Alerts:
    """Keeps what the daemon submits."""

    def __init__(self) -> None:
        self.submitted: list = []

    def submit(self, alert) -> list:
        self.submitted.append(alert)
        return [alert]


def test_the_failing_alert_names_the_failure_when_nothing_listens(db_path):
    dead = closed_port_url()
    alerts = Alerts()
    with Store(db_path) as store:
        daemon = Daemon(settings_for(dead, db_path), store, alerts=alerts)
        daemon.startup()
        try:
            results = [daemon.probe_once() for _ in range(3)]
        finally:
            daemon.shutdown(timeout_s=2)
    assert {r.error_class for r in results} == {"connect_refused"}
    (alert,) = [a for a in alerts.submitted if a.kind == "probes_failing"]
    assert alert.state == "firing" and alert.fields["failure"] == "connect_refused"
    assert alert.cause == "unknown"  # a label Alertmanager matches the resolved alert by
    assert f"every failure connect_refused, nothing listens at {dead}" in alert.message


class RecordingSink(BaseSink):
    """Keeps every alert it is sent, across the daemon runs that share it."""

    def __init__(self, name: str = "recording") -> None:
        super().__init__(name)
        self.sent: list[AlertEvent] = []

    def send(self, alert: AlertEvent) -> None:
        self.sent.append(alert)


def run_alerting(url: str, db: Path, store: Store, probes: int, sinks: list) -> list:
    """One daemon run whose alerts go to `sinks` through a manager over the store, as
    `llm-watchdog run` builds it; every alert is delivered before the run returns."""
    alerts = AlertManager(sinks, store, AlertConfig(tick_interval_s=None))
    try:
        daemon = Daemon(settings_for(url, db), store, alerts=alerts)
        daemon.startup()
        try:
            results = [daemon.probe_once() for _ in range(probes)]
        finally:
            daemon.shutdown(timeout_s=2)
        assert alerts.flush(5)
    finally:
        alerts.close()
    return results


def failing_alerts(sink: RecordingSink) -> list[tuple[str, str]]:
    return [(a.state, a.key) for a in sink.sent if a.kind == "probes_failing"]


def test_the_failing_alert_a_restarted_daemon_carries_on_resolves_once(db_path):
    dead = closed_port_url()
    sink = RecordingSink()
    with Store(db_path) as store:
        assert not any(r.ok for r in run_alerting(dead, db_path, store, 4, [sink]))
        (first,) = failing_rows(store)
        key = f"drift:{first['id']}"
        assert failing_alerts(sink) == [("firing", key)]
        # Restarted while the server is still down: the same alert, not sent again.
        assert not any(r.ok for r in run_alerting(dead, db_path, store, 4, [sink]))
        assert failing_alerts(sink) == [("firing", key)]
        # Restarted against a server that answers: the one resolved alert reaches the sink.
        with StreamServer(answer="Paris", engine="vllm") as srv:
            assert all(r.ok for r in run_alerting(srv.url, db_path, store, 5, [sink]))
        # Once resolved, a later restart owes nothing.
        with StreamServer(answer="Paris", engine="vllm") as srv:
            assert all(r.ok for r in run_alerting(srv.url, db_path, store, 2, [sink]))
    assert failing_alerts(sink) == [("firing", key), ("resolved", key)]
    resolved = sink.sent[-1]
    assert resolved.message.startswith("Resolved after")


def test_a_restarted_daemon_resolves_only_at_the_sinks_that_got_the_firing_alert(db_path):
    dead = closed_port_url()
    before, added = RecordingSink("before"), RecordingSink("added")
    with Store(db_path) as store:
        run_alerting(dead, db_path, store, 4, [before])
        with StreamServer(answer="Paris", engine="vllm") as srv:
            run_alerting(srv.url, db_path, store, 5, [before, added])
        (row,) = failing_rows(store)
    key = f"drift:{row['id']}"
    assert failing_alerts(before) == [("firing", key), ("resolved", key)]
    assert failing_alerts(added) == []


def test_an_alerted_event_closed_at_start_up_sends_a_resolved_alert_saying_so(db_path):
    dead = closed_port_url()
    sink = RecordingSink()
    with Store(db_path) as store:
        run_alerting(dead, db_path, store, 4, [sink])
        (first,) = failing_rows(store)
        # A newer failing event left open as well (by an older version, say): the restart
        # carries that one on and closes the alerted one.
        save_event(store, event("probes_failing", first["start_ts"] + 60), "fp-old")
        run_alerting(dead, db_path, store, 1, [sink])
        closed = store.rows("SELECT end_ts FROM drift_events WHERE id = ?", (first["id"],))
    key = f"drift:{first['id']}"
    assert closed[0]["end_ts"] is not None
    assert failing_alerts(sink) == [("firing", key), ("resolved", key)]
    assert "(daemon restarted)" in sink.sent[-1].message


def run_gpu(nvml, db: Path, store: Store, samples: int, sinks: list) -> list[str]:
    """One daemon run sampling `nvml` (no probes); the GPU event kinds it recorded."""
    alerts = AlertManager(sinks, store, AlertConfig(tick_interval_s=None))
    settings = settings_from_dict(
        {
            "server": {"url": closed_port_url(), "model": "m"},
            "gpu": {"enabled": True, "call_timeout": "1s"},
            "storage": {"path": str(db)},
            "api": {"listen": ""},
        },
        "test.toml",
    )
    try:
        daemon = Daemon(settings, store, nvml=nvml, alerts=alerts)
        daemon.startup()
        try:
            for _ in range(samples):
                daemon.sample_gpu()
        finally:
            daemon.shutdown(timeout_s=2)
        assert alerts.flush(5)
    finally:
        alerts.close()
    return [e["kind"] for e in store.gpu_events()]


def telemetry_alerts(sink: RecordingSink) -> list[tuple[str, str, str]]:
    return [(a.state, a.key, a.message) for a in sink.sent if a.kind == "telemetry_lost"]


def test_a_gpu_lost_before_a_restart_resolves_when_it_answers_after_it(db_path):
    # GPU 0 falls off the bus and the daemon is restarted before it is back (a reboot of the
    # service, a crash): the new run never saw it lost and tells no recovery of its own.
    sink = RecordingSink()
    with Store(db_path) as store:
        lost = fakenvml.scenario_gpu_lost(lost_after_samples=1, back_after_inits=99)
        assert "gpu_lost" in run_gpu(lost, db_path, store, 3, [sink])
        assert [a[:2] for a in telemetry_alerts(sink)] == [("firing", "telemetry:0")]
        # Restarted with GPU 0 still gone: the alert is carried on, not sent again.
        still = fakenvml.scenario_gpu_lost(lost_after_samples=0, back_after_inits=99)
        assert run_gpu(still, db_path, store, 3, [sink]).count("gpu_lost") == 2
        assert [a[:2] for a in telemetry_alerts(sink)] == [("firing", "telemetry:0")]
        # Restarted with both GPUs answering: the first reading resolves it, once.
        run_gpu(fakenvml.scenario_basic(), db_path, store, 3, [sink])
        run_gpu(fakenvml.scenario_basic(), db_path, store, 2, [sink])
    assert telemetry_alerts(sink)[1:] == [("resolved", "telemetry:0", "GPU 0 answers NVML again")]


def test_a_restart_on_another_runtime_says_what_changed_and_one_on_the_same_says_nothing(
    db_path, caplog
):
    import dataclasses
    import logging

    with StreamServer() as srv, Store(db_path) as store:
        caplog.set_level(logging.INFO, logger="llm_watchdog")
        run_daemon(srv.url, db_path, store, 1)
        run_daemon(srv.url, db_path, store, 1)  # the same runtime: nothing to say
        assert "runtime changed" not in caplog.text
        other = settings_for(srv.url, db_path)
        probe = dataclasses.replace(other.probe, cache_mode="cached")
        daemon = Daemon(dataclasses.replace(other, probe=probe), store)
        daemon.startup()
        try:
            daemon.probe_once()
        finally:
            daemon.shutdown(timeout_s=2)
    (line,) = [r.getMessage() for r in caplog.records if "runtime changed" in r.getMessage()]
    assert line.startswith("runtime changed since the last run: config changed: "), line
