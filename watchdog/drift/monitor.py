"""DriftMonitor: one probe observation in, the drift events it opens, updates or closes out.

Pure and deterministic: time comes only from `Observation.ts`, nothing is read from a clock,
a socket or a database. The daemon, `replay` and the heat lab run this same class, so a
recorded trace replays to the same events the daemon raised.

Per observation, in this order: telemetry window and heat trend; failed-probe watch; cold
start check (cold probes stop here); baseline learning or the latency detector; quality gate;
heat early warning. Events come back in that order.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from llm_watchdog import stats
from llm_watchdog.drift import heat, messages, watchers
from llm_watchdog.drift.baseline import BaselineLearner, busy_clock
from llm_watchdog.drift.cause import (
    ClockElasticity,
    TelemetryWindow,
    attribute,
    load_is_up,
    name_shares,
    split_causes,
)
from llm_watchdog.drift.detector import ALARM, END, LatencyDetector
from llm_watchdog.drift.events import EventBook, snapshot
from llm_watchdog.drift.values import (
    BASELINE_INVALIDATED,
    Baseline,
    DriftConfig,
    DriftEvent,
    Observation,
)
from llm_watchdog.nvml import throttle
from llm_watchdog.nvml.thresholds import throttle_onset

# The cause of an open event changes only after the new one has held for this many
# consecutive probes, so one odd reading does not flip "thermal" to "load" and back.
CAUSE_CHANGE_PROBES = 3
# An open event is re-reported when its p95 has grown by this factor since last reported.
PEAK_REPORT_STEP = 1.1
# Busy SM clocks (the latest few) that decide whether telemetry assists the detector: fewer
# than the cause window so a step in clocks is seen within a few probes.
ASSIST_CLOCKS = 5
MIN_EVIDENCE_PROBES = 5
# Clocks within this share of the baseline clock count as recovered (two to three 15 MHz
# boost bins near 2 GHz).
RECOVERED_DROP = 0.02


@dataclass(frozen=True)
class MonitorState:
    """What the monitor knows right now, for `/status` and `llm-watchdog status`."""

    fingerprint_id: str
    baseline: Baseline | None
    learning: tuple[int, int]  # (clean probes so far, needed) while no baseline
    probes: int
    warm_probes: int
    cold_probes: int
    failed_probes: int
    recent_p95_ms: float | None
    detector: dict[str, float] | None
    temp_slope_c_per_min: float | None
    quality_window_failures: int
    quality_window_size: int
    quality_base_rate: float
    quality_flips: int
    open_events: list[DriftEvent] = field(default_factory=list)


class DriftMonitor:
    def __init__(
        self,
        config: DriftConfig | None = None,
        *,
        fingerprint_id: str = "unknown",
        baseline: Baseline | None = None,
    ) -> None:
        self.config = config or DriftConfig()
        self.fingerprint_id = fingerprint_id
        self._telemetry = TelemetryWindow(self.config.cause_window)
        self._heat = heat.HeatWatch(self.config)
        self._quality = watchers.QualityWatch(self.config)
        self._failures = watchers.FailureWatch(self.config)
        self._recent: deque[float] = deque(maxlen=self.config.p95_window)
        # Beside each entry of _recent: the wait of a canary that got no first token (its
        # TTFT was longer), None for a TTFT measured.
        self._waits: deque[float | None] = deque(maxlen=self.config.p95_window)
        self._book = EventBook()
        self._open = self._book.open  # kind -> the open event of that kind
        self._last_ts: float | None = None
        self._slowdown_c = self.config.temp_slowdown_c  # where clocks start to fall
        self._threshold: str | None = "slowdown" if self._slowdown_c is not None else None
        self._hw_slowdown_c = self.config.temp_slowdown_c
        self._elasticity = ClockElasticity()
        self._onset_ts: float | None = None  # last probe with the CUSUM at zero
        self._onset_n = 0  # observation count at that probe
        self._onset_judged = 0  # ... and the count of TTFTs judged (p95 window entries)
        self._recovery_judged = 0  # the count judged when an open event's recovery sum was 0
        self._counts = {"probes": 0, "warm": 0, "cold": 0, "failed": 0, "judged": 0}
        self._baseline: Baseline | None = None
        self._detector: LatencyDetector | None = None
        self._new_baseline: Baseline | None = None
        self._learner = BaselineLearner(self.config, fingerprint_id)
        if baseline is not None:
            self.load_baseline(baseline)

    # -- baseline -------------------------------------------------------------------------

    @property
    def baseline(self) -> Baseline | None:
        return self._baseline

    def pop_new_baseline(self) -> Baseline | None:
        """A baseline learned since the last call (for the daemon to store), once."""
        b, self._new_baseline = self._new_baseline, None
        return b

    def load_baseline(self, baseline: Baseline, ts: float | None = None) -> list[DriftEvent]:
        """Use an explicit baseline (captured, or stored by an earlier run) from now on.

        An open latency event was judged against the old one and is closed at `ts`.
        """
        events = self._close_latency(ts, "baseline replaced")
        self._baseline = baseline
        self._detector = LatencyDetector(baseline, self.config)
        self._quality.freeze(baseline.quality_fail_rate)
        return events

    def reset_baseline(self, ts: float) -> list[DriftEvent]:
        """Forget the baseline and learn a new one from the next warm probes."""
        events = self._close_latency(ts, "baseline reset")
        if "quality" in self._open:  # judged against the old runtime's failure rate
            self._open["quality"].evidence["ended_because"] = "baseline reset"
            events.append(self._book.close("quality", ts))
        self._baseline = None
        self._detector = None
        self._learner = BaselineLearner(self.config, self.fingerprint_id)
        self._quality = watchers.QualityWatch(self.config)
        return events

    def set_fingerprint(self, fingerprint_id: str, ts: float) -> list[DriftEvent]:
        """The runtime changed (model, engine, driver, launch command): re-baseline.

        Returns a `baseline_invalidated` instant event when there was a baseline to invalidate,
        after closing an open latency event: the old baseline no longer speaks for the new
        runtime, and mixing the two would be silent nonsense.
        """
        if fingerprint_id == self.fingerprint_id:
            return []
        old, had = self.fingerprint_id, self._baseline
        self.fingerprint_id = fingerprint_id
        events = self.reset_baseline(ts)
        if had is not None:
            events.append(
                self._book.instant(
                    BASELINE_INVALIDATED,
                    ts,
                    evidence={"old_fingerprint_id": old, "new_fingerprint_id": fingerprint_id},
                    message=f"Runtime changed: re-baselining ({old} -> {fingerprint_id})",
                    baseline_p95_ms=had.ttft_p95_ms,
                )
            )
        return events

    def adopt(self, event: DriftEvent, *, same_runtime: bool) -> bool:
        """Take over an open event left by an earlier run (of the daemon, over the same store);
        `same_runtime`: it was opened under this monitor's fingerprint.

        Kinds whose watcher can pick up where the earlier run stopped carry on under the same
        id, so one condition stays one event and resolves when it clears: failing probes and
        the heat warning (neither depends on the baseline; a running monitor keeps them open
        across a change of runtime too), and a quality event of the same runtime (judged
        against that runtime's failure rate). False for the rest (a latency event needs the
        detector's sums, which start over), for a kind already open here, and for an event
        already closed: the caller closes those.
        """
        if event.end_ts is not None or event.kind in self._open:
            return False
        if event.kind == "probes_failing":
            self._failures.is_open = True
        elif event.kind == "heat_warning":
            self._heat.is_open = True
        elif event.kind == "quality" and same_runtime:
            self._quality.is_open = True
        else:
            return False
        self._book.adopt(event)
        return True

    # -- the main step --------------------------------------------------------------------

    def observe(self, obs: Observation) -> list[DriftEvent]:
        """Take one probe observation; return the events it opened, updated or closed."""
        if self._last_ts is not None and obs.ts < self._last_ts:
            raise ValueError(
                f"observation at ts {obs.ts} is older than the previous one ({self._last_ts}); "
                "observations must come in time order"
            )
        self._last_ts = obs.ts
        self._counts["probes"] += 1
        self._take_thresholds(obs)
        self._telemetry.add(obs)
        self._heat.add(obs.ts, obs.gpu_temp_c)
        events: list[DriftEvent] = []

        ok = obs.usable_ttft
        if not ok:
            self._counts["failed"] += 1
        change = self._failures.update(ok)
        if change == watchers.OPEN:
            events.append(self._open_failing(obs))
        elif change == watchers.CLOSE:
            events.append(self._book.close("probes_failing", obs.ts))

        if obs.cold:
            self._counts["cold"] += 1
            if ok and obs.ttft_ms is not None and obs.ttft_ms > self.config.cold_start_limit_ms:
                events.append(self._cold_slow(obs))
            return events

        if ok and obs.ttft_ms is not None:
            self._counts["warm"] += 1
            self._judged(obs.ttft_ms, None)
            events.extend(self._latency(obs, obs.ttft_ms))
            self._learn_elasticity(obs, obs.ttft_ms)
        elif obs.ttft_over_ms and self._detector is not None:
            # No first token within the timeout: the TTFT was longer than the wait, and the
            # detector takes the wait. z is clipped at clip_z, so once the wait is that far over
            # the baseline the bound counts as the true TTFT would; nearer, it counts for less,
            # never more. Left out, the canaries that waited longest would be the ones unseen.
            self._judged(obs.ttft_over_ms, obs.ttft_over_ms)
            events.extend(self._latency(obs, obs.ttft_over_ms))

        if obs.ok and obs.quality_pass is not None:
            change = self._quality.update(obs.ts, obs.quality_pass)
            if change == watchers.OPEN:
                events.append(self._open_quality(obs))
            elif change == watchers.CLOSE:
                events.append(self._book.close("quality", obs.ts))

        latency = self._open.get("latency")
        change = self._heat.update(
            obs.gpu_temp_c,
            self._slowdown_c,
            chat_slowed=latency is not None,
            slowed_by_heat=latency is not None and latency.cause == "thermal",
            throttled=throttle.is_thermal(obs.throttle_reasons),
        )
        if change == heat.OPEN:
            events.append(self._open_heat(obs))
        elif change == heat.CLOSE:
            why = None
            if obs.gpu_temp_c is not None and self._slowdown_c is not None:
                why = f"{obs.gpu_temp_c:.0f} °C, under {self._slowdown_c:.0f} °C and not rising"
            events.append(self._book.close("heat_warning", obs.ts, why))
        return events

    def _judged(self, ttft_ms: float, waited_ms: float | None) -> None:
        """One TTFT, or the wait of a canary that got no first token, into the p95 window."""
        self._counts["judged"] += 1
        self._recent.append(ttft_ms)
        self._waits.append(waited_ms)

    def _waited_out(self, last_n: int) -> dict[str, Any]:
        """Of the last `last_n` judged: how many canaries got no first token, and the
        shortest such wait (for the message: a p95 at or over it is a lower bound)."""
        waits = [w for w in list(self._waits)[len(self._waits) - last_n :] if w is not None]
        return {"timed_out": len(waits), "timeout_ms": min(waits) if waits else None}

    def _take_thresholds(self, obs: Observation) -> None:
        """Where this observation's GPU starts to slow: the lower of its target and SLOWDOWN."""
        if obs.temp_slowdown_c is not None:
            self._hw_slowdown_c = obs.temp_slowdown_c
        onset = throttle_onset(
            target_c=obs.temp_target_c, gpu_max_c=None, slowdown_c=obs.temp_slowdown_c
        )
        if onset is None:
            return
        self._slowdown_c = onset.temp_c
        self._threshold = obs.temp_threshold if onset.source == "target" else onset.source
        self._threshold = self._threshold or onset.source

    def _learn_elasticity(self, obs: Observation, ttft_ms: float) -> None:
        """Feed the clock elasticity from probes with batch in flight at its baseline level."""
        b = self._baseline
        clock = busy_clock(obs)
        if b is None or not b.sm_clock_mhz or clock is None or ttft_ms <= 0:
            return
        base = b.batch_inflight or 0.0
        if obs.batch_inflight is not None and obs.batch_inflight > base + 0.5:
            return
        self._elasticity.add(math.log(ttft_ms) - b.log_mu, clock / b.sm_clock_mhz)

    # -- latency --------------------------------------------------------------------------

    def _latency(self, obs: Observation, ttft_ms: float) -> list[DriftEvent]:
        if self._detector is None:
            learned = self._learner.add(obs)
            if learned is not None:
                self._baseline = learned
                self._new_baseline = learned
                self._detector = LatencyDetector(learned, self.config)
                self._quality.freeze(None)
            return []
        det = self._detector
        rec = self._open.get("latency")
        clock = self._recent_clock()
        result = det.update(
            ttft_ms,
            assisted=_down(clock, self.config.assist_clock_drop),
            cause_gone=rec is not None and self._cause_gone(rec.cause),
            clock_explains=_down(clock, 1.0 - 1.0 / self.config.shift_ratio),
        )
        if det.s == 0.0 and not det.in_event:
            self._onset_ts = obs.ts
            self._onset_n = self._counts["probes"]
            self._onset_judged = self._counts["judged"]
        if det.in_event and det.d == 0.0:
            self._recovery_judged = self._counts["judged"]
        if result == ALARM:
            return [self._open_latency(obs)]
        if result == END:
            return self._close_latency(obs.ts, self._ended_by(rec, obs))
        if det.in_event:
            return self._update_latency(obs)
        return []

    def _clocks_down(self) -> bool:
        """Telemetry says the GPU got slower: the latest busy SM clocks well under baseline."""
        return _down(self._recent_clock(), self.config.assist_clock_drop)

    def _recent_clock(self) -> tuple[float, float] | None:
        """The latest busy SM clocks' median and the baseline's clock, where telemetry assist
        has both (None otherwise)."""
        if not self.config.telemetry_assist or self._baseline is None:
            return None
        ref = self._baseline.sm_clock_mhz
        if not ref:
            return None
        clocks = [c for c in (busy_clock(o) for o in self._telemetry.recent(ASSIST_CLOCKS)) if c]
        if len(clocks) < 3:
            return None
        return stats.median(clocks), ref

    def _base_p95(self) -> float | None:
        return self._baseline.ttft_p95_ms if self._baseline else None

    def _cause_gone(self, cause: str) -> bool:
        """Telemetry back to its baseline state for the event's cause (see detector)."""
        b = self._baseline
        recent = self._telemetry.recent(ASSIST_CLOCKS)
        if b is None or len(recent) < 3 or cause == "unknown":
            return False
        if cause == "load":
            inflight = [o.batch_inflight for o in recent if o.batch_inflight is not None]
            base = b.batch_inflight or 0.0
            return bool(inflight) and stats.median(inflight) <= max(1.25 * base, base + 0.5)
        if any(throttle.is_throttled(o.throttle_reasons) for o in recent):
            return False
        clocks = [c for c in (busy_clock(o) for o in recent) if c]
        ref = b.sm_clock_mhz
        if not clocks or not ref:
            return False
        return stats.median(clocks) >= (1.0 - RECOVERED_DROP) * ref

    def _p95(self) -> float | None:
        return stats.quantile(self._recent, 0.95) if self._recent else None

    def _p50(self) -> float | None:
        return stats.quantile(self._recent, 0.5) if self._recent else None

    def _since_onset(self) -> list[float]:
        """The warm TTFTs since the CUSUM last stood at zero (at least MIN_EVIDENCE_PROBES,
        at most the p95 window): what the alarm fired on. The whole window would mostly be
        probes from before the rise, and the opening line would then cite figures that show
        no slowdown (the demo: "median 44 ms vs 41 ms" where the probes since the clock fell
        ran at 55-100 ms)."""
        return self._judged_since(self._onset_judged)

    def _judged_since(self, mark: int) -> list[float]:
        """The warm TTFTs judged since the count stood at `mark`: at least
        MIN_EVIDENCE_PROBES, at most the p95 window."""
        since = self._counts["judged"] - mark
        n = min(max(since, MIN_EVIDENCE_PROBES), len(self._recent))
        return list(self._recent)[len(self._recent) - n :]

    def _evidence(self, obs: Observation) -> dict[str, Any]:
        # The observations since the CUSUM last stood at zero (its change-point estimate),
        # at least MIN_EVIDENCE_PROBES, at most the cause window.
        since = self._counts["probes"] - self._onset_n
        n = min(max(since, MIN_EVIDENCE_PROBES), self.config.cause_window)
        ev = self._telemetry.evidence(
            self._baseline,
            now=obs.ts,
            temp_slope_c_per_min=self._heat.slope_c_per_min(),
            temp_slowdown_c=self._slowdown_c,
            last_n=n,
            temp_threshold=self._threshold,
            hw_slowdown_c=self._hw_slowdown_c,
        )
        ev["clock_elasticity"] = self._elasticity.value
        ev["clock_load_split"] = split_causes(
            ev, self._elasticity.value, load_is_up(ev, self.config)
        )
        return ev

    def _attribute(self, ev: dict[str, Any]) -> str:
        """The cause, and its shares beside the other part when both explain the rise."""
        cause = attribute(ev, self.config)
        ev["cause_shares"] = name_shares(ev, cause)
        return cause

    def _open_latency(self, obs: Observation) -> DriftEvent:
        ev = self._evidence(obs)
        cause = self._attribute(ev)
        fired_on = self._since_onset()
        p95 = stats.quantile(fired_on, 0.95) if fired_on else None
        b = self._baseline
        assert b is not None and self._detector is not None
        ev["cause_at_open"] = cause
        ev["onset_ts"] = self._onset_ts
        ev["p95_ms"] = p95
        ev["assisted"] = self._clocks_down()
        rec = self._book.new("latency", obs.ts, cause, b.ttft_p95_ms, p95, ev)
        ev["p50_ms"] = stats.quantile(fired_on, 0.5) if fired_on else None
        ev["ttft_probes"] = len(fired_on)
        ev.update(self._waited_out(len(fired_on)))
        rec.message = messages.latency_message(
            cause, p95, b.ttft_p95_ms, ev, ev["p50_ms"], b.ttft_p50_ms
        )
        rec.reported_peak = p95
        return snapshot(rec, "opened", obs.ts)

    def _update_latency(self, obs: Observation) -> list[DriftEvent]:
        rec = self._open["latency"]
        ev = self._evidence(obs)
        candidate = self._attribute(ev)
        changed = False
        if candidate != rec.cause and candidate != "unknown":
            rec.candidate_n = rec.candidate_n + 1 if candidate == rec.candidate else 1
            rec.candidate = candidate
            if rec.cause == "unknown" or rec.candidate_n >= CAUSE_CHANGE_PROBES:
                rec.cause, changed = candidate, True
        else:
            rec.candidate, rec.candidate_n = None, 0
        p95 = self._p95()
        b50 = self._baseline.ttft_p50_ms if self._baseline is not None else None
        grew = p95 is not None and (rec.peak_p95_ms is None or p95 > rec.peak_p95_ms)
        if grew:
            rec.peak_p95_ms = p95
        if grew or changed:
            # Evidence is kept from the worst moment (or the moment the cause changed), not
            # from the recovery at the end when clocks are already back.
            ev["cause_at_open"] = rec.evidence.get("cause_at_open")
            ev["onset_ts"] = rec.evidence.get("onset_ts")
            ev["p95_ms"] = p95
            ev["p50_ms"] = self._p50()
            ev["ttft_probes"] = len(self._recent)
            ev.update(self._waited_out(len(self._recent)))
            rec.evidence = ev
            rec.message = messages.latency_message(
                rec.cause, rec.peak_p95_ms, rec.baseline_p95_ms, ev, ev["p50_ms"], b50, worst=True
            )
        big = (
            rec.peak_p95_ms is not None
            and rec.reported_peak is not None
            and rec.peak_p95_ms >= PEAK_REPORT_STEP * rec.reported_peak
        )
        if changed or big:
            rec.reported_peak = rec.peak_p95_ms
            return [snapshot(rec, "updated", obs.ts)]
        return []

    def _ended_by(self, rec: Any, obs: Observation) -> str:
        """What ended a latency event, from the newest telemetry: for its resolved message."""
        # The probes since the recovery sum last stood at zero ended it. The p95 window still
        # holds the slowdown's answers: "p95 TTFT back to 507 ms" after an event that opened
        # at 503 ms read as no recovery at all (the demo, --no-control).
        recovered = self._judged_since(self._recovery_judged)
        p95 = stats.quantile(recovered, 0.95) if recovered else None
        parts = [f"p95 TTFT back to {p95:.0f} ms" if p95 is not None else "TTFT back"]
        cause = rec.cause if rec is not None else "unknown"
        clock = busy_clock(obs)
        if cause in ("thermal", "power") and clock is not None:
            bits = throttle.is_throttled(obs.throttle_reasons)
            parts.append(f"SM {clock:.0f} MHz" + ("" if bits else ", no throttle bit"))
        if obs.gpu_temp_c is not None and cause == "thermal":
            parts.append(f"GPU {obs.gpu_temp_c:.0f} °C")
        if cause == "load" or (rec is not None and (rec.evidence.get("cause_shares") or {})):
            if obs.batch_inflight is not None:
                parts.append(f"batch in flight {obs.batch_inflight:g}")
        return ", ".join(parts)

    def _close_latency(self, ts: float | None, why: str | None) -> list[DriftEvent]:
        if self._detector is not None:
            self._detector.close()
        if "latency" not in self._open:
            return []
        rec = self._open["latency"]
        if why:
            rec.evidence["ended_because"] = why
        return [
            self._book.close("latency", ts if ts is not None else self._last_ts or rec.start_ts)
        ]

    # -- the other kinds ------------------------------------------------------------------

    def _open_failing(self, obs: Observation) -> DriftEvent:
        ev = self._evidence(obs)
        f = self._failures
        ev.update(failures=f.failures, window=len(f.window), consecutive=f.consecutive_fail)
        cause = self._attribute(ev)
        rec = self._book.new("probes_failing", obs.ts, cause, self._base_p95(), None, ev)
        rec.message = messages.failing_message(f.failures, len(f.window), f.consecutive_fail)
        return snapshot(rec, "opened", obs.ts)

    def _open_quality(self, obs: Observation) -> DriftEvent:
        q = self._quality
        ev: dict[str, Any] = {
            "failures": q.failures,
            "window": len(q.window),
            "baseline_fail_rate": q.base_rate,
            "flips": q.flips,
        }
        rec = self._book.new("quality", obs.ts, "unknown", self._base_p95(), self._p95(), ev)
        rec.message = messages.quality_message(q.failures, len(q.window), q.base_rate)
        return snapshot(rec, "opened", obs.ts)

    def _open_heat(self, obs: Observation) -> DriftEvent:
        ev = self._evidence(obs)
        rec = self._book.new("heat_warning", obs.ts, "thermal", self._base_p95(), self._p95(), ev)
        rec.message = messages.heat_message(ev)
        return snapshot(rec, "opened", obs.ts)

    def _cold_slow(self, obs: Observation) -> DriftEvent:
        assert obs.ttft_ms is not None
        b = self._baseline
        return self._book.instant(
            "cold_start_slow",
            obs.ts,
            evidence={"ttft_ms": obs.ttft_ms, "limit_ms": self.config.cold_start_limit_ms},
            message=messages.cold_message(obs.ttft_ms, self.config.cold_start_limit_ms),
            baseline_p95_ms=b.ttft_p95_ms if b else None,
        )

    # -- status ---------------------------------------------------------------------------

    def state(self) -> MonitorState:
        det = self._detector
        ts = self._last_ts or 0.0
        return MonitorState(
            fingerprint_id=self.fingerprint_id,
            baseline=self._baseline,
            learning=self._learner.progress,
            probes=self._counts["probes"],
            warm_probes=self._counts["warm"],
            cold_probes=self._counts["cold"],
            failed_probes=self._counts["failed"],
            recent_p95_ms=self._p95(),
            detector=None
            if det is None
            else {"s": det.s, "h": det.cal.h, "d": det.d, "h_end": det.cal.h_end},
            temp_slope_c_per_min=self._heat.slope_c_per_min(),
            quality_window_failures=self._quality.failures,
            quality_window_size=len(self._quality.window),
            quality_base_rate=self._quality.base_rate,
            quality_flips=self._quality.flips,
            open_events=[snapshot(r, "updated", ts) for r in self._open.values()],
        )

    def snapshot(self) -> dict[str, Any]:
        """`state()` as a JSON-ready dict."""
        st = self.state()
        return {
            "fingerprint_id": st.fingerprint_id,
            "baseline": st.baseline.to_dict() if st.baseline else None,
            "learning": {"have": st.learning[0], "need": st.learning[1]},
            "probes": st.probes,
            "warm_probes": st.warm_probes,
            "cold_probes": st.cold_probes,
            "failed_probes": st.failed_probes,
            "recent_p95_ms": st.recent_p95_ms,
            "detector": st.detector,
            "temp_slope_c_per_min": st.temp_slope_c_per_min,
            "quality": {
                "window_failures": st.quality_window_failures,
                "window_size": st.quality_window_size,
                "base_rate": st.quality_base_rate,
                "flips": st.quality_flips,
            },
            "open_events": [e.to_dict() for e in st.open_events],
        }


def _down(clock: tuple[float, float] | None, drop: float) -> bool:
    """The recent busy clock (median, baseline) is down by at least `drop` of the baseline."""
    return clock is not None and clock[0] <= (1.0 - drop) * clock[1]
