from __future__ import annotations

import json
from pathlib import Path

from llm_watchdog.bench.scheduler import parse_prometheus, queue_share, snapshot, summarise

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def text(engine: str, name: str = "metrics.txt") -> str:
    return (FIXTURES / engine / name).read_text()


def grown(snap: dict, factor: float) -> dict:
    return {
        k: (v * factor if v is not None and k.endswith(("_s", "_count")) else v)
        for k, v in snap.items()
    }


def test_parse_prometheus_reads_labels_and_values():
    s = parse_prometheus(text("vllm"))
    ((labels, value),) = s["vllm:num_requests_waiting"]
    assert labels["model_name"] == "Qwen/Qwen2.5-7B-Instruct" and value == 2.0
    assert parse_prometheus('garbage line\nx{a="1"} nope\n') == {}


def test_vllm_queue_time_against_prefill_time_over_a_level():
    first = snapshot("vllm", text("vllm"))
    assert first["waiting"] == 2.0 and first["running"] == 6.0
    assert first["queue_sum_s"] == 12.0 and first["prefill_count"] == 40.0
    summary = summarise("vllm", [first, grown(first, 2.0)])
    # 40 more requests spent 12 s queued and 4 s prefilling.
    assert summary["queue_ms_mean"] == 300.0 and summary["prefill_ms_mean"] == 100.0
    assert summary["exposed"] and summary["waiting_max"] == 2.0
    assert queue_share(summary) == 0.75


def test_llamacpp_metrics_and_slots():
    slots = json.loads(text("llamacpp", "slots.json"))
    snap = snapshot("llamacpp", text("llamacpp"), slots)
    assert snap["busy_slots"] == 0.0  # the capture's slot 3 holds a finished task
    assert snap["waiting"] == 0.0 and snap["running"] == 0.0
    later = dict(snap, prefill_sum_s=snap["prefill_sum_s"] + 1.0)
    summary = summarise("llamacpp", [snap, later], prompts=10)
    assert summary["prefill_ms_mean"] == 100.0 and summary["queue_ms_mean"] is None
    assert "queue depth only" in summary["note"]


def test_tgi_prefill_is_the_prefill_method_only():
    snap = snapshot("tgi", text("tgi"))
    assert snap["prefill_sum_s"] == 1.5 and snap["waiting"] == 3.0
    summary = summarise("tgi", [snap, grown(snap, 2.0)])
    assert summary["queue_ms_mean"] == 250.0 and summary["prefill_ms_mean"] == 150.0


def test_sglang_depths_without_a_queue_histogram():
    summary = summarise("sglang", [snapshot("sglang", text("sglang"))] * 2)
    assert summary["running_mean"] == 7.0 and summary["queue_ms_mean"] is None


def test_an_engine_without_metrics_says_so_plainly():
    summary = summarise("ollama", [snapshot("ollama", None)] * 3)
    assert not summary["exposed"]
    assert "exposes no scheduler metrics" in summary["note"]
    summary = summarise("llamacpp", [snapshot("llamacpp", None)] * 3)
    assert "--metrics" in summary["note"]
