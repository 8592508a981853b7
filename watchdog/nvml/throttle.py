"""NVML clocks-event (throttle) reasons: bit values, names, and what counts as a throttle.

Pure functions over the bitmask that `nvmlDeviceGetCurrentClocksEventReasons` (formerly
`nvmlDeviceGetCurrentClocksThrottleReasons`) returns. No pynvml import: the bit values are
fixed by the C header and the replay trace stores the same integer.

Values from NVIDIA's nvml.h, group `nvmlClocksEventReasons` (NVML API 12, e.g. the header
mirrored at github.com/XuehaiPan/nvml-dev, `nvml.h`):

    nvmlClocksEventReasonGpuIdle                   0x0000000000000001LL
    nvmlClocksEventReasonApplicationsClocksSetting 0x0000000000000002LL
    nvmlClocksEventReasonSwPowerCap                0x0000000000000004LL
    nvmlClocksThrottleReasonHwSlowdown             0x0000000000000008LL
    nvmlClocksEventReasonSyncBoost                 0x0000000000000010LL
    nvmlClocksEventReasonSwThermalSlowdown         0x0000000000000020LL
    nvmlClocksThrottleReasonHwThermalSlowdown      0x0000000000000040LL
    nvmlClocksThrottleReasonHwPowerBrakeSlowdown   0x0000000000000080LL
    nvmlClocksEventReasonDisplayClockSetting       0x0000000000000100LL

The same values are in nvidia-ml-py's `pynvml.py` (`nvmlClocksEventReason*`).
"""

from __future__ import annotations

GPU_IDLE = 0x1
APPLICATIONS_CLOCKS_SETTING = 0x2
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SYNC_BOOST = 0x10
SW_THERMAL_SLOWDOWN = 0x20
HW_THERMAL_SLOWDOWN = 0x40
HW_POWER_BRAKE_SLOWDOWN = 0x80
DISPLAY_CLOCK_SETTING = 0x100

# Names in bit order; snake_case so they work as Prometheus label values and JSON keys.
REASON_NAMES: dict[int, str] = {
    GPU_IDLE: "gpu_idle",
    APPLICATIONS_CLOCKS_SETTING: "applications_clocks_setting",
    SW_POWER_CAP: "sw_power_cap",
    HW_SLOWDOWN: "hw_slowdown",
    SYNC_BOOST: "sync_boost",
    SW_THERMAL_SLOWDOWN: "sw_thermal_slowdown",
    HW_THERMAL_SLOWDOWN: "hw_thermal_slowdown",
    HW_POWER_BRAKE_SLOWDOWN: "hw_power_brake_slowdown",
    DISPLAY_CLOCK_SETTING: "display_clock_setting",
}
KNOWN_MASK = sum(REASON_NAMES)

# Heat. nvml.h documents HwSlowdown as "an indicator of: temperature being too high; External
# Power Brake Assertion ...; Power draw is too high and Fast Trigger protection ...". Temperature
# is its first and most common cause, so it counts as thermal here; a power brake also raises
# HwPowerBrakeSlowdown, which POWER_MASK catches, so a power event is not lost.
THERMAL_MASK = SW_THERMAL_SLOWDOWN | HW_THERMAL_SLOWDOWN | HW_SLOWDOWN

# The power cap (software, the enforced limit) and the external power brake (hardware).
POWER_MASK = SW_POWER_CAP | HW_POWER_BRAKE_SLOWDOWN

# Not throttles: GpuIdle is the clock dropping because nothing runs; application clocks and
# display clocks are settings someone chose; sync boost follows the slowest GPU of a group
# (look at that GPU's reasons instead).
NOT_THROTTLE_MASK = GPU_IDLE | APPLICATIONS_CLOCKS_SETTING | SYNC_BOOST | DISPLAY_CLOCK_SETTING

THROTTLE_MASK = THERMAL_MASK | POWER_MASK


def reason_names(mask: int | None) -> list[str]:
    """Names of the bits set in `mask`, lowest bit first.

    A bit this module does not know (a newer driver's reason) is named by its hex value,
    e.g. "0x200", so it is still visible in logs and reports. None or 0 gives [].
    """
    if not mask:
        return []
    names = [name for bit, name in REASON_NAMES.items() if mask & bit]
    unknown = mask & ~KNOWN_MASK
    bit = 1
    while unknown:
        if unknown & bit:
            names.append(hex(bit))
            unknown &= ~bit
        bit <<= 1
    return names


def is_thermal(mask: int | None) -> bool:
    """True when a heat-related slowdown bit is set."""
    return bool(mask and mask & THERMAL_MASK)


def is_power(mask: int | None) -> bool:
    """True when the power cap or the power brake is holding the clocks down."""
    return bool(mask and mask & POWER_MASK)


def is_idle(mask: int | None) -> bool:
    """True when the card had nothing to run (GpuIdle): its clock then reads its floor,
    whatever the heat, and says nothing of the clock work runs at."""
    return bool(mask and mask & GPU_IDLE)


def is_throttled(mask: int | None) -> bool:
    """True when heat or power is holding the clocks down (idle, settings, sync boost are not)."""
    return bool(mask and mask & THROTTLE_MASK)
