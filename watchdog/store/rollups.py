"""Minute and hour rollups, retention, and `history`, which reads rollups and raw rows as one.

Raw probe results and GPU samples are kept for a retention window; `rollup()` folds each
finished minute and hour into `probes_1m` / `gpu_1m` and `probes_1h` / `gpu_1h`, and prunes
raw rows past the window, so a year of history is some hundred megabytes and a year-long
query reads 8,760 hourly rows. `history()` reads raw rows where they still exist and the
rollups before that, or buckets throughout.

Functions over an open database; `llm_watchdog.store.db.Store` calls them holding its lock (and,
for `rollup`, a transaction), and turns sqlite3 errors into StoreError.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import sqlite_utils

from llm_watchdog.nvml.throttle import POWER_MASK, THERMAL_MASK
from llm_watchdog.store.rows import _insert_sql, _probe_row


def rollup(db: sqlite_utils.Database, now_ts: float, raw_retention_s: float) -> int:
    """The body of `Store.rollup`, in its transaction."""
    boundary = min(_floor(now_ts, 3600), _floor(now_ts - raw_retention_s, 60))
    rolled = 0
    for table, raw in _ROLLUPS:
        span = 60 if table.endswith("_1m") else 3600
        n = _roll(db, table, raw, span, _floor(now_ts, span))
        rolled += n if span == 60 else 0
    for table, raw in _ROLLUPS:
        db.execute(f"DELETE FROM {raw} WHERE ts < ?", [boundary])
        db.execute(
            "UPDATE _rollup_state SET deleted_before = MAX(deleted_before, ?) WHERE name = ?",
            [boundary, table],
        )
    return rolled


def history(
    db: sqlite_utils.Database,
    since_ts: float,
    until_ts: float | None,
    resolution: str,
    series: str,
    gpu_index: int | None,
) -> list[dict[str, Any]]:
    """The body of `Store.history`, `resolution` checked and not "auto"; under the lock."""
    until = float("inf") if until_ts is None else until_ts
    span = 3600 if resolution == "1h" else 60
    table = ("probes_" if series == "probes" else "gpu_") + ("1h" if span == 3600 else "1m")
    start = _floor(since_ts, span)
    gpu = (" AND gpu_index = ?", [gpu_index]) if gpu_index is not None else ("", [])
    state = _state(db, table)
    # Rollups before the edge, raw rows after it; the edge is a whole minute or hour,
    # so nothing is counted twice. "raw": where raw rows begin; else: how far the
    # rollup has got.
    edge = state["deleted_before"] if resolution == "raw" else state["rolled_until"]
    older = _bucket_rows(db, table, start, min(until, edge), gpu)
    if series == "probes":
        raw = [_probe_row(r) for r in db.query(_PROBES_RAW_SQL, [max(start, edge), until])]
        if resolution == "raw":
            newer = [_probe_raw_bucket(r) for r in raw if r["ts"] >= since_ts]
        else:
            newer = _probe_buckets(raw, span)
    else:
        cols = ", ".join(c for c, _, _ in _GPU_SPEC)
        if resolution == "raw":
            sql = (
                f"SELECT ts, 0 AS span_s, gpu_index, {_GPU_PER_ROW} FROM gpu_samples "
                f"WHERE ts >= ? AND ts < ?{gpu[0]} ORDER BY ts, gpu_index"
            )
            lo = max(since_ts, edge)
        else:
            sql = (
                f"SELECT bucket AS ts, {span} AS span_s, gpu_index, {cols} "
                f"FROM ({_gpu_raw_sql(span, gpu[0])}) ORDER BY bucket, gpu_index"
            )
            lo = max(start, edge)
        newer = list(db.query(sql, [lo, until, *gpu[1]]))
    return older + newer


_ROLLUPS = (  # (rollup table, raw table)
    ("probes_1m", "probes"),
    ("probes_1h", "probes"),
    ("gpu_1m", "gpu_samples"),
    ("gpu_1h", "gpu_samples"),
)
RESOLUTIONS = ("auto", "raw", "1m", "1h")
AUTO_RAW_MAX_S = 2 * 86400  # up to 8,640 probes or 172,800 samples per GPU
AUTO_1M_MAX_S = 60 * 86400  # up to 86,400 rows


def _roll(db: sqlite_utils.Database, table: str, raw: str, span: int, cutoff: int) -> int:
    """Roll the raw rows new since the last call, in buckets that ended before `cutoff`, into
    `table`; returns how many new raw rows that covered."""
    state = _state(db, table)
    last_id, deleted_before = state["last_id"], state["deleted_before"]
    # `+ts`: keeps the planner on the rowid range of the new rows; left to itself it takes the
    # ts index and walks every older row too (https://www.sqlite.org/optoverview.html,
    # "Disqualifying WHERE clause terms using unary +"). With a year of data, a 5-minute
    # rollup took 0.56 s without it and 2 ms with it (tests/benchmarks/bench_store.py).
    new = f"FROM {raw} WHERE id > ? AND +ts < ?"
    count = db.execute(f"SELECT COUNT(*) {new}", [last_id, cutoff]).fetchone()[0]
    starts = db.execute(
        f"SELECT DISTINCT CAST(ts / {span} AS INTEGER) * {span} {new}", [last_id, cutoff]
    )
    for lo, hi in _runs(sorted(t for (t,) in starts), span, deleted_before):
        # Below deleted_before only late rows are left: keep the bucket made while its raw
        # rows were all there rather than replace it with a fragment.
        conflict = "REPLACE" if lo >= deleted_before else "IGNORE"
        if raw == "probes":
            _roll_probes(db, table, span, lo, hi, conflict)
        else:
            cols = ", ".join(GPU_BUCKET_COLUMNS)
            sql = f"INSERT OR {conflict} INTO {table} ({cols}) {_gpu_raw_sql(span)}"
            db.execute(sql, [lo, hi])
    pending = db.execute(
        f"SELECT MIN(id) FROM {raw} WHERE id > ? AND +ts >= ?", [last_id, cutoff]
    ).fetchone()[0]
    if pending is not None:
        last_id = pending - 1  # rows of the unfinished bucket: next time
    else:
        last_id = db.execute(f"SELECT MAX(id) FROM {raw}").fetchone()[0] or last_id
    db.execute(
        "UPDATE _rollup_state SET last_id = ?, rolled_until = MAX(rolled_until, ?) WHERE name = ?",
        [last_id, cutoff, table],
    )
    return int(count)


def _bucket_rows(
    db: sqlite_utils.Database, table: str, lo: float, hi: float, gpu: tuple[str, list[Any]]
) -> list[dict[str, Any]]:
    """Rows of a rollup table with lo <= ts < hi, in history shape."""
    span = 3600 if table.endswith("_1h") else 60
    where = gpu[0] if table.startswith("gpu") else ""
    params = [lo, hi, *gpu[1]] if where else [lo, hi]
    sql = f"SELECT *, {span} AS span_s FROM {table} WHERE ts >= ? AND ts < ?{where} ORDER BY ts"
    out = []
    for r in db.query(sql, params):
        if table.startswith("probes"):
            r["prompt_id"] = None
            r["fingerprint_id"] = r["fingerprint_id"] or None
            r["errors"] = json.loads(r["errors"])
            out.append({c: r[c] for c in PROBE_HISTORY_COLUMNS})
        else:
            out.append({c: r[c] for c in GPU_HISTORY_COLUMNS})
    return out


# ---- probe buckets (pure) -------------------------------------------------------------------

PROBE_BUCKET_COLUMNS = (
    "ts", "fingerprint_id", "n", "ok_n", "cold_n", "quality_n", "quality_fail_n", "ttft_n",
    "ttft_mean_ms", "ttft_p50_ms", "ttft_p95_ms", "ttft_min_ms", "ttft_max_ms",
    "cold_ttft_max_ms", "total_n", "total_mean_ms", "errors",
)  # fmt: skip
PROBE_HISTORY_COLUMNS = ("ts", "span_s", "prompt_id", *PROBE_BUCKET_COLUMNS[1:])
_PROBES_RAW_SQL = "SELECT * FROM probes WHERE ts >= ? AND ts < ? ORDER BY ts, id"


def _probe_raw_bucket(row: dict[str, Any]) -> dict[str, Any]:
    """One raw probe in the shape of a bucket (n = 1), for `history`."""
    out = _probe_bucket(row["ts"], 0, row["fingerprint_id"], [row])
    out["prompt_id"] = row["prompt_id"]
    return out


def _probe_buckets(rows: Sequence[dict[str, Any]], span: int) -> list[dict[str, Any]]:
    """Raw probe rows (bools as bool) -> one bucket per span and fingerprint."""
    groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((_floor(r["ts"], span), r["fingerprint_id"] or ""), []).append(r)
    return [_probe_bucket(ts, span, fp or None, g) for (ts, fp), g in sorted(groups.items())]


def _probe_bucket(
    ts: float, span: int, fingerprint_id: str | None, rows: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    # TTFT figures over warm, successful probes only: a cold start (model load, first request
    # after a restart) is kept apart so it never drags a baseline (issue 4, "Cold starts").
    warm = sorted(
        r["ttft_ms"] for r in rows if r["ok"] and not r["cold"] and r["ttft_ms"] is not None
    )
    cold = [r["ttft_ms"] for r in rows if r["cold"] and r["ttft_ms"] is not None]
    totals = [r["total_ms"] for r in rows if r["ok"] and r["total_ms"] is not None]
    errors: dict[str, int] = {}
    for r in rows:
        if r["error_class"]:
            errors[r["error_class"]] = errors.get(r["error_class"], 0) + 1
    return {
        "ts": ts,
        "span_s": span,
        "prompt_id": None,
        "fingerprint_id": fingerprint_id,
        "n": len(rows),
        "ok_n": sum(1 for r in rows if r["ok"]),
        "cold_n": sum(1 for r in rows if r["cold"]),
        "quality_n": sum(1 for r in rows if r["quality_pass"] is not None),
        "quality_fail_n": sum(1 for r in rows if r["quality_pass"] is False),
        "ttft_n": len(warm),
        "ttft_mean_ms": sum(warm) / len(warm) if warm else None,
        "ttft_p50_ms": _quantile(warm, 0.5),
        "ttft_p95_ms": _quantile(warm, 0.95),
        "ttft_min_ms": warm[0] if warm else None,
        "ttft_max_ms": warm[-1] if warm else None,
        "cold_ttft_max_ms": max(cold) if cold else None,
        "total_n": len(totals),
        "total_mean_ms": sum(totals) / len(totals) if totals else None,
        "errors": errors,
    }


def _quantile(sorted_values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between order statistics (numpy's default, Hyndman-Fan type 7)."""
    if not sorted_values:
        return None
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (pos - lo) * (sorted_values[hi] - sorted_values[lo])


def _roll_probes(
    db: sqlite_utils.Database, table: str, span: int, lo: float, hi: float, conflict: str
) -> None:
    raw = [_probe_row(r) for r in db.query(_PROBES_RAW_SQL, [lo, hi])]
    values = []
    for b in _probe_buckets(raw, span):
        b["fingerprint_id"] = b["fingerprint_id"] or ""
        b["errors"] = json.dumps(b["errors"], sort_keys=True)
        values.append([b[c] for c in PROBE_BUCKET_COLUMNS])
    sql = _insert_sql(table, PROBE_BUCKET_COLUMNS).replace("INSERT", f"INSERT OR {conflict}", 1)
    db.conn.executemany(sql, values)


# ---- GPU buckets (SQL) ----------------------------------------------------------------------

# (bucket column, per-sample expression, aggregate over the bucket's samples)
_GPU_SPEC = (
    ("uuid", "uuid", "MAX"),
    ("n", "1", "COUNT"),
    ("temp_mean_c", "temp_c", "AVG"),
    ("temp_max_c", "temp_c", "MAX"),
    ("sm_clock_mean_mhz", "sm_clock_mhz", "AVG"),
    ("sm_clock_min_mhz", "sm_clock_mhz", "MIN"),
    ("sm_clock_max_mhz", "sm_clock_max_mhz", "MAX"),
    ("mem_clock_mean_mhz", "mem_clock_mhz", "AVG"),
    ("mem_clock_max_mhz", "mem_clock_max_mhz", "MAX"),
    ("power_mean_w", "power_w", "AVG"),
    ("power_max_w", "power_w", "MAX"),
    ("power_limit_w", "power_limit_w", "MIN"),
    ("util_gpu_mean_pct", "util_gpu_pct", "AVG"),
    ("util_mem_mean_pct", "util_mem_pct", "AVG"),
    ("fan_mean_pct", "fan_pct", "AVG"),
    ("pstate_max", "pstate", "MAX"),
    ("throttle_reasons", "throttle_reasons", "bit_or"),
    ("thermal_n", f"((throttle_reasons & {THERMAL_MASK}) != 0)", "SUM"),
    ("power_n", f"((throttle_reasons & {POWER_MASK}) != 0)", "SUM"),
    ("thermal_violation_ms", "thermal_violation_ms", "SUM"),
    ("power_violation_ms", "power_violation_ms", "SUM"),
    ("temp_slowdown_c", "temp_slowdown_c", "MIN"),
)
GPU_BUCKET_COLUMNS = ("ts", "gpu_index", *(c for c, _, _ in _GPU_SPEC))
GPU_HISTORY_COLUMNS = ("ts", "span_s", *GPU_BUCKET_COLUMNS[1:])
_GPU_AGG = ", ".join(f"{agg}({expr}) AS {c}" for c, expr, agg in _GPU_SPEC)
_GPU_PER_ROW = ", ".join(f"{expr} AS {c}" for c, expr, _ in _GPU_SPEC)


def _gpu_raw_sql(span: int, gpu_filter: str = "") -> str:
    """Samples with ? <= ts < ? -> one row per `span` seconds and GPU (GPU_BUCKET_COLUMNS,
    the bucket start named `bucket`)."""
    return (
        f"SELECT CAST(ts / {span} AS INTEGER) * {span} AS bucket, gpu_index, {_GPU_AGG} "
        f"FROM gpu_samples WHERE ts >= ? AND ts < ?{gpu_filter} GROUP BY bucket, gpu_index"
    )


class _BitOr:
    """SQL aggregate bit_or(x): OR of the non-NULL values, NULL when there are none."""

    def __init__(self) -> None:
        self.value: int | None = None

    def step(self, x: int | None) -> None:
        if x is not None:
            self.value = (self.value or 0) | int(x)

    def finalize(self) -> int | None:
        return self.value


def _floor(ts: float, span: int) -> int:
    return int(ts // span) * span


def _runs(points: Sequence[int], step: int, split_at: float) -> list[tuple[int, int]]:
    """Sorted bucket starts -> [lo, hi) ranges covering them, a few statements instead of one
    per bucket; gaps up to 10 buckets are bridged (an empty bucket costs nothing), and no
    range crosses `split_at`."""
    out: list[tuple[int, int]] = []
    for t in points:
        if out and t - out[-1][1] <= 10 * step and (t < split_at) == (out[-1][0] < split_at):
            out[-1] = (out[-1][0], t + step)
        else:
            out.append((t, t + step))
    return out


def _state(db: sqlite_utils.Database, table: str) -> dict[str, Any]:
    return next(db.query("SELECT * FROM _rollup_state WHERE name = ?", [table]))
