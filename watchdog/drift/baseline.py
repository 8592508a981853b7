"""Baselines: what chat TTFT and the GPU looked like when things were normal.

One function builds a Baseline from observations (`baseline_from_observations`); the monitor's
automatic learning and `llm-watchdog baseline capture` both go through it, so a captured
baseline and a learned one mean the same thing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from llm_watchdog import stats
from llm_watchdog.drift.values import Baseline, DriftConfig, Observation
from llm_watchdog.nvml import throttle


def is_warm_ok(obs: Observation) -> bool:
    """A successful, warm probe with a TTFT: the only kind that speaks for steady state."""
    return obs.usable_ttft and not obs.cold


def is_clean(obs: Observation) -> bool:
    """Warm, ok, and no heat bit set.

    The power cap does not keep a probe out: a card running its batch job touches the cap
    whenever a prefill runs, and the canaries that land on one are part of its normal. A
    baseline without them is the idle card's, and the detector then reads the usual load as
    a slowdown (the demo fired "cause unknown" at 70 °C that way, p95 249 ms against 57).
    """
    return is_warm_ok(obs) and not throttle.is_thermal(obs.throttle_reasons)


def _median_or_none(values: Sequence[float | None]) -> float | None:
    xs = [v for v in values if v is not None and math.isfinite(v)]
    return stats.median(xs) if xs else None


def busy_clock(obs: Observation) -> float | None:
    """The SM clock when it says something about speed: not while the GPU idles (GpuIdle bit),
    when the clock drops to its idle floor whatever the temperature."""
    if obs.sm_clock_mhz is None or throttle.is_idle(obs.throttle_reasons):
        return None
    return obs.sm_clock_mhz


def baseline_from_observations(
    observations: Sequence[Observation],
    *,
    fingerprint_id: str,
    created_ts: float,
    source: str = "capture",
    config: DriftConfig | None = None,
) -> Baseline:
    """A Baseline from warm, successful probes (the others are ignored), in time order.

    ValueError when fewer than 20 usable probes remain: too few for a median and a MAD that
    mean anything.
    """
    cfg = config or DriftConfig()
    warm = [o for o in observations if is_warm_ok(o)]
    if len(warm) < 20:
        raise ValueError(
            f"only {len(warm)} warm successful probes to build a baseline from; need at least 20"
        )
    clean = [o for o in warm if is_clean(o)]
    throttled = len(clean) < 20
    use = warm if throttled else clean
    ttfts = [o.ttft_ms for o in use if o.ttft_ms is not None]
    logs = [math.log(t) for t in ttfts]
    mu = stats.median(logs)
    sigma = max(stats.robust_sigma(logs), cfg.min_log_sigma)
    c = cfg.clip_z
    z = [stats.clip((y - mu) / sigma, -c, c) for y in logs]
    judged = [o.quality_pass for o in warm if o.quality_pass is not None]
    return Baseline(
        fingerprint_id=fingerprint_id,
        n=len(ttfts),
        ttft_p50_ms=stats.quantile(ttfts, 0.5),
        ttft_p95_ms=stats.quantile(ttfts, 0.95),
        log_mu=mu,
        log_sigma=sigma,
        temp_c=_median_or_none([o.gpu_temp_c for o in use]),
        sm_clock_mhz=_median_or_none([busy_clock(o) for o in use]),
        batch_allowance=_median_or_none([o.batch_allowance for o in use]),
        batch_inflight=_median_or_none([o.batch_inflight for o in use]),
        created_ts=created_ts,
        source=source,
        z_mean=stats.mean(z),
        z_var=max(stats.variance(z), 1e-6),
        # Negative lag-1 correlation would lower the threshold; treat it as none.
        z_lag1=stats.clip(stats.lag1_autocorr(z), 0.0, cfg.max_lag1),
        quality_fail_rate=(judged.count(False) / len(judged)) if len(judged) >= 10 else None,
        throttled=throttled,
    )


class BaselineLearner:
    """Collects warm probes until a baseline can be learned.

    Clean probes (no heat bit) are preferred; when `baseline_max_wait` warm probes have come
    and fewer than `baseline_n` of them were clean, the baseline is learned from the last
    `baseline_n` warm probes and marked `throttled`, rather than never.
    """

    def __init__(self, config: DriftConfig, fingerprint_id: str) -> None:
        self.config = config
        self.fingerprint_id = fingerprint_id
        self._clean: list[Observation] = []
        self._warm: list[Observation] = []

    @property
    def progress(self) -> tuple[int, int]:
        """(clean probes so far, probes needed)."""
        return len(self._clean), self.config.baseline_n

    def add(self, obs: Observation) -> Baseline | None:
        """Feed one observation; returns the Baseline once there is enough, else None."""
        if not is_warm_ok(obs):
            return None
        self._warm.append(obs)
        if is_clean(obs):
            self._clean.append(obs)
        n = self.config.baseline_n
        if len(self._clean) >= n:
            chosen = self._clean
        elif len(self._warm) >= self.config.baseline_max_wait:
            chosen = self._warm[-n:]
        else:
            return None
        return baseline_from_observations(
            chosen,
            fingerprint_id=self.fingerprint_id,
            created_ts=obs.ts,
            source="auto",
            config=self.config,
        )
