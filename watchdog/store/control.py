"""Control decisions in the store: the `control_actions` rows (migration m004) and their reads,
and the law's memory a restart starts from (`law_memory`, migration m011).

A row is written for every decision the steering loop makes (a hold included), with the
inputs and the reason, and completed once the actuator's read-back has said whether the
serving layer really applied it.
"""

from __future__ import annotations

import json
from typing import Any

from llm_watchdog.control.law import ControlAction
from llm_watchdog.store.db import Store


def action_row(
    action: ControlAction,
    *,
    ts: float,
    cls: str = "batch",
    actuator: str | None = None,
    lease_s: float | None = None,
    applied: bool | None = None,
    apply_detail: str | None = None,
) -> dict[str, Any]:
    """A `control_actions` row (migration m004) for a decision; `ts` in unix seconds.

    `applied` is None when nothing was written (a hold), else whether the write succeeded.
    """
    return {
        "ts": ts,
        "cls": cls,
        "kind": action.kind,
        "allowance_before": action.allowance_before,
        "allowance_after": action.allowance_after,
        "reason": action.reason,
        "p95_est_ms": action.p95_est_ms,
        "inputs": json.dumps(action.inputs, sort_keys=True, default=str),
        "actuator": actuator,
        "lease_s": lease_s,
        "applied": None if applied is None else int(applied),
        "apply_detail": apply_detail,
    }


def verification_row(
    *,
    ts: float,
    kind: str,
    detail: str,
    allowance: int | None = None,
    inflight: int | None = None,
    queued: int | None = None,
) -> dict[str, Any]:
    """The columns that complete a `control_actions` row once its write has been checked."""
    return {
        "verify_ts": ts,
        "verify_kind": kind,
        "verify_detail": detail,
        "read_allowance": allowance,
        "read_inflight": inflight,
        "read_queued": queued,
    }


def record_action(store: Store, row: dict[str, Any]) -> int:
    """Insert an `action_row`; returns its id, for `record_verification`."""
    return store.insert("control_actions", row)


def record_verification(store: Store, row_id: int, done: dict[str, Any]) -> None:
    """Complete action `row_id` with a `verification_row`."""
    unknown = set(done) - set(verification_row(ts=0.0, kind="", detail=""))
    if unknown:
        raise ValueError(f"not verification columns: {sorted(unknown)}")
    sets = ", ".join(f"{column} = ?" for column in done)
    store.execute(f"UPDATE control_actions SET {sets} WHERE id = ?", (*done.values(), row_id))


def actions(store: Store, since_ts: float, until_ts: float | None = None) -> list[dict[str, Any]]:
    """Control decisions from `since_ts` up to (not including) `until_ts`, oldest first."""
    return store.rows(
        "SELECT * FROM control_actions WHERE ts >= ? AND ts < ? ORDER BY ts, id",
        (since_ts, until_ts if until_ts is not None else float("inf")),
    )


def last_action(store: Store, *, changed: bool = False) -> dict[str, Any] | None:
    """The newest control decision, a hold included; with `changed`, the newest one whose
    write took a new allowance (a dry run or a failed write leaves the old one in force)."""
    where = "WHERE allowance_after != allowance_before AND applied = 1 " if changed else ""
    rows = store.rows(f"SELECT * FROM control_actions {where}ORDER BY ts DESC, id DESC LIMIT 1")
    return rows[0] if rows else None


def steered_target_ms(store: Store) -> float | None:
    """The chat target (ms) the daemon steered by in its newest decision that records one:
    each decision's inputs hold `target_p95_ms`. None where no decision says."""
    rows = store.rows(
        "SELECT inputs FROM control_actions WHERE inputs LIKE '%target_p95_ms%' "
        "ORDER BY ts DESC, id DESC LIMIT 1"
    )
    if not rows:
        return None
    try:
        stored = json.loads(rows[0]["inputs"]).get("target_p95_ms")
    except (TypeError, ValueError, AttributeError):
        return None
    if isinstance(stored, (int, float)) and not isinstance(stored, bool) and stored >= 1:
        return float(stored)
    return None


def save_surge_memory(
    store: Store, fingerprint_id: str | None, memory: dict[str, Any] | None, ts: float
) -> None:
    """Keep the law's surge memory for this engine (migration m011), or forget it (None)."""
    key = fingerprint_id or ""
    if memory is None:
        store.execute("DELETE FROM law_memory WHERE fingerprint_id = ?", (key,))
        return
    store.execute(
        "INSERT INTO law_memory (fingerprint_id, ts, surge) VALUES (?, ?, ?) "
        "ON CONFLICT(fingerprint_id) DO UPDATE SET ts = excluded.ts, surge = excluded.surge",
        (key, ts, json.dumps(memory, sort_keys=True)),
    )


def surge_memory(
    store: Store, fingerprint_id: str | None, since_ts: float
) -> dict[str, Any] | None:
    """The surge memory kept for this engine at `since_ts` or later; None where none is, or
    what is kept is not a JSON object."""
    rows = store.rows(
        "SELECT surge FROM law_memory WHERE fingerprint_id = ? AND ts >= ?",
        (fingerprint_id or "", since_ts),
    )
    if not rows:
        return None
    try:
        memory = json.loads(rows[0]["surge"])
    except (TypeError, ValueError):
        return None
    return memory if isinstance(memory, dict) else None
