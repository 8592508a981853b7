"""Migration 10: the cause an alert was sent with (heat, power_cap, load, ...).

Alertmanager tells one alert from another by its labels, `cause` among them: the resolved
alert a restarted daemon owes for one an earlier run sent must carry the cause that one had
(llm_watchdog.store.records.owed_resolves). Drift alerts take it from their event; the
others have only this column. Rows stored before hold NULL.
"""

from __future__ import annotations

import sqlite_utils


def up(db: sqlite_utils.Database) -> None:
    db.execute("ALTER TABLE alerts ADD COLUMN cause TEXT")
