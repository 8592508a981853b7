"""A level with a handful of probes: its p95 is given, but no interval and no verdict."""

from __future__ import annotations

import numpy as np
import pytest

from llm_watchdog.bench.compare import MIN_PROBES, compare_runs
from llm_watchdog.bench.stats import (
    MIN_INTERVAL_VALUES,
    TOO_FEW,
    min_values,
    percentile_difference,
    percentile_interval,
    verdict,
)
from llm_watchdog.bench.summary import level_summary, stored_interval_note
from tests.bench.test_compare import rows, run


def test_one_value_has_its_percentile_but_no_interval():
    iv = percentile_interval([250.0], 95)
    assert iv is not None and iv.value == 250.0
    assert iv.low is None and iv.high is None


@pytest.mark.parametrize("n", [1, 2, 5, MIN_INTERVAL_VALUES - 1])
def test_below_the_minimum_no_verdict_however_far_apart(n):
    # One TTFT against one, ten times slower: before, this read "slower".
    diff = percentile_difference([100.0] * n, [1000.0] * n)
    assert diff is not None and diff.value == 900.0
    assert diff.low is None and diff.high is None
    assert verdict(diff) == TOO_FEW == "too few probes"


def test_from_the_minimum_on_the_interval_and_verdict_are_back():
    n = MIN_INTERVAL_VALUES
    rng = np.random.default_rng(4)
    a, b = list(rng.normal(100, 5, n)), list(rng.normal(1000, 5, n))
    assert percentile_interval(a, 95).low is not None
    assert verdict(percentile_difference(a, b)) == "slower"
    # One side short is enough to withhold it.
    assert verdict(percentile_difference(a, b[: n - 1])) == TOO_FEW


def test_the_minimum_grows_with_the_tail():
    assert min_values(50) == min_values(95) == MIN_INTERVAL_VALUES == 20
    assert min_values(99) == 100  # one value in expectation above the p99
    assert MIN_INTERVAL_VALUES < MIN_PROBES


def test_a_level_of_three_right_answers_says_why_it_has_no_interval():
    chat = [{"ok": True, "quality_pass": True, "ttft_ms": v} for v in (100.0, 120.0, 900.0)]
    lv = level_summary(0, chat, [], 5.0)
    assert lv["chat_p95_ms"] is not None  # the value stays: it is what was measured
    assert lv["chat_p95_low_ms"] is None and lv["chat_p95_high_ms"] is None
    assert lv["chat_right"] == 3
    assert lv["chat_interval_note"] == (
        "too few probes: 3 right answers, a p95 interval needs 20; run longer levels (--duration)"
    )
    many = [dict(chat[0], ttft_ms=float(v)) for v in range(100, 130)]
    full = level_summary(0, many, [], 5.0)
    assert full["chat_interval_note"] is None and full["chat_p95_low_ms"] is not None


def test_a_level_stored_before_the_rule_is_counted_back_from_probes_and_quality():
    assert stored_interval_note({"chat_probes": 4, "quality_pass_rate": 0.75}) is not None
    assert "3 right answers" in stored_interval_note({"chat_probes": 4, "quality_pass_rate": 0.75})
    assert stored_interval_note({"chat_probes": 60, "quality_pass_rate": 1.0}) is None
    assert stored_interval_note({}) is None


def test_compare_of_one_probe_against_one_gives_no_verdict_and_says_so():
    out = compare_runs(run(), run(id=2), rows(0, [100.0]), rows(0, [300.0]))
    (lv,) = [x for x in out["levels"] if x["batch_streams"] == 0]
    assert lv["verdict"] == "too few probes"
    assert lv["chat_p95_diff_ms"] == 200.0
    assert lv["chat_p95_diff_low_ms"] is None and lv["chat_p95_diff_high_ms"] is None
    assert (lv["probes_a"], lv["probes_b"]) == (1, 1)
    (warning,) = [w for w in out["warnings"] if "too few probes" in w]
    assert warning.startswith("fewer than 20 right answers at batch 0 (A 1, B 1): ")
    assert "no verdict" in warning and "--duration" in warning
    assert not any("fewer than 50" in w for w in out["warnings"])


def test_compare_between_the_two_minimums_gives_a_verdict_with_the_old_warning():
    rng = np.random.default_rng(5)
    a, b = rows(0, rng.normal(100, 5, 30)), rows(0, rng.normal(400, 5, 30))
    out = compare_runs(run(), run(id=2), a, b)
    assert out["levels"][0]["verdict"] == "slower"
    assert any("fewer than 50 right answers at batch 0" in w for w in out["warnings"])
    assert not any("too few probes" in w for w in out["warnings"])


def test_show_of_a_run_stored_before_the_rule_withholds_its_interval_too(tmp_path):
    # A level stored with an interval from three probes, as the bench wrote it before.
    import json

    from click.testing import CliRunner

    from llm_watchdog.cli import cli
    from llm_watchdog.store import bench as stored
    from llm_watchdog.store.db import Store

    level = {
        "batch_streams": 0,
        "chat_probes": 3,
        "quality_pass_rate": 1.0,
        "chat_p95_ms": 900.0,
        "chat_p95_low_ms": 120.0,
        "chat_p95_high_ms": 900.0,
    }
    db = tmp_path / "b.db"
    with Store(db) as store:
        stored.save_run(store, dict(_stored_run(), levels=[level]))
    invoke = CliRunner().invoke
    shown = invoke(cli, ["bench", "show", "1", "--db", str(db), "--json"], env={}, obj={})
    (lv,) = json.loads(shown.output)["levels"]
    assert lv["chat_p95_ms"] == 900.0 and lv["chat_p95_low_ms"] is None
    assert lv["chat_interval_note"].startswith("too few probes: 3 right answers")
    table = invoke(cli, ["bench", "show", "1", "--db", str(db)], env={}, obj={})
    assert "batch 0: too few probes: 3 right answers, a p95 interval needs 20" in table.output


def _stored_run() -> dict:
    return {
        "started_ts": 1.0,
        "ended_ts": 2.0,
        "complete": True,
        "url": "http://127.0.0.1:8080",
        "engine": "llamacpp",
        "engine_version": "b1",
        "model": "m",
        "launch_command": "llama-server",
        "driver_version": "550",
        "gpu_name": "RTX",
        "gpu_uuid": "GPU-1",
        "probe_set": "default",
        "probe_set_hash": "p" * 64,
        "batch_set": "synthetic",
        "batch_set_hash": "b" * 64,
        "config": {},
        "cold_start": {},
        "levels": [],
    }
