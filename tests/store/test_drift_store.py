"""Migration m002: baselines and drift events survive a round trip through a real SQLite file."""

from __future__ import annotations

import json

import sqlite_utils

from llm_watchdog.drift import Baseline, DriftEvent
from llm_watchdog.store.migrations import migrate


def test_baseline_and_event_round_trip(db: sqlite_utils.Database) -> None:
    assert "m002_drift" in migrate(db)
    baseline = Baseline(
        fingerprint_id="fp",
        n=300,
        ttft_p50_ms=800.0,
        ttft_p95_ms=1100.0,
        log_mu=6.68,
        log_sigma=0.08,
        temp_c=65.0,
        sm_clock_mhz=1950.0,
        batch_allowance=4.0,
        batch_inflight=2.0,
        created_ts=1.7e9,
        source="auto",
        z_mean=0.01,
        z_var=1.1,
        z_lag1=0.3,
        quality_fail_rate=0.02,
        throttled=False,
    )
    db["baselines"].insert(baseline.to_dict())
    row = next(db.query("SELECT * FROM baselines WHERE reset_ts IS NULL"))
    assert Baseline.from_dict(row) == baseline

    event = DriftEvent(
        id="latency-1700000000000",
        serial=1,
        kind="latency",
        change="opened",
        start_ts=1.7e9,
        end_ts=None,
        cause="thermal",
        baseline_p95_ms=1100.0,
        peak_p95_ms=1900.0,
        evidence={"thermal_bits_share": 0.8, "sm_clock_ratio": float("nan")},
        message="Chat slowed under heat",
        ts=1.7e9,
    )
    d = event.to_dict()
    record = {k: d[k] for k in ("id", "kind", "start_ts", "end_ts", "cause", "message")}
    record.update(
        baseline_p95_ms=d["baseline_p95_ms"],
        peak_p95_ms=d["peak_p95_ms"],
        evidence=json.dumps(d["evidence"], allow_nan=False),
        updated_ts=d["ts"],
    )
    db["drift_events"].upsert(record, pk="id")
    db["drift_events"].upsert({**record, "end_ts": 1.7e9 + 600}, pk="id")  # closed
    rows = list(db.query("SELECT * FROM drift_events"))
    assert len(rows) == 1 and rows[0]["end_ts"] == 1.7e9 + 600
    assert json.loads(rows[0]["evidence"]) == {
        "thermal_bits_share": 0.8,
        "sm_clock_ratio": None,
    }
