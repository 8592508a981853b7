"""Rows of the raw tables: their columns, SQLite values back to Python ones, and the reads.

Functions over an open database; `llm_watchdog.store.db.Store` calls them holding its lock, and
turns sqlite3 errors into StoreError.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

import sqlite_utils

from llm_watchdog.models import GpuSample, ProbeResult

PROBE_FIELDS = tuple(f.name for f in fields(ProbeResult))
GPU_FIELDS = tuple(f.name for f in fields(GpuSample))
_PROBE_BOOLS = ("ok", "quality_pass", "cold")


# ---- reads ----------------------------------------------------------------------------------


def probes(
    db: sqlite_utils.Database,
    since_ts: float | None = None,
    until_ts: float | None = None,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    where, params = _range(since_ts, until_ts)
    sql = f"SELECT * FROM probes{where} ORDER BY ts DESC, id DESC"
    if limit is not None:
        sql += f" LIMIT {int(limit)}"
    rows = [_probe_row(r) for r in db.query(sql, params)]
    rows.reverse()
    return rows


def gpu_samples(
    db: sqlite_utils.Database,
    since_ts: float | None = None,
    until_ts: float | None = None,
    gpu_index: int | None = None,
) -> list[dict[str, Any]]:
    where, params = _range(since_ts, until_ts)
    if gpu_index is not None:
        where += " AND gpu_index = ?" if where else " WHERE gpu_index = ?"
        params.append(gpu_index)
    return list(db.query(f"SELECT * FROM gpu_samples{where} ORDER BY ts, gpu_index", params))


def gpu_events(
    db: sqlite_utils.Database, since_ts: float | None = None, until_ts: float | None = None
) -> list[dict[str, Any]]:
    where, params = _range(since_ts, until_ts)
    return list(db.query(f"SELECT * FROM gpu_events{where} ORDER BY ts, id", params))


def last_gpu_samples(db: sqlite_utils.Database) -> list[dict[str, Any]]:
    # The recursive CTE walks the (gpu_index, ts) index from one GPU to the next instead of
    # scanning every sample for DISTINCT (https://www.sqlite.org/lang_with.html).
    sql = """
        WITH RECURSIVE gpu(i) AS (
            SELECT MIN(gpu_index) FROM gpu_samples
            UNION ALL
            SELECT (SELECT MIN(gpu_index) FROM gpu_samples WHERE gpu_index > gpu.i)
            FROM gpu WHERE gpu.i IS NOT NULL
        )
        SELECT s.* FROM gpu JOIN gpu_samples s ON s.id = (
            SELECT id FROM gpu_samples WHERE gpu_index = gpu.i ORDER BY ts DESC, id DESC LIMIT 1
        )
        ORDER BY s.gpu_index
    """
    return list(db.query(sql))


def fingerprint(db: sqlite_utils.Database, fingerprint_id: str) -> dict[str, Any] | None:
    rows = list(db.query("SELECT * FROM fingerprints WHERE id = ?", [fingerprint_id]))
    return _fp_row(rows[0]) if rows else None


def latest_fingerprint(db: sqlite_utils.Database) -> dict[str, Any] | None:
    sql = "SELECT * FROM fingerprints ORDER BY last_seen DESC, first_seen DESC LIMIT 1"
    rows = list(db.query(sql))
    return _fp_row(rows[0]) if rows else None


# ---- row shapes -----------------------------------------------------------------------------


def probe_from_row(row: dict[str, Any]) -> ProbeResult:
    """A ProbeResult back from a row of `Store.probes()`."""
    return ProbeResult(**{k: row[k] for k in PROBE_FIELDS})


def sample_from_row(row: dict[str, Any]) -> GpuSample:
    """A GpuSample back from a row of `Store.gpu_samples()`."""
    return GpuSample(**{k: row[k] for k in GPU_FIELDS})


def _insert_sql(table: str, cols: Sequence[str]) -> str:
    return f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"


def _range(since_ts: float | None, until_ts: float | None) -> tuple[str, list[Any]]:
    clauses, params = [], []
    if since_ts is not None:
        clauses.append("ts >= ?")
        params.append(since_ts)
    if until_ts is not None:
        clauses.append("ts < ?")
        params.append(until_ts)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), params


def _probe_row(row: dict[str, Any]) -> dict[str, Any]:
    for k in _PROBE_BOOLS:
        if row[k] is not None:
            row[k] = bool(row[k])
    return row


def _fp_row(row: dict[str, Any]) -> dict[str, Any]:
    row["extra"] = json.loads(row["extra"] or "{}")
    return row
