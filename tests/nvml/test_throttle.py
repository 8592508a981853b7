from __future__ import annotations

import pynvml
import pytest

from llm_watchdog.nvml import throttle

# (bit, name, thermal, power, throttled)
BITS = [
    (0x1, "gpu_idle", False, False, False),
    (0x2, "applications_clocks_setting", False, False, False),
    (0x4, "sw_power_cap", False, True, True),
    (0x8, "hw_slowdown", True, False, True),
    (0x10, "sync_boost", False, False, False),
    (0x20, "sw_thermal_slowdown", True, False, True),
    (0x40, "hw_thermal_slowdown", True, False, True),
    (0x80, "hw_power_brake_slowdown", False, True, True),
    (0x100, "display_clock_setting", False, False, False),
]


@pytest.mark.parametrize(("bit", "name", "thermal", "power", "throttled"), BITS)
def test_each_bit(bit: int, name: str, thermal: bool, power: bool, throttled: bool) -> None:
    assert throttle.reason_names(bit) == [name]
    assert throttle.is_thermal(bit) is thermal
    assert throttle.is_power(bit) is power
    assert throttle.is_throttled(bit) is throttled


def test_bit_values_match_the_nvml_binding() -> None:
    # nvidia-ml-py copies nvml.h's nvmlClocksEventReason* values; ours must agree.
    pairs = {
        "GpuIdle": throttle.GPU_IDLE,
        "ApplicationsClocksSetting": throttle.APPLICATIONS_CLOCKS_SETTING,
        "SwPowerCap": throttle.SW_POWER_CAP,
        "HwSlowdown": throttle.HW_SLOWDOWN,
        "SyncBoost": throttle.SYNC_BOOST,
        "SwThermalSlowdown": throttle.SW_THERMAL_SLOWDOWN,
        "HwThermalSlowdown": throttle.HW_THERMAL_SLOWDOWN,
        "HwPowerBrakeSlowdown": throttle.HW_POWER_BRAKE_SLOWDOWN,
        "DisplayClockSetting": throttle.DISPLAY_CLOCK_SETTING,
    }
    for suffix, value in pairs.items():
        assert getattr(pynvml, f"nvmlClocksEventReason{suffix}") == value, suffix
        assert getattr(pynvml, f"nvmlClocksThrottleReason{suffix}") == value, suffix


def test_combined_mask_names_in_bit_order() -> None:
    mask = throttle.HW_THERMAL_SLOWDOWN | throttle.GPU_IDLE | throttle.SW_POWER_CAP
    assert throttle.reason_names(mask) == ["gpu_idle", "sw_power_cap", "hw_thermal_slowdown"]
    assert throttle.is_thermal(mask) and throttle.is_power(mask) and throttle.is_throttled(mask)


@pytest.mark.parametrize("mask", [None, 0])
def test_nothing_set(mask: int | None) -> None:
    assert throttle.reason_names(mask) == []
    assert not throttle.is_thermal(mask)
    assert not throttle.is_power(mask)
    assert not throttle.is_throttled(mask)


def test_unknown_bits_are_named_by_value_and_not_throttles() -> None:
    mask = 0x200 | 0x8000_0000_0000_0000 | throttle.GPU_IDLE
    assert throttle.reason_names(mask) == ["gpu_idle", "0x200", "0x8000000000000000"]
    assert not throttle.is_throttled(mask)


def test_idle_and_settings_together_are_not_a_throttle() -> None:
    assert not throttle.is_throttled(throttle.NOT_THROTTLE_MASK)
    assert throttle.NOT_THROTTLE_MASK & throttle.THROTTLE_MASK == 0
    assert throttle.THERMAL_MASK & throttle.POWER_MASK == 0
