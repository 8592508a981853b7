from __future__ import annotations

import pytest

from llm_watchdog.store import bench as stored


def run_row(**changes):
    row = {
        "started_ts": 100.0, "ended_ts": 160.0, "complete": True, "url": "http://x",
        "engine": "vllm", "engine_version": "0.9", "model": "m", "launch_command": "vllm serve m",
        "driver_version": "550", "gpu_name": "RTX", "gpu_uuid": "GPU-1", "probe_set": "default",
        "probe_set_hash": "p", "batch_set": "synthetic-700w", "batch_set_hash": "b",
        "config": {"levels": [0, 2]}, "cold_start": {"mode": "none", "measured": False},
        "levels": [{"batch_streams": 0}, {"batch_streams": 2}],
    }  # fmt: skip
    row.update(changes)
    return row


def test_a_run_and_its_raw_rows_round_trip(store):
    chat = [
        {"level_index": 0, "ts": 101.0, "prompt_id": "a", "ok": True, "ttft_ms": 80.0,
         "quality_pass": True},
        {"level_index": 1, "ts": 131.0, "prompt_id": "b", "ok": False,
         "error_class": "first_token_timeout", "error_detail": "no token", "quality_pass": None},
    ]  # fmt: skip
    batch = [{"level_index": 1, "ts": 130.0, "outcome": "ok", "output_tokens": 64,
              "wait_ms": 3.0}]  # fmt: skip
    gpu = [{"level_index": 1, "ts": 130.5, "gpu_index": 0, "temp_c": 81.0}]
    run_id = stored.save_run(store, run_row(), chat, batch, gpu)
    run = stored.get_run(store, run_id)
    assert run is not None and run["complete"] is True
    assert run["config"] == {"levels": [0, 2]} and run["levels"][1]["batch_streams"] == 2
    rows = stored.run_requests(store, run_id, "chat")
    assert [r["outcome"] for r in rows] == ["ok", "failed"]
    assert rows[0]["quality_pass"] == 1 and rows[1]["quality_pass"] is None
    assert rows[1]["detail"] == "no token"
    assert stored.run_requests(store, run_id, "batch")[0]["output_tokens"] == 64
    assert len(stored.run_requests(store, run_id)) == 3
    assert stored.run_gpu_samples(store, run_id)[0]["temp_c"] == 81.0
    second = stored.save_run(store, run_row(complete=False, stop_reason="interrupted"))
    assert [r["id"] for r in stored.list_runs(store)] == [second, run_id]
    assert stored.get_run(store, second)["complete"] is False
    assert stored.get_run(store, 999) is None


def test_an_unknown_column_is_refused_and_nothing_is_written(store):
    with pytest.raises(ValueError, match="not bench_runs columns"):
        stored.save_run(store, run_row(colour="blue"))
    assert stored.list_runs(store) == []
