"""Issue #4 wired end to end: the daemon learns a baseline, catches a slowdown, stores the
event, alerts a real webhook and resolves it; the CLI lists it and replays the exported trace."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner

from llm_watchdog.alerts import AlertManager, load_alerts
from llm_watchdog.cli import cli
from llm_watchdog.config import settings_from_dict
from llm_watchdog.daemon.service import Daemon
from llm_watchdog.store.db import Store
from tests.helpers.builders import FakeClock, probe_result
from tests.helpers.fakenvml import scenario_basic
from tests.helpers.streamserver import StreamServer, closed_port_url


class Hook:
    """A webhook receiver on 127.0.0.1 that keeps every JSON body it is sent."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        hook = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers["Content-Length"])
                hook.bodies.append(json.loads(self.rfile.read(n)))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def hook():
    h = Hook()
    yield h
    h.close()


def config(url: str, db, hook_url: str) -> dict:
    return {
        "server": {"url": url},
        "probe": {"interval": "1s", "jitter": "0s"},
        "storage": {"path": str(db)},
        "drift": {"baseline_probes": 30},
        "alerts": {"backoff": "0.01s", "sink": [{"type": "webhook", "url": hook_url}]},
    }


@pytest.mark.slow
def test_slowdown_is_caught_stored_alerted_and_resolved(tmp_path, db_path, hook):
    clock = FakeClock(1_800_000_000.0)
    # Jitter like a real engine's (σ_log 0.15): a noiseless server makes the baseline's
    # spread the 3 % floor, and on a loaded machine a few scheduling hiccups of 5-10 ms on
    # 50 ms then read as a slowdown of their own.
    with StreamServer(
        answer="Paris", engine="vllm", first_token_delay_s=0.05, first_token_jitter=0.15
    ) as srv:
        settings = settings_from_dict(config(srv.url, db_path, hook.url), "t.toml")
        with Store(db_path) as store:
            alert_cfg, sinks = load_alerts(settings.alerts)
            manager = AlertManager(sinks, store, alert_cfg, clock=clock)
            daemon = Daemon(settings, store, nvml=scenario_basic(), clock=clock, alerts=manager)
            daemon.startup()

            def probes(n: int) -> list:
                out = []
                for _ in range(n):
                    clock.now += 10
                    daemon.sample_gpu()
                    out.append(daemon.probe_once())
                return out

            try:
                probes(40)  # cold start + 30 warm probes learn the baseline
                srv.set(first_token_delay_s=0.3)  # chat slows ×6
                slow = probes(15)
                srv.set(first_token_delay_s=0.05)
                probes(30)
            finally:
                daemon.shutdown(timeout_s=2)
                assert manager.flush(timeout_s=5)
                manager.close()
            assert all(r.ok for r in slow)
            events = store.rows("SELECT * FROM drift_events WHERE kind = 'latency'")
            baselines = store.rows("SELECT * FROM baselines")
    assert len(baselines) == 1 and baselines[0]["source"] == "auto"
    assert len(events) == 1, [(e["start_ts"], e["end_ts"], e["message"]) for e in events]
    ev = events[0]
    assert ev["end_ts"] is not None, "the event closes once chat is fast again"
    assert ev["peak_p95_ms"] > 3 * ev["baseline_p95_ms"]
    states = [(b["kind"], b["state"]) for b in hook.bodies]
    assert ("chat_slowed", "firing") in states and ("chat_slowed", "resolved") in states
    firing = next(b for b in hook.bodies if b["state"] == "firing")
    assert "p95 TTFT" in firing["message"]

    # The CLI shows it, and the exported trace replays to the same event.
    env = {
        "LLM_WATCHDOG__STORAGE__PATH": str(db_path),
        "LLM_WATCHDOG__DRIFT__BASELINE_PROBES": "30",
    }
    runner = CliRunner()
    out = runner.invoke(cli, ["drift", "--since", "3000d", "--json"], env=env, obj={})
    assert out.exit_code == 0, out.output
    listed = [json.loads(line) for line in out.output.splitlines()]
    assert [e["kind"] for e in listed] == ["latency"]
    trace = tmp_path / "trace.csv"
    out = runner.invoke(
        cli, ["history", "--since", "3000d", "--export-trace", str(trace)], env=env, obj={}
    )
    assert out.exit_code == 0, out.output
    assert trace.read_text().splitlines()[0].startswith("ts,ttft_ms,ok,cold,quality_pass")
    out = runner.invoke(cli, ["replay", str(trace), "--json"], env=env, obj={})
    assert out.exit_code == 0, out.output
    replayed = [json.loads(line) for line in out.output.splitlines()]
    latency = [e for e in replayed if e["kind"] == "latency"]
    assert len(latency) == 1
    assert latency[0]["start_ts"] == pytest.approx(ev["start_ts"])
    out = runner.invoke(cli, ["alerts", "--since", "3000d", "--json"], env=env, obj={})
    sent = [json.loads(line) for line in out.output.splitlines()]
    assert {(a["kind"], a["state"], a["ok"]) for a in sent} >= {
        ("chat_slowed", "firing", True),
        ("chat_slowed", "resolved", True),
    }
    # Both carry the event's cause: the label Alertmanager matches a resolved alert by.
    assert {a["cause"] for a in sent if a["kind"] == "chat_slowed"} == {ev["cause"]}


def test_replay_reports_bad_rows_with_line_numbers(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("ts,ttft_ms,ok\n1,100,1\n2,abc,1\n3,100,1\n")
    out = CliRunner().invoke(cli, ["replay", str(trace)], env={}, obj={})
    assert out.exit_code == 1
    assert "line 3" in out.output and "\n" == out.output[-1] and out.output.count("\n") == 1


def test_replay_of_a_missing_file_says_how_to_make_one(tmp_path):
    out = CliRunner().invoke(cli, ["replay", str(tmp_path / "none.csv")], env={}, obj={})
    assert out.exit_code == 1
    assert "--export-trace" in out.output


def test_baseline_capture_from_history_and_reset(db_path):
    with StreamServer(answer="Paris") as srv:
        settings = settings_from_dict(config(srv.url, db_path, "http://127.0.0.1:9/x"), "t.toml")
        with Store(db_path) as store:
            daemon = Daemon(settings, store, nvml=scenario_basic())
            daemon.startup()
            try:
                for _ in range(25):
                    daemon.probe_once()
            finally:
                daemon.shutdown(timeout_s=2)
    env = {"LLM_WATCHDOG__STORAGE__PATH": str(db_path)}
    runner = CliRunner()
    out = runner.invoke(cli, ["baseline", "capture", "--from-history", "1h"], env=env, obj={})
    assert out.exit_code == 0, out.output
    assert "from 24 probes" in out.output  # the cold first probe is kept out
    out = runner.invoke(cli, ["baseline", "show", "--json"], env=env, obj={})
    shown = [json.loads(line) for line in out.output.splitlines()]
    assert len(shown) == 1 and shown[0]["source"] == "capture"
    out = runner.invoke(cli, ["baseline", "reset"], env=env, obj={})
    assert "retired 1 baseline" in out.output
    out = runner.invoke(cli, ["baseline", "show", "--json"], env=env, obj={})
    assert out.output == ""


def test_baseline_capture_against_a_server_that_is_not_up_fails_at_once_and_writes_nothing(
    db_path,
):
    with Store(db_path) as store:
        store.record_probe(probe_result(), None)  # what the database held before
        before = store.rows("SELECT COUNT(*) AS n FROM probes")[0]["n"]
    dead = closed_port_url()
    env = {"LLM_WATCHDOG__STORAGE__PATH": str(db_path), "LLM_WATCHDOG__SERVER__URL": dead}
    out = CliRunner().invoke(cli, ["baseline", "capture", "--for", "5s"], env=env, obj={})
    assert out.exit_code == 1, out.output
    line = out.output.strip()
    assert "\n" not in line and f"cannot reach {dead}" in line and "is the server running" in line
    with Store(db_path) as store:
        assert store.rows("SELECT COUNT(*) AS n FROM probes")[0]["n"] == before
        assert store.rows("SELECT COUNT(*) AS n FROM fingerprints")[0]["n"] == 0


def test_baseline_capture_says_each_new_probe_failure_once_as_it_happens(db_path):
    env = {"LLM_WATCHDOG__STORAGE__PATH": str(db_path), "LLM_WATCHDOG__PROBE__INTERVAL": "1s"}
    with StreamServer(fault="status") as srv:  # up, but every chat request is a 500
        env["LLM_WATCHDOG__SERVER__URL"] = srv.url
        out = CliRunner().invoke(cli, ["baseline", "capture", "--for", "3s"], env=env, obj={})
    assert out.exit_code == 1
    failed = [line for line in out.output.splitlines() if line.startswith("probe failed:")]
    assert len(failed) == 1 and "500" in failed[0], out.output


def test_replay_says_when_it_learned_no_baseline_and_what_to_set(tmp_path):
    trace = tmp_path / "t.csv"
    rows = "".join(f"{1_700_000_000 + 10 * i},{100 + i % 7},1\n" for i in range(40))
    trace.write_text("ts,ttft_ms,ok\n" + rows)
    runner = CliRunner()
    short = runner.invoke(cli, ["replay", str(trace)], env={}, obj={})
    assert short.exit_code == 0, short.output
    assert "no baseline learned: 39 clean warm probes of the 300 it takes" in short.output
    learned = runner.invoke(
        cli, ["replay", str(trace)], env={"LLM_WATCHDOG__DRIFT__BASELINE_PROBES": "30"}, obj={}
    )
    assert learned.exit_code == 0 and "no baseline" not in learned.output


def test_replay_help_names_the_columns_the_reader_requires_and_how_to_export_a_trace():
    from llm_watchdog.drift.replay import REQUIRED

    out = CliRunner().invoke(cli, ["replay", "--help"], env={}, obj={})
    text = " ".join(out.output.split())
    assert all(f"`{c}`" in text for c in REQUIRED) and "are required" in text
    assert "history --since 7d --export-trace week.csv" in text
