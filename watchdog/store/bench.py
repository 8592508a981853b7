"""Bench runs in the store: the `bench_runs`, `bench_requests` and `bench_gpu_samples` tables
(migrations m008, m009), written once per run and read by `bench list`, `show` and `compare`.

A run is written in one transaction, its raw rows with it, so a run is either all there or
not at all; an interrupted run is written the same way, marked incomplete.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from llm_watchdog.store.db import Store

RUN_FIELDS = (
    "started_ts",
    "ended_ts",
    "complete",
    "stop_reason",
    "url",
    "engine",
    "engine_version",
    "model",
    "launch_command",
    "driver_version",
    "gpu_name",
    "gpu_uuid",
    "probe_set",
    "probe_set_hash",
    "batch_set",
    "batch_set_hash",
    "fingerprint_id",
    "config",
    "cold_start",
    "levels",
)
_JSON_FIELDS = ("config", "cold_start", "levels")
_REQUEST_FIELDS = (
    "run_id",
    "level_index",
    "kind",
    "ts",
    "prompt_id",
    "outcome",
    "ttft_ms",
    "wait_ms",
    "total_ms",
    "output_tokens",
    "output_chars",
    "quality_pass",
    "error_class",
    "detail",
    "prompt_ms",
    "prompt_n",
    "engine_wait_ms",
)
# What `bench show --requests` lists: every stored request column but the run and the detail.
REQUEST_LISTING_COLUMNS = [c for c in _REQUEST_FIELDS if c not in ("run_id", "detail")]
_GPU_FIELDS = (
    "run_id",
    "level_index",
    "ts",
    "gpu_index",
    "temp_c",
    "sm_clock_mhz",
    "power_w",
    "thermal_violation_ms",
    "power_violation_ms",
    "throttle_reasons",
)


def save_run(
    store: Store,
    run: Mapping[str, Any],
    chat_rows: Sequence[Mapping[str, Any]] = (),
    batch_rows: Sequence[Mapping[str, Any]] = (),
    gpu_rows: Sequence[Mapping[str, Any]] = (),
) -> int:
    """Store one run with its raw rows; returns its id."""
    unknown = set(run) - set(RUN_FIELDS)
    if unknown:
        raise ValueError(f"not bench_runs columns: {sorted(unknown)}")
    values = {
        k: json.dumps(v, sort_keys=True, default=str) if k in _JSON_FIELDS else v
        for k, v in run.items()
    }
    values["complete"] = int(bool(values.get("complete")))
    cols = ", ".join(values)
    with store.transaction() as db:
        cur = db.execute(
            f"INSERT INTO bench_runs ({cols}) VALUES ({', '.join('?' * len(values))})",
            list(values.values()),
        )
        run_id = int(cur.lastrowid or 0)
        requests = [_chat(run_id, r) for r in chat_rows] + [_batch(run_id, r) for r in batch_rows]
        if requests:
            db.conn.executemany(
                f"INSERT INTO bench_requests ({', '.join(_REQUEST_FIELDS)}) "
                f"VALUES ({', '.join('?' * len(_REQUEST_FIELDS))})",
                [tuple(r.get(f) for f in _REQUEST_FIELDS) for r in requests],
            )
        if gpu_rows:
            db.conn.executemany(
                f"INSERT INTO bench_gpu_samples ({', '.join(_GPU_FIELDS)}) "
                f"VALUES ({', '.join('?' * len(_GPU_FIELDS))})",
                [tuple(dict(g, run_id=run_id).get(f) for f in _GPU_FIELDS) for g in gpu_rows],
            )
    return run_id


def _chat(run_id: int, r: Mapping[str, Any]) -> dict[str, Any]:
    qp = r.get("quality_pass")
    return {
        "run_id": run_id,
        "level_index": r["level_index"],
        "kind": "chat",
        "ts": r.get("ts"),
        "prompt_id": r.get("prompt_id"),
        "outcome": "ok" if r.get("ok") else "failed",
        "ttft_ms": r.get("ttft_ms"),
        "total_ms": r.get("total_ms"),
        "output_tokens": r.get("output_tokens"),
        "quality_pass": None if qp is None else int(bool(qp)),
        "error_class": r.get("error_class"),
        "detail": r.get("error_detail") or r.get("answer"),
        **_timings(r),
    }


def _batch(run_id: int, r: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "level_index": r["level_index"],
        "kind": "batch",
        "ts": r.get("ts"),
        "outcome": r.get("outcome"),
        "ttft_ms": r.get("ttft_ms"),
        "wait_ms": r.get("wait_ms"),
        "total_ms": r.get("total_ms"),
        "output_tokens": r.get("output_tokens"),
        "output_chars": r.get("output_chars"),
        "detail": r.get("detail"),
        **_timings(r),
    }


def _timings(r: Mapping[str, Any]) -> dict[str, Any]:
    """The engine's own timings of the request (None where it gives none)."""
    return {k: r.get(k) for k in ("prompt_ms", "prompt_n", "engine_wait_ms")}


def _decode(row: dict[str, Any]) -> dict[str, Any]:
    for k in _JSON_FIELDS:
        if isinstance(row.get(k), str):
            row[k] = json.loads(row[k])
    row["complete"] = bool(row.get("complete"))
    return row


def list_runs(store: Store, limit: int = 50) -> list[dict[str, Any]]:
    """The newest runs first."""
    rows = store.rows("SELECT * FROM bench_runs ORDER BY id DESC LIMIT ?", (limit,))
    return [_decode(r) for r in rows]


def get_run(store: Store, run_id: int) -> dict[str, Any] | None:
    rows = store.rows("SELECT * FROM bench_runs WHERE id = ?", (run_id,))
    return _decode(rows[0]) if rows else None


def run_requests(store: Store, run_id: int, kind: str | None = None) -> list[dict[str, Any]]:
    """A run's raw requests in the order they were sent (chat and batch, or one `kind`)."""
    if kind is None:
        return store.rows(
            "SELECT * FROM bench_requests WHERE run_id = ? ORDER BY level_index, ts, rowid",
            (run_id,),
        )
    return store.rows(
        "SELECT * FROM bench_requests WHERE run_id = ? AND kind = ? "
        "ORDER BY level_index, ts, rowid",
        (run_id, kind),
    )


def run_gpu_samples(store: Store, run_id: int) -> list[dict[str, Any]]:
    return store.rows(
        "SELECT * FROM bench_gpu_samples WHERE run_id = ? ORDER BY ts, gpu_index", (run_id,)
    )
