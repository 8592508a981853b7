"""Migration 8: stored bench runs (`llm-watchdog bench`), their raw requests and GPU samples.

A run row holds what produced the numbers (engine, version, model, launch command, driver,
GPU, probe-set and batch-set hashes, the bench's own settings as JSON) beside its results
(the cold start and one summary per level, as JSON) and whether it ran to the end. The raw
rows are every chat probe and batch request it sent, so a comparison can resample them.
"""

from __future__ import annotations

import sqlite_utils

STATEMENTS = [
    """
    CREATE TABLE bench_runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        started_ts REAL NOT NULL,  -- unix seconds
        ended_ts REAL,
        complete INTEGER NOT NULL DEFAULT 0,  -- 1 ran to the end; 0 stopped or failed
        stop_reason TEXT,  -- one line, when incomplete
        url TEXT NOT NULL,
        engine TEXT NOT NULL,
        engine_version TEXT NOT NULL,
        model TEXT NOT NULL,
        launch_command TEXT NOT NULL,
        driver_version TEXT NOT NULL,
        gpu_name TEXT NOT NULL,
        gpu_uuid TEXT NOT NULL,
        probe_set TEXT NOT NULL,
        probe_set_hash TEXT NOT NULL,
        batch_set TEXT NOT NULL,
        batch_set_hash TEXT NOT NULL,
        fingerprint_id TEXT,
        config TEXT NOT NULL DEFAULT '{}',  -- JSON: the bench's settings
        cold_start TEXT NOT NULL DEFAULT '{}',  -- JSON
        levels TEXT NOT NULL DEFAULT '[]'  -- JSON: one summary per batch level
    )
    """,
    """
    CREATE TABLE bench_requests (
        run_id INTEGER NOT NULL REFERENCES bench_runs(id) ON DELETE CASCADE,
        level_index INTEGER NOT NULL,
        kind TEXT NOT NULL,  -- chat | batch
        ts REAL,
        prompt_id TEXT,
        outcome TEXT,  -- chat: ok | failed; batch: ok | rejected | queue_cap | error | stopped
        ttft_ms REAL,
        wait_ms REAL,  -- batch: until the response began (a gateway's queue)
        total_ms REAL,
        output_tokens INTEGER,
        output_chars INTEGER,
        quality_pass INTEGER,
        error_class TEXT,
        detail TEXT
    )
    """,
    "CREATE INDEX idx_bench_requests_run ON bench_requests (run_id, level_index, kind)",
    """
    CREATE TABLE bench_gpu_samples (
        run_id INTEGER NOT NULL REFERENCES bench_runs(id) ON DELETE CASCADE,
        level_index INTEGER NOT NULL,
        ts REAL NOT NULL,
        gpu_index INTEGER NOT NULL,
        temp_c REAL,
        sm_clock_mhz REAL,
        power_w REAL,
        thermal_violation_ms REAL,
        power_violation_ms REAL,
        throttle_reasons INTEGER
    )
    """,
]


def up(db: sqlite_utils.Database) -> None:
    for sql in STATEMENTS:
        db.execute(sql)
