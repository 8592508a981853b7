"""Migration 4: the `control_actions` table, one row per decision of the allowance law.

Rows come from `llm_watchdog.control.law.action_row` (the decision, its inputs and reason, and how
the write went) and are completed by `llm_watchdog.control.law.verification_row` once the actuator's
read-back has been checked a drain time later ("the flag you set is not the behaviour you
get"). `verify_kind` is ok | not_effective | unreadable | unverified; NULL until checked, and
for decisions that wrote nothing (holds).
"""

from __future__ import annotations

import sqlite_utils

STATEMENTS = [
    """
    CREATE TABLE control_actions (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        ts REAL NOT NULL,  -- unix seconds of the decision
        cls TEXT NOT NULL DEFAULT 'batch',  -- the class whose allowance this is
        kind TEXT NOT NULL,  -- cut | halve | grow | hold | freeze
        allowance_before INTEGER NOT NULL,
        allowance_after INTEGER NOT NULL,
        reason TEXT NOT NULL,  -- one line
        p95_est_ms REAL,  -- the law's chat TTFT p95 estimate; NULL before enough samples
        inputs TEXT NOT NULL DEFAULT '{}',  -- JSON object: samples, GPU state, in-flight, ...
        actuator TEXT,  -- where it was written, e.g. "gateway http://127.0.0.1:8090"
        lease_s REAL,
        applied INTEGER,  -- 1 written, 0 the write failed, NULL nothing to write
        apply_detail TEXT,  -- one line; the error when applied = 0
        verify_ts REAL,
        verify_kind TEXT,
        verify_detail TEXT,
        read_allowance INTEGER,  -- what the serving layer reported at verification
        read_inflight INTEGER,
        read_queued INTEGER
    )
    """,
    "CREATE INDEX idx_control_actions_ts ON control_actions (ts)",
]


def up(db: sqlite_utils.Database) -> None:
    for sql in STATEMENTS:
        db.execute(sql)
