"""`llm-watchdog probe` marks cold probes as the daemon counts them, so a slow first probe
reads as a cold start, not as one bad probe."""

from __future__ import annotations

import json

from click.testing import CliRunner

from llm_watchdog.cli import cli
from tests.helpers.streamserver import StreamServer


def probe(*args: str):
    return CliRunner().invoke(cli, ["probe", *args], env={}, obj={})


def json_rows(output: str) -> list[dict]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def test_the_first_probe_is_cold_until_the_server_has_answered_one():
    with StreamServer(answer="Paris Tokyo 7 4") as srv:
        out = probe("--url", srv.url, "--rounds", "2", "--json")
    assert out.exit_code == 0, out.output
    assert [r["cold"] for r in json_rows(out.output)] == [True] + [False] * 9


def test_a_failed_first_probe_leaves_the_next_one_cold():
    # A probe that got no answer has not shown the engine warm (the daemon's rule too).
    with StreamServer(answer="Paris", fault="status") as srv:
        out = probe("--url", srv.url, "--json")
    rows = json_rows(out.output)
    assert out.exit_code == 1 and rows and all(r["cold"] for r in rows)


def test_an_ollama_model_load_marks_every_probe_that_timed_it():
    with StreamServer(
        answer="Paris Tokyo 7 4", engine="ollama", model="qwen3:0.6b", load_duration_ms=900.0
    ) as srv:
        out = probe("--url", srv.url, "--api", "ollama", "--model", "qwen3:0.6b", "--json")
    assert out.exit_code == 0, out.output
    assert [r["cold"] for r in json_rows(out.output)] == [True] * 5


def test_the_table_has_a_cold_column_and_keeps_the_p50_line():
    with StreamServer(answer="Paris Tokyo 7 4") as srv:
        out = probe("--url", srv.url)
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    head = next(line for line in lines if line.startswith("prompt_id"))
    assert head.split()[:3] == ["prompt_id", "ok", "cold"]
    rows = lines[lines.index(head) + 1 : lines.index(head) + 6]
    assert [r.split()[2] for r in rows] == ["yes", "no", "no", "no", "no"]
    assert any(line.startswith("# 5/5 passed; TTFT p50 ") for line in lines)
