"""Learned thresholds on a real SQLite file, and the trace export's threshold columns."""

from __future__ import annotations

import csv
import io

from llm_watchdog.cli.judge import export_trace
from llm_watchdog.drift.replay import THRESHOLD_COLUMNS, WAIT_COLUMNS, parse_trace
from llm_watchdog.models import GpuSample
from llm_watchdog.store.db import Store
from llm_watchdog.store.thresholds import learned_thresholds, save_learned_threshold
from tests.helpers.builders import T0, probe_result


def test_a_learned_threshold_is_kept_once_per_card_and_survives_reopening(db_path) -> None:
    with Store(db_path) as store:
        assert learned_thresholds(store) == {}
        save_learned_threshold(store, "GPU-a", 84.0, T0, 0)
        save_learned_threshold(store, "GPU-a", 88.0, T0 + 60, 0)  # the first one stays
        save_learned_threshold(store, "GPU-b", 79.0, T0, 1)
    with Store(db_path) as store:
        assert learned_thresholds(store) == {"GPU-a": 84.0, "GPU-b": 79.0}


def test_export_writes_the_target_and_slowdown_columns(db_path) -> None:
    with Store(db_path) as store:
        save_learned_threshold(store, "GPU-b", 79.0, T0, 1)
        store.record_probe(probe_result(T0 + 1), None)
        store.record_probe(probe_result(T0 + 3), None)
        store.record_gpu_samples(
            [
                GpuSample(
                    ts=T0,
                    gpu_index=0,
                    uuid="GPU-a",
                    temp_c=70.0,
                    temp_target_c=83.0,
                    temp_slowdown_c=93.0,
                )
            ]
        )
        store.record_gpu_samples(
            [GpuSample(ts=T0 + 2.5, gpu_index=0, uuid="GPU-b", temp_c=75.0, temp_slowdown_c=None)]
        )
        out = io.StringIO()
        assert export_trace(store, None, None, out) == 2
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert tuple(rows[0])[-3:-1] == THRESHOLD_COLUMNS == ("temp_target_c", "temp_slowdown_c")
    assert tuple(rows[0])[-1:] == WAIT_COLUMNS == ("ttft_over_ms",)
    assert (rows[0]["temp_target_c"], rows[0]["temp_slowdown_c"]) == ("83.0", "93.0")
    # A card without a target gets the temperature it was first seen to throttle at.
    assert (rows[1]["temp_target_c"], rows[1]["temp_slowdown_c"]) == ("79.0", "")


def test_export_takes_the_gpu_the_daemon_judged_the_worst_of_those_sampled(db_path) -> None:
    with Store(db_path) as store:
        store.record_probe(probe_result(T0 + 1), None)
        store.record_gpu_samples(
            [
                GpuSample(ts=T0, gpu_index=0, uuid="GPU-a", temp_c=80.0, temp_target_c=90.0),
                # Cooler, but nearer the temperature its clocks fall at.
                GpuSample(ts=T0, gpu_index=1, uuid="GPU-b", temp_c=78.0, temp_target_c=79.0),
            ]
        )
        out = io.StringIO()
        export_trace(store, None, None, out)
    (row,) = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert (row["gpu_temp_c"], row["temp_target_c"]) == ("78.0", "79.0")


def test_export_writes_how_long_a_canary_waited_for_a_first_token_that_did_not_come(
    db_path, tmp_path
) -> None:
    with Store(db_path) as store:
        store.record_probe(probe_result(T0 + 1), None)
        fail = {"ok": False, "ttft_ms": None, "quality_pass": None}
        waited = probe_result(T0 + 2, **fail, error_class="first_token_timeout", total_ms=3e4)
        store.record_probe(waited, None)
        refused = probe_result(T0 + 3, **fail, error_class="connect_refused", total_ms=2.0)
        store.record_probe(refused, None)
        trace = tmp_path / "trace.csv"
        with open(trace, "w", newline="") as fh:
            assert export_trace(store, None, None, fh) == 3
    rows = list(csv.DictReader(io.StringIO(trace.read_text())))
    assert [(r["ttft_ms"], r["ok"], r["ttft_over_ms"]) for r in rows] == [
        ("100.0", "1", ""),
        ("", "0", "30000.0"),
        ("", "0", ""),  # a refused connection says nothing of how long chat takes
    ]
    assert [o.ttft_over_ms for o in parse_trace(trace)] == [None, 3e4, None]
