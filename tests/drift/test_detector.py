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


def first_alarm(
    det: LatencyDetector, probes: int, ttft_ms: float = DOUBLED_MS, **kw: bool
) -> int | None:
    """The probe (from 1) at which `ttft_ms`, fed over and over, first alarms."""
    for i in range(probes):
        if det.update(ttft_ms, **kw) == ALARM:
            return i + 1
    return None


def test_a_doubled_median_with_the_clock_under_the_design_shift_alarms_within_a_window():
    # The CUSUM gains ~0.02 a probe here: the tail was already at the clip.
    assert first_alarm(LatencyDetector(HEAVY_TAIL, DriftConfig()), 60, assisted=True) is None
    det = LatencyDetector(HEAVY_TAIL, DriftConfig())
    assert first_alarm(det, 60, assisted=True, clock_explains=True) == RECENT_PROBES
    assert det.in_event


def test_the_median_rule_needs_the_shift_not_only_the_clock():
    det = LatencyDetector(HEAVY_TAIL, DriftConfig())
    usual = [30.0, 48.0, 52.0, 45.0, 240.0]  # the baseline's own mix, tail included
    for i in range(200):
        assert det.update(usual[i % len(usual)], assisted=True, clock_explains=True) != ALARM


# A fast engine's canaries: median 13 ms, 5 % noise.
FAST = Baseline(
    fingerprint_id="f",
    n=300,
    ttft_p50_ms=13.0,
    ttft_p95_ms=14.2,
    log_mu=2.5649,
    log_sigma=0.05,
    temp_c=60.0,
    sm_clock_mhz=1900.0,
    batch_allowance=4.0,
    batch_inflight=2.0,
    created_ts=0.0,
    source="auto",
    z_mean=0.0,
    z_var=1.0,
    z_lag1=0.1,
)


def test_a_few_milliseconds_on_a_fast_engine_raise_no_alarm_however_large_the_ratio():
    # 13 -> 16 ms is x1.23 and 3 ms: the CUSUM is sure within a minute; no reader would be.
    assert first_alarm(LatencyDetector(FAST, DriftConfig()), 500, 16.0) is None
    # Without the floor the same trace alarms, so the floor is what holds it back.
    assert first_alarm(LatencyDetector(FAST, DriftConfig(min_rise_ms=0.0)), 500, 16.0) is not None


def test_a_rise_past_the_floor_alarms_at_once_from_the_evidence_already_summed():
    det = LatencyDetector(FAST, DriftConfig())
    assert first_alarm(det, 100, 16.0) is None
    # 13 -> 40 ms: the CUSUM already stands at h, so the alarm waits only for the median
    # of the last RECENT_PROBES to clear 33 ms (half of them).
    at = first_alarm(det, 100, 40.0)
    assert at is not None and at <= RECENT_PROBES // 2 + 1
    assert det.in_event
