"""The reads behind `llm-watchdog headroom`: each stored probe with the GPU sample before it.

One row per warm, successful probe of one fingerprint since a time: its TTFT, the batch
requests in flight when it was sent (migration m005), and the newest sample of the first GPU
taken at most `MAX_SAMPLE_AGE_S` before it (NULLs where there was none: latency-only mode),
and chat's arrival rate the control loop recorded with its newest decision at most
`MAX_RATE_AGE_S` before it (NULL where there was none, or it had no rate yet).
"""

from __future__ import annotations

from typing import Any

from llm_watchdog.store.db import Store

MAX_SAMPLE_AGE_S = 30.0
# The control loop records a decision at least once a minute: the newest within this long
# before a probe carries chat's rate around it.
MAX_RATE_AGE_S = 90.0

_SQL = """
SELECT p.ts, p.ttft_ms, p.batch_inflight, p.batch_allowance,
       g.temp_c, g.sm_clock_mhz, g.sm_clock_max_mhz, g.throttle_reasons, g.temp_slowdown_c,
       g.temp_target_c,
       (SELECT json_extract(a.inputs, '$.chat_per_s') FROM control_actions a
        WHERE a.ts <= p.ts AND a.ts > p.ts - ?
        ORDER BY a.ts DESC LIMIT 1) AS chat_per_s
FROM probes p
LEFT JOIN gpu_samples g ON g.id = (
    SELECT s.id FROM gpu_samples s
    WHERE s.gpu_index = (SELECT MIN(gpu_index) FROM gpu_samples)
      AND s.ts <= p.ts AND s.ts > p.ts - ?
    ORDER BY s.ts DESC LIMIT 1
)
WHERE p.ts >= ? AND p.ok = 1 AND p.cold = 0 AND p.ttft_ms IS NOT NULL
  AND p.batch_inflight IS NOT NULL {fingerprint}
ORDER BY p.ts
"""


def probe_states(
    store: Store,
    since_ts: float,
    fingerprint_id: str | None = None,
    until_ts: float | None = None,
) -> list[dict[str, Any]]:
    """Probes from `since_ts` to `until_ts` (None: now; of `fingerprint_id` where given),
    oldest first, each with the GPU sample it was sent under. Probes without a batch in-flight
    count are left out: they say nothing about headroom."""
    params: list[Any] = [MAX_RATE_AGE_S, MAX_SAMPLE_AGE_S, since_ts]
    where = ""
    if fingerprint_id is not None:
        where = "AND p.fingerprint_id = ?"
        params.append(fingerprint_id)
    if until_ts is not None:
        where += " AND p.ts < ?"
        params.append(until_ts)
    return store.rows(_SQL.format(fingerprint=where), params)


def chat_rates_seen(store: Store, since_ts: float, until_ts: float | None = None) -> list[float]:
    """The usual chat rates (answers a second) the control loop recorded from `since_ts` to
    `until_ts`, one per stored decision that has one (the gateway counted chat)."""
    rows = store.rows(
        "SELECT json_extract(inputs, '$.chat_usual_per_s') AS r FROM control_actions "
        "WHERE ts >= ? AND ts < ? AND json_extract(inputs, '$.chat_usual_per_s') IS NOT NULL",
        (since_ts, until_ts if until_ts is not None else float("inf")),
    )
    return [float(r["r"]) for r in rows]


def probes_without_load(store: Store, since_ts: float) -> int:
    """Warm successful probes since `since_ts` that carry no batch in-flight count (sent
    without the control loop): why a map can be empty."""
    rows = store.rows(
        "SELECT COUNT(*) AS n FROM probes WHERE ts >= ? AND ok = 1 AND cold = 0 "
        "AND batch_inflight IS NULL",
        (since_ts,),
    )
    return int(rows[0]["n"]) if rows else 0
