"""Values of the drift layer: what goes in (Observation), what it learns (Baseline), what comes
out (DriftEvent), and how it is tuned (DriftConfig). Frozen, units in the names, no I/O."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from llm_watchdog.models import GpuSample, ProbeResult

KINDS = ("latency", "quality", "heat_warning", "cold_start_slow", "probes_failing")
# Raised by DriftMonitor.set_fingerprint when the runtime changed under a baseline.
BASELINE_INVALIDATED = "baseline_invalidated"
CAUSES = ("thermal", "power", "load", "unknown")
# How a snapshot relates to its event: first seen, changed, ended, or begun and ended at once
# (a slow cold start, a baseline invalidated). Alerts fire on opened/instant, resolve on closed.
CHANGES = ("opened", "updated", "closed", "instant")


@dataclass(frozen=True)
class Observation:
    """One canary probe with the GPU state beside it: a row of the replay trace.

    Field for field the columns of the replay CSV contract (README.md), with the GPU's
    thresholds (reported once per GPU rather than per sample): `temp_target_c` is where its
    clocks start to fall (the lowest of NVML's target, GPU_MAX and SLOWDOWN, or the learned
    one; `temp_threshold` says which), `temp_slowdown_c` is NVML's SLOWDOWN.
    """

    ts: float  # UTC unix seconds
    ttft_ms: float | None = None  # None when the probe failed
    ok: bool = True
    cold: bool = False
    quality_pass: bool | None = None  # None: the answer was not judged
    gpu_temp_c: float | None = None
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    throttle_reasons: int | None = None  # NVML clocks-event reasons bitmask
    batch_inflight: float | None = None
    batch_allowance: float | None = None
    temp_slowdown_c: float | None = None
    temp_target_c: float | None = None
    temp_threshold: str | None = None  # llm_watchdog.nvml.thresholds.SOURCES; None: inferred
    gpu_index: int | None = None  # the GPU the telemetry is from (the worst serving one)
    # A failed probe that got no first token within the first-token timeout: how long it
    # waited. Its TTFT was longer than this (a lower bound the latency detector takes).
    ttft_over_ms: float | None = None

    @property
    def usable_ttft(self) -> bool:
        """A successful probe with a TTFT worth judging (not failed, not missing, positive)."""
        return self.ok and self.ttft_ms is not None and self.ttft_ms > 0.0


def observation_from(
    probe: ProbeResult,
    gpu: GpuSample | None = None,
    *,
    cold: bool | None = None,
    batch_inflight: float | None = None,
    batch_allowance: float | None = None,
    temp_slowdown_c: float | None = None,
    temp_target_c: float | None = None,
    temp_threshold: str | None = None,
) -> Observation:
    """The daemon's bridge: a probe result and the latest GPU sample as one Observation.

    `cold` overrides `probe.cold` (the daemon decides with `classify_cold`).
    """
    g = gpu
    return Observation(
        ts=probe.ts,
        ttft_ms=probe.ttft_ms if probe.ok else None,
        ok=probe.ok,
        cold=probe.cold if cold is None else cold,
        quality_pass=probe.quality_pass,
        gpu_temp_c=g.temp_c if g else None,
        sm_clock_mhz=g.sm_clock_mhz if g else None,
        sm_clock_max_mhz=g.sm_clock_max_mhz if g else None,
        power_w=g.power_w if g else None,
        power_limit_w=g.power_limit_w if g else None,
        throttle_reasons=g.throttle_reasons if g else None,
        batch_inflight=batch_inflight,
        batch_allowance=batch_allowance,
        temp_slowdown_c=temp_slowdown_c
        if temp_slowdown_c is not None
        else (g.temp_slowdown_c if g else None),
        temp_target_c=temp_target_c
        if temp_target_c is not None
        else (g.temp_target_c if g else None),
        temp_threshold=temp_threshold,
        gpu_index=g.gpu_index if g else None,
        ttft_over_ms=ttft_over_ms(probe.ok, probe.error_class, probe.total_ms),
    )


def ttft_over_ms(ok: bool, error_class: str | None, total_ms: float | None) -> float | None:
    """What a first-token timeout says of the TTFT: longer than the wait (None otherwise).
    Takes a probe's fields, so a stored row is read without building a ProbeResult."""
    if ok or error_class != "first_token_timeout" or not total_ms:
        return None
    return total_ms


@dataclass(frozen=True)
class Baseline:
    """What normal looked like for one fingerprint: chat TTFT and the GPU state it was taken in.

    log_mu / log_sigma are the median and 1.4826 x MAD of ln(TTFT in ms). The z_* fields
    describe the detector's own input on the baseline samples (the clipped, standardised log
    TTFT): its mean, variance and lag-1 autocorrelation, so the alarm threshold is set for the
    noise this engine really has. A baseline stored without them gets conservative defaults.
    """

    fingerprint_id: str
    n: int
    ttft_p50_ms: float
    ttft_p95_ms: float
    log_mu: float
    log_sigma: float
    temp_c: float | None
    sm_clock_mhz: float | None
    batch_allowance: float | None
    batch_inflight: float | None
    created_ts: float
    source: str  # "auto" (learned by the monitor) or "capture" (`baseline capture`)
    z_mean: float = 0.0
    z_var: float = 1.0
    z_lag1: float = 0.3
    quality_fail_rate: float | None = None
    throttled: bool = False  # too few probes free of heat bits came in time: taken hot

    def __post_init__(self) -> None:
        if self.source not in ("auto", "capture"):
            raise ValueError(f"baseline source {self.source!r}: expected 'auto' or 'capture'")
        if self.n < 1 or not self.ttft_p50_ms > 0 or not self.log_sigma > 0:
            raise ValueError("a baseline needs n >= 1, ttft_p50_ms > 0 and log_sigma > 0")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Baseline:
        """From a stored row; unknown keys (a database id, say) are ignored."""
        names = {f.name for f in fields(cls)}
        kept = {k: v for k, v in d.items() if k in names}
        if "throttled" in kept:
            kept["throttled"] = bool(kept["throttled"])
        return cls(**kept)


def _clean(value: Any) -> Any:
    """JSON-safe: NaN and infinities become null, floats keep 4 decimals, dicts recurse."""
    if isinstance(value, float):
        return round(value, 4) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


@dataclass(frozen=True)
class DriftEvent:
    """One snapshot of a drift event. The same `id` is reported when the event opens, when its
    cause or peak changes, and when it closes (end_ts set)."""

    id: str  # "<kind>-<start in unix ms>": stable across snapshots and across restarts
    serial: int  # 1, 2, ... in the order this monitor opened its events
    kind: str
    change: str  # one of CHANGES
    start_ts: float
    end_ts: float | None
    cause: str
    baseline_p95_ms: float | None
    peak_p95_ms: float | None
    evidence: dict[str, Any] = field(default_factory=dict, hash=False)
    message: str = ""
    ts: float = 0.0  # the observation this snapshot was taken at

    @property
    def is_open(self) -> bool:
        return self.end_ts is None

    def contract_dict(self) -> dict[str, Any]:
        """Exactly the keys of the replay `--json` contract, in its order."""
        return {
            "start_ts": self.start_ts,
            "end_ts": self.end_ts,
            "kind": self.kind,
            "cause": self.cause,
            "baseline_p95_ms": _clean(self.baseline_p95_ms),
            "peak_p95_ms": _clean(self.peak_p95_ms),
            "evidence": _clean(self.evidence),
        }

    def to_json(self) -> str:
        """One line of `replay --json` output (no trailing newline)."""
        return json.dumps(self.contract_dict(), ensure_ascii=False, allow_nan=False)

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-safe: for the store, /status and the alerts bridge."""
        d = asdict(self)
        d["evidence"] = _clean(self.evidence)
        d["baseline_p95_ms"] = _clean(self.baseline_p95_ms)
        d["peak_p95_ms"] = _clean(self.peak_p95_ms)
        return d


@dataclass(frozen=True)
class DriftConfig:
    """Tuning of the drift monitor. Defaults are the benchmarked ones (tests/benchmarks)."""

    # Baseline. 300 warm probes at a 10 s interval is 50 minutes with no latency detection
    # after every start and every runtime change. Fewer makes the baseline's median wander
    # (standard error ~1.25 sigma/sqrt(n)), and a CUSUM's false-alarm rate grows roughly
    # exponentially with that offset; the detector adds one standard error as a margin, which
    # slows detection as n shrinks. More buys few false alarms for hours more without
    # detection (docs/drift.md has the figures).
    baseline_n: int = 300
    # Warm ok probes to wait for ones free of heat bits before learning from hot ones anyway
    # (a GPU that sits at its power cap under batch load would otherwise never get a baseline).
    baseline_max_wait: int = 900
    # Detector: the smallest TTFT ratio worth an alarm sets the CUSUM reference value.
    shift_ratio: float = 1.3
    # And the smallest rise in milliseconds: the recent median TTFT must stand this far over
    # the baseline's before an alarm. A 13 ms engine at 15 ms is a 1.15x shift to the CUSUM and
    # nothing to a reader of chat; at an 800 ms baseline 20 ms is 2.5 %, under any design shift.
    min_rise_ms: float = 20.0
    # Nominal in-control run length (~8 weeks at 10 s). Siegmund's formula is optimistic for
    # AR(1) noise, so the false-alarm rate is higher than nominal (docs/drift.md).
    arl0_probes: float = 500_000.0
    end_arl_probes: float = 20_000.0  # nominal run length to a false end at the design shift
    # Standard errors of the baseline's median and autocorrelation added to k and rho: a
    # baseline from n probes is itself uncertain, and errors on the wrong side cost alarms.
    margin_se: float = 1.0
    clip_z: float = 3.0  # standardised log TTFT clipped to +-clip_z: spikes move S by <= clip_z
    min_log_sigma: float = 0.03  # a 3 % floor: a noiseless engine must not make every ms "3 sigma"
    max_lag1: float = 0.8
    telemetry_assist: bool = True  # SM clock down >= assist_clock_drop: alarm at assist_h_factor h
    assist_clock_drop: float = 0.10
    # Low enough that a slower clock brings the alarm early, high enough that a clock throttle
    # that leaves TTFT alone (an engine not bound by the GPU) raises no alarm (docs/drift.md
    # tells how it was chosen).
    assist_h_factor: float = 0.6
    p95_window: int = 30  # recent warm probes (5 min) behind the "p95 TTFT" of an event
    # Cause.
    cause_window: int = 18  # recent observations (3 min at 10 s) the cause is read from
    bits_share_cause: float = 0.5
    clock_drop_cause: float = 0.10
    temp_rising_c_per_min: float = 0.2
    load_inflight_ratio: float = 1.5
    # Heat early warning.
    temp_slowdown_c: float | None = None  # used when the observations do not carry one
    heat_window_s: float = 300.0
    # The trend is also read over the last fraction of the window, and the steeper of the two
    # is used: a fan that stops shows within a minute, not after the window has filled.
    heat_recent_share: float = 0.25
    heat_min_span_s: float = 60.0  # readings spanning this long before any trend is trusted
    heat_horizon_s: float = 300.0  # warn when throttling is predicted within this time
    heat_min_slope_c_per_min: float = 0.3
    heat_near_c: float = 15.0  # and only within this many degrees of the threshold
    # Quality gate.
    quality_window: int = 30
    quality_alpha: float = 1e-4  # binomial tail probability that opens a quality event
    quality_min_rise: float = 0.10  # and the window's failure rate at least this above baseline
    quality_prior_rate: float = 0.05
    quality_prior_weight: float = 20.0
    # Failed probes.
    fail_window: int = 10
    fail_open_consecutive: int = 3
    fail_open_in_window: int = 5
    fail_close_consecutive: int = 5
    # Cold starts.
    cold_start_limit_ms: float = 20_000.0
    idle_after_s: float = 300.0  # Ollama's default keep_alive unloads a model after 5 min

    def __post_init__(self) -> None:
        checks = [
            (self.baseline_n >= 20, "baseline_n must be >= 20"),
            (self.baseline_max_wait >= self.baseline_n, "baseline_max_wait must be >= baseline_n"),
            (self.shift_ratio > 1.0, "shift_ratio must be > 1 (e.g. 1.3 for +30 %)"),
            (self.min_rise_ms >= 0, "min_rise_ms must be >= 0"),
            (self.arl0_probes > 10, "arl0_probes must be > 10"),
            (self.end_arl_probes > 10, "end_arl_probes must be > 10"),
            (self.clip_z > 0.5, "clip_z must be > 0.5"),
            (self.margin_se >= 0, "margin_se must be >= 0"),
            (self.min_log_sigma > 0, "min_log_sigma must be > 0"),
            (0.0 <= self.max_lag1 < 1.0, "max_lag1 must be in [0, 1)"),
            (0.0 < self.assist_h_factor <= 1.0, "assist_h_factor must be in (0, 1]"),
            (self.p95_window >= 5, "p95_window must be >= 5"),
            (self.cause_window >= 3, "cause_window must be >= 3"),
            (self.heat_horizon_s > 0, "heat_horizon_s must be > 0"),
            (self.quality_window >= 5, "quality_window must be >= 5"),
            (0.0 < self.quality_alpha < 0.5, "quality_alpha must be in (0, 0.5)"),
            (self.fail_window >= self.fail_open_in_window >= 1, "need fail_window >= open count"),
            (self.fail_open_consecutive >= 1, "fail_open_consecutive must be >= 1"),
            (self.fail_close_consecutive >= 1, "fail_close_consecutive must be >= 1"),
            (self.cold_start_limit_ms > 0, "cold_start_limit_ms must be > 0"),
            (self.idle_after_s > 0, "idle_after_s must be > 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"drift config: {message}")
