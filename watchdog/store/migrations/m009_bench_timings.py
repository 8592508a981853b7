"""Migration 9: the engine's own timings of each bench request, where it gives them.

llama.cpp reports per request how long it spent on the prompt (`timings.prompt_ms`, over
`prompt_n` tokens); a request's wait in the engine's queue is then its TTFT less that. Three
nullable columns on `bench_requests`: rows stored before, and rows from engines that report
no timings, hold NULL.
"""

from __future__ import annotations

import sqlite_utils

STATEMENTS = [
    "ALTER TABLE bench_requests ADD COLUMN prompt_ms REAL",  # the engine's prefill time
    "ALTER TABLE bench_requests ADD COLUMN prompt_n INTEGER",  # prompt tokens it evaluated
    "ALTER TABLE bench_requests ADD COLUMN engine_wait_ms REAL",  # TTFT - prompt_ms, >= 0
]


def up(db: sqlite_utils.Database) -> None:
    for sql in STATEMENTS:
        db.execute(sql)
