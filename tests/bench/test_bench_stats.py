from __future__ import annotations

import numpy as np

from llm_watchdog.bench.stats import percentile_difference, percentile_interval, verdict
from llm_watchdog.bench.summary import level_summary


def test_interval_holds_the_percentile_and_is_reproducible():
    rng = np.random.default_rng(1)
    xs = list(rng.lognormal(5, 0.5, 200))
    iv = percentile_interval(xs, 95)
    assert iv is not None
    assert iv.low <= iv.value <= iv.high
    assert iv == percentile_interval(xs, 95)
    assert iv.value == float(np.percentile(xs, 95))
    assert percentile_interval([], 95) is None


def test_difference_verdicts():
    rng = np.random.default_rng(2)
    a = list(rng.normal(100, 5, 300))
    slower = [x + 50 for x in rng.normal(100, 5, 300)]
    same = list(rng.normal(100, 5, 300))
    up = percentile_difference(a, slower)
    assert up is not None and up.low > 0 and verdict(up) == "slower"
    down = percentile_difference(slower, a)
    assert verdict(down) == "faster"
    assert verdict(percentile_difference(a, same)) == "no difference shown"
    assert verdict(percentile_difference(a, [])) == "not measured"


def test_wrong_answers_and_failures_never_count_as_fast():
    chat = [
        {"ok": True, "quality_pass": True, "ttft_ms": 500.0},
        {"ok": True, "quality_pass": True, "ttft_ms": 600.0},
        {"ok": True, "quality_pass": False, "ttft_ms": 5.0},  # fast and wrong
        {"ok": False, "quality_pass": None, "ttft_ms": None, "error_class": "http_status"},
    ]
    lv = level_summary(0, chat, [], 10.0)
    assert lv["chat_probes"] == 4 and lv["chat_wrong"] == 1 and lv["chat_failed"] == 1
    assert lv["quality_pass_rate"] == 0.5
    assert lv["chat_p50_ms"] == 550.0
    assert lv["chat_p95_ms"] >= 500.0
    assert lv["chat_p95_low_ms"] is None  # two right answers: too few for an interval


def test_batch_output_in_tokens_where_the_engine_counts_them_else_characters():
    tokens = [{"outcome": "ok", "output_tokens": 64, "output_chars": 200, "wait_ms": 3.0}] * 5
    lv = level_summary(2, [], tokens + [{"outcome": "rejected"}, {"outcome": "queue_cap"}], 10.0)
    assert lv["batch_output_unit"] == "tokens" and lv["batch_output_per_s"] == 32.0
    assert lv["batch_rejected"] == 1 and lv["batch_queue_cap_hits"] == 1
    chars = [{"outcome": "ok", "output_tokens": None, "output_chars": 200}] * 5
    lv = level_summary(2, [], chars, 10.0)
    assert lv["batch_output_unit"] == "chars" and lv["batch_output_per_s"] == 100.0
