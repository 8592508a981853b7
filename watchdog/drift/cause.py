"""Why chat slowed: heat, the power cap, batch load, or unknown, with the evidence behind it.

Read from the last few minutes of observations (`cause_window`), against the baseline:

- thermal / power: throttle reason bits set in most recent samples, or the SM clock at least
  10 % under the baseline clock. Bits come late on a slow heat soak: GPU Boost lowers the
  clock bin by bin as the die warms long before SwThermalSlowdown is raised, so falling
  clocks with a rising (or already high) temperature are called thermal without any bit.
- load: more batch requests in flight than at baseline while clocks hold steady; then it is
  the batch sharing the GPU, not the GPU slowing down.
- unknown: none of those. Said plainly rather than guessed.

Heat and batch load usually arrive together. Then the rise in log TTFT is split
(`split_causes`): the part the clock explains is e·ln(f_baseline/f), with the elasticity e of
log TTFT to 1/clock measured from this card's own history (`ClockElasticity`; prefill is
compute bound, so e is near the engine's clock-bound share), and the rest is the part batch
in flight explains. Both are named with shares, and the larger one is the cause.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any

from llm_watchdog import stats
from llm_watchdog.drift.baseline import busy_clock
from llm_watchdog.drift.values import Baseline, DriftConfig, Observation
from llm_watchdog.nvml import throttle

# NVML's own spelling, for text a person reads next to `nvidia-smi -q -d PERFORMANCE`.
REASON_LABELS = {
    throttle.SW_THERMAL_SLOWDOWN: "SwThermalSlowdown",
    throttle.HW_THERMAL_SLOWDOWN: "HwThermalSlowdown",
    throttle.HW_SLOWDOWN: "HwSlowdown",
    throttle.SW_POWER_CAP: "SwPowerCap",
    throttle.HW_POWER_BRAKE_SLOWDOWN: "HwPowerBrakeSlowdown",
}
# A temperature within this many degrees of the slowdown threshold counts as "hot" even when
# it has stopped rising: a throttled GPU sits on its threshold with a slope near zero.
HOT_MARGIN_C = 5.0
# Power within this share of the enforced limit counts as "at the cap" (NVML's power reading
# averages over ~1 s and hovers just under the limit when capped).
AT_CAP_SHARE = 0.95
# A clock drop smaller than `clock_drop_cause` still names the cause when it explains at least
# this share of the TTFT rise in log terms, and is more than clock-bin jitter (15 MHz bins).
EXPLAINED_SHARE = 0.5
MIN_EXPLAINING_DROP = 0.03
# Elasticity of log TTFT to ln(f_baseline/f): the prior (prefill time ∝ 1/clock) and its
# weight, as if PRIOR_PROBES probes at a 5 % clock drop had shown it; bounds on the estimate.
ELASTICITY_PRIOR = 1.0
PRIOR_PROBES = 20.0
ELASTICITY_BOUNDS = (0.2, 1.5)
LEARN_BELOW_RATIO = 0.9
# A part smaller than this share of the rise is not named beside the other.
MINOR_SHARE = 0.15
# The clock's part of a mixed rise is judged on the latest few probes: the clock a throttle
# has just pulled down, not the median of a window that began before it fell.
NOW_PROBES = 3


class ClockElasticity:
    """How much log TTFT rises per unit of ln(f_baseline/f) on this card, from its history.

    A least-squares slope through the origin over warm probes taken with batch in flight at
    its baseline level (so load does not pose as clock), pulled towards the prior 1.0 by
    PRIOR_PROBES pseudo-probes: a card that never throttled yet keeps the textbook value.
    """

    def __init__(self) -> None:
        self._sxx = PRIOR_PROBES * 0.05**2
        self._sxy = self._sxx * ELASTICITY_PRIOR
        self.n = 0

    def add(self, log_ttft_rise: float, clock_ratio: float) -> None:
        # Only real clock drops teach it: a few bins of jitter come and go with the batch's own
        # prefills (SwPowerCap while they run), so they would credit load to the clock.
        if not 0.1 < clock_ratio <= LEARN_BELOW_RATIO:
            return
        x = math.log(1.0 / clock_ratio)
        self._sxx += x * x
        self._sxy += x * log_ttft_rise
        self.n += 1

    @property
    def value(self) -> float:
        lo, hi = ELASTICITY_BOUNDS
        return stats.clip(self._sxy / self._sxx, lo, hi)


def split_causes(ev: dict[str, Any], elasticity: float, load_up: bool) -> dict[str, float] | None:
    """Shares of the log TTFT rise: {"clock": c, "load": l}, summing to 1; None without a rise.

    The clock part is elasticity·ln(1/clock ratio), at most the whole rise; batch load takes
    the rest when more batch is in flight than at baseline, else the rest is left unnamed and
    the clock's share is of the explained part only.
    """
    # Both parts on the latest probes: a window's median lags a rise still under way.
    ratio, ttft_ratio = ev.get("sm_clock_ratio_now"), ev.get("ttft_ratio_now")
    if ratio is None:
        ratio = ev.get("sm_clock_ratio")
    if ttft_ratio is None:
        ttft_ratio = ev.get("ttft_ratio")
    if ttft_ratio is None or ttft_ratio <= 1.0:
        return None
    total = math.log(ttft_ratio)
    clock = 0.0
    if ratio is not None and ratio < 1.0:
        clock = min(total, elasticity * math.log(1.0 / ratio))
    load = total - clock if load_up else 0.0
    if clock + load <= 0.0:
        return None
    return {"clock": clock / (clock + load), "load": load / (clock + load)}


def load_is_up(ev: dict[str, Any], config: DriftConfig) -> bool:
    inflight, base_inflight = ev["batch_inflight"], ev["baseline_batch_inflight"]
    return inflight is not None and inflight >= max(
        (base_inflight or 0.0) * config.load_inflight_ratio, (base_inflight or 0.0) + 1.0
    )


def _median(values: Sequence[float]) -> float | None:
    return stats.median(values) if values else None


class TelemetryWindow:
    """The last `size` observations' GPU state, and how long each throttle bit has been on."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._obs: deque[Observation] = deque(maxlen=size)
        self._since: dict[int, float] = {}  # bit -> ts it came on (continuously on since)
        self.last: Observation | None = None

    def add(self, obs: Observation) -> None:
        self._obs.append(obs)
        self.last = obs
        mask = obs.throttle_reasons
        if mask is None:  # no telemetry this time: neither on nor off
            return
        for bit in REASON_LABELS:
            if mask & bit:
                self._since.setdefault(bit, obs.ts)
            else:
                self._since.pop(bit, None)

    def recent(self, n: int) -> list[Observation]:
        """The latest `n` observations, oldest first."""
        return list(self._obs)[-n:]

    def bits_on_for_s(self, now: float) -> dict[int, float]:
        """Throttle bits on right now -> seconds they have been on without a break."""
        return {bit: now - since for bit, since in self._since.items()}

    def clock_ratio(self, baseline: Baseline | None, last_n: int | None = None) -> float | None:
        """Median busy SM clock of the last `last_n` observations over the baseline clock."""
        obs = self.recent(last_n) if last_n else list(self._obs)
        ref = baseline.sm_clock_mhz if baseline else None
        if ref is None:  # baseline taken at idle clocks only: compare to the boost maximum
            ref = _median([o.sm_clock_max_mhz for o in obs if o.sm_clock_max_mhz])
        clocks = [c for c in (busy_clock(o) for o in obs) if c is not None]
        if not ref or not clocks:
            return None
        return stats.median(clocks) / ref

    def evidence(
        self,
        baseline: Baseline | None,
        *,
        now: float,
        temp_slope_c_per_min: float | None,
        temp_slowdown_c: float | None,
        last_n: int | None = None,
        temp_threshold: str | None = None,
        hw_slowdown_c: float | None = None,
    ) -> dict[str, Any]:
        """Figures behind a cause, over the last `last_n` observations (all when None).

        The monitor passes the observations since the detector's estimate of the shift's
        onset (at least a few): bits that came on with the shift are then "most" samples even
        when the alarm follows the shift within a few probes.
        """
        obs = self.recent(last_n) if last_n else list(self._obs)
        with_bits = [o.throttle_reasons for o in obs if o.throttle_reasons is not None]
        n_bits = len(with_bits)
        thermal = sum(1 for m in with_bits if throttle.is_thermal(m))
        power = sum(1 for m in with_bits if throttle.is_power(m))
        last = self.last
        temp = last.gpu_temp_c if last else None
        eta = None
        if temp is not None and temp_slowdown_c is not None:
            if temp >= temp_slowdown_c:
                eta = 0.0
            elif temp_slope_c_per_min and temp_slope_c_per_min > 0:
                eta = (temp_slowdown_c - temp) / temp_slope_c_per_min * 60.0
        ratio = self.clock_ratio(baseline, last_n)
        warm = [o.ttft_ms for o in obs if o.usable_ttft and not o.cold and o.ttft_ms]
        ttft_ratio = (
            stats.median(warm) / baseline.ttft_p50_ms if warm and baseline is not None else None
        )
        warm_now = [o.ttft_ms for o in self.recent(NOW_PROBES) if o.usable_ttft and not o.cold]
        ttft_ratio_now = (
            stats.median([t for t in warm_now if t]) / baseline.ttft_p50_ms
            if warm_now and baseline is not None
            else None
        )
        inflight = [o.batch_inflight for o in obs if o.batch_inflight is not None]
        powers = [o.power_w for o in obs if o.power_w is not None]
        return {
            "window_probes": len(obs),
            "ttft_ratio": ttft_ratio,
            "ttft_ratio_now": ttft_ratio_now,
            "thermal_bits_share": thermal / n_bits if n_bits else None,
            "power_bits_share": power / n_bits if n_bits else None,
            "reasons_on_s": {
                throttle.REASON_NAMES[bit]: round(s, 1)
                for bit, s in sorted(self.bits_on_for_s(now).items())
            },
            "sm_clock_mhz": _median([c for c in (busy_clock(o) for o in obs) if c is not None]),
            "sm_clock_max_mhz": last.sm_clock_max_mhz if last else None,
            "baseline_sm_clock_mhz": baseline.sm_clock_mhz if baseline else None,
            "sm_clock_ratio": ratio,
            "sm_clock_ratio_now": self.clock_ratio(baseline, NOW_PROBES),
            "gpu_temp_c": temp,
            "baseline_temp_c": baseline.temp_c if baseline else None,
            # Where the clocks start to fall, and which threshold that is (thresholds.SOURCES).
            "temp_slowdown_c": temp_slowdown_c,
            "temp_threshold": temp_threshold,
            "temp_hw_slowdown_c": hw_slowdown_c,
            "temp_slope_c_per_min": temp_slope_c_per_min,
            "time_to_slowdown_s": eta,
            "batch_inflight": _median(inflight),
            "baseline_batch_inflight": baseline.batch_inflight if baseline else None,
            "batch_allowance": last.batch_allowance if last else None,
            "power_w": _median(powers),
            "power_limit_w": last.power_limit_w if last else None,
            # The newest reading, for a message that says how the GPU is now.
            "gpu_index": last.gpu_index if last else None,
            "sm_clock_now_mhz": busy_clock(last) if last else None,
            "reasons_now": throttle.reason_names(last.throttle_reasons)
            if last and last.throttle_reasons is not None
            else None,
        }


def attribute(ev: dict[str, Any], config: DriftConfig) -> str:
    """The cause named by an evidence dict from `TelemetryWindow.evidence`."""
    thermal_share = ev["thermal_bits_share"] or 0.0
    power_share = ev["power_bits_share"] or 0.0
    bits = max(thermal_share, power_share) >= config.bits_share_cause
    ratio, ttft_ratio = ev["sm_clock_ratio"], ev["ttft_ratio"]
    clock_down = ratio is not None and (
        ratio <= 1.0 - config.clock_drop_cause
        # Or a smaller drop that accounts for most of the TTFT rise (prefill time scales
        # with 1/clock): an early alarm on a ramp sees the clock part-way down.
        or (
            ratio <= 1.0 - MIN_EXPLAINING_DROP
            and ttft_ratio is not None
            and ttft_ratio > 1.0
            and math.log(1.0 / ratio) >= EXPLAINED_SHARE * math.log(ttft_ratio)
        )
    )
    temp, slope, slowdown = ev["gpu_temp_c"], ev["temp_slope_c_per_min"], ev["temp_slowdown_c"]
    base_temp = ev["baseline_temp_c"]
    hot = temp is not None and (
        (slope is not None and slope >= config.temp_rising_c_per_min)
        or (slowdown is not None and temp >= slowdown - HOT_MARGIN_C)
        or (base_temp is not None and temp >= base_temp + 2 * HOT_MARGIN_C)
    )
    power_w, limit_w = ev["power_w"], ev["power_limit_w"]
    at_cap = power_w is not None and bool(limit_w) and power_w >= AT_CAP_SHARE * limit_w
    load_up = load_is_up(ev, config)
    # The clock may have fallen only in the last few probes of a window that began with the
    # load (the CUSUM's onset): the newest clocks count too.
    now = ev.get("sm_clock_ratio_now")
    clock_down = clock_down or (now is not None and now <= 1.0 - config.clock_drop_cause)
    if clock_down or bits:
        if bits:
            clock_cause = "thermal" if thermal_share >= power_share else "power"
        elif hot:
            clock_cause = "thermal"
        elif at_cap:
            clock_cause = "power"
        else:
            clock_cause = "unknown"
        if load_up:  # both at once: the part that explains more of the rise names the cause
            split = ev.get("clock_load_split")
            if split is not None:
                return "load" if split["load"] > split["clock"] else clock_cause
            if not clock_down:
                return "load"
        return clock_cause
    if load_up:
        return "load"
    return "unknown"


def name_shares(ev: dict[str, Any], cause: str) -> dict[str, float] | None:
    """The split of `ev["clock_load_split"]` under the names a person reads.

    The clock part is named for what slowed the clock (thermal or power); None when one part
    alone explains the rise (the other under MINOR_SHARE) or nothing could be split.
    """
    split = ev.get("clock_load_split")
    if not split:
        return None
    clock_name = cause if cause in ("thermal", "power") else None
    if clock_name is None:
        thermal_share = ev["thermal_bits_share"] or 0.0
        power_share = ev["power_bits_share"] or 0.0
        clock_name = "power" if power_share > thermal_share else "thermal"
    shares = {clock_name: split["clock"], "load": split["load"]}
    if min(shares.values()) < MINOR_SHARE:
        return None
    return shares


def longest_reason(ev: dict[str, Any], cause: str) -> tuple[str, float] | None:
    """The NVML label and duration of the longest-running throttle bit matching `cause`."""
    mask = throttle.THERMAL_MASK if cause == "thermal" else throttle.POWER_MASK
    best: tuple[str, float] | None = None
    names = {throttle.REASON_NAMES[b]: b for b in REASON_LABELS}
    for name, seconds in ev.get("reasons_on_s", {}).items():
        bit = names.get(name)
        if bit is not None and bit & mask and (best is None or seconds > best[1]):
            best = (REASON_LABELS[bit], seconds)
    return best
