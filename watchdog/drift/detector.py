"""The latency detector: a robust, self-calibrating CUSUM on log TTFT, with an end rule.

Input per warm, successful probe: y = ln(TTFT ms). Against a Baseline (median mu0 and
1.4826 x MAD sigma0 of y):

    z = clip((y - mu0) / sigma0, -c, c)          c = 3: one spike moves S by at most ~c
    u = (z - z_mean) / s                          s = sqrt(z_var (1 + rho) / (1 - rho))
    S = max(0, S + u - k_alarm)                   alarm when S >= h

Where this departs from the textbook CUSUM, and why:

- `s` is the *long-run* standard deviation of z, from the baseline's own variance and lag-1
  autocorrelation rho (plus one standard error, 1/sqrt(n)). TTFT noise is autocorrelated
  (batch load comes and goes over minutes); a CUSUM sums increments, and the variance of a sum
  of AR(1) terms is (1+rho)/(1-rho) times that of independent ones. Ignoring it multiplies
  false alarms (the benchmark shows how much).
- k is half the shift the detector is designed for (`shift_ratio`, 1.3 = +30 %), expressed in
  the same units after clipping (`stats.clipped_normal_mean`). A CUSUM with k = delta/2 is
  the fastest detector of a shift delta at a given false-alarm rate (Lorden 1971, Moustakides
  1986).
- k_alarm adds one standard error of the baseline median (1.25 / sqrt(n) in these units): a
  baseline taken from n probes is itself uncertain, and the false-alarm rate grows roughly as
  exp(2 h e) with an offset e of the reference.
- h is solved from the target in-control run length (`arl0_probes`) with Siegmund's
  approximation (`stats.cusum_threshold`) instead of a fixed table value, so it follows k.
- An alarm also needs the recent median TTFT (the last RECENT_PROBES) at least
  `min_rise_ms` over the baseline's median: on a 13 ms engine a rise to 15 ms is a real
  shift to the CUSUM and no slowdown anyone reading chat can see. S waits at h meanwhile.
- When the GPU's SM clock is already well under its baseline clock (telemetry says the GPU
  got slower), the alarm threshold is `assist_h_factor` x h: prefill is compute bound, so a
  slower clock makes a TTFT rise the expected outcome, not a surprise to be doubted. The same
  factor applies to the end threshold once the event's cause has cleared in telemetry (clocks
  back, throttle bits off, batch in flight back to baseline).

End rule: while an event is open, D = max(0, D + k_end - u) sums evidence that the level is
back below the midpoint between baseline and the event's level, and the event ends at
D >= h_end, with h_end solved from `end_arl_probes` for that k_end. k_end is half the event's
level, bounded:
- at most 1.5 k, the level taken as the median u since the alarm (up to 60 probes): a x1.5
  shift ends in about half the time a x1.3 one needs, and clipping makes higher levels noisy;
- at least k once the running median of the last 20 u has reached the design shift, so an
  event at x1.3 is never held to a lower midpoint by a noisy median;
- below that, at least k/3: an alarm raised early on a ramp (at x1.1 on its way to x1.5; the
  telemetry assist allows that) must not end while the ramp still climbs.
Each probe adds at most h_end / 3 to D, so no single fast probe ends an event. Recovery ends
an event in about h_end / k_end probes. Siegmund's formula is optimistic for the small h_end
and correlated noise here, hence the large `end_arl_probes`.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from functools import lru_cache

from llm_watchdog import stats
from llm_watchdog.drift.values import Baseline, DriftConfig

ALARM = "alarm"
END = "end"
# The running median behind "has the event reached the design shift" (and the seed of the
# event's level at the alarm), and the window of the event's level.
RECENT_PROBES = 20
LEVEL_PROBES = 60
K_END_MAX = 1.5  # times k
END_AGREE = 3  # probes that must agree before an event ends


@lru_cache(maxsize=512)
def _end_threshold(arl: float, k_end_rounded: float) -> float:
    return stats.cusum_threshold(arl, k_end_rounded)


@dataclass(frozen=True)
class Calibration:
    """The detector's constants for one baseline (all in standardised log units)."""

    mu: float
    sigma: float
    clip: float
    z_mean: float
    scale: float  # long-run standard deviation of the clipped z
    k: float  # half the design shift, in units of `scale`
    k_alarm: float  # k plus the baseline-uncertainty margin
    h: float
    h_end: float


def calibrate(baseline: Baseline, config: DriftConfig) -> Calibration:
    sigma = max(baseline.log_sigma, config.min_log_sigma)
    c = config.clip_z
    # One standard error (1/sqrt(n)) added to the estimated autocorrelation, for the same
    # reason as the margin on k: an underestimate lowers the threshold below what the noise
    # needs, and that is where the benchmark's false alarms come from.
    n = max(baseline.n, 1)
    rho = stats.clip(baseline.z_lag1 + config.margin_se / math.sqrt(n), 0.0, config.max_lag1)
    scale = math.sqrt(max(baseline.z_var, 1e-6) * (1.0 + rho) / (1.0 - rho))
    shift = math.log(config.shift_ratio) / sigma
    gain = stats.clipped_normal_mean(shift, c) - stats.clipped_normal_mean(0.0, c)
    k = 0.5 * gain / scale
    k_alarm = k + config.margin_se * 1.25 / math.sqrt(n)
    return Calibration(
        mu=baseline.log_mu,
        sigma=sigma,
        clip=c,
        z_mean=baseline.z_mean,
        scale=scale,
        k=k,
        k_alarm=k_alarm,
        h=stats.cusum_threshold(config.arl0_probes, k_alarm),
        h_end=stats.cusum_threshold(config.end_arl_probes, k),
    )


class LatencyDetector:
    """Sequential test for a sustained rise of TTFT above a baseline, and for its end."""

    def __init__(self, baseline: Baseline, config: DriftConfig) -> None:
        self.cal = calibrate(baseline, config)
        self.assist_h_factor = config.assist_h_factor
        self.end_arl = config.end_arl_probes
        self.s = 0.0  # evidence of a rise (CUSUM up)
        self.d = 0.0  # evidence of recovery, while an event is open
        self.in_event = False
        self.last_u: float | None = None
        self.k_end = self.cal.k
        self.h_end = self.cal.h_end
        self.reached = False  # the event's running median has reached the design shift
        self._recent_u: deque[float] = deque(maxlen=RECENT_PROBES)
        self._recent_y: deque[float] = deque(maxlen=RECENT_PROBES)
        self.shift_log = math.log(config.shift_ratio)
        self.min_rise_ms = config.min_rise_ms
        self._event_u: deque[float] = deque(maxlen=LEVEL_PROBES)

    def standardise(self, ttft_ms: float) -> float:
        """u for one TTFT: clipped, centred, in long-run standard deviations."""
        cal = self.cal
        z = stats.clip((math.log(ttft_ms) - cal.mu) / cal.sigma, -cal.clip, cal.clip)
        return (z - cal.z_mean) / cal.scale

    def threshold(self, assisted: bool) -> float:
        return self.cal.h * (self.assist_h_factor if assisted else 1.0)

    def update(
        self,
        ttft_ms: float,
        *,
        assisted: bool = False,
        cause_gone: bool = False,
        clock_explains: bool = False,
    ) -> str | None:
        """Feed one warm, successful TTFT; returns ALARM, END or None.

        `assisted`: telemetry says the GPU got slower (alarm at a lower threshold).
        `cause_gone`: the event's cause has cleared in telemetry (end at a lower threshold).
        `clock_explains`: the busy clock has fallen by at least the design shift (to under
        1 / shift_ratio of the baseline's): then the median of the last RECENT_PROBES alone,
        that far over the baseline's, is an alarm.
        """
        cal = self.cal
        u = self.standardise(ttft_ms)
        self.last_u = u
        self._recent_u.append(u)
        self._recent_y.append(math.log(ttft_ms))
        # Capped at h: while an event is open S only says "still high", and a huge S would
        # otherwise make the next event after this one start with a head start.
        self.s = min(max(0.0, self.s + u - cal.k_alarm), cal.h)
        if not self.in_event:
            shifted = self.s >= self.threshold(assisted) or (
                clock_explains and self._median_shifted()
            )
            if shifted and self._rise_ms() >= self.min_rise_ms:
                self.s = max(self.s, cal.h)
                self.in_event = True
                self.d = 0.0
                self._event_u.clear()
                self._event_u.extend(list(self._recent_u)[-10:])
                return ALARM
            return None
        self._event_u.append(u)
        if not self.reached and stats.median(self._recent_u) >= 2.0 * cal.k:
            self.reached = True
        floor = cal.k if self.reached else cal.k / 3.0
        half_level = 0.5 * stats.median(self._event_u)
        self.k_end = round(min(K_END_MAX * cal.k, max(half_level, floor)), 2)
        self.h_end = _end_threshold(self.end_arl, self.k_end)
        # One very fast probe (the clip allows u down to -c/s) could otherwise end an event
        # alone; each probe may bring at most a third of the way, so three must agree.
        self.d = max(0.0, self.d + min(self.k_end - u, self.h_end / END_AGREE))
        if self.d >= self.h_end * (self.assist_h_factor if cause_gone else 1.0):
            self.close()
            return END
        return None

    def _median_shifted(self) -> bool:
        """The last RECENT_PROBES' median is the design shift over the baseline's. With a
        heavy-tailed baseline (canaries behind a batch job's prefill chunks: p95 five times
        the median) the clipped CUSUM gains little from a doubled median, since the tail
        was already at the clip; the median does not saturate."""
        if len(self._recent_y) < RECENT_PROBES:
            return False
        return stats.median(self._recent_y) - self.cal.mu >= self.shift_log

    def _rise_ms(self) -> float:
        """How far the recent median TTFT stands over the baseline's, in ms (RECENT_PROBES,
        or as many as there are since the detector started)."""
        if not self._recent_y:
            return 0.0
        return math.exp(stats.median(self._recent_y)) - math.exp(self.cal.mu)

    def close(self) -> None:
        """Forget an open event without evidence of its end (the baseline was replaced)."""
        self.in_event = False
        self.s = 0.0
        self.d = 0.0
        self.k_end = self.cal.k
        self.h_end = self.cal.h_end
        self.reached = False
