"""Heat early warning: how long until the GPU reaches the temperature its clocks fall at.

The threshold is where slowdown really begins (llm_watchdog.nvml.thresholds: the lowest of the
target temperature, GPU_MAX and SLOWDOWN, or the learned one). The trend is a least-squares
slope of temperature over the last `heat_window_s` (5 min), or over its last
`heat_recent_share` when that is steeper (a stopped fan shows within a minute), extrapolated to
the threshold. When throttling is predicted within `heat_horizon_s` and chat has not slowed
yet, that is a `heat_warning`: time to shed batch load before people notice.
"""

from __future__ import annotations

from llm_watchdog.drift.values import DriftConfig
from llm_watchdog.stats import WindowSlope

OPEN = "open"
CLOSE = "close"
# Consecutive clear readings before a warning ends: integer NVML temperatures flicker by 1 °C.
CLEAR_READINGS = 3
# Below the threshold by this much, and not heading back, counts as clear.
CLEAR_MARGIN_C = 2.0


class HeatWatch:
    def __init__(self, config: DriftConfig) -> None:
        self.config = config
        self._slope = WindowSlope(config.heat_window_s)
        self._recent = WindowSlope(config.heat_window_s * config.heat_recent_share)
        self.is_open = False
        self._clear = 0

    def add(self, ts: float, temp_c: float | None) -> None:
        if temp_c is not None:
            self._slope.add(ts, temp_c)
            self._recent.add(ts, temp_c)

    def slope_c_per_min(self) -> float | None:
        """Temperature trend in °C per minute, the steeper of the long and the recent window;
        None with under 5 readings or `heat_min_span_s` of them."""
        slopes = []
        for w in (self._slope, self._recent):
            min_span = min(self.config.heat_min_span_s, 0.8 * w.window_s)
            if len(w) >= 5 and w.span_s >= min_span:
                s = w.slope()
                if s is not None:
                    slopes.append(s * 60.0)
        return max(slopes) if slopes else None

    def eta_s(self, temp_c: float | None, slowdown_c: float | None) -> float | None:
        """Seconds until slowdown at the present trend: 0 when there, None when not heading."""
        if temp_c is None or slowdown_c is None:
            return None
        if temp_c >= slowdown_c:
            return 0.0
        slope = self.slope_c_per_min()
        if slope is None or slope < self.config.heat_min_slope_c_per_min:
            return None
        return (slowdown_c - temp_c) / slope * 60.0

    def update(
        self,
        temp_c: float | None,
        slowdown_c: float | None,
        *,
        chat_slowed: bool,
        slowed_by_heat: bool = False,
        throttled: bool = False,
    ) -> str | None:
        """OPEN, CLOSE or None for the latest reading.

        A warning opens only while chat has not slowed yet (after that, the latency event
        speaks), and does not end while chat is slowed by heat, even when the temperature has
        levelled off at the threshold: the warning came true, it did not go away.
        """
        cfg = self.config
        eta = self.eta_s(temp_c, slowdown_c)
        if not self.is_open:
            if (
                eta is not None
                and eta <= cfg.heat_horizon_s
                and temp_c is not None
                and slowdown_c is not None
                and temp_c >= slowdown_c - cfg.heat_near_c
                and not chat_slowed
            ):
                self.is_open = True
                self._clear = 0
                return OPEN
            return None
        # A card held at its threshold by a thermal slowdown sits a degree or two under it,
        # and the warning came true: it stays open while the bit is on.
        clear = (
            not slowed_by_heat
            and not throttled
            and temp_c is not None
            and slowdown_c is not None
            and temp_c <= slowdown_c - CLEAR_MARGIN_C
            and (eta is None or eta > 2.0 * cfg.heat_horizon_s)
        )
        self._clear = self._clear + 1 if clear else 0
        if self._clear >= CLEAR_READINGS:
            self.is_open = False
            self._clear = 0
            return CLOSE
        return None
