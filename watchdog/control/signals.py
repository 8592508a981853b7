"""The estimates the allowance law runs on: p95 of chat TTFT, arrival rates, surges.

Pure: samples and times in, numbers out; see watchdog/control/law.py for how they are used.
"""

from __future__ import annotations

import math
from collections import deque

from llm_watchdog.stats import Ewma

Z95 = 1.6448536269514722  # Φ⁻¹(0.95): the 95th percentile of a normal, in standard deviations


class LogEwma:
    """EWMA of the mean and variance of ln x; p95 = exp(μ̂ + 1.645 σ̂) (log-normal TTFT).

    `llm_watchdog.stats.Ewma` does the update; the weight of a sample is max(α, 1/n), so the
    first samples make an ordinary mean instead of the first one being remembered far too
    long.
    """

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        self._ewma = Ewma(alpha)

    @property
    def n(self) -> int:
        return self._ewma.n

    def add(self, x_ms: float) -> None:
        self._ewma.alpha = max(self.alpha, 1.0 / (self._ewma.n + 1))
        self._ewma.update(math.log(max(x_ms, 1e-3)))

    def p95_ms(self) -> float | None:
        e = self._ewma
        if e.mean is None:
            return None
        return math.exp(e.mean + Z95 * math.sqrt(e.var))


class RateEwma:
    """Events per second, an EWMA in time with time constant `tau_s`.

    Until `tau_s` seconds have been seen it is the plain mean rate so far, so a first
    interval that happened to be quiet (or busy) does not stand for the usual rate.
    """

    def __init__(self, tau_s: float) -> None:
        self.tau_s = tau_s
        self.rate: float | None = None
        self.seen_s = 0.0
        self.count = 0

    def add(self, count: int, dt_s: float) -> None:
        if dt_s <= 0:
            return
        self.seen_s += dt_s
        self.count += count
        if self.seen_s <= self.tau_s or self.rate is None:
            self.rate = self.count / self.seen_s
            return
        w = 1.0 - math.exp(-dt_s / self.tau_s)
        self.rate += w * (count / dt_s - self.rate)


class SurgeDetector:
    """Is chat arriving much faster than usual right now?

    Arrivals over the last `window_s` seconds are compared with what the usual rate (an
    EWMA over `slow_s`) predicts. A surge must be large (`ratio` × the usual), unlikely to
    be chance (a Poisson count `z` standard deviations over its mean: z = 3 is about one
    window in 700), and not tiny (`min_count`). It ends when the ratio falls under halfway
    between 1 and `ratio` (for `confirm` calls in a row). The usual rate keeps learning
    during a surge, so a surge much longer than `slow_s` becomes the new usual; none is
    called before `warmup_s` of history. With `level_minutes`, the usual rate is at least the
    median of the last that many one-minute rates: a step up that holds for over half of them
    is the usual from then on, where the EWMA would take tens of minutes.
    """

    def __init__(
        self,
        *,
        ratio: float,
        window_s: float,
        slow_s: float,
        z: float,
        min_count: int,
        warmup_s: float,
        confirm: int = 1,
        level_minutes: int = 0,
        keep_minutes: int = 0,
    ) -> None:
        self.ratio = ratio
        self.window_s = window_s
        self.z = z
        self.min_count = min_count
        self.warmup_s = warmup_s
        self.usual = RateEwma(slow_s)
        self.recent: deque[tuple[float, int, float]] = deque()  # (now_s, count, dt_s)
        self.confirm = confirm  # calls in a row that must see it before it is a surge
        self.streak = 0
        # Ending takes as many calls in a row as starting: one thin count in a burst's
        # 10-s window does not split it into two surges.
        self.low_streak = 0
        self.surging = False
        self.last_ratio = 0.0
        self.level_minutes = level_minutes
        self.minutes: deque[float] = deque(maxlen=max(level_minutes, keep_minutes, 1))
        self.last_count = 0  # arrivals in the last window_s, and the span they cover
        self.last_span = 0.0
        self.minute_count = 0
        self.minute_s = 0.0

    def level(self, minutes: int | None = None) -> float | None:
        """The median of the last `minutes` (`level_minutes`) one-minute rates; None until
        that many."""
        k = self.level_minutes if minutes is None else minutes
        if k <= 0 or len(self.minutes) < k:
            return None
        last = list(self.minutes)[-k:]
        return sorted(last)[k // 2]

    def _beyond(self, n: int, expected: float) -> bool:
        """Is `n` arrivals a surge by size and by odds over `expected`?"""
        return n >= self.ratio * expected and n >= expected + self.z * math.sqrt(expected)

    def surge_over(self, rate: float) -> bool:
        """Would the last window's arrivals be a surge over `rate` (arrivals a second)?"""
        return self._beyond(self.last_count, rate * self.last_span)

    def add(self, now_s: float, count: int, dt_s: float) -> bool:
        """Count the arrivals of the last `dt_s` seconds; True while a surge lasts."""
        if dt_s <= 0:
            return self.surging
        self.recent.append((now_s, count, dt_s))
        while self.recent and self.recent[0][0] <= now_s - self.window_s:
            self.recent.popleft()
        n = sum(k for _, k, _ in self.recent)
        span = sum(d for _, _, d in self.recent)
        self.last_count, self.last_span = n, span
        usual = self.usual.rate
        level = self.level()
        if level is not None and usual is not None:
            # A rate that stepped up and has held for most of the last minutes is the usual
            # now; the EWMA takes tens of minutes to follow it, and every chance cluster over
            # its lagging rate would read as a surge (team-arrives-long-outputs: 23 sheds). A
            # burst that fills under half of the minutes leaves the median where it was.
            usual = max(usual, level)
        expected = (usual or 0.0) * span
        self.usual.add(count, dt_s)
        self.minute_count += count
        self.minute_s += dt_s
        if self.minute_s >= 60.0:
            self.minutes.append(self.minute_count / self.minute_s)
            self.minute_count, self.minute_s = 0, 0.0
        self.last_ratio = n / expected if expected > 0 else 0.0
        if self.usual.seen_s < self.warmup_s or expected <= 0:
            self.surging = False
            return False
        big = self._beyond(n, expected) and n >= self.min_count
        self.streak = self.streak + 1 if big else 0
        low = self.last_ratio < 0.5 * (1.0 + self.ratio)
        self.low_streak = self.low_streak + 1 if low else 0
        if self.streak >= self.confirm:
            self.surging = True
        elif self.surging and self.low_streak >= self.confirm:
            self.surging = False
        return self.surging
