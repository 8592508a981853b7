"""The real-engine tier for `llm-watchdog bench`: a short run on llama.cpp, and a comparison
between two launches that differ in one flag (`--parallel`)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from llm_watchdog.cli import cli
from tests.helpers.llamacpp import LlamaServer, Unavailable

pytestmark = pytest.mark.real_engine


def bench_once(parallel: int, db) -> dict:
    try:
        server = LlamaServer(parallel=parallel)
    except Unavailable as exc:
        pytest.fail(f"real engine tier selected but not installed: {exc}")
    with server:
        out = CliRunner().invoke(
            cli,
            # Short batch requests: on a loaded 2-core machine some still finish within a
            # level (a level's in-flight requests are cut off at its end).
            ["bench", "--url", server.url, "--db", str(db)]
            + "--batch-streams 0,1 --duration 20s --warmup 2s --document-words 20".split()
            + "--batch-max-tokens 4 --cold-start none --json".split(),
            env={},
            obj={},
        )
    assert out.exit_code == 0, out.output
    return {"levels": [json.loads(x) for x in out.output.splitlines() if x.startswith("{")]}


@pytest.mark.timeout(600)
def test_bench_and_compare_two_launches_name_the_one_flag(tmp_path):
    db = tmp_path / "bench.db"
    first = bench_once(4, db)
    bench_once(1, db)
    levels = first["levels"]
    assert [lv["batch_streams"] for lv in levels] == [0, 1]
    assert all(lv["chat_probes"] > 0 for lv in levels), levels
    assert levels[0]["quality_pass_rate"] is not None
    assert levels[1]["batch_requests_ok"] > 0, levels[1]
    assert levels[1]["batch_output_unit"] == "tokens" and levels[1]["batch_output_per_s"] > 0
    # llama.cpp's /metrics was read: its queue depth and prompt time per request.
    assert levels[0]["engine_waiting_mean"] is not None
    assert levels[0]["engine_prefill_ms_mean"] is not None
    # llama.cpp's per-request timings: chat's own wait in the engine's queue, apart from batch.
    assert levels[0]["chat_timed"] > 0 and levels[0]["chat_engine_wait_p50_ms"] is not None
    assert levels[0]["chat_prefill_p50_ms"] > 0, levels[0]
    assert levels[0]["per_class_note"] in (None, ""), levels[0]
    out = CliRunner().invoke(
        cli, ["bench", "compare", "1", "2", "--db", str(db), "--json"], env={}, obj={}
    )
    assert out.exit_code == 0, out.output
    result = json.loads(out.output)
    assert [d["variable"] for d in result["differences"]] == ["launch command --parallel"]
    assert (result["differences"][0]["a"], result["differences"][0]["b"]) == ("4", "1")
    assert not any("variables differ" in w for w in result["warnings"])
    assert len(result["levels"]) == 2
    assert all(lv["chat_engine_wait_diff_ms"] is not None for lv in result["levels"]), result
