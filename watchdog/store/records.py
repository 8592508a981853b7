"""Drift baselines and events, and alert deliveries, in the store: the SQL the CLI and the
daemon share.

The tables come from migrations m002 and m003; only `llm_watchdog.store.db.Store` talks to
SQLite, and these helpers go through its `insert` / `execute` / `rows`.
"""

from __future__ import annotations

import json
from typing import Any

from llm_watchdog.drift import Baseline, DriftEvent
from llm_watchdog.store.db import Store


def save_baseline(store: Store, baseline: Baseline) -> int:
    """Store a baseline as the one in use for its fingerprint (older ones are retired)."""
    with store.transaction():
        store.execute(
            "UPDATE baselines SET reset_ts = ? WHERE fingerprint_id = ? AND reset_ts IS NULL",
            (baseline.created_ts, baseline.fingerprint_id),
        )
        return store.insert("baselines", baseline.to_dict())


def active_baseline(store: Store, fingerprint_id: str) -> Baseline | None:
    rows = store.rows(
        "SELECT * FROM baselines WHERE fingerprint_id = ? AND reset_ts IS NULL "
        "ORDER BY created_ts DESC LIMIT 1",
        (fingerprint_id,),
    )
    return Baseline.from_dict(rows[0]) if rows else None


def reset_baselines(store: Store, ts: float, fingerprint_id: str | None = None) -> int:
    """Retire the baseline in use (of one fingerprint, or all); returns how many."""
    if fingerprint_id is None:
        return store.execute("UPDATE baselines SET reset_ts = ? WHERE reset_ts IS NULL", (ts,))
    return store.execute(
        "UPDATE baselines SET reset_ts = ? WHERE fingerprint_id = ? AND reset_ts IS NULL",
        (ts, fingerprint_id),
    )


def baselines(store: Store, include_retired: bool = False) -> list[dict[str, Any]]:
    where = "" if include_retired else " WHERE reset_ts IS NULL"
    return store.rows(f"SELECT * FROM baselines{where} ORDER BY created_ts")


def save_event(store: Store, event: DriftEvent, fingerprint_id: str | None) -> None:
    """Upsert one snapshot: an event keeps its id from opening to closing."""
    row = {
        "id": event.id,
        "kind": event.kind,
        "fingerprint_id": fingerprint_id,
        "start_ts": event.start_ts,
        "end_ts": event.end_ts,
        "cause": event.cause,
        "baseline_p95_ms": event.to_dict()["baseline_p95_ms"],
        "peak_p95_ms": event.to_dict()["peak_p95_ms"],
        "evidence": json.dumps(event.to_dict()["evidence"], sort_keys=True),
        "message": event.message,
        "updated_ts": event.ts,
    }
    columns = ", ".join(row)
    marks = ", ".join("?" for _ in row)
    updates = ", ".join(f"{c} = excluded.{c}" for c in row if c != "id")
    store.execute(
        f"INSERT INTO drift_events ({columns}) VALUES ({marks}) "
        f"ON CONFLICT(id) DO UPDATE SET {updates}",
        tuple(row.values()),
    )


def events(
    store: Store, since_ts: float | None = None, until_ts: float | None = None
) -> list[dict[str, Any]]:
    """Events that overlap [since, until), oldest first; open events always count."""
    since = -1.0 if since_ts is None else since_ts
    until = float("inf") if until_ts is None else until_ts
    rows = store.rows(
        "SELECT * FROM drift_events WHERE (end_ts IS NULL OR end_ts >= ?) AND start_ts < ? "
        "ORDER BY start_ts",
        (since, until),
    )
    for r in rows:
        r["evidence"] = json.loads(r["evidence"] or "{}")
    return rows


def open_events(store: Store) -> list[tuple[DriftEvent, str | None]]:
    """Events with no end yet, oldest first, each with the fingerprint it was stored under:
    what a daemon finds open when it starts."""
    rows = store.rows("SELECT * FROM drift_events WHERE end_ts IS NULL ORDER BY start_ts, id")
    out = []
    for r in rows:
        event = DriftEvent(
            id=r["id"],
            serial=0,
            kind=r["kind"],
            change="opened",
            start_ts=r["start_ts"],
            end_ts=None,
            cause=r["cause"] or "unknown",
            baseline_p95_ms=r["baseline_p95_ms"],
            peak_p95_ms=r["peak_p95_ms"],
            evidence=json.loads(r["evidence"] or "{}"),
            message=r["message"] or "",
            ts=r["updated_ts"] if r["updated_ts"] is not None else r["start_ts"],
        )
        out.append((event, r["fingerprint_id"]))
    return out


def deliveries(store: Store, since_ts: float) -> list[dict[str, Any]]:
    """Final alert deliveries (one row per alert and sink, after its retries), oldest first."""
    return store.rows("SELECT * FROM alerts WHERE final = 1 AND ts >= ? ORDER BY ts", (since_ts,))


def alert_fired(store: Store, key: str) -> bool:
    """Whether the history holds a firing row of alert `key`."""
    return bool(
        store.rows("SELECT 1 FROM alerts WHERE key = ? AND state = 'firing' LIMIT 1", [key])
    )


def owed_resolves(store: Store) -> list[dict[str, Any]]:
    """Firing alerts that reached a sink which has had no resolved alert for them since, and
    whose condition may still hold: what a daemon starting over this store owes a "resolved"
    to, one row per alert and sink, oldest first.

    Those are the alerts of drift events still open (key "drift:<event id>",
    llm_watchdog.daemon.judge.alert_for), of GPU telemetry lost ("telemetry:<index>",
    `telemetry_alert`), which the next run resolves once that GPU answers, and of control not
    taking effect ("control:not_effective:<actuator>"), resolved by the next write that
    does. Each row has the alert's key, kind, severity, title, message and cause as it was
    sent (a drift alert's cause is its event's), the sink, `sent_ts` (when it got through),
    and for a drift event its `start_ts` and `event_id` (None for the others).
    """
    unresolved = (
        "a.state = 'firing' AND a.ok = 1 AND a.final = 1 "
        "AND NOT EXISTS (SELECT 1 FROM alerts r WHERE r.key = a.key AND r.sink = a.sink "
        "AND r.state = 'resolved' AND r.ok = 1 AND r.ts >= a.ts)"
    )
    return store.rows(
        "SELECT * FROM ("
        "SELECT a.key, a.kind, a.severity, a.sink, a.title, a.message, MAX(a.ts) AS sent_ts, "
        "e.id AS event_id, e.start_ts, e.cause "
        "FROM drift_events e JOIN alerts a ON a.key = 'drift:' || e.id "
        f"WHERE e.end_ts IS NULL AND {unresolved} GROUP BY a.key, a.sink "
        "UNION ALL "
        "SELECT a.key, a.kind, a.severity, a.sink, a.title, a.message, MAX(a.ts) AS sent_ts, "
        "NULL, NULL, a.cause FROM alerts a "
        f"WHERE a.kind IN ('telemetry_lost', 'control_not_effective') AND {unresolved} "
        "GROUP BY a.key, a.sink"
        ") ORDER BY sent_ts, key, sink"
    )
