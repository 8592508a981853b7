"""classify_cold: which probes measure a load or a fresh process rather than steady chat."""

from __future__ import annotations

import pytest

from llm_watchdog.drift import classify_cold

T = 1_700_000_000.0


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"previous_ts": None}, "first_probe"),
        (
            {"previous_ts": T - 10, "fingerprint_id": "b", "previous_fingerprint_id": "a"},
            "engine_changed",
        ),
        ({"previous_ts": T - 10, "engine_pid": 42, "previous_engine_pid": 41}, "engine_restarted"),
        ({"previous_ts": T - 10, "load_duration_ms": 2500.0}, "model_loaded"),
        ({"previous_ts": T - 301}, "idle"),
    ],
)
def test_cold_reasons(kwargs: dict[str, object], reason: str) -> None:
    verdict = classify_cold(ts=T, **kwargs)  # type: ignore[arg-type]
    assert verdict.cold and bool(verdict) and verdict.reason == reason


@pytest.mark.parametrize(
    "kwargs",
    [
        {"previous_ts": T - 10},
        {"previous_ts": T - 10, "fingerprint_id": "a", "previous_fingerprint_id": "a"},
        {"previous_ts": T - 10, "engine_pid": 41, "previous_engine_pid": 41},
        {"previous_ts": T - 10, "load_duration_ms": 3.0},  # Ollama's warm answer: a few ms
        {"previous_ts": T - 299},
        {"previous_ts": T - 10, "engine_pid": 41, "previous_engine_pid": None},  # pid unknown
    ],
)
def test_warm_probes(kwargs: dict[str, object]) -> None:
    verdict = classify_cold(ts=T, **kwargs)  # type: ignore[arg-type]
    assert not verdict and verdict.reason is None


def test_idle_limit_is_configurable() -> None:
    assert classify_cold(ts=T, previous_ts=T - 120, idle_after_s=60).reason == "idle"
    assert not classify_cold(ts=T, previous_ts=T - 120, idle_after_s=600)
