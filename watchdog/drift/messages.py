"""One line for a person per drift event, built from the event's figures.

    Chat slowed under heat: p95 TTFT 1.9 s vs 0.8 s baseline; GPU 86 °C, SM 1450/1980 MHz,
    SwThermalSlowdown for 7 min
    Chat slowed under heat and batch load (thermal 70 %, load 30 %): p95 TTFT ...
    Resolved after 4 min (p95 TTFT back to 0.7 s, ...): Chat slowed under heat: p95 TTFT at
    worst 2.6 s vs 0.8 s baseline; ...

An event's line is written when it opens, from the figures the alarm fired on, and again each
time chat gets worse, from its worst figures so far ("at worst"); the resolved line is the
last of those.

The GPU figures are the newest reading the event was judged on (temperature, clock and bits
as they are when the alert is sent), not a median over the minutes before it.

Unknown figures are left out rather than printed as "None". Durations and latencies are
spelled by llm_watchdog.durations, as in every alert.
"""

from __future__ import annotations

from typing import Any

from llm_watchdog.drift.cause import REASON_LABELS, longest_reason
from llm_watchdog.durations import human_duration, human_ms
from llm_watchdog.nvml import throttle
from llm_watchdog.nvml.thresholds import SOURCES

HEADLINES = {
    "thermal": "Chat slowed under heat",
    "power": "Chat slowed at the power cap",
    "load": "Chat slowed under batch load",
    "unknown": "Chat slowed, cause unknown",
}


# Shares as a headline names them.
SHARE_NAMES = {"thermal": "heat", "power": "the power cap", "load": "batch load"}


def _gpu_name(ev: dict[str, Any]) -> str:
    index = ev.get("gpu_index")
    return "GPU" if index is None else f"GPU {index}"


def _now_clock(ev: dict[str, Any]) -> float | None:
    now = ev.get("sm_clock_now_mhz")
    return now if now is not None else ev.get("sm_clock_mhz")


def _gpu_part(ev: dict[str, Any], cause: str) -> list[str]:
    parts: list[str] = []
    temp = ev.get("gpu_temp_c")
    if temp is not None:
        text = f"{_gpu_name(ev)} {temp:.0f} °C"
        slope = ev.get("temp_slope_c_per_min")
        # At or past where its clocks start to fall the driver holds the card there by
        # slowing it: the slope is the climb that brought it, and "rising" would describe a
        # card whose temperature has stopped moving. The clock says the rest.
        onset = ev.get("temp_slowdown_c")
        held = onset is not None and temp >= onset
        if cause == "thermal" and slope is not None and slope >= 0.2 and not held:
            text += f" rising {slope:.1f} °C/min"
        parts.append(text)
    if cause == "power" and ev.get("power_w") is not None and ev.get("power_limit_w"):
        parts.append(f"{ev['power_w']:.0f}/{ev['power_limit_w']:.0f} W")
    clock, ceiling = _now_clock(ev), ev.get("sm_clock_max_mhz")
    if clock is not None:
        ref = ceiling or ev.get("baseline_sm_clock_mhz")
        parts.append(f"SM {clock:.0f}/{ref:.0f} MHz" if ref else f"SM {clock:.0f} MHz")
    reason = longest_reason(ev, cause) if cause in ("thermal", "power") else None
    now = ev.get("reasons_now")
    if reason and now is not None:  # only a bit that is still on now
        bit = {v: k for k, v in REASON_LABELS.items()}.get(reason[0])
        if bit is None or throttle.REASON_NAMES[bit] not in now:
            reason = None
    if reason:  # a bit that just came on gets no duration ("for 0 s" reads like a bug)
        on_for = f" for {human_duration(reason[1])}" if reason[1] >= 30 else ""
        parts.append(reason[0] + on_for)
    elif cause == "thermal" and ev.get("sm_clock_ratio") is not None:
        parts.append(f"clock {100 * (1 - ev['sm_clock_ratio']):.0f} % under baseline, no bit yet")
    return parts


# A p95 under this many times its baseline's has not clearly risen: the message then leads
# with the median, which is what the detector saw move.
P95_RISEN = 1.1


def _ttft_part(
    p95_ms: float | None,
    baseline_p95_ms: float | None,
    p50_ms: float | None,
    baseline_p50_ms: float | None,
    worst: bool = False,
    over: bool = False,
) -> str:
    """`over`: the p95 is the wait of a canary that got no first token, so chat's p95 is
    longer than the figure."""
    p95 = ("at worst " if worst else "") + (
        ("over " if over else "")
        + f"{human_ms(p95_ms, scale_of=baseline_p95_ms)} vs "
        + human_ms(baseline_p95_ms, scale_of=p95_ms)
    )
    if (
        p95_ms is not None
        and baseline_p95_ms is not None
        and p50_ms is not None
        and baseline_p50_ms is not None
        and p95_ms < P95_RISEN * baseline_p95_ms
        and p50_ms > baseline_p50_ms
    ):
        # Chat whose tail is set by something else (canaries that land on a batch prefill)
        # slows in its body first: "p95 255 ms vs 272 ms" alone reads as no slowdown at all.
        return (
            f"median TTFT {human_ms(p50_ms, scale_of=baseline_p50_ms)} vs "
            f"{human_ms(baseline_p50_ms, scale_of=p50_ms)} baseline (p95 {p95})"
        )
    return f"p95 TTFT {p95} baseline"


def latency_message(
    cause: str,
    p95_ms: float | None,
    baseline_p95_ms: float | None,
    ev: dict[str, Any],
    p50_ms: float | None = None,
    baseline_p50_ms: float | None = None,
    worst: bool = False,
) -> str:
    """`worst`: the figures are the event's worst so far (an update, and the resolved line
    built from it), not those the alarm fired on; the line says so, so that the opened and
    resolved lines of one event do not show two p95s as if both were "the" p95."""
    head = HEADLINES.get(cause, HEADLINES["unknown"])
    shares = ev.get("cause_shares")
    if shares:
        ordered = sorted(shares.items(), key=lambda kv: (-kv[1], kv[0] != cause))
        names = " and ".join(SHARE_NAMES.get(k, k) for k, _ in ordered)
        split = ", ".join(f"{k} {100 * v:.0f} %" for k, v in ordered)
        head = f"Chat slowed under {names} ({split})"
    waited, wait_ms = ev.get("timed_out") or 0, ev.get("timeout_ms")
    over = bool(waited) and p95_ms is not None and wait_ms is not None and p95_ms >= wait_ms
    ttft = _ttft_part(p95_ms, baseline_p95_ms, p50_ms, baseline_p50_ms, worst, over)
    if waited and wait_ms is not None:
        of = f" of {ev['ttft_probes']}" if ev.get("ttft_probes") else ""
        ttft += f", {waited}{of} canaries got no first token in {human_ms(wait_ms)}"
    line = f"{head}: {ttft}"
    parts = _gpu_part(ev, cause)
    if cause == "load":
        inflight, base = ev.get("batch_inflight"), ev.get("baseline_batch_inflight")
        if inflight is not None:
            parts = [f"batch in flight {inflight:g} vs {base or 0:g} at baseline"]
        clock, ref = _now_clock(ev), ev.get("baseline_sm_clock_mhz")
        if clock is not None:
            steady = ref is None or clock >= 0.97 * ref
            ceiling = ev.get("sm_clock_max_mhz")
            if steady:
                parts.append(f"SM {clock:.0f} MHz steady")
            else:
                parts.append(f"SM {clock:.0f}/{ceiling or ref:.0f} MHz")
    return line + ("; " + ", ".join(parts) if parts else "")


def closed_message(duration_s: float, opened_message: str, why: str | None = None) -> str:
    ended = f" ({why})" if why else ""
    return f"Resolved after {human_duration(duration_s)}{ended}: {opened_message}"


def threshold_phrase(ev: dict[str, Any]) -> str:
    """Which threshold, and where: "its target temperature 83 °C" or "slowdown at 93 °C"."""
    limit, source = ev.get("temp_slowdown_c"), ev.get("temp_threshold")
    if limit is None:
        return "thermal slowdown"
    if source in SOURCES:
        return f"its {SOURCES[source]} {limit:.0f} °C"
    return f"slowdown at {limit:.0f} °C"


def heat_message(ev: dict[str, Any]) -> str:
    temp, slope = ev.get("gpu_temp_c"), ev.get("temp_slope_c_per_min")
    eta = ev.get("time_to_slowdown_s")
    rise = f" rising {slope:.1f} °C/min" if slope else ""
    when = "now" if eta == 0 else f"in ~{human_duration(eta)}" if eta is not None else "soon"
    return (
        f"{_gpu_name(ev)} heating toward {threshold_phrase(ev)}, where its clocks start to "
        f"fall: {temp:.0f} °C{rise}, there {when}; chat not slowed yet"
    )


def quality_message(fails: int, window: int, base_rate: float) -> str:
    return (
        f"Quality gate failing: {fails} of the last {window} answers missed their expectation "
        f"(baseline {100 * base_rate:.1f} %)"
    )


def failing_message(fails: int, window: int, consecutive: int) -> str:
    return (
        f"Canary probes failing: {fails} of the last {window} failed, "
        f"{consecutive} in a row; chat may be down"
    )


def cold_message(ttft_ms: float, limit_ms: float) -> str:
    return f"Cold start slow: first token after {human_ms(ttft_ms)} (limit {human_ms(limit_ms)})"
