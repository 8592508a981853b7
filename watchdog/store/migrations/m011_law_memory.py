"""Migration 11: the `law_memory` table, what the allowance law learned that a restart of the
same engine starts from.

One row per engine fingerprint: the surge cap the law holds (`AllowanceController.
surge_memory`, a JSON object) and when it was written. The steering loop writes it when the
cap changes and deletes it when the cap goes, so a restart never brings back a cap this run
had dropped (llm_watchdog.store.control).
"""

from __future__ import annotations

import sqlite_utils


def up(db: sqlite_utils.Database) -> None:
    db.execute(
        """
        CREATE TABLE law_memory (
            fingerprint_id TEXT NOT NULL PRIMARY KEY,  -- '' where no engine was identified
            ts REAL NOT NULL,  -- unix seconds it was written
            surge TEXT NOT NULL  -- JSON object: cap, ratio, missed_at, hot, clock_ratio
        )
        """
    )
