"""The controllers ours is measured against: a static allowance, AIMD, and Gradient2.

Each takes the same `ControlInput` and returns the same `ControlAction` as
`llm_watchdog.control.law.AllowanceController`, so the daemon, `replay` and the heat lab can run any
of them. They are baselines: faithful to how they are used elsewhere, not tuned here.

- `StaticController(n)`: always n.
- `AimdController`: what batch gateways do: halve the allowance when an interval saw a
  violation (its chat p95 over T, or a failed canary), else add 1, at most once per interval.
- `Gradient2Controller`: a port of Netflix concurrency-limits' `Gradient2Limit`
  (concurrency-limits-core/src/main/java/com/netflix/concurrency/limits/limit/
  Gradient2Limit.java) behind its `WindowedLimit` with the default average sample window
  (WindowedLimit.java, AverageSampleWindow). Per window of at least `window_size` samples:

      shortRtt = mean RTT of the window            (SingleMeasurement)
      longRtt  = EMA over `long_window` windows    (ExpAvgMeasurement(600, 10): plain mean
                                                    for the first 10, then 2/(n+1))
      if longRtt / shortRtt > 2: longRtt *= 0.9    (recover after a long overload)
      if inflight < limit / 2: keep the limit      ("app limited")
      gradient = max(0.5, min(1.0, longRtt / shortRtt))
      newLimit = limit·gradient + queueSize
      newLimit = limit·(1 − smoothing) + newLimit·smoothing
      limit    = clamp(newLimit, minLimit, maxConcurrency)

  The RTT it watches is the chat TTFT (the latency we protect; the limited class is batch),
  and in-flight is the batch job's. Defaults as in the Java builder: smoothing 0.2,
  longWindow 600, queueSize 4; minLimit and maxConcurrency are the floor and the ceiling
  (the Java defaults 20/200 are for RPC servers, not a GPU that runs a few dozen sequences).
  The limit is a double inside and an int outside, as in the Java code.
"""

from __future__ import annotations

from llm_watchdog.control.law import ControlAction, ControlConfig, ControlInput
from llm_watchdog.stats import quantile


class StaticController:
    """A fixed allowance."""

    def __init__(self, allowance: int) -> None:
        if allowance < 0:
            raise ValueError(f"a static allowance must be ≥ 0, got {allowance}")
        self.allowance = allowance

    def step(self, inp: ControlInput) -> ControlAction:
        before = self.allowance if inp.allowance is None else inp.allowance
        kind = "hold" if before == self.allowance else "cut"
        if self.allowance > before:
            kind = "grow"
        return ControlAction(
            inp.now_s, before, self.allowance, f"static {self.allowance}", {}, None, kind
        )


class AimdController:
    """Halve on a violating interval, +1 on a clean one, within [floor, ceiling]."""

    def __init__(self, config: ControlConfig) -> None:
        self.config = config
        self.allowance = config.default_allowance

    def step(self, inp: ControlInput) -> ControlAction:
        c = self.config
        before = self.allowance if inp.allowance is None else inp.allowance
        level = min(max(before, c.floor), c.ceiling)
        samples = list(inp.chat_ttfts_ms)
        est = quantile(samples, 0.95) if samples else None
        if inp.failed_canaries or (est is not None and est > c.target_p95_ms):
            kind, after = "halve", max(c.floor, level // 2)
            why = "violation" if not inp.failed_canaries else "canary failed"
        elif est is None:
            kind, after, why = "hold", level, "no samples"
        else:
            kind, after, why = "grow", min(c.ceiling, level + 1), "no violation"
        if after == level and kind != "hold":
            kind = "hold"
        self.allowance = after
        return ControlAction(
            inp.now_s,
            before,
            after,
            f"aimd {kind} {before} → {after}: {why}",
            {"samples": len(samples)},
            est,
            kind,
        )


class ExpAvg:
    """ExpAvgMeasurement: a plain mean for `warmup` samples, then EMA with 2/(window+1)."""

    def __init__(self, window: int, warmup: int) -> None:
        self.window = window
        self.warmup = warmup
        self.value = 0.0
        self.total = 0.0
        self.count = 0

    def add(self, sample: float) -> float:
        if self.count < self.warmup:
            self.count += 1
            self.total += sample
            self.value = self.total / self.count
        else:
            factor = 2.0 / (self.window + 1)
            self.value = self.value * (1 - factor) + sample * factor
        return self.value


class Gradient2Controller:
    """Netflix concurrency-limits' Gradient2Limit behind a WindowedLimit (see module doc)."""

    def __init__(
        self,
        config: ControlConfig,
        *,
        queue_size: float = 4.0,
        smoothing: float = 0.2,
        long_window: int = 600,
        window_size: int = 10,
    ) -> None:
        self.config = config
        self.estimated_limit = float(config.default_allowance)
        self.queue_size = queue_size
        self.smoothing = smoothing
        self.long_rtt = ExpAvg(long_window, 10)
        self.window_size = window_size
        self._window: list[float] = []
        self._max_inflight = 0

    def _update(self, rtt: float, inflight: int) -> None:
        """Gradient2Limit._update, one window's average RTT and max in-flight."""
        c = self.config
        short_rtt = rtt
        long_rtt = self.long_rtt.add(rtt)
        if long_rtt / short_rtt > 2:
            self.long_rtt.value *= 0.9
        if inflight < self.estimated_limit / 2:
            return
        gradient = max(0.5, min(1.0, long_rtt / short_rtt))
        new_limit = self.estimated_limit * gradient + self.queue_size
        new_limit = self.estimated_limit * (1 - self.smoothing) + new_limit * self.smoothing
        self.estimated_limit = max(float(c.floor), min(float(c.ceiling), new_limit))

    def step(self, inp: ControlInput) -> ControlAction:
        before = int(self.estimated_limit) if inp.allowance is None else inp.allowance
        # A failed request has no RTT to give; the Java limiter passes didDrop, which
        # Gradient2 ignores. Failed canaries are ignored here the same way.
        self._window.extend(v for v in inp.chat_ttfts_ms if v > 0.1)  # minRttThreshold 100 µs
        inflight = inp.batch_inflight if inp.batch_inflight is not None else before
        self._max_inflight = max(self._max_inflight, inflight)
        rtt = None
        if len(self._window) >= self.window_size:
            rtt = sum(self._window) / len(self._window)
            self._update(rtt, self._max_inflight)
            self._window, self._max_inflight = [], 0
        after = int(self.estimated_limit)
        kind = "hold" if after == before else ("grow" if after > before else "cut")
        return ControlAction(
            inp.now_s,
            before,
            after,
            f"gradient2 {kind} {before} → {after}",
            {"window_rtt_ms": rtt, "long_rtt_ms": self.long_rtt.value},
            None,
            kind,
        )
