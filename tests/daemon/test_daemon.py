"""The daemon end to end: real HTTP to a local streaming server, a real SQLite file, fake NVML
passed in; and `llm-watchdog run` as a real subprocess stopped with SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llm_watchdog.config import settings_from_dict
from llm_watchdog.daemon.service import Daemon
from llm_watchdog.store.db import Store
from tests.helpers.fakenvml import scenario_basic
from tests.helpers.streamserver import StreamServer, closed_port_url

ROOT = Path(__file__).resolve().parents[2]


def settings_for(url: str, db: Path, **probe: object):
    return settings_from_dict(
        {
            "server": {"url": url, "model": "auto"},
            "probe": {"interval": "1s", "jitter": "0s", **probe},
            "gpu": {"interval": "1s"},
            "storage": {"path": str(db)},
        },
        "test.toml",
    )


def test_probe_rows_point_to_a_fingerprint_and_the_first_is_cold(db_path):
    with (
        StreamServer(answer="Paris", engine="llamacpp", version="b1234") as srv,
        Store(db_path) as store,
    ):
        daemon = Daemon(settings_for(srv.url, db_path), store, nvml=scenario_basic())
        daemon.startup()
        try:
            results = [daemon.probe_once() for _ in range(3)]
            samples = daemon.sample_gpu()
        finally:
            daemon.shutdown(timeout_s=2)
        rows = store.probes()
        fp = store.latest_fingerprint()
    assert [r.cold for r in results] == [True, False, False]
    assert len(rows) == 3 and all(r["fingerprint_id"] == fp["id"] for r in rows)
    assert fp["engine"] == "llamacpp" and fp["engine_version"] == "b1234"
    assert fp["gpu_name"] not in (None, "unknown")
    # llama.cpp has its own prompt-cache switch; the daemon asks the engine and uses it.
    assert results[0].cache_bust == "cache_prompt_false"
    assert srv.chat_requests()[0].json["cache_prompt"] is False
    assert len(samples) == 2 and samples[0].temp_c is not None


def test_a_server_that_is_down_gives_failed_rows_not_a_crash(db_path):
    url = closed_port_url()
    with Store(db_path) as store:
        daemon = Daemon(settings_for(url, db_path), store, nvml=scenario_basic())
        daemon.startup()
        try:
            result = daemon.probe_once()
        finally:
            daemon.shutdown(timeout_s=2)
        rows = store.probes()
    assert not result.ok and result.error_class == "connect_refused"
    assert rows[0]["error_class"] == "connect_refused"


def test_runtime_change_makes_the_next_probe_cold(db_path):
    with (
        StreamServer(answer="Paris", engine="vllm", version="0.6.0") as srv,
        Store(db_path) as store,
    ):
        daemon = Daemon(settings_for(srv.url, db_path), store, nvml=scenario_basic())
        daemon.startup()
        try:
            daemon.probe_once()
            assert daemon.probe_once().cold is False
            srv.set(version="0.6.1")  # the engine was upgraded and restarted
            daemon.refresh_identity()
            assert daemon.probe_once().cold is True
        finally:
            daemon.shutdown(timeout_s=2)
        assert len(store.rows("SELECT id FROM fingerprints")) == 2


@pytest.mark.slow
def test_run_subprocess_writes_rows_and_stops_on_sigterm(tmp_path, db_path):
    with StreamServer(answer="Paris", first_token_delay_s=0.02) as srv:
        config = tmp_path / "config.toml"
        api_port = free_port()
        config.write_text(
            f'[server]\nurl = "{srv.url}"\n'
            '[probe]\ninterval = "0.5s"\njitter = "0s"\n'
            f'[storage]\npath = "{db_path}"\n'
            f'[api]\nlisten = "127.0.0.1:{api_port}"\n'
            '[logging]\nformat = "text"\n'
        )
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("LLM_WATCHDOG_CONFIG", None)
        proc = subprocess.Popen(
            [sys.executable, "-m", "llm_watchdog", "--config", str(config), "run"],
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and len(srv.chat_requests()) < 4:
                time.sleep(0.1)
            metrics = httpx.get(f"http://127.0.0.1:{api_port}/metrics", timeout=5).text
            status = httpx.get(f"http://127.0.0.1:{api_port}/status", timeout=5).json()
            proc.send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            try:
                _, err = proc.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
                pytest.fail(f"did not stop within 15 s of SIGTERM; its log:\n{err}")
            stop_s = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
            if proc.stderr is not None:
                # A daemon that died before its log was read leaves the pipe open, and under
                # filterwarnings=error its ResourceWarning would fail some later test.
                proc.stderr.close()
    assert proc.returncode == 0, err
    assert stop_s < 6, f"took {stop_s:.1f}s to stop"
    # The log says why it stopped, and that it did: the last two lines of the run.
    tail = [line.split(": ", 1)[-1] for line in err.strip().splitlines()[-2:]]
    assert tail == ["stopping on SIGTERM", "stopped"], err[-600:]
    with Store(db_path) as store:
        rows = store.probes()
        events = store.gpu_events()
    assert len(rows) >= 4
    assert all(r["ok"] for r in rows)
    assert rows[0]["cold"] and not rows[-1]["cold"]
    # No NVIDIA driver on a CI machine: said once, recorded, and the daemon carried on.
    if not Path("/dev/nvidiactl").exists():
        assert [e["kind"] for e in events] == ["nvml_unavailable"]
        assert err.count("latency-only") == 1
    assert "watching " + srv.url in err
    # An engine not identified yet is said so, not "engine unknown unknown".
    watching = next(line for line in err.splitlines() if "watching " + srv.url in line)
    assert "unknown" not in watching, watching
    assert "engine not known yet, read again every 1 min" in watching or "(model" in watching
    # Parsed, not matched as text: prometheus-client orders a sample's labels its own way.
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
    }
    assert samples[("llm_watchdog_probes_total", (("error", ""), ("outcome", "ok")))] > 0
    assert "llm_watchdog_ttft_seconds_count" in metrics
    assert status["last_probe"]["ok"] is True and status["server"] == srv.url
    assert status["drift"]["learning"]["need"] == 300


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
