"""A simulated GPU: heat, fan, power, GPU Boost clocks and NVML's clock-event reasons.

Pure: `SimGpu.step(dt_s, load)` moves the card `dt_s` seconds forward under a load; time is a
value passed in, never read from a clock. What is modelled, and why that way:

- Heat: one thermal mass behind one thermal resistance (first-order RC), C·dT/dt = P −
  (T − T_ambient)/R. The steady state is T_ambient + R·P and a step settles to 63 % of it
  after τ = R·C. Each sub-step is integrated exactly (exponential), so large steps stay stable.
- Fan: a piecewise-linear curve temperature → fan %, and R falls linearly from
  `thermal_resistance_fan_min_c_per_w` at the curve's lowest speed to
  `thermal_resistance_c_per_w` at 100 %. C is fixed, so τ shortens as the fan speeds up.
- Power: P = P_idle + (P_max − P_idle)·load·(f/f_max)·(V(f)/V_max)², the usual CMOS dynamic
  power ∝ f·V², with V linear in f from `voltage_min_ratio`·V_max at the min clock.
- Clocks (GPU Boost): below `boost_temp_c` the card runs its max boost clock; above it the
  clock drops one `clock_bin_mhz` bin per `boost_bin_step_c` degrees, down to the base clock,
  with no reason bit (real cards do the same: a boost bin lost to temperature is not a
  "throttle"). Then, in NVML's terms (nvml.h, nvmlClocksEventReason*):
  * SwThermalSlowdown (0x20): above the target temperature (`temp_target_c`, NVML's
    ACOUSTIC_CURR, where set) or GPU_MAX (`temp_max_operating_c`), whichever is lower, the
    driver lowers a clock ceiling at `sw_slowdown_slew_mhz_per_s` until the temperature stops
    rising past it; the ceiling rises again only below that − `sw_slowdown_hysteresis_c`.
  * HwThermalSlowdown (0x40) and HwSlowdown (0x8): at SLOWDOWN (`temp_slowdown_c`) the
    hardware cuts the clock by `hw_slowdown_clock_ratio` ("a factor of 2 or more") until the
    temperature falls below SLOWDOWN − `hw_slowdown_hysteresis_c`.
  * SwPowerCap (0x4): the highest clock bin whose power fits the enforced limit.
  * HwPowerBrakeSlowdown (0x80) with HwSlowdown: an external power brake (set from a
    scenario's schedule) pins the min clock.
  * GpuIdle (0x1): no work; the card drops to its idle clock and P8.
- Violation counters: thermal (0x20|0x40) and power (0x4|0x80) time accumulates in ns, as
  nvmlDeviceGetViolationStatus reports it.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from llm_watchdog.sim.scenario import GpuParams

# nvml.h clock-event reason bits (the same values as pynvml.nvmlClocksEventReason*)
GPU_IDLE = 0x1
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SW_THERMAL_SLOWDOWN = 0x20
HW_THERMAL_SLOWDOWN = 0x40
HW_POWER_BRAKE_SLOWDOWN = 0x80
THERMAL_BITS = SW_THERMAL_SLOWDOWN | HW_THERMAL_SLOWDOWN
POWER_BITS = SW_POWER_CAP | HW_POWER_BRAKE_SLOWDOWN
THROTTLE_BITS = THERMAL_BITS | POWER_BITS | HW_SLOWDOWN

PSTATE_BUSY = 0
PSTATE_IDLE = 8
MAX_SUBSTEP_S = 0.25  # the clock controllers react within this; exact thermal within a step
UTIL_WINDOW_S = 1.0  # NVML utilisation is a share of "the past sample period" (1/6 s .. 1 s)


@dataclass(frozen=True)
class GpuSnapshot:
    """What NVML would read right now."""

    temp_c: float
    sm_clock_mhz: float
    sm_clock_active_mhz: float  # the clock a kernel would run at now (also when idle)
    mem_clock_mhz: float
    power_w: float
    power_limit_w: float
    fan_pct: float
    util_gpu_pct: float
    util_mem_pct: float
    pstate: int
    reasons: int
    thermal_violation_ns: int
    power_violation_ns: int
    energy_mj: int
    ambient_c: float


class SimGpu:
    """One simulated card. Mutable state; all change goes through `step`."""

    def __init__(self, params: GpuParams) -> None:
        self.p = params
        self.ambient_c = params.ambient_c
        self.power_limit_w = params.power_limit_w
        self.power_brake = False
        self.temp_c = (
            params.initial_temp_c if params.initial_temp_c is not None else (params.ambient_c)
        )
        # C from τ at full fan: τ = R_full · C
        self.heat_capacity_j_per_c = (
            params.thermal_time_constant_s / params.thermal_resistance_c_per_w
        )
        # sub-steps short next to τ, so a compressed lab (τ of seconds) stays as smooth
        self._max_substep_s = min(MAX_SUBSTEP_S, params.thermal_time_constant_s / 200.0)
        self.sw_ceiling_mhz = params.sm_clock_max_mhz
        self.sw_active = False
        self.hw_active = False
        self.load = 0.0
        self.last_busy_load = 1.0
        self.sm_clock_mhz = params.sm_clock_idle_mhz
        self.sm_clock_active_mhz = params.sm_clock_max_mhz
        self.power_w = params.power_idle_w
        self.fan_pct = self.fan_for(self.temp_c)
        self.reasons = GPU_IDLE
        self.util_busy = 0.0  # share of the last UTIL_WINDOW_S with work
        self.util_load = 0.0
        self.thermal_violation_ns = 0
        self.power_violation_ns = 0
        self.throttled_ns = 0  # any thermal or power reason, counted once
        self.energy_j = 0.0
        self.elapsed_s = 0.0

    # -- physics ----------------------------------------------------------------------------

    def fan_for(self, temp_c: float) -> float:
        pts = self.p.fan_curve_c_pct
        if temp_c <= pts[0][0]:
            return pts[0][1]
        for (t0, f0), (t1, f1) in itertools.pairwise(pts):
            if temp_c <= t1:
                return f0 + (f1 - f0) * (temp_c - t0) / (t1 - t0)
        return pts[-1][1]

    def resistance_for(self, fan_pct: float) -> float:
        lo = self.p.fan_curve_c_pct[0][1]
        if lo >= 100.0:
            return self.p.thermal_resistance_c_per_w
        share = min(1.0, max(0.0, (fan_pct - lo) / (100.0 - lo)))
        r_min_fan, r_full = (
            self.p.thermal_resistance_fan_min_c_per_w,
            self.p.thermal_resistance_c_per_w,
        )
        return r_min_fan + (r_full - r_min_fan) * share

    def power_at(self, clock_mhz: float, load: float) -> float:
        p = self.p
        if load <= 0.0:
            return p.power_idle_w
        f_ratio = clock_mhz / p.sm_clock_max_mhz
        span = max(p.sm_clock_max_mhz - p.sm_clock_min_mhz, 1e-9)
        v_ratio = p.voltage_min_ratio + (1.0 - p.voltage_min_ratio) * max(
            0.0, (clock_mhz - p.sm_clock_min_mhz) / span
        )
        return p.power_idle_w + (p.power_max_w - p.power_idle_w) * load * f_ratio * v_ratio**2

    def boost_clock(self, temp_c: float) -> float:
        p = self.p
        if temp_c < p.boost_temp_c:
            return p.sm_clock_max_mhz
        bins = math.floor((temp_c - p.boost_temp_c) / p.boost_bin_step_c) + 1
        return max(p.sm_clock_base_mhz, p.sm_clock_max_mhz - bins * p.clock_bin_mhz)

    def _bin(self, clock_mhz: float) -> float:
        """Round down to a clock bin counted from the max clock."""
        p = self.p
        n = math.ceil((p.sm_clock_max_mhz - clock_mhz) / p.clock_bin_mhz - 1e-9)
        return max(p.sm_clock_min_mhz, p.sm_clock_max_mhz - n * p.clock_bin_mhz)

    def _clock(self, load: float) -> tuple[float, int]:
        """The clock a kernel runs at now, and the reason bits holding it down."""
        p = self.p
        reasons = 0
        clock = self.boost_clock(self.temp_c)
        if self.sw_ceiling_mhz < clock:
            clock = self.sw_ceiling_mhz
            reasons |= SW_THERMAL_SLOWDOWN
        if self.hw_active:
            clock = min(clock, p.sm_clock_max_mhz * p.hw_slowdown_clock_ratio)
            reasons |= HW_THERMAL_SLOWDOWN | HW_SLOWDOWN
        if self.power_brake:
            clock = p.sm_clock_min_mhz
            reasons |= HW_POWER_BRAKE_SLOWDOWN | HW_SLOWDOWN
        clock = self._bin(clock)
        # Idle: the cap is judged at the last working load, so the clock a new kernel gets
        # is the one the power controller would allow it.
        load = load if load > 0 else self.last_busy_load
        if self.power_at(clock, load) <= self.power_limit_w:
            return clock, reasons
        # P rises with f, so the highest bin that fits is found by bisection over bins.
        lo, hi = 0, round((clock - p.sm_clock_min_mhz) / p.clock_bin_mhz)  # bins below `clock`
        while lo < hi:
            mid = (lo + hi) // 2
            if self.power_at(clock - mid * p.clock_bin_mhz, load) <= self.power_limit_w:
                hi = mid
            else:
                lo = mid + 1
        return max(p.sm_clock_min_mhz, clock - lo * p.clock_bin_mhz), reasons | SW_POWER_CAP

    def _thermal_controllers(self, dt_s: float) -> None:
        p = self.p
        t = self.temp_c
        hold = p.sw_hold_c
        if t > hold:
            self.sw_active = True
            floor = p.sm_clock_min_mhz
            self.sw_ceiling_mhz = max(
                floor, self.sw_ceiling_mhz - p.sw_slowdown_slew_mhz_per_s * dt_s
            )
        elif self.sw_active and t < hold - p.sw_slowdown_hysteresis_c:
            self.sw_ceiling_mhz += p.sw_slowdown_slew_mhz_per_s * dt_s
            if self.sw_ceiling_mhz >= p.sm_clock_max_mhz:
                self.sw_ceiling_mhz = p.sm_clock_max_mhz
                self.sw_active = False
        if t >= p.temp_slowdown_c:
            self.hw_active = True
        elif self.hw_active and t < p.temp_slowdown_c - p.hw_slowdown_hysteresis_c:
            self.hw_active = False

    def step(self, dt_s: float, load: float, busy_fraction: float | None = None) -> None:
        """Advance `dt_s` seconds under `load` (0 = idle .. 1 = full).

        busy_fraction: the share of the interval with any work (default: 1 when load > 0),
        for utilisation and the idle state.
        """
        if dt_s <= 0:
            return
        load = min(1.0, max(0.0, load))
        busy = (1.0 if load > 0 else 0.0) if busy_fraction is None else busy_fraction
        n = max(1, math.ceil(dt_s / self._max_substep_s))
        h = dt_s / n
        for _ in range(n):
            self._substep(h, load, busy)

    def _substep(self, h: float, load: float, busy: float) -> None:
        p = self.p
        self._thermal_controllers(h)
        active_clock, reasons = self._clock(load)
        self.sm_clock_active_mhz = active_clock
        if busy <= 0.0:
            clock = p.sm_clock_idle_mhz
            power = p.power_idle_w
            reasons = (reasons & (THERMAL_BITS | HW_SLOWDOWN | HW_POWER_BRAKE_SLOWDOWN)) | GPU_IDLE
        else:
            clock = active_clock
            power = self.power_at(clock, load)
        self.fan_pct = self.fan_for(self.temp_c)
        r = self.resistance_for(self.fan_pct)
        tau = r * self.heat_capacity_j_per_c
        t_ss = self.ambient_c + r * power
        self.temp_c = t_ss + (self.temp_c - t_ss) * math.exp(-h / tau)
        if reasons & THERMAL_BITS:
            self.thermal_violation_ns += round(h * 1e9)
        if reasons & POWER_BITS:
            self.power_violation_ns += round(h * 1e9)
        if reasons & THROTTLE_BITS:
            self.throttled_ns += round(h * 1e9)
        a = 1.0 - math.exp(-h / UTIL_WINDOW_S)
        self.util_busy += (busy - self.util_busy) * a
        self.util_load += (load - self.util_load) * a
        self.sm_clock_mhz = clock
        self.power_w = power
        self.load = load
        if load > 0:
            self.last_busy_load = load
        self.reasons = reasons
        self.energy_j += power * h
        self.elapsed_s += h

    # -- reading ------------------------------------------------------------------------------

    def snapshot(self) -> GpuSnapshot:
        p = self.p
        idle = bool(self.reasons & GPU_IDLE)
        return GpuSnapshot(
            temp_c=self.temp_c,
            sm_clock_mhz=self.sm_clock_mhz,
            sm_clock_active_mhz=self.sm_clock_active_mhz,
            mem_clock_mhz=p.mem_clock_idle_mhz if idle else p.mem_clock_max_mhz,
            power_w=self.power_w,
            power_limit_w=self.power_limit_w,
            fan_pct=self.fan_pct,
            util_gpu_pct=100.0 * self.util_busy,
            util_mem_pct=p.mem_util_full_load_pct * self.util_load,
            pstate=PSTATE_IDLE if idle else PSTATE_BUSY,
            reasons=self.reasons,
            thermal_violation_ns=self.thermal_violation_ns,
            power_violation_ns=self.power_violation_ns,
            energy_mj=round(self.energy_j * 1000.0),
            ambient_c=self.ambient_c,
        )
