"""Learned thresholds: the temperature each card was first seen to raise SwThermalSlowdown at.

Read at start-up by the daemon (llm_watchdog.nvml.thresholds.SlowdownLearner is seeded with
them) and written once per card, the first time it throttles for heat.
"""

from __future__ import annotations

from llm_watchdog.store.db import Store


def learned_thresholds(store: Store) -> dict[str, float]:
    """UUID -> temperature in °C, for every card learned so far."""
    rows = store.rows("SELECT gpu_uuid, temp_c FROM learned_thresholds")
    return {str(r["gpu_uuid"]): float(r["temp_c"]) for r in rows}


def save_learned_threshold(
    store: Store, uuid: str, temp_c: float, ts: float, gpu_index: int | None = None
) -> None:
    """Keep the first one: a card seen again keeps the temperature it first throttled at."""
    store.execute(
        "INSERT OR IGNORE INTO learned_thresholds (gpu_uuid, temp_c, ts, gpu_index) "
        "VALUES (?, ?, ?, ?)",
        (uuid, temp_c, ts, gpu_index),
    )
