"""Fakes and values that tests in several packages build the same way.

    from tests.helpers.builders import DRIFT_EVENT_KEYS, FakeClock, probe_result

The fixtures built on them (`clock`, `db_path`, `store`, `db`) are in tests/conftest.py.
"""

from __future__ import annotations

from typing import Any

from llm_watchdog.models import ProbeResult

T0 = 1_700_000_000.0  # a plausible wall time, 2023-11-14T22:13:20Z


class FakeClock:
    """Injected time: the test moves `now`, the code under test only calls the clock."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def probe_result(ts: float = T0, **fields: Any) -> ProbeResult:
    """A successful cache-busted probe (100 ms to the first token, 300 ms in all, a right
    answer); `fields` override any of its values."""
    values: dict[str, Any] = {
        "ts": ts,
        "prompt_id": "capital",
        "probe_set": "default",
        "url": "http://127.0.0.1:8000/v1",
        "model": "m",
        "ok": True,
        "cache_mode": "bust",
        "cache_bust": "system_nonce",
        "ttft_ms": 100.0,
        "total_ms": 300.0,
        "quality_pass": True,
    }
    values.update(fields)
    return ProbeResult(**values)


# The keys of a drift event's JSON (`replay --json`, DriftEvent.to_json), in order: the replay
# contract. Written out here, not taken from the package, so that a change to it fails a test.
DRIFT_EVENT_KEYS = (
    "start_ts",
    "end_ts",
    "kind",
    "cause",
    "baseline_p95_ms",
    "peak_p95_ms",
    "evidence",
)
