"""The latency detector on a heavy-tailed baseline: a doubled median with the clocks down."""

from __future__ import annotations

from llm_watchdog.drift.detector import ALARM, RECENT_PROBES, LatencyDetector
from llm_watchdog.drift.values import Baseline, DriftConfig

# The demo's canaries behind a batch job's 512-token prefill chunks, as one run learned them:
# median 48 ms, p95 241 ms; the clipped z's mean 0.80 and variance 2.59.
HEAVY_TAIL = Baseline(
    fingerprint_id="f",
    n=50,
    ttft_p50_ms=47.8,
    ttft_p95_ms=241.4,
    log_mu=3.8665,
    log_sigma=0.435,
    temp_c=63.5,
    sm_clock_mhz=1875.0,
    batch_allowance=4.0,
    batch_inflight=4.0,
    created_ts=0.0,
    source="auto",
    z_mean=0.80,
    z_var=2.59,
    z_lag1=0.24,
)
DOUBLED_MS = 96.0


def first_alarm(det: LatencyDetector, probes: int, **kw: bool) -> int | None:
    for i in range(probes):
        if det.update(DOUBLED_MS, assisted=True, **kw) == ALARM:
            return i + 1
    return None


def test_a_doubled_median_with_the_clock_under_the_design_shift_alarms_within_a_window():
    # The CUSUM gains ~0.02 a probe here: the tail was already at the clip.
    assert first_alarm(LatencyDetector(HEAVY_TAIL, DriftConfig()), 60) is None
    det = LatencyDetector(HEAVY_TAIL, DriftConfig())
    assert first_alarm(det, 60, clock_explains=True) == RECENT_PROBES
    assert det.in_event


def test_the_median_rule_needs_the_shift_not_only_the_clock():
    det = LatencyDetector(HEAVY_TAIL, DriftConfig())
    usual = [30.0, 48.0, 52.0, 45.0, 240.0]  # the baseline's own mix, tail included
    for i in range(200):
        assert det.update(usual[i % len(usual)], assisted=True, clock_explains=True) != ALARM
