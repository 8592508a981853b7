"""The bench's per-class view: the engine's own timings of each chat and batch request
(llama.cpp's `timings`), the engine-queue wait worked out from them, stored, shown, compared."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import sqlite_utils
from click.testing import CliRunner

from llm_watchdog.bench.compare import compare_runs
from llm_watchdog.bench.loadgen import BatchLoad
from llm_watchdog.bench.summary import NO_TIMINGS_NOTE, engine_wait_ms, per_class
from llm_watchdog.cli import cli
from llm_watchdog.probe.client import ProbeOptions, Prober
from llm_watchdog.probe.sets import Prompt
from llm_watchdog.probe.streams import engine_timings
from llm_watchdog.store import bench as stored
from llm_watchdog.store.db import Store
from llm_watchdog.store.migrations import discover, migrate
from tests.cli.test_bench_cli import run_args
from tests.helpers.streamserver import StreamServer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ANY = Prompt("any", ({"role": "user", "content": "Count."},), expect_any_of=("1",), max_tokens=64)
FAST = ProbeOptions(connect_timeout_s=1.0, first_token_timeout_s=2.0, total_timeout_s=4.0)


@contextmanager
def serving(body: bytes) -> Iterator[str]:
    """A socket that answers every POST with `body` as an event stream (a captured one)."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


CAPTURES = [
    ("llamacpp/chat_stream_plain.sse", 39.883, 10),
    ("llamacpp/chat_stream_usage.sse", 235.32, 42),
    ("vllm/chat_stream_usage.sse", None, None),
]


@pytest.mark.parametrize(("name", "prompt_ms", "prompt_n"), CAPTURES)
def test_the_probe_keeps_the_engines_prefill_time(name, prompt_ms, prompt_n):
    with serving((FIXTURES / name).read_bytes()) as url:
        with Prober(url, "m", FAST) as prober:
            r, timings = prober.probe_timed(ANY, "default")
    assert r.ok, r.error_detail
    assert (timings.prompt_ms, timings.prompt_n) == (prompt_ms, prompt_n)


@pytest.mark.parametrize(("name", "prompt_ms", "prompt_n"), CAPTURES)
def test_the_batch_load_keeps_the_engines_prefill_time(name, prompt_ms, prompt_n):
    with serving((FIXTURES / name).read_bytes()) as url:
        with BatchLoad(url, "m", streams=1, words=10, keep_rows=True) as load:
            deadline = time.monotonic() + 5
            while load.stats.ok < 1 and time.monotonic() < deadline:
                time.sleep(0.02)
        rows = [r for r in load.take_rows() if r["outcome"] == "ok"]
    assert rows
    assert {(r.get("prompt_ms"), r.get("prompt_n")) for r in rows} == {(prompt_ms, prompt_n)}


def test_a_whole_answer_carries_its_timings_too():
    answer = json.loads((FIXTURES / "llamacpp" / "chat_nonstream.json").read_text())
    assert engine_timings(answer) == (16.291, 1)
    assert engine_timings({"choices": [], "usage": {"prompt_tokens": 3}}) == (None, None)
    assert engine_timings({"timings": {"prompt_ms": "slow", "prompt_n": -1}}) == (None, None)


def test_the_queue_wait_is_ttft_less_prefill_never_below_zero():
    assert engine_wait_ms(120.0, 40.0) == 80.0
    assert engine_wait_ms(30.0, 40.0) == 0.0
    assert engine_wait_ms(None, 40.0) is None and engine_wait_ms(120.0, None) is None
    chat = [{"ok": True, "engine_wait_ms": w, "prompt_ms": 40.0} for w in (10.0, 20.0, 30.0)]
    chat.append({"ok": False, "engine_wait_ms": 999.0, "prompt_ms": 40.0})
    view = per_class(chat, [{"outcome": "ok", "engine_wait_ms": None, "prompt_ms": None}])
    assert view["chat_timed"] == 3 and view["chat_engine_wait_p50_ms"] == 20.0
    assert view["chat_prefill_p50_ms"] == 40.0 and view["batch_timed"] == 0
    assert view["batch_engine_wait_p50_ms"] is None and view["per_class_note"] is None


def bench(*args: str):
    return CliRunner().invoke(cli, ["bench", *args], env={}, obj={})


DELAY_S, PREFILL_MS = 0.2, 100.0


def test_a_run_against_an_engine_with_timings_shows_each_class_queue_wait(tmp_path):
    db = tmp_path / "b.db"
    with StreamServer(
        answer="Paris", first_token_delay_s=DELAY_S, prompt_ms=PREFILL_MS, engine="llamacpp"
    ) as srv:
        out = bench(*run_args(srv.url, db))
    assert out.exit_code == 0, out.output
    expected = DELAY_S * 1000 - PREFILL_MS  # the first-token delay less the reported prefill

    with Store(db) as store:
        rows = stored.run_requests(store, 1)
    timed = [r for r in rows if r["outcome"] == "ok"]
    assert {r["kind"] for r in timed} == {"chat", "batch"}
    for r in timed:
        assert r["prompt_ms"] == PREFILL_MS and r["prompt_n"] == 12
        assert expected - 5 <= r["engine_wait_ms"] <= expected + 80, r
        assert r["engine_wait_ms"] == pytest.approx(r["ttft_ms"] - PREFILL_MS)

    level = json.loads(bench("show", "1", "--db", str(db), "--json").output)["levels"][1]
    for cls in ("chat", "batch"):
        assert level[f"{cls}_timed"] >= 1
        assert expected - 5 <= level[f"{cls}_engine_wait_p50_ms"] <= expected + 80
        assert level[f"{cls}_prefill_p50_ms"] == PREFILL_MS
    assert level["per_class_note"] is None
    assert "# per class, batch 1: chat waited" in out.output
    assert "in the engine's queue" in out.output and NO_TIMINGS_NOTE not in out.output

    shown = bench("show", "1", "--db", str(db))
    assert "per class, batch 0: chat waited" in shown.output
    listed = bench("show", "1", "--db", str(db), "--requests", "--csv").output.splitlines()
    assert {"prompt_ms", "prompt_n", "engine_wait_ms"} <= set(listed[0].split(","))


def test_a_run_against_an_engine_without_timings_says_so_in_one_line(tmp_path):
    db = tmp_path / "b.db"
    with StreamServer(answer="Paris", first_token_delay_s=0.005, engine="vllm") as srv:
        out = bench(*run_args(srv.url, db, "--json"))
    assert out.exit_code == 0, out.output
    said = [x for x in out.output.splitlines() if not x.startswith("{")]
    assert [x for x in said if NO_TIMINGS_NOTE in x] == [f"# per class, {NO_TIMINGS_NOTE}"]
    levels = [json.loads(x) for x in out.output.splitlines() if x.startswith("{")]
    assert levels and all(lv["per_class_note"] == NO_TIMINGS_NOTE for lv in levels)
    assert all(lv["chat_timed"] == 0 and lv["chat_engine_wait_p50_ms"] is None for lv in levels)
    with Store(db) as store:
        rows = stored.run_requests(store, 1)
    assert rows and all(r["prompt_ms"] is None and r["engine_wait_ms"] is None for r in rows)
    shown = bench("show", "1", "--db", str(db))
    assert shown.exit_code == 0 and shown.output.count(NO_TIMINGS_NOTE) == 1


def test_the_migration_keeps_old_bench_rows_with_null_timings(tmp_path):
    path = tmp_path / "old.db"
    old = [m for m in discover() if m.number <= 8]
    with sqlite_utils.Database(path) as db:
        migrate(db, old)
        db.execute(
            "INSERT INTO bench_runs (started_ts, url, engine, engine_version, model, "
            "launch_command, driver_version, gpu_name, gpu_uuid, probe_set, probe_set_hash, "
            "batch_set, batch_set_hash) VALUES (1, 'u', 'vllm', '1', 'm', '', '', '', '', 'p', "
            "'h', 'b', 'h')"
        )
        db.execute(
            "INSERT INTO bench_requests (run_id, level_index, kind, outcome, ttft_ms) "
            "VALUES (1, 0, 'chat', 'ok', 12.5)"
        )
        db.conn.commit()
        assert "prompt_ms" not in db["bench_requests"].columns_dict
        assert [m.name for m in discover() if m.number > 8] == migrate(db)
    with sqlite3.connect(path) as conn:
        row = conn.execute(
            "SELECT ttft_ms, prompt_ms, prompt_n, engine_wait_ms FROM bench_requests"
        ).fetchone()
    assert row == (12.5, None, None, None)


def test_compare_says_how_far_chat_moved_in_the_engines_queue(tmp_path):
    db = tmp_path / "b.db"
    for delay_s in (0.2, 0.05):  # B's chat waits about 150 ms less
        with StreamServer(
            answer="Paris", first_token_delay_s=delay_s, prompt_ms=20.0, engine="llamacpp"
        ) as srv:
            assert bench(*run_args(srv.url, db)).exit_code == 0
    result = json.loads(bench("compare", "1", "2", "--db", str(db), "--json").output)
    for lv in result["levels"]:
        assert 175 <= lv["chat_engine_wait_a_ms"] <= 260
        assert 25 <= lv["chat_engine_wait_b_ms"] <= 110
        assert -190 <= lv["chat_engine_wait_diff_ms"] <= -110
    table = bench("compare", "1", "2", "--db", str(db)).output
    assert "scheduler: batch 1: chat requests waited" in table
    assert "(median) in the engine's queue in A" in table


def test_compare_without_timings_on_one_side_adds_no_chat_line():
    la = [{"batch_streams": 2, "chat_engine_wait_p50_ms": 80.0, "quality_pass_rate": 1.0}]
    lb = [{"batch_streams": 2, "chat_engine_wait_p50_ms": None, "quality_pass_rate": 1.0}]
    a = {"id": 1, "complete": True, "levels": la}
    out = compare_runs(a, {"id": 2, "complete": True, "levels": lb}, [], [])
    assert out["levels"][0]["chat_engine_wait_diff_ms"] is None
    assert not any("chat requests waited" in line for line in out["scheduler"])
    both = compare_runs(a, dict(a, id=2), [], [])
    assert both["scheduler"] == [
        "batch 2: chat requests waited 80 ms (median) in the engine's queue in A, 80 ms in B "
        "(+0 ms)"
    ]
