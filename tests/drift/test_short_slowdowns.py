"""How long a slowdown must last before the defaults open a latency event (docs/drift.md,
"What is flagged, and how soon"): a step is flagged within 15 probes, a burst of three
(30 s at the default 10 s interval) is not, however large."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llm_watchdog.drift import Baseline, DriftConfig, DriftMonitor, Observation
from llm_watchdog.drift.detector import ALARM, RECENT_PROBES, LatencyDetector

T0 = 1_700_000_000.0
BASE_MS, SIGMA_LOG, RHO = 800.0, 0.2, 0.3
BASELINE_PROBES, BEFORE = 300, 60  # the default baseline, then quiet probes before the shift
SEEDS = range(20)


def noise(rng: np.random.Generator, n: int) -> np.ndarray:
    """The benchmarks' canary noise: AR(1) with Student-t(4) innovations, 1 % spikes x2-x5."""
    innov = rng.standard_t(4, n) / math.sqrt(2) * SIGMA_LOG * math.sqrt(1 - RHO * RHO)
    out, prev = np.empty(n), 0.0
    for i, e in enumerate(innov.tolist()):
        prev = RHO * prev + e
        out[i] = prev
    hit = rng.random(n) < 0.01
    out[hit] += np.log(rng.uniform(2, 5, int(hit.sum())))
    return out


def probes_to_event(seed: int, ratio: float, lasting: int | None = None) -> int | None:
    """Probes from the first slow one to the latency event, at the defaults (None: no event
    within 60 probes of the shift's start)."""
    n = BASELINE_PROBES + BEFORE + 60
    ys = noise(np.random.default_rng(seed), n)
    monitor = DriftMonitor(DriftConfig())
    start = BASELINE_PROBES + BEFORE
    for i, y in enumerate(ys.tolist()):
        slow = i >= start and (lasting is None or i < start + lasting)
        ttft_ms = BASE_MS * math.exp(y) * (ratio if slow else 1.0)
        events = monitor.observe(Observation(ts=T0 + 10.0 * i, ttft_ms=ttft_ms))
        if any(e.kind == "latency" and e.change == "opened" for e in events):
            assert i >= start, f"seed {seed}: a latency event before the shift"
            return i - start + 1
    return None


@pytest.mark.parametrize("ratio", [2.0, 5.0])
def test_a_sustained_slowdown_is_flagged_within_15_probes(ratio: float) -> None:
    delays = [probes_to_event(seed, ratio) for seed in SEEDS]
    assert None not in delays
    found = sorted(d for d in delays if d is not None)
    # Each probe past the clip adds the same to the CUSUM, so x5 is no faster than x2.
    assert found[len(found) // 2] <= 10 and found[-1] <= 15, found


def test_a_thirty_second_burst_is_not_flagged_however_large() -> None:
    # Three probes at x20 (an 800 ms chat at 16 s): the median of the last 20 never moves.
    assert [probes_to_event(seed, 20.0, lasting=3) for seed in SEEDS] == [None] * len(SEEDS)


def test_on_a_steady_engine_the_median_gate_needs_half_the_last_20_probes() -> None:
    # Probes at exactly the baseline's median, then x5: the CUSUM is past its threshold
    # after a few probes, and the event waits until the median of the last RECENT_PROBES
    # is slow, i.e. until 10 of them are.
    base = Baseline(
        fingerprint_id="fp",
        n=300,
        ttft_p50_ms=BASE_MS,
        ttft_p95_ms=BASE_MS * 1.4,
        log_mu=math.log(BASE_MS),
        log_sigma=SIGMA_LOG,
        temp_c=None,
        sm_clock_mhz=None,
        batch_allowance=None,
        batch_inflight=None,
        created_ts=T0,
        source="capture",
        z_var=0.97,
    )
    det = LatencyDetector(base, DriftConfig())
    for _ in range(RECENT_PROBES):
        assert det.update(BASE_MS) is None
    results = [det.update(5 * BASE_MS) for _ in range(RECENT_PROBES)]
    assert results.index(ALARM) + 1 == RECENT_PROBES // 2
    # A burst one probe shorter opens nothing, however long the quiet after it.
    det = LatencyDetector(base, DriftConfig())
    burst = [BASE_MS] * RECENT_PROBES + [5 * BASE_MS] * 9 + [BASE_MS] * 100
    assert ALARM not in [det.update(t) for t in burst]
