"""The allowance law and its baselines, deterministic with injected time.

Constant TTFT samples make p̂95 exact (σ̂ = 0: p̂95 is the sample itself), so every expected
allowance below is computed by hand from the starting-point law or from the Java source ported.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re

import pytest
import sqlite_utils

from llm_watchdog.control.baselines import (
    AimdController,
    ExpAvg,
    Gradient2Controller,
    StaticController,
)
from llm_watchdog.control.law import (
    AllowanceController,
    ControlAction,
    ControlConfig,
    ControlInput,
    GpuState,
    design_law,
)
from llm_watchdog.control.signals import LogEwma, RateEwma, SurgeDetector
from llm_watchdog.nvml.throttle import GPU_IDLE, SW_POWER_CAP, SW_THERMAL_SLOWDOWN
from llm_watchdog.sim import law as control_sim
from llm_watchdog.sim.controllers import ControllerContext, ControllerError, make_controller
from llm_watchdog.sim.scenario import load_scenario
from llm_watchdog.sim.virtual import run_virtual
from llm_watchdog.stats import quantile
from llm_watchdog.store.control import action_row, verification_row
from llm_watchdog.store.migrations import migrate

T = 1000.0  # the chat p95 target in every test
MAX_MHZ = 2000.0
COOL = GpuState(0, 1950.0, MAX_MHZ)


def law(**changes: object) -> AllowanceController:
    """the starting-point law (every addition off) with a 1000 ms target and round numbers."""
    base = ControlConfig(
        target_p95_ms=T,
        floor=1,
        ceiling=20,
        default_allowance=8,
        drain_time_s=20.0,
        grow_cooldown_s=30.0,
        freeze_release_s=120.0,
    )
    return AllowanceController(dataclasses.replace(design_law(base), **changes))


def ours(**changes: object) -> AllowanceController:
    base = ControlConfig(target_p95_ms=T, floor=0, ceiling=32, default_allowance=8)
    return AllowanceController(dataclasses.replace(base, **changes))


def inp(now: float, ms: float | None = None, n: int = 5, **kw: object) -> ControlInput:
    samples = () if ms is None else (ms,) * n
    return ControlInput(now_s=now, chat_ttfts_ms=samples, **kw)  # type: ignore[arg-type]


# -- the starting-point law ----------------------------------------------------------------------


def test_no_decision_before_enough_samples() -> None:
    c = law()
    a = c.step(inp(0.0, 5000.0, n=2))
    assert (a.kind, a.allowance_after) == ("hold", 8)
    assert a.reason == "hold 8: waiting for samples (2/5)"


def test_cut_is_proportional_and_bounded_by_half() -> None:
    c = law()
    a = c.step(inp(0.0, 1200.0))  # p̂95 = 1200 > 900: 8 × 900/1200 = 6
    assert (a.kind, a.allowance_before, a.allowance_after) == ("cut", 8, 6)
    assert a.p95_est_ms == pytest.approx(1200.0)
    assert a.reason == "cut 8 → 6: p95≈1200 ms > 0.9×T"
    c = law()
    a = c.step(inp(0.0, 1900.0))  # 900/1900 < 0.5: at most halved
    assert a.allowance_after == 4


def test_one_cut_per_drain_time() -> None:
    c = law()
    assert c.step(inp(0.0, 1200.0)).allowance_after == 6
    a = c.step(inp(10.0, 1200.0))
    assert (a.kind, a.allowance_after) == ("hold", 6)
    assert a.reason == "hold 6: p95≈1200 ms over 0.9×T, the last cut still draining"
    assert c.step(inp(20.0, 1200.0)).allowance_after == 4  # floor(6 × 0.75)


def test_one_sample_over_twice_the_target_halves() -> None:
    c = law()
    c.step(inp(0.0, 850.0))  # the dead band: nothing changes
    a = c.step(ControlInput(5.0, (850.0, 2100.0)))
    assert (a.kind, a.allowance_after) == ("halve", 4)
    assert a.reason == "halve 8 → 4: a chat TTFT of 2100 ms is over 2×T"


def test_failed_canaries_count_as_violations() -> None:
    c = law()
    c.step(inp(0.0, 850.0))
    a = c.step(ControlInput(5.0, (), failed_canaries=1))
    assert (a.kind, a.allowance_after) == ("halve", 4)
    assert a.reason == "halve 8 → 4: 1 failed canary(ies) count as violations"
    assert a.inputs["failed_canaries"] == 1
    # and they enter the estimate as samples at 2T: failures alone drive p̂95 over target
    c = law()
    for i in range(8):
        a = c.step(ControlInput(30.0 * i, (), failed_canaries=1))
    assert a.p95_est_ms == pytest.approx(2 * T)
    assert a.allowance_after == 1  # the floor


def test_grow_after_three_low_samples_and_the_cooldown() -> None:
    c = law()
    a = c.step(inp(0.0, 400.0))
    assert (a.kind, a.allowance_after) == ("grow", 9)  # max(1, ⌈0.05 × 8⌉) = 1
    a = c.step(inp(10.0, 400.0))
    assert (a.kind, a.allowance_after) == ("hold", 9)
    assert a.reason == "hold 9: p95≈400 ms low, in cooldown after the last change"
    assert c.step(inp(40.0, 400.0)).allowance_after == 10


def test_grow_needs_three_samples_in_a_row() -> None:
    c = law(min_samples=1)
    a = c.step(inp(0.0, 400.0, n=2))
    assert (a.kind, a.allowance_after) == ("hold", 8)
    assert a.reason == "hold 8: p95≈400 ms low for 2 sample(s) only"
    assert c.step(inp(5.0, 400.0, n=1)).allowance_after == 9


def test_growth_step_scales_with_the_allowance() -> None:
    c = law(ceiling=64, default_allowance=40)
    assert c.step(inp(0.0, 400.0)).allowance_after == 42  # ⌈0.05 × 40⌉ = 2


def test_dead_band_holds() -> None:
    c = law()
    a = c.step(inp(0.0, 850.0))
    assert (a.kind, a.allowance_after) == ("hold", 8)
    assert a.reason == "hold 8: p95≈850 ms in the dead band"


def test_floor_and_ceiling() -> None:
    c = law(default_allowance=1)
    a = c.step(inp(0.0, 5000.0))
    assert (a.kind, a.allowance_after) == ("hold", 1)
    c = law(default_allowance=20)
    a = c.step(inp(0.0, 100.0))
    assert (a.kind, a.allowance_after) == ("hold", 20)
    assert a.reason == "hold 20: p95≈100 ms low, held at the ceiling 20"


def test_read_back_allowance_is_where_the_law_starts() -> None:
    """A lease ran out and the serving layer went back to its default: the law starts
    from what is in force, not from what it last wrote."""
    c = law()
    c.step(inp(0.0, 1200.0))  # wrote 6
    a = c.step(inp(30.0, 1200.0, allowance=12))
    assert (a.allowance_before, a.allowance_after) == (12, 9)


def test_freeze_under_throttling_until_clocks_are_normal_long_enough() -> None:
    hot = GpuState(SW_THERMAL_SLOWDOWN, 1500.0, MAX_MHZ)
    c = law()
    a = c.step(inp(0.0, 400.0, gpu=hot))
    assert (a.kind, a.allowance_after) == ("freeze", 8)
    assert (
        a.reason
        == "freeze 8: p95≈400 ms low, held at the ceiling frozen while the card is throttled"
    )
    assert a.inputs["throttle_names"] == ["sw_thermal_slowdown"]
    # the power cap freezes too, in the starting-point law
    assert c.step(inp(40.0, 400.0, gpu=GpuState(SW_POWER_CAP, 1800.0, MAX_MHZ))).kind == "freeze"
    # clocks normal from t=80: still frozen at t=80+119, released at t=80+120
    assert c.step(inp(80.0, 400.0, gpu=COOL)).kind == "freeze"
    a = c.step(inp(199.0, 400.0, gpu=COOL))
    assert a.reason.endswith("held at the ceiling frozen until the clocks have settled")
    a = c.step(inp(200.0, 400.0, gpu=COOL))
    assert (a.kind, a.allowance_after) == ("grow", 9)


def test_frozen_ceiling_follows_cuts_down() -> None:
    hot = GpuState(SW_THERMAL_SLOWDOWN, 1500.0, MAX_MHZ)
    c = law()
    assert c.step(inp(0.0, 1200.0, gpu=hot)).allowance_after == 6
    assert c.frozen_ceiling == 6


def test_latency_only_mode_without_nvml() -> None:
    c = law()
    a = c.step(inp(0.0, 1200.0))
    assert a.inputs["latency_only"] is True
    assert a.inputs["throttle_reasons"] is None
    assert a.allowance_after == 6
    assert c.step(inp(40.0, 300.0, n=60)).kind == "grow"


# -- the changes over the starting-point law ------------------------------------------------------


def test_power_cap_alone_does_not_freeze_ours() -> None:
    capped = GpuState(SW_POWER_CAP, 1800.0, MAX_MHZ)
    c = ours()
    a = c.step(inp(0.0, 300.0, gpu=capped, batch_inflight=8))
    assert (a.kind, a.allowance_after) == ("grow", 10)  # p̂95 < 0.5T: ⌈0.25 × 8⌉
    assert a.inputs["throttled"] is True and a.inputs["frozen_ceiling"] is None


def test_ours_freezes_only_while_the_clock_falls_under_heat() -> None:
    c = ours(grow_cooldown_s=0.0, freeze_release_s=60.0)
    c.step(inp(0.0, 300.0, gpu=GpuState(SW_THERMAL_SLOWDOWN, 1800.0, MAX_MHZ), batch_inflight=8))
    a = c.step(
        inp(5.0, 300.0, gpu=GpuState(SW_THERMAL_SLOWDOWN, 1700.0, MAX_MHZ), batch_inflight=10)
    )
    assert a.kind == "freeze" and a.inputs["clock_drop"] == pytest.approx(1 - 1700 / 1800, abs=1e-4)
    assert a.reason.endswith("the ceiling frozen while the clock falls under heat")
    # settled at 1700 MHz, still throttled: frozen until it has held 60 s, then free; the
    # reason says so, not "while throttled", which the growth after it would contradict
    settled = GpuState(SW_THERMAL_SLOWDOWN, 1700.0, MAX_MHZ)
    assert c.step(inp(10.0, 300.0, gpu=settled, batch_inflight=10)).kind == "freeze"
    a = c.step(inp(69.0, 300.0, gpu=settled, batch_inflight=10))
    assert a.kind == "freeze"
    assert a.reason.endswith("the ceiling frozen until the clock has held for 60 s")
    assert c.step(inp(70.0, 300.0, gpu=settled, batch_inflight=10)).kind == "grow"


def test_idle_clock_is_not_a_fall() -> None:
    c = ours(grow_cooldown_s=0.0)
    c.step(inp(0.0, 300.0, gpu=GpuState(SW_THERMAL_SLOWDOWN, 1800.0, MAX_MHZ), batch_inflight=8))
    idle = GpuState(GPU_IDLE | SW_THERMAL_SLOWDOWN, 210.0, MAX_MHZ)
    a = c.step(inp(5.0, 300.0, gpu=idle, batch_inflight=10))
    assert a.kind == "grow" and a.inputs["clock_drop"] == 0.0


def test_growth_stays_near_what_the_batch_job_uses() -> None:
    c = ours()
    a = c.step(inp(0.0, 300.0, batch_inflight=3))
    assert (a.kind, a.allowance_after) == ("hold", 8)
    assert a.reason == "hold 8: p95≈300 ms low, held at in-flight 3 + headroom"


def test_window_p95_sees_the_slow_tail_an_ewma_forgets() -> None:
    c = ours(window_min_samples=10)
    # 19 fast answers and 2 over target in the last minute: the window's p95 is over 0.9T
    c.step(ControlInput(0.0, (200.0,) * 10))
    a = c.step(ControlInput(5.0, (1500.0, 1500.0) + (200.0,) * 9))
    assert a.kind == "cut"
    assert a.p95_est_ms == pytest.approx(quantile([200.0] * 19 + [1500.0] * 2, 0.95))
    assert len(c.window) == 0  # a cut starts the window afresh


def test_surge_sheds_batch_in_proportion_and_teaches_a_ceiling() -> None:
    c = ours(default_allowance=12, app_limited_headroom=0, surge_confirm=1)
    now = 0.0
    for _ in range(24):  # two minutes of chat at 1/s, fast; the allowance in force is 12
        c.step(ControlInput(now, (200.0,) * 5, allowance=12))
        now += 5.0
    # chat arrives at 4/s and slows: the latency cut first ...
    a = c.step(ControlInput(now, (1200.0,) * 20, allowance=12))
    assert (a.kind, a.allowance_after) == ("cut", 6)
    assert a.inputs["chat_surge"] == 2.5
    # ... then, inside the drain time, the surge sheds batch in proportion to it
    a = c.step(ControlInput(now + 5.0, (1200.0,) * 20))
    assert (
        a.reason == "cut 6 → 3: chat arriving at 3.6× its usual rate: shed batch ahead of the queue"
    )
    now += 5.0
    while c.surge.surging:
        now += 5.0
        a = c.step(ControlInput(now, (200.0,) * 5))
        assert a.kind == "hold"  # no probing upward while chat still surges
    # the surge was missed from 12: from now on growth stops at ⌊0.5 × 12⌋
    assert c.surge_cap == 6
    c.allowance = 6
    a = c.step(ControlInput(now + 300.0, (200.0,) * 60))
    assert (a.kind, a.allowance_after) == ("hold", 6)
    assert a.reason.endswith("ms low, held at the level chat surges were met from")


def surge(c: AllowanceController, now: float, level: int, per_5s: int, ms: float) -> float:
    """Two minutes of 1/s chat, then 15 s of `per_5s` arrivals per 5 s, each `ms` slow,
    then 1/s again until the surge is over."""
    for _ in range(24):
        c.step(ControlInput(now, (200.0,) * 5, allowance=level))
        now += 5.0
    for _ in range(3):
        c.step(ControlInput(now, (ms,) * per_5s, allowance=level))
        now += 5.0
    while c.surge.surging:
        c.step(ControlInput(now, (ms,) * 5, allowance=level))
        now += 5.0
    return now


def test_surge_cap_rises_only_for_a_surge_as_big_met_with_room() -> None:
    c = ours(default_allowance=12, app_limited_headroom=0, surge_confirm=1)
    now = surge(c, 0.0, 12, 20, 1500.0)  # missed from 12
    assert (c.surge_cap, c.surge_cap_ratio > 2.0) == (6, True)
    now = surge(c, now, 6, 12, 300.0)  # a smaller surge met: says little about a big one
    assert (c.surge_cap, 0.0 < c.surge_peak < 0.8 * c.surge_cap_ratio) == (6, True)
    surge(c, now, 6, 20, 300.0)  # as big, met with room to spare from the cap
    assert c.surge_cap == 7


def test_on_a_large_engine_the_surge_cap_rises_by_a_growth_step() -> None:
    c = ours(default_allowance=80, ceiling=128, app_limited_headroom=0, surge_confirm=1)
    now = surge(c, 0.0, 80, 20, 1500.0)  # missed from 80
    assert c.surge_cap == 40
    surge(c, now, 40, 20, 300.0)  # as big, met with room to spare: ⌈0.05 × 40⌉ more
    assert c.surge_cap == 42


def test_a_cut_acts_on_what_runs_not_on_room_nobody_uses() -> None:
    assert law().step(inp(0.0, 1200.0, batch_inflight=2)).allowance_after == 6  # as the start
    c = ours(default_allowance=16)
    # 8 of 16 running: a cut to 12 would change nothing; p̂95 1200 cuts 8 × 0.75
    a = c.step(inp(0.0, 1200.0, batch_inflight=8))
    assert (a.kind, a.allowance_before, a.allowance_after) == ("cut", 16, 6)
    c = ours(default_allowance=16)
    a = c.step(inp(0.0, 2500.0, batch_inflight=6))  # over 2T: half of what runs
    assert (a.kind, a.allowance_after) == ("halve", 3)
    c = ours(default_allowance=8)
    a = c.step(inp(0.0, 1200.0, batch_inflight=12))  # more running than allowed (a cut
    assert a.allowance_after == 6  # still draining): the allowance is the basis


def test_a_surge_missed_with_no_batch_running_teaches_nothing_about_batch() -> None:
    c = ours(default_allowance=0, app_limited_headroom=0, surge_confirm=1)
    surge(c, 0.0, 0, 20, 1500.0)  # missed, but at the floor: chat alone was too much
    assert c.surge_cap is None
    # missed from 1: backing off from it reaches the floor, and a cap of 0 would keep batch
    # off the card all day on one lost minute; from 2 a cap of 1 is learned
    for level, cap in ((1, None), (2, 1)):
        c = ours(default_allowance=level, app_limited_headroom=0, surge_confirm=1)
        surge(c, 0.0, level, 20, 1500.0)
        assert c.surge_cap == cap


def test_what_a_met_surge_shed_comes_back_at_the_fast_pace() -> None:
    def regrowth(surge_ms: float) -> list[int]:
        c = ours(default_allowance=12, app_limited_headroom=0, surge_confirm=1)
        now = 0.0
        for _ in range(24):  # two minutes of chat at 1/s
            c.step(ControlInput(now, (600.0,) * 5))
            now += 5.0
        while now < 135.0 or c.surge.surging:  # 4/s for 15 s, then 1/s until it is over
            c.step(ControlInput(now, (surge_ms,) * (20 if now < 135.0 else 5)))
            now += 5.0
        levels = []
        for _ in range(12):  # a minute of chat at 0.6 T: grows, but not "far below"
            now += 5.0
            levels.append(c.step(ControlInput(now, (600.0,) * 5)).allowance_after)
        return levels

    met, missed = regrowth(600.0), regrowth(1500.0)
    # shed from 20 (where the calm two minutes had grown it), and nearly back in a minute
    assert met[0] < 10 and met[-1] >= 19
    steps = [b - a for a, b in zip(met, met[1:], strict=False) if b > a]
    assert max(steps) >= 2  # a quarter of the level per step, not one at a time
    # a surge missed is news about batch: growth after it stays slow (and under the cap)
    assert all(b - a <= 1 for a, b in zip(missed, missed[1:], strict=False))


def test_where_the_gateway_ramps_a_comfortably_met_surge_comes_back_in_one_write() -> None:
    def regrowth(surge_ms: float, serving_ramps: bool, inflight_after: int = 5) -> tuple[int, int]:
        """(the lowest level the surge shed to, the first raise after that)"""
        c = ours(
            default_allowance=12,
            app_limited_headroom=0,
            surge_confirm=1,
            serving_ramps=serving_ramps,
        )
        levels = []
        now = 0.0
        for _ in range(24):  # two minutes of chat at 1/s, 5 in flight
            c.step(ControlInput(now, (600.0,) * 5, chat_inflight=5))
            now += 5.0
        while now < 135.0 or c.surge.surging:  # 4/s for 15 s, then 1/s until it is over
            n, held = (20, 20) if now < 135.0 else (5, inflight_after)
            levels.append(c.step(ControlInput(now, (surge_ms,) * n, chat_inflight=held)))
            now += 5.0
        for k in range(12):  # a minute of chat at 0.6 T
            a = c.step(ControlInput(now + 5.0 * k, (600.0,) * 5, chat_inflight=inflight_after))
            levels.append(a)
        low = min(a.allowance_after for a in levels)
        shed_at = next(i for i, a in enumerate(levels) if a.allowance_after == low)
        first_raise = next(a for a in levels[shed_at:] if a.allowance_after > low)
        return low, first_raise.allowance_after

    low, back_to = regrowth(600.0, serving_ramps=True)
    assert low < 10 and back_to >= 19  # shed from 20, and back in one write
    # met, but near the target (0.8 T): back step by step, each step judged on its own
    assert regrowth(800.0, serving_ramps=True)[1] < 15
    # a gateway that lets a raise in at once: step by step, or the prefills stampede
    assert regrowth(600.0, serving_ramps=False)[1] < 15
    # chat still holds 4x its usual slots (a burst outlasting its detector): step by step
    assert regrowth(600.0, serving_ramps=True, inflight_after=20)[1] < 15


def test_a_surge_shed_comes_back_step_by_step_while_the_card_is_in_thermal_slowdown() -> None:
    """The level the surge was shed from was the cool card's: under a thermal slowdown bit
    the one-write return would put it back on a slower engine (hr-fans-stall-twice with the
    gateway pre-empting: 3 -> 16 at 84 °C, then missed windows)."""

    def first_raise(gpu_after: GpuState | None) -> tuple[int, int]:
        c = ours(default_allowance=12, app_limited_headroom=0, surge_confirm=1, serving_ramps=True)
        now, levels = 0.0, []
        for _ in range(24):
            c.step(ControlInput(now, (600.0,) * 5, chat_inflight=5))
            now += 5.0
        while now < 135.0 or c.surge.surging:
            n, held = (20, 20) if now < 135.0 else (5, 5)
            gpu = None if now < 135.0 else gpu_after
            levels.append(c.step(ControlInput(now, (600.0,) * n, gpu=gpu, chat_inflight=held)))
            now += 5.0
        for k in range(12):
            levels.append(
                c.step(ControlInput(now + 5.0 * k, (600.0,) * 5, gpu=gpu_after, chat_inflight=5))
            )
        low = min(a.allowance_after for a in levels)
        shed_at = next(i for i, a in enumerate(levels) if a.allowance_after == low)
        raised = [a.allowance_after for a in levels[shed_at:] if a.allowance_after > low]
        return low, raised[0] if raised else low

    low, back_to = first_raise(None)
    assert low < 10 and back_to >= 19  # no heat: back in one write
    low, back_to = first_raise(GpuState(SW_THERMAL_SLOWDOWN, 1950.0, MAX_MHZ))
    assert low < 10 and back_to < 15, (low, back_to)


def test_surge_cap_is_learned_from_the_level_before_the_cuts() -> None:
    c = ours(default_allowance=12, ceiling=12, app_limited_headroom=0, surge_confirm=2)
    now = 0.0
    for _ in range(24):  # two minutes of fast chat at 1/s, 12 in force
        c.step(ControlInput(now, (200.0,) * 5))
        now += 5.0
    a = c.step(ControlInput(now, (1200.0,) * 20))  # the burst: slow, not yet confirmed
    assert (a.kind, a.allowance_after) == ("cut", 6)
    now += 5.0
    while True:  # confirmed at 6, after the latency cut; missed; then it ends
        a = c.step(ControlInput(now, (1200.0,) * 20 if now < 160.0 else (200.0,) * 5))
        now += 5.0
        if not c.surge.surging and now > 160.0:
            break
    # missed from 12, the level it began at: ⌊0.5 × 12⌋, not ⌊0.5 × 6⌋
    assert c.surge_cap == 6


def test_a_surge_is_judged_from_its_first_seconds() -> None:
    # The slow answers came before the surge was confirmed (a shed then saved the rest of
    # it): the minute was lost all the same, so the surge counts as missed.
    c = ours(default_allowance=12, ceiling=12, app_limited_headroom=0, surge_confirm=3)
    now = 0.0
    for _ in range(120):  # two minutes of fast chat at 1/s, 12 in force
        c.step(ControlInput(now, (200.0,), allowance=12))
        now += 1.0
    shed = None
    for k in range(20):  # a 4/s burst: its first 3 s slow, then fast once shed
        a = c.step(ControlInput(now, (2500.0 if k < 3 else 200.0,) * 4))
        shed = shed or (a.inputs["chat_surge"] and k)
        now += 1.0
    assert shed and shed >= 3  # confirmed after the slow answers
    while c.surge.surging:
        c.step(ControlInput(now, (200.0,)))
        now += 1.0
    assert c.surge_cap == 6  # missed from 12


def test_a_surge_is_judged_by_its_first_minute_as_the_slo_is() -> None:
    # Three minutes at 4/s: the first minute loses its p95 (one answer in ten slow), the
    # two after the shed are fast. Over all three minutes the p95 is fast; the SLO's first
    # minute was lost all the same, so the surge counts as missed and teaches a cap.
    def cap(window_s: float) -> int | None:
        c = ours(default_allowance=12, ceiling=12, app_limited_headroom=0, window_s=window_s)
        now = 0.0
        for _ in range(600):  # ten minutes of fast chat at 1/s (the usual rate), 12 in force
            c.step(ControlInput(now, (200.0,), allowance=12))
            now += 1.0
        for k in range(180):
            slow = k < 60 and k % 10 == 0
            c.step(ControlInput(now, (2500.0 if slow else 200.0,) * 4, allowance=12))
            now += 1.0
        assert c.surge.surging
        while c.surge.surging:
            c.step(ControlInput(now, (200.0,), allowance=12))
            now += 1.0
        return c.surge_cap

    assert cap(60.0) == 6  # missed from 12
    assert cap(0.0) is None  # judged over the whole surge: "met"


def test_arrivals_show_a_burst_before_its_first_tokens_do() -> None:
    # A burst queues behind itself: its first tokens land late and few. The gateway counts
    # it as it comes, and the surge is shed on that, while the TTFTs still look calm.
    def run(with_arrivals: bool) -> int | None:
        c = ours(default_allowance=12, ceiling=12, app_limited_headroom=0)
        now = 0.0
        for _ in range(120):  # two minutes of fast chat at 1/s
            c.step(ControlInput(now, (200.0,), chat_arrivals=1 if with_arrivals else None))
            now += 1.0
        for k in range(10):  # 4/s arrive; one first token a second comes back, still fast
            arrivals = 4 if with_arrivals else None
            a = c.step(ControlInput(now, (200.0,), chat_arrivals=arrivals))
            if a.inputs["chat_surge"]:
                return k
            now += 1.0
        return None

    assert run(with_arrivals=False) is None
    shed_at = run(with_arrivals=True)
    assert shed_at is not None and shed_at <= 5


def slots_law(**changes: object) -> AllowanceController:
    """Ours on an engine with 32 slots, chat usually 6 in flight (learned over 10 min)."""
    c = ours(default_allowance=10, engine_slots=32, app_limited_headroom=0, **changes)
    for now in range(0, 600):
        c.step(ControlInput(float(now), (200.0,), chat_inflight=6, batch_inflight=10))
    return c


def test_growth_keeps_the_engine_slots_a_chat_burst_needs() -> None:
    c = slots_law()
    assert c.chat_usual is not None and abs(c.chat_usual - 6.0) < 0.01
    level = c.allowance
    for now in range(600, 1200):
        a = c.step(ControlInput(float(now), (200.0,), chat_inflight=6, batch_inflight=level))
        level = a.allowance_after
    # 32 slots − ⌈3 × 6⌉ for a burst: batch never grows past 14, though chat is fast
    assert level == 14
    assert a.reason.endswith("held at the engine's slots a chat burst needs")
    # without the engine's slot count the rule is off, and growth goes on to the ceiling
    c = ours(default_allowance=10, app_limited_headroom=0)
    for now in range(0, 1200):
        c.step(ControlInput(float(now), (200.0,), chat_inflight=6))
    assert c.allowance == 32


def test_chat_holding_the_slots_cuts_batch_at_once() -> None:
    c = slots_law()
    # chat is still fast, but 20 of 32 slots hold chat and 10 batch: over 32 − 4
    a = c.step(ControlInput(600.0, (200.0,), chat_inflight=20, batch_inflight=10))
    assert (a.kind, a.allowance_after) == ("cut", 8)
    assert a.reason == "cut 14 → 8: chat holds 20 of the engine's 32 slots"
    # no drain time to wait for: the next second, with more chat, batch gives way again
    a = c.step(ControlInput(601.0, (200.0,), chat_inflight=23, batch_inflight=9))
    assert (a.kind, a.allowance_after) == ("cut", 5)
    # a cut to room batch does not use changes nothing: 5 running, room for 5
    a = c.step(ControlInput(602.0, (200.0,), chat_inflight=23, batch_inflight=5))
    assert a.kind != "cut"


def test_where_the_gateway_holds_the_slot_line_chat_in_the_slots_writes_no_cut() -> None:
    c = slots_law(serving_slots=True)
    # the same 20 chat of 32 slots: the gateway lets no more batch in, the law writes nothing
    a = c.step(ControlInput(600.0, (200.0,), chat_inflight=20, batch_inflight=10))
    assert a.kind != "cut" and a.allowance_after >= 10, a.reason
    # growth still keeps the slots a chat burst needs
    level = c.allowance
    for now in range(601, 1200):
        a = c.step(ControlInput(float(now), (200.0,), chat_inflight=6, batch_inflight=level))
        level = a.allowance_after
    assert level == 14


def test_on_a_small_engine_the_slot_margin_is_an_eighth_of_it() -> None:
    # llama.cpp with --parallel 8: a margin of 4 would keep half the engine from batch
    c = ours(default_allowance=6, engine_slots=8, app_limited_headroom=0)
    for now in range(0, 120):
        a = c.step(ControlInput(float(now), (200.0,), chat_inflight=1, batch_inflight=6))
        assert a.kind != "cut", a.reason  # 6 + 1 fits 8 − 1
    a = c.step(ControlInput(120.0, (200.0,), chat_inflight=2, batch_inflight=6))
    assert a.reason == "cut 6 → 5: chat holds 2 of the engine's 8 slots"


def test_a_halving_of_what_runs_says_so() -> None:
    # The allowance was 8 with 2 running: "halve 8 → 1" read as half of 8.
    c = ours(default_allowance=8, app_limited_headroom=0)
    now = 0.0
    for _ in range(20):
        c.step(ControlInput(now, (200.0,), batch_inflight=2))
        now += 1.0
    a = c.step(ControlInput(now + 30, (9000.0,), batch_inflight=2))
    assert a.kind == "halve" and a.allowance_after == 1, a.reason
    assert a.reason.endswith("; half of the 2 batch running"), a.reason


def test_on_a_four_slot_engine_one_slot_is_kept_for_chat() -> None:
    # An eighth of 4 is none: batch filled all four and chat waited behind it.
    c = ours(default_allowance=3, engine_slots=4, app_limited_headroom=0)
    for now in range(0, 60):
        a = c.step(ControlInput(float(now), (200.0,), chat_inflight=0, batch_inflight=3))
        assert a.kind != "cut", a.reason  # 3 fits 4 − 1
    a = c.step(ControlInput(60.0, (200.0,), chat_inflight=1, batch_inflight=3))
    # To 4 − 1 kept − 1 chat = 2, from wherever growth had taken it.
    assert a.kind == "cut" and a.allowance_after == 2, a.reason
    assert a.reason.endswith("→ 2: chat holds 1 of the engine's 4 slots"), a.reason


def test_a_shed_for_load_leaves_the_frozen_ceiling_where_heat_put_it() -> None:
    c = ours(default_allowance=12, ceiling=12, app_limited_headroom=0)
    hot = GpuState(SW_THERMAL_SLOWDOWN, 1500.0, MAX_MHZ)
    c.frozen_ceiling = 12  # the card is heating: no growth past 12 for now
    now = 0.0
    for _ in range(120):
        c.step(ControlInput(now, (200.0,), chat_arrivals=1, gpu=hot))
        now += 1.0
    for _ in range(5):  # a burst: shed
        a = c.step(ControlInput(now, (200.0,), chat_arrivals=6, gpu=hot))
        now += 1.0
    assert c.allowance < 6 and a.inputs["chat_surge"]
    assert c.frozen_ceiling == 12
    # a latency cut is news about what the card can do now: that one lowers it
    c.last_cut_s = -math.inf
    c.step(ControlInput(now, (2500.0,) * 5, gpu=hot))
    assert c.frozen_ceiling == c.allowance


def warmed_detector(confirm: int = 1) -> tuple[SurgeDetector, float]:
    """A detector that has seen chat at 1/s for 100 s (in 5-s steps), and the time now."""
    d = SurgeDetector(
        ratio=2.0, window_s=10.0, slow_s=600.0, z=3.0, min_count=6, warmup_s=60.0, confirm=confirm
    )
    t = 0.0
    for _ in range(20):
        t += 5.0
        assert d.add(t, 5, 5.0) is False
    return d, t


def test_surge_detector_ends_only_after_confirmation_too() -> None:
    d, t = warmed_detector(confirm=2)
    d.add(t + 5.0, 20, 5.0)
    assert d.add(t + 10.0, 20, 5.0) is True
    assert d.add(t + 15.0, 20, 5.0) is True
    assert d.add(t + 20.0, 1, 5.0) is True  # one thin count (21 in 10 s): still the surge
    assert d.add(t + 25.0, 2, 5.0) is True  # under 1.5× once (3 in 10 s) ...
    assert d.add(t + 30.0, 5, 5.0) is False  # ... and twice in a row: over


def test_surge_detector_needs_a_large_unlikely_count() -> None:
    d, t = warmed_detector()
    assert d.add(t + 5.0, 9, 5.0) is False  # 14 in 10 s: < 2×10, not a surge
    assert d.add(t + 10.0, 20, 5.0) is True  # 29 in 10 s against 10
    assert d.add(t + 15.0, 5, 5.0) is True  # 25: still over 1.5×
    assert d.add(t + 20.0, 5, 5.0) is False


def test_surge_detector_can_ask_for_confirmation() -> None:
    d, t = warmed_detector(confirm=2)
    assert d.add(t + 5.0, 20, 5.0) is False  # seen once: a chance cluster, maybe
    assert d.add(t + 10.0, 20, 5.0) is True  # seen twice in a row: a surge


def test_surge_detector_waits_for_history() -> None:
    d = SurgeDetector(ratio=2.0, window_s=10.0, slow_s=600.0, z=3.0, min_count=6, warmup_s=60.0)
    assert d.add(5.0, 1, 5.0) is False
    assert d.add(10.0, 30, 5.0) is False  # 20 s of history only


def poisson_surges(
    d: SurgeDetector, rates: list[tuple[float, float]], seed: int
) -> list[tuple[float, bool]]:
    """Feed `d` Poisson arrivals in 5-s steps, at rate r from time t on for each (t, r), up
    to the last t; returns (time, surging) for every step."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out, t = [], 0.0
    while t < rates[-1][0]:
        t += 5.0
        rate = next(r for at, r in reversed(rates) if t > at)
        out.append((t, d.add(t, int(rng.poisson(rate * 5.0)), 5.0)))
    return out


def detector(level_minutes: int) -> SurgeDetector:
    return SurgeDetector(
        ratio=2.0,
        window_s=10.0,
        slow_s=600.0,
        z=3.0,
        min_count=6,
        warmup_s=60.0,
        confirm=3,
        level_minutes=level_minutes,
    )


def test_a_rate_that_steps_up_and_stays_becomes_the_usual_within_minutes() -> None:
    # Chat steps from 0.1 to 0.3/s and then 0.6/s and stays (a team arriving): the slow EWMA
    # lags each step for tens of minutes, and chance clusters over the lagging rate read as
    # surges (team-arrives-long-outputs: 23 sheds); the median of the last five minutes
    # follows a step once it has held for three of them.
    rates = [(0.0, 0.1), (900.0, 0.3), (1800.0, 0.6), (3600.0, 0.6)]

    def settled_surge_s(level_minutes: int) -> float:
        return sum(
            5.0
            for seed in range(20)
            for t, on in poisson_surges(detector(level_minutes), rates, seed)
            if on and (1080.0 <= t < 1800.0 or 1980.0 <= t < 3600.0)
        )

    lagging, following = settled_surge_s(0), settled_surge_s(5)
    assert lagging >= 200.0
    assert following <= lagging / 5


def test_a_burst_of_a_minute_or_two_stays_a_surge_from_start_to_end() -> None:
    # The median of five minutes is not moved by a burst that fills two of them: a 4× burst
    # of 120 s is one surge, seen within seconds of its start and held to near its end.
    for seed in range(10):
        steps = poisson_surges(
            detector(5), [(0.0, 0.35), (600.0, 1.4), (720.0, 0.35), (900.0, 0.35)], seed
        )
        on = [t for t, surging in steps if surging]
        assert 600.0 < on[0] <= 640.0 and on[-1] >= 710.0, (on[0], on[-1])
        assert on == [t for t, _ in steps if on[0] <= t <= on[-1]], "split in two"


def test_the_level_waits_for_its_minutes() -> None:
    d = detector(5)
    for i in range(1, 49):  # four minutes of 1/s
        d.add(5.0 * i, 5, 5.0)
    assert d.level() is None
    for i in range(49, 61):
        d.add(5.0 * i, 5, 5.0)
    assert d.level() == pytest.approx(1.0)


# -- estimators --------------------------------------------------------------------------


def test_log_ewma_p95_of_a_lognormal() -> None:
    e = LogEwma(0.01)
    import random

    rng = random.Random(1)
    for _ in range(20000):
        e.add(math.exp(rng.gauss(math.log(300.0), 0.5)))
    assert e.p95_ms() == pytest.approx(300.0 * math.exp(1.6449 * 0.5), rel=0.08)


def test_rate_ewma_starts_as_a_plain_mean() -> None:
    r = RateEwma(600.0)
    r.add(0, 5.0)
    r.add(10, 5.0)
    assert r.rate == pytest.approx(1.0)


# -- baselines ---------------------------------------------------------------------------


def test_static() -> None:
    a = StaticController(3).step(inp(0.0, 9000.0, allowance=8))
    assert (a.kind, a.allowance_after) == ("cut", 3)


def test_aimd_halves_on_violation_adds_one_otherwise() -> None:
    cfg = ControlConfig(target_p95_ms=T, floor=0, ceiling=10, default_allowance=8)
    c = AimdController(cfg)
    assert c.step(inp(0.0, 1100.0)).allowance_after == 4
    assert c.step(inp(10.0, 500.0)).allowance_after == 5
    assert c.step(inp(20.0)).allowance_after == 5  # no samples: hold
    assert c.step(ControlInput(30.0, (), failed_canaries=1)).allowance_after == 2


def test_exp_avg_matches_the_java_measurement() -> None:
    m = ExpAvg(window=600, warmup=10)
    for x in range(1, 11):
        m.add(float(x))
    assert m.value == pytest.approx(5.5)  # plain mean of the first 10
    m.add(16.5)
    assert m.value == pytest.approx(5.5 * (1 - 2 / 601) + 16.5 * 2 / 601)


def test_gradient2_step_matches_hand_computation() -> None:
    cfg = ControlConfig(target_p95_ms=T, floor=1, ceiling=50, default_allowance=20)
    g = Gradient2Controller(cfg)
    # first window: longRtt = shortRtt = 100 → gradient 1 → 20·0.8 + (20 + 4)·0.2 = 20.8
    a = g.step(ControlInput(0.0, (100.0,) * 10, batch_inflight=20))
    assert g.estimated_limit == pytest.approx(20.8) and a.allowance_after == 20
    # second: short 300, long = mean(100 ×10 windows... ) = (100 + 300)/2 = 200
    g.step(ControlInput(1.0, (300.0,) * 10, batch_inflight=20))
    grad = max(0.5, min(1.0, 200.0 / 300.0))
    expected = 20.8 * 0.8 + (20.8 * grad + 4) * 0.2
    assert g.estimated_limit == pytest.approx(expected)
    # app limited: in-flight under half the limit leaves it alone
    before = g.estimated_limit
    g.step(ControlInput(2.0, (900.0,) * 10, batch_inflight=5))
    assert g.estimated_limit == before


def test_gradient2_waits_for_ten_samples() -> None:
    cfg = ControlConfig(target_p95_ms=T, default_allowance=20)
    g = Gradient2Controller(cfg)
    g.step(ControlInput(0.0, (5000.0,) * 9, batch_inflight=20))
    assert g.estimated_limit == 20.0


# -- configuration and records ------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"target_p95_ms": 0}, "control: target_p95_ms must be > 0 ms, got 0"),
        ({"floor": 5, "ceiling": 2}, "control: need 0 ≤ floor ≤ ceiling, got floor 5, ceiling 2"),
        ({"default_allowance": 99}, "control: default_allowance must be within [0, 64], got 99"),
        (
            {"freeze": "never"},
            "control: freeze must be one of throttled, falling, off, got 'never'",
        ),
        ({"drain_time_s": -1}, "control: drain_time_s must be ≥ 0 s, got -1"),
    ],
)
def test_config_errors_are_one_line(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError) as err:
        ControlConfig(**{"target_p95_ms": T, **changes})  # type: ignore[arg-type]
    assert str(err.value) == message


def test_rows_fit_the_control_actions_table(db: sqlite_utils.Database) -> None:
    migrate(db)
    action = ControlAction(
        ts=10.0,
        allowance_before=8,
        allowance_after=6,
        reason="cut 8 → 6: p95≈1200 ms > 0.9×T",
        inputs={"samples": 5, "gpu": None},
        p95_est_ms=1200.0,
        kind="cut",
    )
    row = action_row(
        action,
        ts=1_700_000_000.0,
        actuator="gateway http://127.0.0.1:8090",
        lease_s=120.0,
        applied=True,
        apply_detail="ok",
    )
    pk = db["control_actions"].insert(row).last_pk
    db["control_actions"].update(
        pk,
        verification_row(
            ts=1_700_000_020.0,
            kind="not_effective",
            detail="x",
            allowance=8,
            inflight=8,
            queued=0,
        ),
    )
    got = db["control_actions"].get(pk)
    assert (got["kind"], got["allowance_after"], got["applied"]) == ("cut", 6, 1)
    assert json.loads(got["inputs"]) == {"samples": 5, "gpu": None}
    assert (got["verify_kind"], got["read_allowance"], got["read_inflight"]) == (
        "not_effective",
        8,
        8,
    )


# -- in the heat lab ----------------------------------------------------------------------


def lab_context() -> ControllerContext:
    return ControllerContext(slo_ttft_ms=1500.0, max_allowance=16, engine_max_running=48)


def test_lab_names_after_register() -> None:
    control_sim.register()
    ctl = make_controller("ours:window_s=30,freeze=off", lab_context())
    assert isinstance(ctl, control_sim.SimController)
    inner = ctl.inner
    assert isinstance(inner, AllowanceController)
    assert (inner.config.window_s, inner.config.freeze, inner.config.ceiling) == (30.0, "off", 48)
    design = make_controller("design", lab_context()).inner  # type: ignore[attr-defined]
    assert (design.config.freeze, design.config.surge_ratio) == ("throttled", 0.0)
    # the engine's slots are known in the lab, but the starting-point law does not use them
    assert design.config.engine_slots == 48
    assert (design.config.slot_reserve, design.config.slot_margin) == (0.0, -1)
    assert isinstance(make_controller("aimd:5", lab_context()), control_sim.SimController)
    assert make_controller("aimd:5", lab_context()).interval_s == 5.0
    # without registration, by import path
    assert isinstance(
        make_controller("llm_watchdog.sim.law:gradient2:8", lab_context()).inner,  # type: ignore[attr-defined]
        Gradient2Controller,
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "ours:bogus=1",
            "controller 'ours': expected key=value pairs of ControlConfig fields, "
            "got 'bogus=1' (e.g. ours:drain_time_s=20,window_s=60)",
        ),
        ("ours:window_s=soon", "controller 'ours': window_s needs a float, got 'soon'"),
        (
            "ours:floor=99",
            "controller 'ours': control: need 0 ≤ floor ≤ ceiling, got floor 99, ceiling 48",
        ),
        ("aimd:-1", "controller 'aimd' takes an interval in seconds, e.g. aimd:10, got '-1'"),
    ],
)
def test_lab_argument_errors_are_one_line(spec: str, message: str) -> None:
    control_sim.register()
    with pytest.raises(ControllerError) as err:
        make_controller(spec, lab_context())
    assert str(err.value) == message


def test_closed_loop_in_virtual_time_keeps_chat_within_target() -> None:
    """15 simulated minutes of the workstation with its batch job: uncapped, chat misses its
    target in the chat burst; ours cuts, keeps it, and still runs batch."""
    s = load_scenario("workstation")
    free = run_virtual(s, 1080.0, "none", warmup_s=120.0)
    ctl = control_sim.ours(None, lab_context())
    r = run_virtual(s, 1080.0, ctl, warmup_s=120.0)
    assert free.slo_attainment is not None and free.slo_attainment < 0.95
    assert r.slo_attainment == 1.0
    assert r.batch_tokens_per_s > 0.5 * free.batch_tokens_per_s
    kinds = {a.kind for a in ctl.actions}
    assert {"grow", "cut"} <= kinds
    assert all(a.reason.count("\n") == 0 for a in ctl.actions)


def test_growth_stops_under_the_slots_chat_has_held_lately() -> None:
    # With `slot_peak_s` set (it is off by default). Chat usually holds 2 of 32 slots and
    # now and then 8: the burst reserve (32 − ⌈3 × 2⌉)
    # would let batch grow to 26, which the slot cut (32 − 4 − 8 = 20) takes back at each
    # peak, and growth regrows: a change every peak. Growth stops at the line instead.
    def run(**changes: object) -> tuple[int, int, AllowanceController]:
        c = ours(default_allowance=10, engine_slots=32, app_limited_headroom=0, **changes)
        level, changed, cuts = 10, 0, 0
        for now in range(0, 1800):
            chat = 8 if now % 60 < 4 else 2  # a peak of 4 s a minute: 7 % of the time
            a = c.step(ControlInput(float(now), (200.0,), chat_inflight=chat, batch_inflight=level))
            if now >= 600:  # the last 20 minutes
                changed += a.allowance_after != level
                cuts += a.kind == "cut"
            level = a.allowance_after
        return changed, cuts, c

    changed, cuts, c = run(slot_peak_s=600.0)
    assert (changed, cuts) == (0, 0)
    assert c.allowance == 20
    assert c.step(ControlInput(1800.0, (200.0,), chat_inflight=2, batch_inflight=20)).reason == (
        "hold 20: p95≈200 ms low, held at the engine's slots chat has held lately"
    )
    changed, cuts, _ = run()  # the rule off: a cut and a regrow a minute
    assert cuts >= 15 and changed >= 30


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("slot_peak_s", -1.0, "slot_peak_s must be ≥ 0 s (0: off), got -1.0"),
        ("slot_peak_quantile", 0.0, "slot_peak_quantile must be in (0, 1], got 0.0"),
        ("slot_peak_quantile", 1.5, "slot_peak_quantile must be in (0, 1], got 1.5"),
    ],
)
def test_the_slot_peak_settings_are_checked(field: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        ControlConfig(target_p95_ms=2000.0, **{field: value})


def _cliff(
    c: AllowanceController, start: float, end: float, level: int, gpu: GpuState | None = None
) -> tuple[int, int]:
    """Chat at 300 ms while at most 10 batch requests run, 1500 ms (over T) past that; five
    answers a second. Returns (cuts, the allowance at the end)."""
    cuts = 0
    for now in range(int(start), int(end)):
        ms = 300.0 if level <= 10 else 1500.0
        a = c.step(inp(float(now), ms, batch_inflight=level, gpu=gpu))
        cuts += a.kind in ("cut", "halve")
        level = a.allowance_after
    return cuts, level


def test_a_latency_cut_holds_growth_under_what_ran_when_chat_slowed() -> None:
    # Without the memory, the law regrows into the level that slowed chat a couple of minutes
    # after each cut, and each time chat slows again. With it, it stays one under: the first
    # two minutes find the cliff (13, 12, 11 fail in turn), then ten minutes without a cut.
    c = ours(
        cut_memory_s=600.0, cut_memory_hot_only=False, app_limited_headroom=0, grow_to_demand=False
    )
    _, level = _cliff(c, 0, 120, 8)
    assert c.failed is not None and c.failed[0] == 11
    cuts, level = _cliff(c, 120, 660, level)
    assert (cuts, level) == (0, 10)
    a = c.step(inp(660.0, 300.0, batch_inflight=10))
    assert (
        a.reason
        == "hold 10: p95≈300 ms low, held at one under the 11 batch requests chat slowed at"
    )
    # Ten minutes after the last cut the memory lapses, and growth probes again.
    cuts, _ = _cliff(c, 661, 800, 10)
    assert cuts >= 1
    off = ours(cut_memory_s=0.0, app_limited_headroom=0, grow_to_demand=False)
    _, level = _cliff(off, 0, 120, 8)
    cuts, _ = _cliff(off, 120, 660, level)
    assert cuts >= 10


def test_the_cut_memory_lapses_once_the_card_is_cooler() -> None:
    hot = GpuState(SW_THERMAL_SLOWDOWN, 1500.0, MAX_MHZ, temp_c=88.0, temp_slowdown_c=90.0)
    warm = GpuState(0, 1900.0, MAX_MHZ, temp_c=80.0, temp_slowdown_c=90.0)  # no bit: cooler
    c = ours(cut_memory_s=3600.0, cut_memory_hot_only=False, app_limited_headroom=0)
    _, level = _cliff(c, 0, 600, 8, gpu=hot)
    assert level == 10 and c.failed is not None and c.failed[0] == 11
    # Still hot: held. Cooler: the memory is gone and growth probes past it again.
    cuts, level = _cliff(c, 600, 900, level, gpu=hot)
    assert (cuts, level) == (0, 10)
    cuts, _ = _cliff(c, 900, 1200, level, gpu=warm)
    assert cuts >= 1


def test_by_default_the_cut_memory_is_for_heat_only() -> None:
    hot = GpuState(SW_THERMAL_SLOWDOWN, 1500.0, MAX_MHZ, temp_c=88.0, temp_slowdown_c=90.0)
    cool = GpuState(0, 1950.0, MAX_MHZ, temp_c=60.0, temp_slowdown_c=90.0)
    c = ours(app_limited_headroom=0, grow_to_demand=False)
    assert (c.config.cut_memory_s, c.config.cut_memory_hot_only) == (1200.0, True)
    # A cool card's cuts teach nothing: it regrows into the cliff each time.
    cuts, _ = _cliff(c, 0, 600, 8, gpu=cool)
    assert c.failed is None and cuts >= 10
    # A cut under a thermal slowdown bit is remembered, until the bit clears.
    c = ours(app_limited_headroom=0, grow_to_demand=False)
    cuts, level = _cliff(c, 0, 600, 8, gpu=hot)
    assert c.failed is not None and level == 10 and cuts <= 3
    a = c.step(inp(600.0, 300.0, batch_inflight=10, gpu=cool))
    assert c.failed is None and a.allowance_after > 10  # the bit cleared: forgotten


def test_the_cut_memory_setting_is_checked() -> None:
    with pytest.raises(ValueError, match=re.escape("cut_memory_s must be ≥ 0 s, got -1.0")):
        ControlConfig(target_p95_ms=2000.0, cut_memory_s=-1.0)


def _fall(
    c: AllowanceController, clocks: list[float], reasons: int, start: float = 0.0
) -> list[ControlAction]:
    """One step a second at each busy clock (MHz) in turn, chat at 300 ms (well under T),
    batch running what the law allows."""
    out, level = [], c.allowance
    for i, mhz in enumerate(clocks):
        gpu = GpuState(reasons, mhz, MAX_MHZ)
        a = c.step(inp(start + i, 300.0, batch_inflight=level, gpu=gpu))
        out.append(a)
        level = a.allowance_after
    return out


def test_a_deep_clock_fall_under_heat_cuts_before_chat_slows() -> None:
    # A card at its target temperature (slowdown bit set, clock steady at 0.95) whose fans
    # stall: the clock falls to 0.4 in seconds. Chat has not slowed yet; what runs is cut by
    # as much as the clock fell, once.
    c = ours(grow_to_demand=False, app_limited_headroom=0)
    steady = _fall(c, [1900.0] * 60, SW_THERMAL_SLOWDOWN)
    level = steady[-1].allowance_after
    assert all(a.kind not in ("cut", "halve") for a in steady)
    falling = _fall(c, [1700.0, 1400.0, 1100.0, 800.0] + [800.0] * 60, SW_THERMAL_SLOWDOWN, 60)
    cuts = [a for a in falling if a.kind in ("cut", "halve")]
    assert len(cuts) == 1
    cut = cuts[0]
    # 800 / 1900 = 0.42 of the minute's busiest: 0.42 × what ran, rounded down
    assert cut.allowance_before == level
    assert cut.allowance_after == math.floor(level * 800.0 / 1900.0)
    assert cut.reason == (
        f"cut {level} → {cut.allowance_after}: the clock fell to 0.42 of its busiest in the "
        "last minute under a thermal slowdown: what runs cut by as much, before chat shows it"
    )
    # It counts as a latency cut under heat: growth stays under what ran while the bit holds.
    assert c.failed is not None and c.failed[0] == level
    assert max(a.allowance_after for a in falling[falling.index(cut) :]) < level


def test_a_clock_fall_that_is_shallow_or_not_thermal_cuts_nothing() -> None:
    def cuts(clocks: list[float], reasons: int, **changes: object) -> int:
        c = ours(grow_to_demand=False, app_limited_headroom=0, **changes)
        acts = _fall(c, [1900.0] * 60 + clocks + [clocks[-1]] * 30, reasons)
        return sum(a.kind in ("cut", "halve") for a in acts)

    deep = [1700.0, 1400.0, 1100.0, 800.0]
    assert cuts(deep, SW_THERMAL_SLOWDOWN) == 1
    # a power cap pulls the clock for a reason the card's heat does not explain
    assert cuts(deep, SW_POWER_CAP) == 0
    # a dip to 0.63 of the busiest clock (a long prefill's, a bin or two of heat)
    assert cuts([1600.0, 1300.0, 1200.0], SW_THERMAL_SLOWDOWN) == 0
    # off
    assert cuts(deep, SW_THERMAL_SLOWDOWN, clock_fall_cut=0.0) == 0


@pytest.mark.parametrize("value", [1.0, -0.1])
def test_the_clock_fall_setting_is_checked(value: float) -> None:
    with pytest.raises(
        ValueError, match=re.escape(f"clock_fall_cut must be in [0, 1) (0: off), got {value}")
    ):
        ControlConfig(target_p95_ms=2000.0, clock_fall_cut=value)


@pytest.mark.parametrize("slots", [0, 1, 2, 4, 7, 8, 16, 31, 32, 33, 64, 128, 256])
def test_the_laws_slot_line_is_the_gateways(slots: int) -> None:
    from llm_watchdog.gateway.config import slot_line

    law = ControlConfig(target_p95_ms=1000.0, engine_slots=slots).slot_line
    assert law == (slot_line(slots) if slots else 0)
    # A smaller margin keeps fewer, never more; -1 keeps none.
    assert ControlConfig(target_p95_ms=1000.0, engine_slots=slots, slot_margin=1).slot_line >= law
    assert (
        ControlConfig(target_p95_ms=1000.0, engine_slots=slots, slot_margin=-1).slot_line == slots
    )


# -- the surge gate (surge_shed_gate, surge_gate_minutes: off by default) ----------------------


def stepped_chat(gate: float, cluster: int, slow: float | None = None) -> ControlAction:
    """Ten minutes of chat at 1/s, five at 2/s (it stepped up and stays), then a 10-s
    cluster of `cluster` arrivals, all fast but for one `slow` answer if given. Returns the
    decision at the cluster's second half."""
    c = ours(
        default_allowance=12,
        ceiling=12,
        app_limited_headroom=0,
        surge_confirm=1,
        surge_shed_gate=gate,
        surge_gate_minutes=5 if gate else 0,
    )
    now = 0.0
    for per_5s, steps in ((5, 120), (10, 60)):
        for _ in range(steps):
            c.step(ControlInput(now, (200.0,) * per_5s, allowance=12))
            now += 5.0
    half = cluster // 2
    c.step(ControlInput(now, (200.0,) * half, allowance=12))
    answers = (200.0,) * (cluster - half - 1) + ((slow,) if slow is not None else (200.0,))
    return c.step(ControlInput(now + 5.0, answers, allowance=12))


def test_a_cluster_over_a_lagging_usual_rate_sheds_without_the_gate() -> None:
    # 30 in 10 s is over 2× the EWMA (still near 1.4/s), not over 2× the 5-minute median (2/s)
    a = stepped_chat(0.0, 30)
    assert a.kind == "cut" and a.reason.endswith("shed batch ahead of the queue")


def test_the_gate_holds_a_step_cluster_that_chat_meets_fast() -> None:
    a = stepped_chat(0.5, 30)
    assert (a.kind, a.allowance_after) == ("hold", 12)
    assert a.reason == "hold 12: chat still arriving faster than usual: no probing upward"
    assert a.inputs["chat_surge"] >= 2.0  # a surge all the same: no growth into it


def test_the_gate_sheds_once_an_answer_of_the_cluster_slows() -> None:
    a = stepped_chat(0.5, 30, slow=600.0)  # over 0.5 T
    assert a.kind == "cut" and a.reason.endswith("shed batch ahead of the queue")


def test_the_gate_never_holds_a_burst_over_the_recent_minutes() -> None:
    a = stepped_chat(0.5, 50)  # over 2× the median too: a burst, shed at once
    assert a.kind == "cut" and a.reason.endswith("shed batch ahead of the queue")
