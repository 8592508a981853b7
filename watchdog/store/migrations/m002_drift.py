"""Migration 2: drift baselines and drift events.

`baselines`: one row per Baseline (llm_watchdog.drift.values.Baseline), learned ("auto") or
captured ("capture"). The row in use for a fingerprint is the newest with `reset_ts IS NULL`;
`baseline reset` and a runtime change set `reset_ts` instead of deleting, so history keeps
what each event was judged against.

`drift_events`: one row per DriftEvent id, upserted on every snapshot (opened, updated,
closed); `end_ts` is NULL while the event is open. `evidence` is the JSON object of the
replay contract. Columns are spelled out, not derived from the dataclasses (a released
migration builds the same tables forever).
"""

from __future__ import annotations

import sqlite_utils

STATEMENTS = [
    """
    CREATE TABLE baselines (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        fingerprint_id TEXT NOT NULL,
        n INTEGER NOT NULL,  -- warm probes it was learned from
        ttft_p50_ms REAL NOT NULL,
        ttft_p95_ms REAL NOT NULL,
        log_mu REAL NOT NULL,  -- median of ln(TTFT ms)
        log_sigma REAL NOT NULL,  -- 1.4826 x MAD of ln(TTFT ms)
        temp_c REAL,
        sm_clock_mhz REAL,  -- median busy SM clock (GpuIdle samples left out)
        batch_allowance REAL,
        batch_inflight REAL,
        created_ts REAL NOT NULL,
        source TEXT NOT NULL CHECK (source IN ('auto', 'capture')),
        z_mean REAL NOT NULL,  -- the detector's clipped, standardised log TTFT on the baseline
        z_var REAL NOT NULL,
        z_lag1 REAL NOT NULL,
        quality_fail_rate REAL,
        throttled INTEGER NOT NULL DEFAULT 0,  -- 1: learned from throttled probes, none clean
        reset_ts REAL  -- set when reset or invalidated by a runtime change
    )
    """,
    "CREATE INDEX idx_baselines_fingerprint ON baselines (fingerprint_id, created_ts)",
    """
    CREATE TABLE drift_events (
        id TEXT PRIMARY KEY,  -- DriftEvent.id, "<kind>-<start unix ms>"
        kind TEXT NOT NULL,  -- latency, quality, heat_warning, cold_start_slow, probes_failing,
                             -- baseline_invalidated
        fingerprint_id TEXT,
        start_ts REAL NOT NULL,
        end_ts REAL,  -- NULL while open
        cause TEXT NOT NULL CHECK (cause IN ('thermal', 'power', 'load', 'unknown')),
        baseline_p95_ms REAL,
        peak_p95_ms REAL,
        evidence TEXT NOT NULL DEFAULT '{}',  -- JSON object
        message TEXT NOT NULL,
        updated_ts REAL NOT NULL  -- the observation of the latest snapshot
    )
    """,
    "CREATE INDEX idx_drift_events_start ON drift_events (start_ts)",
    "CREATE INDEX idx_drift_events_open ON drift_events (end_ts)",
]


def up(db: sqlite_utils.Database) -> None:
    for sql in STATEMENTS:
        db.execute(sql)
