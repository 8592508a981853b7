"""Virtual time: run a scenario for hours in seconds, as a discrete-event simulation.

No wall clock, no sockets: the clock jumps from one event to the next (a step ends, a chat
message arrives, a batch stream sends, the schedule changes, the controller decides). The
same `World` (engine + GPU + batch job) runs here as in the real-time lab.

Chat arrives as a Poisson process whose rate is multiplied by `burst_multiplier` during
bursts (`burst_duration_s` every `burst_every_s`); the batch job keeps its streams full up to
the allowance the controller sets.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from llm_watchdog.gateway.config import DEFAULT_BATCH_RAMP_IDLE_S, DEFAULT_BATCH_RAMP_PER_S
from llm_watchdog.models import GpuSample
from llm_watchdog.sim.controllers import (
    Controller,
    ControllerContext,
    Observation,
    make_controller,
)
from llm_watchdog.sim.engine import Request
from llm_watchdog.sim.gpu import GpuSnapshot
from llm_watchdog.sim.scenario import Scenario
from llm_watchdog.sim.world import World

WINDOW_S = 60.0  # SLO attainment is judged per 1-minute window


@dataclass(frozen=True)
class MinuteRow:
    t_s: float  # window start
    chat_requests: int
    chat_p95_ms: float | None
    temp_c: float
    sm_clock_mhz: float  # the clock a kernel got at the window's end
    reasons: int  # clock-event reason bits seen at any step in the window (OR)
    allowance: int | None
    batch_inflight: int
    batch_tokens: int


@dataclass(frozen=True)
class RunResult:
    scenario: str
    controller: str
    duration_s: float
    warmup_s: float
    slo_ttft_ms: float
    chat_requests: int
    chat_ttft_p50_ms: float | None
    chat_ttft_p95_ms: float | None
    chat_ttft_p99_ms: float | None
    slo_windows: int
    slo_attainment: float | None  # share of 1-minute windows with chat p95 ≤ target
    batch_requests: int
    batch_tokens_per_s: float
    batch_chars_per_s: float
    allowance_changes: int
    final_allowance: int | None
    peak_temp_c: float
    throttled_s: float  # time with any thermal or power reason bit
    thermal_violation_s: float
    power_violation_s: float
    wall_s: float
    minutes: tuple[MinuteRow, ...] = field(default=(), repr=False)
    batch_preempted: int = 0  # batch requests the gateway pre-empted (their tokens not counted)
    slot_line: int | None = None  # the gateway's slot line batch was held under (None: none)
    # Every chat answer the figures count: (arrival s, TTFT ms), in arrival order.
    answers: tuple[tuple[float, float], ...] = field(default=(), repr=False)

    def to_dict(self, minutes: bool = False) -> dict[str, Any]:
        # The answers are for callers in Python (thousands of pairs), not for the JSON.
        d = asdict(dataclasses.replace(self, answers=()))
        d.pop("answers")
        if not minutes:
            d.pop("minutes")
        return d


def gpu_sample(
    snap: GpuSnapshot, scenario: Scenario, ts: float, prev: GpuSnapshot | None
) -> GpuSample:
    """A GpuSample as the daemon's NVML reader would record it."""
    g = scenario.gpu

    def since(now_ns: int, before_ns: int | None) -> float | None:
        return None if before_ns is None else (now_ns - before_ns) / 1e6

    return GpuSample(
        ts=ts,
        gpu_index=0,
        uuid=g.uuid,
        temp_c=round(snap.temp_c),
        sm_clock_mhz=snap.sm_clock_mhz,
        sm_clock_max_mhz=g.sm_clock_max_mhz,
        mem_clock_mhz=snap.mem_clock_mhz,
        mem_clock_max_mhz=g.mem_clock_max_mhz,
        power_w=round(snap.power_w, 3),
        power_limit_w=snap.power_limit_w,
        util_gpu_pct=round(snap.util_gpu_pct),
        util_mem_pct=round(snap.util_mem_pct),
        fan_pct=round(snap.fan_pct),
        pstate=snap.pstate,
        throttle_reasons=snap.reasons,
        thermal_violation_ms=since(
            snap.thermal_violation_ns, None if prev is None else prev.thermal_violation_ns
        ),
        power_violation_ms=since(
            snap.power_violation_ns, None if prev is None else prev.power_violation_ns
        ),
        temp_slowdown_c=g.temp_slowdown_c,
    )


class _ChatArrivals:
    """Poisson arrivals, rate piecewise constant (bursts); memoryless, so a draw that crosses
    a rate change is simply drawn again from the change."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.c = world.scenario.chat

    def _rate_and_edge(self, t: float) -> tuple[float, float]:
        base = self.world.chat_arrivals_per_s
        every, dur = self.c.burst_every_s, self.c.burst_duration_s
        if every <= 0 or dur <= 0:
            return base, math.inf
        k = math.floor(t / every)
        start = k * every
        if k >= 1 and t < start + dur:
            return base * self.c.burst_multiplier, start + dur
        return base, (k + 1) * every

    def next_after(self, t: float, horizon: float) -> float:
        while t < horizon:
            rate, edge = self._rate_and_edge(t)
            edge = min(edge, self.world.next_schedule_s(t), horizon)
            if rate > 0:
                nxt = t + self.world.rng_chat_arrivals.expovariate(rate)
                if nxt < edge:
                    return nxt
            t = max(edge, t + 1e-9)
        return math.inf


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def run_virtual(
    scenario: Scenario,
    duration_s: float | None = None,
    controller: str | Controller = "none",
    *,
    seed: int = 0,
    slo_ttft_ms: float | None = None,
    thermal: bool = True,
    batch_streams: int | None = None,
    warmup_s: float = 0.0,
    ramp_per_s: float | None = None,
    ramp_idle_s: float | None = None,
    preempt: bool = False,
    hold_slots: bool = False,
) -> RunResult:
    """Run `scenario` for `duration_s` simulated seconds under `controller`.

    thermal=False holds the card at its starting temperature (the "cool" case of a sweep).
    batch_streams overrides the batch job's demand. TTFT figures and SLO windows leave out
    chat that arrived in the first `warmup_s` seconds. ramp_per_s is the gateway's batch ramp
    after a raise (None: the gateway's default; 0: a raise lets batch in at once); ramp_idle_s
    how long an allowance left unused waits before it ramps again (None: the gateway's
    default; 0: never). preempt: the gateway ends the newest batch requests over a lowered
    allowance; their output tokens are lost and not counted in the batch throughput.
    hold_slots: the gateway holds batch under the engine's slots less a few kept for chat
    (`--engine-slots`).
    """
    wall0 = time.perf_counter()
    duration = float(duration_s if duration_s is not None else scenario.duration_s)
    if not duration > 0:  # the figures are per second of it
        raise ValueError(f"duration must be above 0 s, got {duration:g}")
    slo = float(slo_ttft_ms if slo_ttft_ms is not None else scenario.slo_chat_ttft_p95_ms)
    if batch_streams is not None:
        scenario = dataclasses.replace(
            scenario, batch=dataclasses.replace(scenario.batch, streams=batch_streams)
        )
    world = World(scenario, seed=seed, thermal=thermal, preempt=preempt, hold_slots=hold_slots)
    world.ramp.per_s = DEFAULT_BATCH_RAMP_PER_S if ramp_per_s is None else ramp_per_s
    world.ramp.idle_s = DEFAULT_BATCH_RAMP_IDLE_S if ramp_idle_s is None else ramp_idle_s
    ctx = ControllerContext(
        slo,
        scenario.batch.streams,
        scenario.engine.max_running_seqs,
        scenario.gpu.sw_hold_c,
        hold_slots,
    )
    ctl = make_controller(controller, ctx) if isinstance(controller, str) else controller
    ctl_name = controller if isinstance(controller, str) else type(controller).__name__
    overhead_s = scenario.engine.request_overhead_ms / 1000.0
    chars_per_token = scenario.engine.chars_per_token
    arrivals = _ChatArrivals(world)
    next_chat = arrivals.next_after(0.0, duration)
    pending: list[tuple[float, int, Request]] = []  # chat requests not yet handed to the engine
    next_ctl = 0.0  # the first decision sets the allowance before any batch request starts
    next_minute = WINDOW_S
    ttfts: list[tuple[float, float]] = []  # (arrival s, ttft ms)
    recent: list[float] = []
    arrived = 0  # chat arrivals since the last decision
    chat_open: set[int] = set()  # chat requests arrived and not finished
    window_ttfts: list[float] = []
    minutes: list[MinuteRow] = []
    window_reasons = 0
    window_batch_tokens = 0
    batch_tokens = 0
    batch_done = 0
    changes = 0
    decided = False
    peak = world.gpu.temp_c
    prev_snap: GpuSnapshot | None = None
    plan = None
    t = 0.0

    def close_window(end_s: float) -> None:
        nonlocal window_ttfts, window_reasons, window_batch_tokens
        snap = world.snapshot(end_s)
        minutes.append(
            MinuteRow(
                t_s=end_s - WINDOW_S,
                chat_requests=len(window_ttfts),
                chat_p95_ms=_pct(window_ttfts, 95),
                temp_c=round(snap.temp_c, 1),
                sm_clock_mhz=snap.sm_clock_active_mhz,
                reasons=window_reasons,
                allowance=world.allowance,
                batch_inflight=world.batch_inflight,
                batch_tokens=window_batch_tokens,
            )
        )
        window_ttfts, window_reasons, window_batch_tokens = [], 0, 0

    while True:
        t_step = plan.end_s if plan is not None else math.inf
        t_pending = pending[0][0] if pending else math.inf
        t = min(t_step, next_chat, t_pending, next_ctl, next_minute, world.next_wakeup())
        if t >= duration:
            break
        if t == t_step:
            res = world.finish_step()
            plan = None
            if world.gpu.temp_c > peak:
                peak = world.gpu.temp_c
            window_reasons |= world.gpu.reasons
            for req in res.first_tokens:
                if req.cls == "chat" and req.ttft_s is not None:
                    ms = req.ttft_s * 1000.0
                    recent.append(ms)
                    if req.arrival_s >= warmup_s:
                        ttfts.append((req.arrival_s, ms))
                        window_ttfts.append(ms)
            n = res.tokens_by_class.get("batch", 0)
            batch_tokens += n
            window_batch_tokens += n
            batch_done += sum(1 for r in res.finished if r.cls == "batch")
            chat_open.difference_update(r.id for r in res.finished if r.cls == "chat")
        elif t == next_chat:
            req = world.new_request("chat", t)
            arrived += 1
            chat_open.add(req.id)
            heapq.heappush(pending, (t + overhead_s, req.id, req))
            next_chat = arrivals.next_after(t, duration)
        elif t == t_pending:
            _, _, req = heapq.heappop(pending)
            world.submit(req, t)
        elif t == next_ctl:
            snap = world.snapshot(t)
            obs = Observation(
                now_s=t,
                chat_ttfts_ms=tuple(recent),
                gpu=gpu_sample(snap, scenario, t, prev_snap),
                batch_inflight=world.batch_inflight,
                batch_waiting=max(0, world.batch_streams - world.batch_inflight),
                batch_demand=world.batch_streams,
                allowance=world.allowance,
                slo_ttft_ms=slo,
                chat_arrivals=arrived,
                chat_inflight=len(chat_open),
            )
            prev_snap = snap
            recent, arrived = [], 0
            decision = ctl.decide(t, obs)
            if decision is not None and decision != world.allowance:
                if decided:  # the first decision sets the allowance, it does not change it
                    changes += 1
                lost = world.preempted_tokens
                world.set_allowance(decision, t)
                lost = world.preempted_tokens - lost  # counted by steps already, now lost
                batch_tokens -= lost
                window_batch_tokens = max(0, window_batch_tokens - lost)
            decided = decided or decision is not None
            next_ctl = t + ctl.interval_s
        elif t == next_minute:
            close_window(t)
            next_minute = t + WINDOW_S
        else:  # the schedule or a batch stream
            world.poll(t)
        if plan is None:
            plan = world.start_step(t)
    if next_minute == duration:  # the last whole minute ends with the run
        close_window(duration)
    else:  # a part minute is not judged
        world.snapshot(duration)
    peak = max(peak, world.gpu.temp_c)
    values = [ms for _, ms in ttfts]
    judged = [m for m in minutes if m.chat_p95_ms is not None and m.t_s >= warmup_s]
    met = sum(1 for m in judged if m.chat_p95_ms is not None and m.chat_p95_ms <= slo)
    gpu = world.gpu
    return RunResult(
        scenario=scenario.name,
        controller=ctl_name,
        duration_s=duration,
        warmup_s=warmup_s,
        slo_ttft_ms=slo,
        chat_requests=len(values),
        chat_ttft_p50_ms=_pct(values, 50),
        chat_ttft_p95_ms=_pct(values, 95),
        chat_ttft_p99_ms=_pct(values, 99),
        slo_windows=len(judged),
        slo_attainment=met / len(judged) if judged else None,
        batch_requests=batch_done,
        batch_tokens_per_s=batch_tokens / duration,
        batch_chars_per_s=batch_tokens * chars_per_token / duration,
        allowance_changes=changes,
        final_allowance=world.allowance,
        peak_temp_c=round(peak, 2),
        throttled_s=gpu.throttled_ns / 1e9,
        thermal_violation_s=gpu.thermal_violation_ns / 1e9,
        power_violation_s=gpu.power_violation_ns / 1e9,
        wall_s=time.perf_counter() - wall0,
        minutes=tuple(minutes),
        batch_preempted=world.preempted,
        slot_line=world.slot_line,
        answers=tuple(sorted(ttfts)),
    )
