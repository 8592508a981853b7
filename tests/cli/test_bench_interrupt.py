"""Ctrl-C in the middle of `llm-watchdog bench` keeps what was measured, marked incomplete;
and the cold start, measured by a restart command and kept apart from the levels."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from llm_watchdog.cli import cli
from llm_watchdog.store import bench as stored
from llm_watchdog.store.db import Store
from tests.helpers.streamserver import StreamServer

ROOT = Path(__file__).resolve().parents[2]


def paris_set(folder: Path) -> str:
    path = folder / "paris.toml"
    path.write_text('[[prompts]]\nid = "fr"\nquestion = "Capital of France?"\nany_of = ["paris"]\n')
    return str(path)


def test_ctrl_c_stores_what_was_measured_marked_incomplete(tmp_path):
    db = tmp_path / "b.db"
    # faulthandler: a bench that does not stop is sent SIGABRT and prints every thread's stack.
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), PYTHONFAULTHANDLER="1"
    )
    with StreamServer(answer="Paris", first_token_delay_s=0.01) as srv:
        argv = [sys.executable, "-m", "llm_watchdog", "--config", os.devnull, "bench"]
        argv += ["--url", srv.url, "--chat-set", paris_set(tmp_path), "--db", str(db)]
        argv += "--batch-streams 0,1 --duration 10m --cold-start none".split()
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and len(srv.chat_requests()) < 5:
                time.sleep(0.1)
            proc.send_signal(signal.SIGINT)
            try:
                out, err = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGABRT)
                out, err = proc.communicate(timeout=20)
                pytest.fail(
                    f"bench did not stop within 60 s of Ctrl-C "
                    f"({len(srv.chat_requests())} chat requests); its threads:\n{err[-6000:]}"
                )
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 1, err
    assert "marked incomplete" in err and "Traceback" not in err
    with Store(db) as store:
        (run,) = stored.list_runs(store)
        chat = stored.run_requests(store, run["id"], "chat")
    assert run["complete"] is False and run["stop_reason"] == "interrupted (Ctrl-C)"
    assert len(run["levels"]) == 1, (run, err)
    assert run["levels"][0]["complete"] is False
    assert len(chat) >= 5


def test_a_restart_command_measures_the_cold_start_apart(tmp_path):
    marker = tmp_path / "restarted"
    with StreamServer(answer="Paris") as srv:
        out = CliRunner().invoke(
            cli,
            ["bench", "--url", srv.url, "--chat-set", paris_set(tmp_path)]
            + ["--db", str(tmp_path / "b.db"), "--cold-start", f"touch {marker}"]
            + "--batch-streams 0 --duration 1s --json".split(),
            env={},
            obj={},
        )
        cold_requests = 1
        level_requests = len(srv.chat_requests()) - cold_requests
    assert out.exit_code == 0, out.output
    assert marker.exists()
    assert "cold start (command): first token" in out.output
    assert "server ready after" in out.output
    (level,) = [json.loads(x) for x in out.output.splitlines() if x.startswith("{")]
    assert level["chat_probes"] == level_requests  # the cold request is not in the level


def test_cold_start_command_that_fails_and_auto_without_an_unload(tmp_path):
    with StreamServer(answer="Paris", engine="llamacpp") as srv:
        args = ["bench", "--url", srv.url, "--chat-set", paris_set(tmp_path),
                "--batch-streams", "0", "--duration", "0.5s",
                "--db", str(tmp_path / "b.db")]  # fmt: skip
        failed = CliRunner().invoke(cli, [*args, "--cold-start", "exit 3"], env={}, obj={})
        auto = CliRunner().invoke(cli, args, env={}, obj={})
    assert failed.exit_code == 1 and "cold-start command exited with 3" in failed.output
    assert auto.exit_code == 0, auto.output
    assert "cold start: not measured (llamacpp cannot unload its model" in auto.output


def test_auto_cold_start_unloads_an_ollama_model_with_keep_alive_zero(tmp_path):
    with StreamServer(
        answer="Paris", engine="ollama", model="qwen3:0.6b", static={"/api/generate": (200, b"{}")}
    ) as srv:
        out = CliRunner().invoke(
            cli,
            ["bench", "--url", srv.url, "--chat-set", paris_set(tmp_path)]
            + ["--db", str(tmp_path / "b.db")]
            + "--batch-streams 0 --duration 0.5s".split(),
            env={},
            obj={},
        )
        unloads = [r.json for r in srv.requests if r.path == "/api/generate"]
        first_chat = next(i for i, r in enumerate(srv.requests) if r.method == "POST"
                          and r.path != "/api/generate")  # fmt: skip
        unload_at = next(i for i, r in enumerate(srv.requests) if r.path == "/api/generate")
    assert out.exit_code == 0, out.output
    assert unloads == [{"model": "qwen3:0.6b", "keep_alive": 0}]
    assert unload_at < first_chat
    assert "cold start (auto): first token" in out.output
