"""A throttle period's kind (heat or the power cap) is a field set from the reasons, and the
summary and the GPU chart read that field, not the label's wording."""

from __future__ import annotations

import json
from typing import Any

import httpx
from matplotlib.figure import Figure

from llm_watchdog.nvml.throttle import HW_SLOWDOWN, SW_POWER_CAP, SW_THERMAL_SLOWDOWN
from llm_watchdog.report.charts import POWER_CAP, THROTTLE, draw_gpu
from llm_watchdog.report.data import HEAT, POWER, Period, Report, throttled_periods
from llm_watchdog.report.prometheus import from_prometheus

T0 = 1_796_100_000.0


def gpu(ts: float, reasons: int) -> dict[str, object]:
    return {
        "ts": ts,
        "gpu_index": 0,
        "temp_c": 70.0,
        "sm_clock_mhz": 1800.0,
        "throttle_reasons": reasons,
    }


def test_the_kind_comes_from_the_reasons_where_the_period_is_made() -> None:
    masks = [SW_POWER_CAP, SW_POWER_CAP, HW_SLOWDOWN, SW_THERMAL_SLOWDOWN | SW_POWER_CAP, 0]
    periods = throttled_periods([gpu(T0 + 10 * i, m) for i, m in enumerate(masks)])
    assert [(p.start_ts - T0, p.end_ts - T0, p.kind) for p in periods] == [
        (0.0, 20.0, POWER),  # each sample stands until the next
        (20.0, 40.0, HEAT),  # heat wins where both hold
    ]
    # The labels print as before.
    assert [p.label for p in periods] == [
        "power cap: sw_power_cap",
        "heat: hw_slowdown,sw_power_cap,sw_thermal_slowdown",
    ]


def _misleading() -> Report:
    # Labels that say the opposite of the kind: whoever reads the label gets it backwards.
    report = Report("test", T0, T0 + 100)
    report.throttled = [
        Period(T0, T0 + 30, "heat: worded like heat", POWER),
        Period(T0 + 50, T0 + 60, "power cap: worded like the cap", HEAT),
    ]
    report.temp_c.add(T0, 70.0)
    report.sm_clock_mhz.add(T0, 1800.0)
    return report


def test_the_summary_adds_up_by_kind_not_by_label() -> None:
    s = _misleading().summary()
    assert (s["heat_s"], s["power_s"], s["throttled_s"]) == (10.0, 30.0, 40.0)


def test_the_gpu_chart_shades_by_kind_not_by_label() -> None:
    fig = Figure()
    ax = fig.add_subplot()
    assert draw_gpu(ax, _misleading())
    spans = [p for p in ax.patches if p.get_label() in ("slowed by heat", "at the power cap")]
    assert [(p.get_label(), p.get_facecolor()[:3]) for p in spans] == [
        ("at the power cap", _rgb(POWER_CAP)),
        ("slowed by heat", _rgb(THROTTLE)),
    ]


def _rgb(hex_colour: str) -> tuple[float, float, float]:
    h = hex_colour.lstrip("#")
    r, g, b = (int(h[i : i + 2], 16) / 255.0 for i in (0, 2, 4))
    return (r, g, b)


def test_periods_from_prometheus_carry_their_kind() -> None:
    # The heat query alone, and the power query "unless" heat: each answers one run.
    def handler(request: httpx.Request) -> httpx.Response:
        query = request.url.params["query"]
        result: list[dict[str, Any]] = []
        if "clock_event_active" in query:
            start, step_s = (
                T0 + (300 if "unless" in query else 0),
                float(request.url.params["step"]),
            )
            values = [[start + step_s * i, "1"] for i in range(3)]
            result = [{"metric": {}, "values": values}]
        body = {"status": "success", "data": {"resultType": "matrix", "result": result}}
        return httpx.Response(200, content=json.dumps(body))

    r = from_prometheus(
        "http://prom.test:9090",
        T0,
        T0 + 600,
        target_p95_ms=500.0,
        transport=httpx.MockTransport(handler),
    )
    assert [(p.start_ts - T0, p.kind, p.label.split(":")[0]) for p in r.throttled] == [
        (0.0, HEAT, "heat"),
        (300.0, POWER, "power cap"),
    ]


def test_a_prometheus_point_stands_for_its_step() -> None:
    from llm_watchdog.report.prometheus import _periods

    # Points 15 s apart: one lone point at the cap is 15 s of it, a run of three 45 s; a
    # run that ends at a gap ends a step after its last point.
    values = [[T0 + 15 * i, "1" if i in (1, 4, 5, 6, 10) else "0"] for i in range(9)]
    values += [[T0 + 150, "1"]]
    result = [{"metric": {}, "values": values}]
    got = [(p.start_ts - T0, p.end_ts - T0) for p in _periods(result, 15.0, lambda m: "x")]
    assert got == [(15.0, 30.0), (60.0, 105.0), (150.0, 165.0)]
