"""The simulated card's physics, asserted qualitatively (watchdog/sim/gpu.py)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from llm_watchdog.sim.gpu import (
    GPU_IDLE,
    HW_POWER_BRAKE_SLOWDOWN,
    HW_SLOWDOWN,
    HW_THERMAL_SLOWDOWN,
    PSTATE_IDLE,
    SW_POWER_CAP,
    SW_THERMAL_SLOWDOWN,
    SimGpu,
)
from llm_watchdog.sim.scenario import GpuParams, load_scenario

# A card whose heat path is one fixed RC: the fan never changes R, no boost bin is lost, no
# threshold or power limit is reached. Its temperature must follow T∞ + (T0 − T∞)·e^(−t/τ).
RC_ONLY = GpuParams(
    ambient_c=25.0,
    thermal_resistance_c_per_w=0.2,
    thermal_resistance_fan_min_c_per_w=0.2,
    thermal_time_constant_s=100.0,
    fan_curve_c_pct=((0.0, 100.0),),
    power_idle_w=30.0,
    power_max_w=250.0,
    power_limit_w=400.0,
    boost_temp_c=200.0,
    temp_max_operating_c=200.0,
    temp_slowdown_c=210.0,
    temp_shutdown_c=220.0,
)


def heat(gpu: SimGpu, seconds: float, load: float, dt: float = 1.0) -> None:
    for _ in range(round(seconds / dt)):
        gpu.step(dt, load)


def test_temperature_reaches_63_percent_of_its_step_after_one_time_constant() -> None:
    gpu = SimGpu(RC_ONLY)
    t_inf = RC_ONLY.ambient_c + RC_ONLY.thermal_resistance_c_per_w * RC_ONLY.power_max_w
    heat(gpu, RC_ONLY.thermal_time_constant_s, 1.0)
    share = (gpu.temp_c - RC_ONLY.ambient_c) / (t_inf - RC_ONLY.ambient_c)
    assert share == pytest.approx(0.632, abs=0.01)
    heat(gpu, 4 * RC_ONLY.thermal_time_constant_s, 1.0)
    share = (gpu.temp_c - RC_ONLY.ambient_c) / (t_inf - RC_ONLY.ambient_c)
    assert share == pytest.approx(1 - math.exp(-5), abs=0.003)  # after 5 τ
    assert gpu.power_w == pytest.approx(RC_ONLY.power_max_w)


def test_one_large_step_matches_many_small_ones() -> None:
    a, b = SimGpu(RC_ONLY), SimGpu(RC_ONLY)
    a.step(300.0, 1.0)
    heat(b, 300.0, 1.0, dt=0.05)
    assert a.temp_c == pytest.approx(b.temp_c, abs=0.05)


def test_a_faster_fan_cools_to_a_lower_steady_state() -> None:
    weak = dataclasses.replace(
        RC_ONLY, fan_curve_c_pct=((0.0, 30.0),), thermal_resistance_fan_min_c_per_w=0.3
    )
    slow_fan, full_fan = SimGpu(weak), SimGpu(RC_ONLY)
    heat(slow_fan, 2000, 1.0, dt=5)
    heat(full_fan, 2000, 1.0, dt=5)
    assert slow_fan.fan_pct == 30.0 and full_fan.fan_pct == 100.0
    assert slow_fan.temp_c > full_fan.temp_c + 15


def consumer() -> GpuParams:
    return load_scenario("consumer-warm-room").gpu


def test_boost_bins_step_down_with_temperature_without_a_reason_bit() -> None:
    p = consumer()
    gpu = SimGpu(dataclasses.replace(p, initial_temp_c=p.boost_temp_c + 2 * p.boost_bin_step_c + 1))
    gpu.step(0.05, 0.3)
    assert gpu.sm_clock_mhz == p.sm_clock_max_mhz - 3 * p.clock_bin_mhz
    assert gpu.reasons == 0
    cool = SimGpu(dataclasses.replace(p, initial_temp_c=30.0))
    cool.step(0.05, 0.3)
    assert cool.sm_clock_mhz == p.sm_clock_max_mhz


def test_clocks_fall_past_gpu_max_and_recover_only_below_the_hysteresis_band() -> None:
    p = consumer()
    gpu = SimGpu(p)
    heat(gpu, 900, 0.85)
    assert gpu.temp_c > p.temp_max_operating_c - p.sw_slowdown_hysteresis_c
    assert gpu.reasons & SW_THERMAL_SLOWDOWN
    throttled_mhz = gpu.sm_clock_mhz
    assert throttled_mhz < gpu.boost_clock(gpu.temp_c) - 100
    assert gpu.thermal_violation_ns > 0
    # the room cools a little: inside the band the ceiling holds
    gpu.ambient_c = p.ambient_c - 4
    band_low = p.temp_max_operating_c - p.sw_slowdown_hysteresis_c
    while gpu.temp_c > band_low + 0.3:
        gpu.step(1.0, 0.85)
        if gpu.temp_c < p.temp_max_operating_c:
            assert gpu.sm_clock_mhz <= throttled_mhz
    # much cooler air: below the band the clock climbs back and the bit clears
    gpu.ambient_c = 5.0
    heat(gpu, 900, 0.85)
    assert gpu.temp_c < band_low
    assert not gpu.reasons & SW_THERMAL_SLOWDOWN
    assert gpu.sm_clock_mhz >= gpu.boost_clock(gpu.temp_c) - p.clock_bin_mhz
    assert gpu.sm_clock_mhz > throttled_mhz + 200


def test_hardware_slowdown_halves_the_clock_and_releases_with_hysteresis() -> None:
    # no software slowdown and hot air: the card cycles between SLOWDOWN and the release point
    p = dataclasses.replace(
        consumer(),
        sw_slowdown_slew_mhz_per_s=0.0,
        ambient_c=45.0,
        thermal_resistance_c_per_w=0.25,
        thermal_resistance_fan_min_c_per_w=0.3,
    )
    gpu = SimGpu(p)
    heat(gpu, 1200, 1.0)
    release = p.temp_slowdown_c - p.hw_slowdown_hysteresis_c
    engaged_at, released_at, in_band = [], [], set()
    was = bool(gpu.reasons & HW_THERMAL_SLOWDOWN)
    for _ in range(int(600 / 0.05)):
        before = gpu.temp_c
        gpu.step(0.05, 1.0)
        now = bool(gpu.reasons & HW_THERMAL_SLOWDOWN)
        if now:
            assert gpu.reasons & HW_SLOWDOWN
            assert gpu.sm_clock_mhz <= p.sm_clock_max_mhz * p.hw_slowdown_clock_ratio
        if now and not was:
            engaged_at.append(before)
        if was and not now:
            released_at.append(before)
        if release + 0.5 < gpu.temp_c < p.temp_slowdown_c - 0.5:
            in_band.add(now)
        was = now
    assert engaged_at and released_at
    assert min(engaged_at) >= p.temp_slowdown_c - 0.1
    assert max(released_at) <= release + 0.1
    assert in_band == {True, False}  # between the two points it depends on where it came from


def test_power_cap_trims_the_clock_to_the_limit_and_sets_sw_power_cap() -> None:
    p = dataclasses.replace(consumer(), power_limit_w=200.0, initial_temp_c=40.0)
    gpu = SimGpu(p)
    gpu.step(0.5, 1.0)
    assert gpu.reasons & SW_POWER_CAP
    assert gpu.power_w <= 200.0
    assert (
        gpu.power_at(gpu.sm_clock_mhz + p.clock_bin_mhz, 1.0) > 200.0
    )  # the highest bin that fits
    assert gpu.power_violation_ns > 0 and gpu.thermal_violation_ns == 0
    light = SimGpu(p)
    light.step(0.5, 0.2)
    assert not light.reasons & SW_POWER_CAP


def test_idle_card_reports_gpu_idle_p8_and_idle_clocks() -> None:
    p = consumer()
    gpu = SimGpu(p)
    gpu.step(2.0, 0.0)
    snap = gpu.snapshot()
    assert snap.reasons == GPU_IDLE
    assert snap.pstate == PSTATE_IDLE
    assert snap.sm_clock_mhz == p.sm_clock_idle_mhz
    assert snap.power_w == p.power_idle_w
    assert snap.util_gpu_pct < 1
    assert snap.sm_clock_active_mhz > p.sm_clock_base_mhz  # what the next kernel would get


def test_power_brake_pins_the_min_clock() -> None:
    gpu = SimGpu(consumer())
    gpu.power_brake = True
    gpu.step(1.0, 0.8)
    assert gpu.reasons & HW_POWER_BRAKE_SLOWDOWN and gpu.reasons & HW_SLOWDOWN
    assert gpu.sm_clock_mhz == consumer().sm_clock_min_mhz
    assert gpu.power_violation_ns > 0


def test_utilisation_follows_the_busy_share() -> None:
    gpu = SimGpu(consumer())
    for _ in range(100):
        gpu.step(0.1, 0.6, busy_fraction=0.5)
    assert gpu.snapshot().util_gpu_pct == pytest.approx(50, abs=3)
