"""Migration 5: each probe row keeps the batch in-flight count and allowance it was sent under.

The drift judge reads them to tell load from heat; stored, they make `history
--export-trace` carry the replay contract's `batch_inflight` and `batch_allowance` columns, so
a replay gives the cause the daemon gave.
"""

from __future__ import annotations

import sqlite_utils


def up(db: sqlite_utils.Database) -> None:
    db.execute("ALTER TABLE probes ADD COLUMN batch_inflight INTEGER")
    db.execute("ALTER TABLE probes ADD COLUMN batch_allowance INTEGER")
