"""The heat warning aims at where clocks really start to fall, mixed causes are split into
shares, and messages say how the GPU is now and what ended an event."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np

from llm_watchdog.drift import DriftConfig, DriftMonitor, Observation
from llm_watchdog.drift.cause import ClockElasticity, split_causes
from llm_watchdog.drift.replay import parse_trace, replay_observations
from llm_watchdog.durations import human_ms
from tests.drift.test_monitor import SW_THERMAL, T0, index_of, of_kind, run, trace

TARGET_C, SLOWDOWN_C = 83.0, 93.0


def with_thresholds(obs: list[Observation], **kw: object) -> list[Observation]:
    return [dataclasses.replace(o, **kw) for o in obs]  # type: ignore[arg-type]


def fan_stop(n: int = 700, at: int = 400) -> tuple[list[Observation], int]:
    """The fans stop at `at`: 1.5 °C a probe (9 °C/min) from 66 °C; at the 83 °C target the
    driver pulls the clock down (SwThermalSlowdown) and TTFT follows 1/clock."""
    i = np.arange(n)
    temp = np.minimum(66 + np.clip(i - at, 0, None) * 1.5, TARGET_C + 1)
    hot = temp > TARGET_C
    first_hot = int(np.argmax(hot))
    clock = np.where(hot, 1950 * 0.6, 1950.0)
    mult = np.where(hot, 1 / 0.6, 1.0)
    obs = trace(n, seed=21, mult=mult, temp=temp, clock=clock, bits=np.where(hot, SW_THERMAL, 0))
    return with_thresholds(obs, temp_target_c=TARGET_C, temp_slowdown_c=SLOWDOWN_C), first_hot


def test_the_warning_aims_at_the_target_temperature_and_leads_the_throttle() -> None:
    obs, first_hot = fan_stop()
    events = run(obs)
    (warn,) = of_kind(events, "heat_warning", "opened")
    assert warn.evidence["temp_slowdown_c"] == TARGET_C
    assert warn.evidence["temp_threshold"] == "target"
    assert warn.evidence["temp_hw_slowdown_c"] == SLOWDOWN_C
    assert "target temperature 83 °C" in warn.message
    lead_s = (first_hot - index_of(warn)) * 10.0
    assert lead_s >= 60.0, lead_s
    (lat,) = of_kind(events, "latency", "opened")
    assert lat.cause == "thermal"


def test_judged_against_slowdown_alone_the_same_fan_stop_is_told_too_late() -> None:
    obs, first_hot = fan_stop()
    (aimed,) = of_kind(run(obs), "heat_warning", "opened")
    only_slowdown = with_thresholds(obs, temp_target_c=None)
    (late,) = of_kind(run(only_slowdown), "heat_warning", "opened")
    assert late.evidence["temp_threshold"] == "slowdown"
    # What the issue saw: the ETA points at 93 °C while the clocks fall at 83 °C, so the
    # warning comes later and promises more time than there is.
    eta_s = late.evidence["time_to_slowdown_s"]
    assert index_of(late) * 10.0 + eta_s > first_hot * 10.0
    assert (first_hot - index_of(late)) * 10.0 < 60.0 <= (first_hot - index_of(aimed)) * 10.0


def test_a_learned_threshold_is_named_as_learned() -> None:
    obs, _ = fan_stop()
    learned = with_thresholds(obs, temp_slowdown_c=None, temp_threshold="learned")
    (warn,) = of_kind(run(learned), "heat_warning", "opened")
    assert warn.evidence["temp_threshold"] == "learned"
    assert "temperature it first throttled at 83 °C" in warn.message


def test_heat_and_load_together_are_split_into_shares() -> None:
    n, at = 700, 400
    i = np.arange(n)
    on = i >= at
    clock_ratio = np.where(on, 0.7, 1.0)
    # TTFT x1/0.7 from the clock and x1.4 more from the batch: log shares 0.36 vs 0.34.
    mult = np.where(on, (1 / 0.7) * 1.4, 1.0)
    obs = trace(
        n,
        seed=22,
        mult=mult,
        temp=np.where(on, 84.0, 70.0),
        clock=1950 * clock_ratio,
        bits=np.where(on, SW_THERMAL, 0),
        inflight=np.where(on, 6.0, 2.0),
    )
    obs = with_thresholds(obs, temp_target_c=TARGET_C)
    events = run(obs)
    (lat,) = of_kind(events, "latency", "opened")
    shares = lat.evidence["cause_shares"]
    assert set(shares) == {"thermal", "load"}
    assert abs(shares["thermal"] - 0.51) < 0.2, shares
    assert lat.cause == max(shares, key=shares.get)
    assert "thermal" in lat.message and "load" in lat.message and " %" in lat.message


def test_the_split_follows_what_the_clock_explains() -> None:
    ev = {"sm_clock_ratio_now": 0.5, "sm_clock_ratio": 0.9, "ttft_ratio": 4.0}
    split = split_causes(ev, 1.0, load_up=True)
    assert split is not None and abs(split["clock"] - 0.5) < 1e-9  # ln 2 of ln 4
    assert split_causes(ev, 1.0, load_up=False) == {"clock": 1.0, "load": 0.0}
    assert split_causes({"sm_clock_ratio": 1.0, "ttft_ratio": 0.9}, 1.0, load_up=True) is None


def test_clock_elasticity_is_learned_from_the_cards_history() -> None:
    e = ClockElasticity()
    assert e.value == 1.0  # the prior: prefill time scales with 1/clock
    for _ in range(200):  # this engine's TTFT stretches only half as much as its clock
        e.add(0.5 * np.log(1 / 0.7), 0.7)
    assert abs(e.value - 0.5) < 0.05


def test_messages_use_the_newest_clock_and_the_resolved_one_says_what_ended_it() -> None:
    n, at, back = 900, 400, 600
    i = np.arange(n)
    hot = (i >= at) & (i < back)
    # The clock keeps falling after the alarm: the message must show the newest reading.
    clock = np.where(hot, np.maximum(1950 * 0.75 - (i - at) * 15, 900), 1950.0)
    obs = trace(
        n,
        seed=23,
        mult=np.where(hot, 1950 / clock, 1.0),
        temp=np.where(hot, 84.0, 66.0),
        clock=clock,
        bits=np.where(hot, SW_THERMAL, 0),
    )
    obs = with_thresholds(obs, temp_target_c=TARGET_C)
    events = run(obs)
    (opened,) = of_kind(events, "latency", "opened")
    k = index_of(opened)
    assert f"SM {clock[k]:.0f}/1980 MHz" in opened.message
    (closed,) = of_kind(events, "latency", "closed")
    assert closed.message.startswith("Resolved after")
    assert "p95 TTFT back to" in closed.message and "no throttle bit" in closed.message
    # "Back to" is the probes that ended it, not the p95 window, which still holds the hot
    # answers (it said "back to 2118 ms" here, over the 1.2 s the event opened at).
    back_ms = float(re.search(r"p95 TTFT back to (\d+) ms", closed.message).group(1))  # type: ignore[union-attr]
    assert closed.baseline_p95_ms is not None and back_ms < 1.25 * closed.baseline_p95_ms
    # Chat got worse after the alarm: the resolved line gives the worst p95 and says so, and
    # the opened line's p95 is the one the alarm fired on.
    assert "at worst" not in opened.message
    assert closed.peak_p95_ms is not None and opened.peak_p95_ms is not None
    assert closed.peak_p95_ms > opened.peak_p95_ms
    worst = human_ms(closed.peak_p95_ms, scale_of=closed.baseline_p95_ms)
    assert f"p95 TTFT at worst {worst} vs " in closed.message


def test_replay_reads_the_threshold_columns(tmp_path: Path) -> None:
    obs, first_hot = fan_stop()
    path = tmp_path / "fans.csv"
    cols = (
        "ts,ttft_ms,gpu_temp_c,sm_clock_mhz,sm_clock_max_mhz,throttle_reasons,"
        "batch_inflight,temp_target_c,temp_slowdown_c"
    )
    lines = [cols] + [
        f"{o.ts},{o.ttft_ms},{o.gpu_temp_c},{o.sm_clock_mhz},1980,{o.throttle_reasons},2,"
        f"{TARGET_C:g},{SLOWDOWN_C:g}"
        for o in obs
    ]
    path.write_text("\n".join(lines) + "\n")
    parsed = parse_trace(path)
    assert parsed[0].temp_target_c == TARGET_C and parsed[0].temp_slowdown_c == SLOWDOWN_C
    events = replay_observations(parsed, DriftConfig())
    (warn,) = [e for e in events if e.kind == "heat_warning"]
    assert warn.evidence["temp_slowdown_c"] == TARGET_C
    assert (first_hot - round((warn.start_ts - T0) / 10)) * 10 >= 60
    # Without the target column the same trace warns against SLOWDOWN, as before.
    path.write_text(
        "\n".join(line.rsplit(",", 2)[0] + "," + line.rsplit(",", 1)[1] for line in lines) + "\n"
    )
    assert parse_trace(path)[0].temp_target_c is None


def test_a_monitor_without_thresholds_warns_against_the_configured_one() -> None:
    obs, _ = fan_stop()
    bare = with_thresholds(obs, temp_target_c=None, temp_slowdown_c=None)
    mon = DriftMonitor(DriftConfig(temp_slowdown_c=TARGET_C))
    (warn,) = of_kind(run(bare, mon), "heat_warning", "opened")
    assert warn.evidence["temp_slowdown_c"] == TARGET_C
