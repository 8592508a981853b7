"""SQLite storage: the only module that touches the database.

One file, opened through sqlite-utils, in WAL mode (readers such as the CLI never block the
daemon's writes), with a busy timeout for the moments two processes write at once. Schema
changes are numbered migrations (`watchdog.migrations`), applied on open.

Raw probe results and GPU samples are kept for a retention window; `rollup()` folds each
finished minute and hour into `probes_1m` / `gpu_1m` and `probes_1h` / `gpu_1h`, and prunes
raw rows past the window, so a year of history is some hundred megabytes and a year-long
query reads 8,760 hourly rows. `history()` reads raw rows where they still exist and the
rollups before that, or buckets throughout.

Exceptions: everything the database can throw leaves this module as

    StoreError  one line: what happened, and what to do

raised `from` the sqlite3 error. A failed write rolls back its whole transaction, so it
never takes earlier rows with it.

Threads: the daemon's scheduler calls in from worker threads. One connection
(`check_same_thread=False`) is shared, and a lock serialises every use of it; SQLite would
serialise the writes anyway.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any

import sqlite_utils

from watchdog.migrations import MigrationError, migrate
from watchdog.models import Fingerprint, GpuEvent, GpuSample, ProbeResult
from watchdog.throttle import POWER_MASK, THERMAL_MASK

PROBE_FIELDS = tuple(f.name for f in fields(ProbeResult))
GPU_FIELDS = tuple(f.name for f in fields(GpuSample))
_PROBE_BOOLS = ("ok", "quality_pass", "cold")
_FP_FIELDS = tuple(Fingerprint().key_fields())
_PROBE_COLUMNS = ("fingerprint_id", *PROBE_FIELDS)


class StoreError(Exception):
    """The database could not do what was asked. str(err) is one line."""


class Store:
    """The watchdog's database. `Store(path)` opens (creating if needed) and migrates it."""

    def __init__(
        self,
        path: str | Path,
        *,
        busy_timeout_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = str(path)
        self.busy_timeout_s = busy_timeout_s
        self._clock = clock
        self._lock = threading.RLock()
        self._db: sqlite_utils.Database | None = None
        conn = _connect(self.path, busy_timeout_s)
        try:
            db = sqlite_utils.Database(conn)
            db.conn.create_aggregate("bit_or", 1, _BitOr)  # type: ignore[arg-type]
            if self.path != ":memory:":
                # WAL: readers and one writer at once; synchronous=NORMAL is durable across
                # an application crash and only risks the last commits on power loss
                # (https://www.sqlite.org/wal.html, pragma.html#pragma_synchronous).
                db.enable_wal()
                db.execute("PRAGMA synchronous=NORMAL")
                # A big first rollup can grow the WAL file; without a limit it stays that size
                # (https://www.sqlite.org/pragma.html#pragma_journal_size_limit).
                db.execute("PRAGMA journal_size_limit = 33554432")
            db.execute("PRAGMA foreign_keys=ON")
            migrate(db, where=f"database {self.path}", now=clock)
            _check_columns(db, self.path)
        except MigrationError as exc:
            conn.close()
            raise StoreError(str(exc)) from None
        except sqlite3.Error as exc:
            conn.close()
            raise StoreError(_describe(exc, self.path, busy_timeout_s, opening=True)) from exc
        except BaseException:
            conn.close()
            raise
        self._db = db

    @classmethod
    def memory(cls, *, clock: Callable[[], float] = time.time) -> Store:
        """A private in-memory database, for tests and `replay`."""
        return cls(":memory:", clock=clock)

    @property
    def db(self) -> sqlite_utils.Database:
        """The sqlite_utils.Database, for migrations. Other code goes through the methods,
        which hold the lock; use `transaction()` for several writes at once."""
        if self._db is None:
            raise StoreError(f"database {self.path} is closed")
        return self._db

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self.path!r})"

    # ---- transactions ---------------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[sqlite_utils.Database]:
        """Hold the lock and a write transaction; commit on success, roll back on error.

        `BEGIN IMMEDIATE` takes SQLite's write lock up front: a deferred transaction that
        reads first can fail with SQLITE_BUSY when it upgrades, without waiting for the busy
        timeout (https://www.sqlite.org/lang_transaction.html). Nested calls use savepoints.
        """
        with self._lock:
            db = self.db
            nested = db.conn.in_transaction
            try:
                db.execute("SAVEPOINT store_nested" if nested else "BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise StoreError(_describe(exc, self.path, self.busy_timeout_s)) from exc
            try:
                yield db
            except BaseException as exc:
                if db.conn.in_transaction:
                    if nested:
                        db.execute("ROLLBACK TO store_nested")
                        db.execute("RELEASE store_nested")
                    else:
                        db.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise StoreError(_describe(exc, self.path, self.busy_timeout_s)) from exc
                raise
            try:
                db.execute("RELEASE store_nested" if nested else "COMMIT")
            except sqlite3.Error as exc:
                if not nested and db.conn.in_transaction:
                    db.execute("ROLLBACK")
                raise StoreError(_describe(exc, self.path, self.busy_timeout_s)) from exc

    @contextmanager
    def _reading(self) -> Iterator[sqlite_utils.Database]:
        with self._lock:
            try:
                yield self.db
            except sqlite3.Error as exc:
                raise StoreError(_describe(exc, self.path, self.busy_timeout_s)) from exc

    # ---- generic helpers for other modules' tables ----------------------------------------

    def insert(self, table: str, row: dict[str, Any]) -> int:
        """Insert one row; dict and list values are stored as JSON. Returns the rowid."""
        values = [json.dumps(v) if isinstance(v, (dict, list)) else v for v in row.values()]
        cols = ", ".join(_quote(c) for c in row)
        sql = f"INSERT INTO {_quote(table)} ({cols}) VALUES ({', '.join('?' * len(row))})"
        with self.transaction() as db:
            return int(db.execute(sql, values).lastrowid or 0)

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> int:
        """Run one writing statement (UPDATE, DELETE, ...) in a transaction; rows changed."""
        with self.transaction() as db:
            return int(db.execute(sql, params).rowcount)

    def rows(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[dict[str, Any]]:
        """Rows of a read-only query. A statement that would write raises StoreError."""
        with self._reading() as db:
            db.execute("PRAGMA query_only=ON")
            try:
                return list(db.query(sql, params))
            except ValueError as exc:  # sqlite-utils: not a statement that returns rows
                raise StoreError(f"rows() needs a query that returns rows ({exc})") from exc
            except sqlite3.OperationalError as exc:
                if "readonly" in str(exc):
                    raise StoreError(
                        f"rows() only reads, and this statement writes: {sql.strip()[:60]!r}; "
                        "use Store.execute() or Store.insert()"
                    ) from exc
                raise
            finally:
                db.execute("PRAGMA query_only=OFF")

    # ---- writes ---------------------------------------------------------------------------

    def record_fingerprint(self, fp: Fingerprint, now_ts: float | None = None) -> str:
        """Insert the fingerprint or, if known, move its last_seen forward. Returns its id."""
        now_ts = self._clock() if now_ts is None else now_ts
        key = fp.key_fields()
        cols = ("id", *_FP_FIELDS, "extra", "first_seen", "last_seen")
        values = (fp.id, *(key[f] for f in _FP_FIELDS), json.dumps(fp.extra), now_ts, now_ts)
        sql = (
            f"INSERT INTO fingerprints ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))}) "
            "ON CONFLICT(id) DO UPDATE SET last_seen = MAX(last_seen, excluded.last_seen), "
            "extra = excluded.extra"
        )
        with self.transaction() as db:
            db.execute(sql, values)
        return fp.id

    def record_probe(self, result: ProbeResult, fingerprint_id: str | None) -> int:
        """Store one probe result; returns its row id."""
        row = result.to_dict()
        row["fingerprint_id"] = fingerprint_id
        values = [row[c] for c in _PROBE_COLUMNS]
        with self.transaction() as db:
            return int(db.execute(_insert_sql("probes", _PROBE_COLUMNS), values).lastrowid or 0)

    def record_gpu_samples(self, samples: Sequence[GpuSample]) -> None:
        """Store one reading of every GPU, all or nothing."""
        if not samples:
            return
        rows = [[getattr(s, c) for c in GPU_FIELDS] for s in samples]
        with self.transaction() as db:
            db.conn.executemany(_insert_sql("gpu_samples", GPU_FIELDS), rows)

    def record_gpu_event(self, ev: GpuEvent) -> int:
        cols = ("ts", "kind", "gpu_index", "detail")
        with self.transaction() as db:
            cursor = db.execute(_insert_sql("gpu_events", cols), [getattr(ev, c) for c in cols])
            return int(cursor.lastrowid or 0)

    # ---- reads ----------------------------------------------------------------------------

    def probes(
        self, since_ts: float | None = None, until_ts: float | None = None, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """Raw probe rows with since_ts <= ts < until_ts, oldest first; with `limit`, the newest
        `limit` of them. Booleans come back as bool (quality_pass may be None)."""
        where, params = _range(since_ts, until_ts)
        sql = f"SELECT * FROM probes{where} ORDER BY ts DESC, id DESC"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        with self._reading() as db:
            rows = [_probe_row(r) for r in db.query(sql, params)]
        rows.reverse()
        return rows

    def gpu_samples(
        self,
        since_ts: float | None = None,
        until_ts: float | None = None,
        gpu_index: int | None = None,
    ) -> list[dict[str, Any]]:
        """Raw GPU samples with since_ts <= ts < until_ts, oldest first."""
        where, params = _range(since_ts, until_ts)
        if gpu_index is not None:
            where += " AND gpu_index = ?" if where else " WHERE gpu_index = ?"
            params.append(gpu_index)
        with self._reading() as db:
            return list(
                db.query(f"SELECT * FROM gpu_samples{where} ORDER BY ts, gpu_index", params)
            )

    def gpu_events(
        self, since_ts: float | None = None, until_ts: float | None = None
    ) -> list[dict[str, Any]]:
        where, params = _range(since_ts, until_ts)
        with self._reading() as db:
            return list(db.query(f"SELECT * FROM gpu_events{where} ORDER BY ts, id", params))

    def last_probe(self) -> dict[str, Any] | None:
        rows = self.probes(limit=1)
        return rows[0] if rows else None

    def last_gpu_samples(self) -> list[dict[str, Any]]:
        """The newest sample of each GPU, by index."""
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
        with self._reading() as db:
            return list(db.query(sql))

    def fingerprint(self, fingerprint_id: str) -> dict[str, Any] | None:
        with self._reading() as db:
            rows = list(db.query("SELECT * FROM fingerprints WHERE id = ?", [fingerprint_id]))
        return _fp_row(rows[0]) if rows else None

    def latest_fingerprint(self) -> dict[str, Any] | None:
        """The fingerprint seen most recently."""
        sql = "SELECT * FROM fingerprints ORDER BY last_seen DESC, first_seen DESC LIMIT 1"
        with self._reading() as db:
            rows = list(db.query(sql))
        return _fp_row(rows[0]) if rows else None

    # ---- rollup and history ---------------------------------------------------------------

    def rollup(self, now_ts: float, raw_retention_s: float) -> int:
        """Fold finished minutes and hours of raw rows into the rollup tables, then delete raw
        rows older than the retention. Returns how many raw rows were newly rolled up (into
        the minute tables).

        Idempotent: a second call with nothing new changes nothing and returns 0. New rows are
        found by id (the last id rolled up is remembered per table), so a probe stored late,
        after its minute was rolled up, gets that minute and hour recomputed from all their
        raw rows. Raw rows go whole minutes at a time, and never before their hour is rolled
        up, so every bucket is computed from complete raw data.
        """
        if raw_retention_s < 0:
            raise ValueError(f"raw_retention_s must be >= 0, not {raw_retention_s}")
        boundary = min(_floor(now_ts, 3600), _floor(now_ts - raw_retention_s, 60))
        rolled = 0
        with self.transaction() as db:
            for table, raw in _ROLLUPS:
                span = 60 if table.endswith("_1m") else 3600
                n = _roll(db, table, raw, span, _floor(now_ts, span))
                rolled += n if span == 60 else 0
            for table, raw in _ROLLUPS:
                db.execute(f"DELETE FROM {raw} WHERE ts < ?", [boundary])
                db.execute(
                    "UPDATE _rollup_state SET deleted_before = MAX(deleted_before, ?) "
                    "WHERE name = ?",
                    [boundary, table],
                )
        return rolled

    def history(
        self,
        since_ts: float,
        until_ts: float | None = None,
        resolution: str = "auto",
        *,
        series: str = "probes",
        gpu_index: int | None = None,
    ) -> list[dict[str, Any]]:
        """Probe results (series="probes") or GPU telemetry (series="gpu") from since_ts to
        until_ts, oldest first, every row in one shape (PROBE_HISTORY_COLUMNS or
        GPU_HISTORY_COLUMNS): a raw row is a bucket of one, with `span_s` 0.

        resolution "raw": raw rows where they still exist, 1-minute rollups before that.
        "1m" / "1h": buckets throughout (rollups, and raw rows not rolled up yet, bucketed
        here the same way); they start on a whole minute or hour, so the first may begin
        before since_ts. "auto": "raw" up to AUTO_RAW_MAX_S, "1m" up to AUTO_1M_MAX_S, else
        "1h", which keeps a listing to some thousands of rows per series and GPU.
        """
        if resolution not in RESOLUTIONS:
            raise ValueError(f"resolution must be one of {RESOLUTIONS}, not {resolution!r}")
        if series not in ("probes", "gpu"):
            raise ValueError(f"series must be 'probes' or 'gpu', not {series!r}")
        until = float("inf") if until_ts is None else until_ts
        if resolution == "auto":
            length = (self._clock() if until_ts is None else until_ts) - since_ts
            resolution = (
                "raw" if length <= AUTO_RAW_MAX_S else "1m" if length <= AUTO_1M_MAX_S else "1h"
            )
        span = 3600 if resolution == "1h" else 60
        table = ("probes_" if series == "probes" else "gpu_") + ("1h" if span == 3600 else "1m")
        start = _floor(since_ts, span)
        gpu = (" AND gpu_index = ?", [gpu_index]) if gpu_index is not None else ("", [])
        with self._reading() as db:
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


# ---- helpers --------------------------------------------------------------------------------


def probe_from_row(row: dict[str, Any]) -> ProbeResult:
    """A ProbeResult back from a row of `Store.probes()`."""
    return ProbeResult(**{k: row[k] for k in PROBE_FIELDS})


def sample_from_row(row: dict[str, Any]) -> GpuSample:
    """A GpuSample back from a row of `Store.gpu_samples()`."""
    return GpuSample(**{k: row[k] for k in GPU_FIELDS})


def _connect(path: str, busy_timeout_s: float) -> sqlite3.Connection:
    if path != ":memory:":
        p = Path(path)
        if not p.parent.is_dir():
            raise StoreError(
                f"cannot open database {path}: directory does not exist; "
                "create it or set storage.path"
            )
        if p.is_dir():
            raise StoreError(
                f"cannot open database {path}: it is a directory; set storage.path to a file"
            )
    try:
        # isolation_level=None: the sqlite3 module opens no transaction on its own; they are
        # explicit (Store.transaction, sqlite-utils' atomic()).
        conn = sqlite3.connect(
            path, timeout=busy_timeout_s, check_same_thread=False, isolation_level=None
        )
    except sqlite3.Error as exc:
        raise StoreError(_describe(exc, path, busy_timeout_s, opening=True)) from exc
    return conn


def _describe(exc: sqlite3.Error, path: str, busy_timeout_s: float, opening: bool = False) -> str:
    """One line for a sqlite3 error: what happened to which file, and what to try."""
    msg = str(exc)
    if "file is not a database" in msg:
        return (
            f"cannot open database {path}: not an SQLite database; move it away or set storage.path"
        )
    if "unable to open" in msg or "readonly" in msg or "read-only" in msg:
        what = "open" if opening else "write to"
        return (
            f"cannot {what} database {path}: permission denied or read-only file system "
            f"({msg}); check the owner and mode of the file and its directory"
        )
    if "locked" in msg or "busy" in msg:
        return (
            f"database {path} is locked: another process held it for more than "
            f"{busy_timeout_s:g} s ({msg}); is a second watchdog writing to it?"
        )
    if "full" in msg:
        return f"database {path}: disk full ({msg}); free space or set storage.path"
    return f"database {path}: {msg}"


def _check_columns(db: sqlite_utils.Database, path: str) -> None:
    """Refuse to start when a model field has no column: every insert would fail later."""
    for table, wanted in (("probes", _PROBE_COLUMNS), ("gpu_samples", GPU_FIELDS)):
        have = {r["name"] for r in db.query(f"PRAGMA table_info({table})")}
        missing = [c for c in wanted if c not in have]
        if missing:
            raise StoreError(
                f"database {path}: table {table} has no column {', '.join(missing)}; "
                "a migration that adds it is missing from watchdog/migrations"
            )


def _state(db: sqlite_utils.Database, table: str) -> dict[str, Any]:
    return next(db.query("SELECT * FROM _rollup_state WHERE name = ?", [table]))


def _insert_sql(table: str, cols: Sequence[str]) -> str:
    return f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


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
