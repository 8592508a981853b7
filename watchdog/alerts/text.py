"""Alert text for a person: figures with their units, one line per alert.

The builders here give the daemon a ready line per kind, e.g.

    Chat slowed under heat: p95 TTFT 1.9 s vs 0.8 s baseline; GPU 0 86 °C,
    SM 1450/1980 MHz, SwThermalSlowdown for 7 min

(one line in practice). Every argument but the headline figures may be None: what is unknown
is left out rather than printed as "None".
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from watchdog import throttle

# NVML clocks-event reasons named in alert text the way nvml.h and nvidia-smi spell them, so a
# person can search for them. Only slowdowns are named: idle, application/display clock
# settings and sync boost are not why chat got slow (see watchdog.throttle).
THROTTLE_REASON_BITS: dict[int, str] = {
    throttle.SW_POWER_CAP: "SwPowerCap",
    throttle.HW_SLOWDOWN: "HwSlowdown",
    throttle.SW_THERMAL_SLOWDOWN: "SwThermalSlowdown",
    throttle.HW_THERMAL_SLOWDOWN: "HwThermalSlowdown",
    throttle.HW_POWER_BRAKE_SLOWDOWN: "HwPowerBrakeSlowdown",
}

CAUSE_PHRASES = {
    "thermal": "under heat",
    "power": "at the power cap",
    "load": "under batch load",
}


def format_duration(seconds: float | None) -> str:
    """A duration the way a person says it: "0.4 s", "45 s", "7 min", "1 h 20 min", "2 d 3 h"."""
    if seconds is None or math.isnan(seconds):
        return "?"
    s = max(0.0, float(seconds))
    if s < 10:
        text = f"{s:.1f}".rstrip("0").rstrip(".")
        return f"{text} s"
    if s < 59.5:
        return f"{round(s)} s"
    minutes = round(s / 60)
    if minutes < 60:
        return f"{minutes} min"
    if s < 86400 - 30:
        hours, rest = divmod(minutes, 60)
        return f"{hours} h" if rest == 0 else f"{hours} h {rest} min"
    hours_total = round(s / 3600)
    days, hours = divmod(hours_total, 24)
    return f"{days} d" if hours == 0 else f"{days} d {hours} h"


def format_ms(ms: float | None, *, scale_of: float | None = None) -> str:
    """A latency: "850 ms", "1.9 s", "12 s".

    The unit is picked from the larger of `ms` and `scale_of`, so two figures compared in one
    sentence share a unit: format_ms(800, scale_of=1900) == "0.8 s".
    """
    if ms is None or math.isnan(ms):
        return "?"
    scale = max(abs(ms), abs(scale_of)) if scale_of is not None else abs(ms)
    if scale < 999.5:  # what would round to "1000 ms" reads better as "1.0 s"
        return f"{round(ms)} ms"
    s = ms / 1000
    if scale < 9_950:
        return f"{s:.1f} s"
    return f"{round(s)} s"


def format_temp_c(temp_c: float | None) -> str:
    return "?" if temp_c is None else f"{round(temp_c)} °C"


def format_clock(sm_clock_mhz: float | None, sm_clock_max_mhz: float | None) -> str | None:
    if sm_clock_mhz is None:
        return None
    if sm_clock_max_mhz is None:
        return f"SM {round(sm_clock_mhz)} MHz"
    return f"SM {round(sm_clock_mhz)}/{round(sm_clock_max_mhz)} MHz"


def throttle_reason_names(bitmask: int | None) -> list[str]:
    """Names of the slowdown reasons set in an NVML clocks-event bitmask, in bit order."""
    if not bitmask:
        return []
    return [name for bit, name in THROTTLE_REASON_BITS.items() if bitmask & bit]


def gpu_state(
    *,
    gpu_index: int | None = None,
    temp_c: float | None = None,
    sm_clock_mhz: float | None = None,
    sm_clock_max_mhz: float | None = None,
    throttle_reasons: int | None = None,
    throttled_s: float | None = None,
) -> str:
    """ "GPU 0 86 °C, SM 1450/1980 MHz, SwThermalSlowdown for 7 min", or "" when nothing known."""
    parts: list[str] = []
    head = "GPU" if gpu_index is None else f"GPU {gpu_index}"
    if temp_c is not None:
        parts.append(f"{head} {format_temp_c(temp_c)}")
    clock = format_clock(sm_clock_mhz, sm_clock_max_mhz)
    if clock:
        parts.append(clock if parts else f"{head} {clock}")
    reasons = throttle_reason_names(throttle_reasons)
    if reasons:
        text = "+".join(reasons)
        if throttled_s is not None:
            text += f" for {format_duration(throttled_s)}"
        parts.append(text)
    return ", ".join(parts)


def title_for(kind: str, cause: str | None = None) -> str:
    """A short title: "Chat slowed (thermal)", "Heat warning", "Probes failing"."""
    base = kind.replace("_", " ").capitalize()
    return f"{base} ({cause})" if cause else base


def chat_slowed_message(
    cause: str | None,
    p95_ms: float,
    baseline_p95_ms: float,
    *,
    gpu_index: int | None = None,
    temp_c: float | None = None,
    sm_clock_mhz: float | None = None,
    sm_clock_max_mhz: float | None = None,
    throttle_reasons: int | None = None,
    throttled_s: float | None = None,
    batch_inflight: float | None = None,
    baseline_batch_inflight: float | None = None,
) -> str:
    phrase = CAUSE_PHRASES.get(cause or "", "")
    head = f"Chat slowed {phrase}".rstrip()
    line = (
        f"{head}: p95 TTFT {format_ms(p95_ms)} vs "
        f"{format_ms(baseline_p95_ms, scale_of=p95_ms)} baseline"
    )
    details: list[str] = []
    gpu = gpu_state(
        gpu_index=gpu_index,
        temp_c=temp_c,
        sm_clock_mhz=sm_clock_mhz,
        sm_clock_max_mhz=sm_clock_max_mhz,
        throttle_reasons=throttle_reasons,
        throttled_s=throttled_s,
    )
    if gpu:
        details.append(gpu)
    if batch_inflight is not None:
        batch = f"batch in flight {batch_inflight:g}"
        if baseline_batch_inflight is not None:
            batch += f" vs {baseline_batch_inflight:g} at baseline"
        details.append(batch)
    return line + ("; " + "; ".join(details) if details else "")


def heat_warning_message(
    temp_c: float,
    slowdown_c: float,
    *,
    gpu_index: int | None = None,
    slope_c_per_min: float | None = None,
    eta_s: float | None = None,
) -> str:
    head = "GPU" if gpu_index is None else f"GPU {gpu_index}"
    line = f"{head} heading for thermal slowdown: {format_temp_c(temp_c)}"
    if slope_c_per_min is not None:
        line += f" rising {slope_c_per_min:.1f} °C/min"
    line += f", slowdown at {format_temp_c(slowdown_c)}"
    if eta_s is not None:
        line += f" in about {format_duration(eta_s)}"
    return line + "; chat not slow yet"


def quality_failed_message(
    failed: int, total: int, *, window_s: float | None = None, example: str | None = None
) -> str:
    line = f"Canary answers failing: {failed} of {total} wrong"
    if window_s is not None:
        line += f" in the last {format_duration(window_s)}"
    if example:
        line += f" ({example})"
    return line


def cold_start_message(ttft_ms: float, limit_ms: float, *, reason: str | None = None) -> str:
    line = (
        f"Cold start slow: first token after {format_ms(ttft_ms)} "
        f"(limit {format_ms(limit_ms, scale_of=ttft_ms)})"
    )
    return line + (f" after {reason}" if reason else "")


def baseline_invalidated_message(
    changes: Mapping[str, tuple[str, str]], *, samples_needed: int | None = None
) -> str:
    """ "Runtime changed: re-baselining (model a → b, driver 550 → 555); ..."."""
    changed = ", ".join(f"{name} {old} → {new}" for name, (old, new) in changes.items())
    line = "Runtime changed: re-baselining" + (f" ({changed})" if changed else "")
    if samples_needed is not None:
        line += f"; drift checks resume after {samples_needed} warm probes"
    return line


def telemetry_lost_message(gpu_index: int | None, detail: str = "") -> str:
    head = "GPU telemetry lost" + ("" if gpu_index is None else f" for GPU {gpu_index}")
    return head + (f": {detail}" if detail else "") + "; latency-only until it is back"


def probes_failing_message(
    failed: int, total: int, *, error_class: str | None = None, url: str | None = None
) -> str:
    line = f"Canary probes failing: {failed} of the last {total}"
    if error_class:
        line += f", {error_class}"
    if url:
        line += f" at {url}"
    return line


def control_not_effective_message(
    wanted: float, observed: float | None, *, actuator: str | None = None
) -> str:
    seen = "nothing readable" if observed is None else f"{observed:g}"
    where = f" ({actuator})" if actuator else ""
    return f"Batch allowance not applied: set {wanted:g}, serving layer reports {seen}{where}"


def resolved_message(title: str, duration_s: float | None, detail: str | None = None) -> str:
    line = f"Resolved after {format_duration(duration_s)}: {title}"
    return line + (f"; {detail}" if detail else "")
