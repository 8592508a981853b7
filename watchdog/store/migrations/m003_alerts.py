"""Migration 3: the `alerts` table, one row per delivery attempt of an alert to a sink.

Rows come from `llm_watchdog.alerts.manager.attempt_row`. `final` is 1 on the row that ends a
delivery (sent, given up, dropped or skipped), so "what was sent and what failed" reads
`WHERE final = 1`; the rows before it are the retries. `attempts` is 0 for an alert that was
never tried (queue full, daemon stopping, resolved alert whose firing one never got through).
"""

from __future__ import annotations

import sqlite_utils

STATEMENTS = [
    """
    CREATE TABLE alerts (
        id INTEGER PRIMARY KEY,
        ts REAL NOT NULL,  -- unix seconds of the attempt
        key TEXT NOT NULL,  -- stable id of the underlying event
        kind TEXT NOT NULL,  -- chat_slowed, heat_warning, ... (llm_watchdog.alerts.events.KINDS)
        state TEXT NOT NULL,  -- firing | resolved | summary | test
        severity TEXT NOT NULL,  -- info | warning | critical
        sink TEXT NOT NULL,  -- the sink's name; never a webhook URL or token
        ok INTEGER NOT NULL,  -- 1 delivered, 0 failed or not sent
        attempts INTEGER NOT NULL,
        final INTEGER NOT NULL,
        error TEXT,  -- one line, no secrets; NULL when ok
        title TEXT NOT NULL,
        message TEXT NOT NULL
    )
    """,
    "CREATE INDEX idx_alerts_ts ON alerts (ts)",
    "CREATE INDEX idx_alerts_key ON alerts (key)",
]


def up(db: sqlite_utils.Database) -> None:
    for sql in STATEMENTS:
        db.execute(sql)
