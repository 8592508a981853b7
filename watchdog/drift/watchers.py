"""The quality gate and the failed-probe watch: rates over a window, not single outcomes.

One wrong answer from a small model is noise (docs/probe.md: 37/40 passes with the nonce
before the question); a rise of the failure rate that the baseline rate cannot explain is an
event.
"""

from __future__ import annotations

from collections import deque

from llm_watchdog import stats
from llm_watchdog.drift.values import DriftConfig

OPEN = "open"
CLOSE = "close"
# A window this unremarkable under the baseline rate ends a quality event.
QUALITY_CLOSE_P = 0.05
QUALITY_FLOOR_RATE = 0.005  # a model that never failed in baseline is not held to 0 %


class QualityWatch:
    """Expectation failures over the last `quality_window` judged answers.

    The baseline failure rate is learned (with a prior of `quality_prior_rate`, weight
    `quality_prior_weight`) until `freeze` is called when the latency baseline is set. An event
    opens when the window's failures are improbable under that rate (binomial tail below
    `quality_alpha`) and the rate is at least `quality_min_rise` above it.
    """

    def __init__(self, config: DriftConfig) -> None:
        self.config = config
        self.window: deque[bool] = deque(maxlen=config.quality_window)  # True = failed
        self.is_open = False
        self.flips = 0  # single failures after a pass: noted, not events
        self.last_flip_ts: float | None = None
        self._fails = 0
        self._judged = 0
        self._frozen: float | None = None

    @property
    def base_rate(self) -> float:
        if self._frozen is not None:
            return self._frozen
        cfg = self.config
        w = cfg.quality_prior_weight
        return (self._fails + cfg.quality_prior_rate * w) / (self._judged + w)

    def freeze(self, rate: float | None = None) -> None:
        """Stop learning; use `rate` (from a stored baseline) or what was learned so far."""
        self._frozen = max(QUALITY_FLOOR_RATE, self.base_rate if rate is None else rate)

    @property
    def failures(self) -> int:
        return sum(self.window)

    def update(self, ts: float, passed: bool) -> str | None:
        failed = not passed
        if failed and (not self.window or not self.window[-1]):
            self.flips += 1
            self.last_flip_ts = ts
        self.window.append(failed)
        if self._frozen is None and not self.is_open:
            self._judged += 1
            self._fails += failed
        n = len(self.window)
        if n < self.config.quality_window // 2:
            return None
        x = self.failures
        p0 = max(QUALITY_FLOOR_RATE, self.base_rate)
        tail = stats.binom_sf(x, n, p0)
        rise = x / n - p0
        if not self.is_open:
            if x >= 2 and tail < self.config.quality_alpha and rise >= self.config.quality_min_rise:
                self.is_open = True
                return OPEN
            return None
        if tail >= QUALITY_CLOSE_P or rise < 0.5 * self.config.quality_min_rise:
            self.is_open = False
            return CLOSE
        return None


class FailureWatch:
    """A burst of failed probes (errors, timeouts, no TTFT) is an event of its own.

    Failed probes never feed the latency detector: a dead server is not a slow one, and
    counting failures as slow probes would turn every restart into a "latency shift".
    """

    def __init__(self, config: DriftConfig) -> None:
        self.config = config
        self.window: deque[bool] = deque(maxlen=config.fail_window)  # True = failed
        self.consecutive_fail = 0
        self.consecutive_ok = 0
        self.total_failures = 0
        self.is_open = False

    @property
    def failures(self) -> int:
        return sum(self.window)

    def update(self, ok: bool) -> str | None:
        cfg = self.config
        self.window.append(not ok)
        if ok:
            self.consecutive_ok += 1
            self.consecutive_fail = 0
        else:
            self.consecutive_fail += 1
            self.consecutive_ok = 0
            self.total_failures += 1
        if not self.is_open:
            if (
                self.consecutive_fail >= cfg.fail_open_consecutive
                or self.failures >= cfg.fail_open_in_window
            ):
                self.is_open = True
                return OPEN
            return None
        if self.consecutive_ok >= cfg.fail_close_consecutive:
            self.is_open = False
            return CLOSE
        return None
