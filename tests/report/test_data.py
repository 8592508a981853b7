"""The report's values from rows: windows, throttled periods, marks, the scatter, the PNG."""

from __future__ import annotations

import io

from PIL import Image

from llm_watchdog.nvml.throttle import SW_POWER_CAP, SW_THERMAL_SLOWDOWN
from llm_watchdog.report.charts import report_figure, report_png
from llm_watchdog.report.data import (
    Report,
    from_rows,
    nearest_rank,
    probe_interval_s,
    throttled_periods,
    window_s,
)
from llm_watchdog.report.page import report_html

T0 = 1_796_100_000.0


def probe(ts: float, ttft_ms: float | None, **over: object) -> dict[str, object]:
    row: dict[str, object] = {
        "ts": ts,
        "ok": ttft_ms is not None,
        "cold": False,
        "ttft_ms": ttft_ms,
        "batch_inflight": 4,
        "batch_allowance": 8,
    }
    row.update(over)
    return row


def gpu(
    ts: float, temp_c: float, clock: float, reasons: int = 0, index: int = 0
) -> dict[str, object]:
    return {
        "ts": ts,
        "gpu_index": index,
        "temp_c": temp_c,
        "sm_clock_mhz": clock,
        "throttle_reasons": reasons,
    }


def test_windows_hold_about_ten_probes_and_at_most_a_hundred_a_span() -> None:
    assert window_s(T0, T0 + 300, probe_interval_s=1.0) == 10.0
    assert window_s(T0, T0 + 300, probe_interval_s=10.0) == 120.0
    assert window_s(T0, T0 + 86400, probe_interval_s=10.0) == 900.0
    assert probe_interval_s([probe(T0, 1), probe(T0 + 10, 1), probe(T0 + 20, 1)]) == 10.0
    assert probe_interval_s([]) is None


def test_nearest_rank_is_a_value_seen() -> None:
    assert nearest_rank([], 0.95) is None
    assert nearest_rank([1.0, 2.0, 3.0], 0.5) == 2.0
    assert nearest_rank([float(v) for v in range(1, 101)], 0.95) == 95.0


def test_throttled_periods_join_throttled_samples_and_ignore_idle() -> None:
    rows = [
        gpu(T0 + i, 70.0, 1800.0, SW_THERMAL_SLOWDOWN if 3 <= i <= 6 else 0x1) for i in range(10)
    ]
    rows[8] = gpu(T0 + 8, 70.0, 1800.0, SW_POWER_CAP)
    periods = throttled_periods(rows)
    # A sample stands until the next: four 1-s samples are 4 s, one is 1 s, not none.
    assert [(p.start_ts - T0, p.end_ts - T0, p.label) for p in periods] == [
        (3.0, 7.0, "heat: sw_thermal_slowdown"),
        (8.0, 9.0, "power cap: sw_power_cap"),
    ]
    # The last sample of the data stands for a usual gap; a gap in the samples ends a run
    # a usual gap after its last sample, not at the next sample minutes later.
    rows = [gpu(T0 + i, 70.0, 1800.0, SW_POWER_CAP) for i in range(3)]
    rows += [gpu(T0 + 60 + i, 70.0, 1800.0, SW_POWER_CAP) for i in range(2)]
    got = [(p.start_ts - T0, p.end_ts - T0) for p in throttled_periods(rows)]
    assert got == [(0.0, 3.0), (60.0, 62.0)]


def test_heat_and_the_power_cap_are_periods_of_their_own_and_heat_wins_where_both_hold() -> None:
    # A cool card at full load touches its cap now and then; then the fans stop. Counted as
    # one "throttled", the cap's minutes read as heat.
    masks = [SW_POWER_CAP, 0, SW_POWER_CAP, SW_POWER_CAP, SW_THERMAL_SLOWDOWN | SW_POWER_CAP]
    masks += [SW_THERMAL_SLOWDOWN] * 3 + [SW_POWER_CAP, 0]
    rows = [gpu(T0 + 10 * i, 70.0, 1800.0, m) for i, m in enumerate(masks)]
    got = [(p.start_ts - T0, p.end_ts - T0, p.label) for p in throttled_periods(rows)]
    assert got == [
        (0.0, 10.0, "power cap: sw_power_cap"),
        (20.0, 40.0, "power cap: sw_power_cap"),
        (40.0, 80.0, "heat: sw_power_cap,sw_thermal_slowdown"),
        (80.0, 90.0, "power cap: sw_power_cap"),
    ]
    report = Report("test", T0, T0 + 100)
    report.throttled = throttled_periods(rows)
    s = report.summary()
    # Four 10-s samples hot and four at the cap (the cap's lone samples were 0 s before).
    assert (s["heat_s"], s["power_s"], s["throttled_s"]) == (40.0, 40.0, 80.0)


def test_from_rows_windows_marks_scatter_and_notes() -> None:
    probes = [probe(T0 + 10 * i, 100.0 if i < 30 else 2000.0) for i in range(60)]
    probes.append(probe(T0 + 5, 9000.0, cold=True))  # cold starts are not chat
    probes.sort(key=lambda p: float(p["ts"]))  # type: ignore[arg-type]
    samples = [gpu(T0 + 5 * i, 60 + i / 10, 1900 - i) for i in range(120)]
    samples += [gpu(T0 + 5 * i, 40.0, 1000.0, index=1) for i in range(120)]
    actions = [
        {"ts": T0 + 310, "kind": "cut", "allowance_before": 8, "allowance_after": 4, "applied": 1},
        {"ts": T0 + 320, "kind": "hold", "allowance_before": 4, "allowance_after": 4, "applied": 1},
        {"ts": T0 + 330, "kind": "cut", "allowance_before": 4, "allowance_after": 2, "applied": 0},
    ]
    events = [{"start_ts": T0 + 300, "end_ts": None, "kind": "latency", "cause": "thermal"}]
    r = from_rows(
        source="t",
        since_ts=T0,
        until_ts=T0 + 600,
        probes=probes,
        gpu=samples,
        actions=actions,
        events=events,
        headroom=[{"allowance": 8, "chat_p95_cool_ms": 400.0, "chat_p95_hot_ms": 1900.0}],
        target_p95_ms=1500.0,
    )
    assert window_s(T0, T0 + 600, 10.0) == 120.0
    assert [v for v in r.ttft_p95_ms.values] == [100.0, 100.0, 2000.0, 2000.0, 2000.0]
    assert r.summary()["windows_over_target"] == 3
    # A span that runs on past the probes counts only the windows that hold some.
    later = from_rows(
        source="t",
        since_ts=T0,
        until_ts=T0 + 1200,
        probes=probes,
        gpu=samples,
        actions=actions,
        events=events,
        target_p95_ms=1500.0,
    )
    assert (
        later.summary()["windows"]
        == len([v for v in later.ttft_p95_ms.values if v])
        < len(later.ttft_p95_ms.ts)
    )
    # Only GPU 0 (the first), only real changes that were applied.
    assert max(v for v in r.temp_c.values if v is not None) < 73
    assert [m.label for m in r.actions] == ["cut 8→4"]
    assert r.allowance.values == [4, 4, 4]
    # Still open when the rows end: drawn up to the last row, not on to the span's end.
    assert r.drift[0].end_ts == T0 + 595 and r.drift[0].label == "latency (thermal)"
    assert len(r.scatter) == 60 and all(p[2] == 4 for p in r.scatter)
    assert r.headroom and not r.notes


def test_empty_span_says_why_and_still_renders() -> None:
    r = from_rows(source="t", since_ts=T0, until_ts=T0 + 600, probes=[], gpu=[])
    # No probes either: a daemon that did not run, not one in latency-only mode.
    assert r.notes == ["No canary probes in this span: is the daemon running?"]
    assert not r.latency_only
    page = report_html(r)
    assert "No canary probes" in page and 'data-drawn="0"' in page
    assert Image.open(io.BytesIO(report_png(r))).size[0] == 1050


def test_the_page_fetches_nothing() -> None:
    probes = [probe(T0 + 10 * i, 100.0) for i in range(30)]
    samples = [gpu(T0 + 10 * i, 60.0, 1800.0) for i in range(30)]
    r = from_rows(source="t", since_ts=T0, until_ts=T0 + 300, probes=probes, gpu=samples)
    page = report_html(r)
    for outside in ("http://", "https://", "<script", "@import", "url("):
        assert outside not in page
    assert page.count('src="data:image/png;base64,') == 4


def test_the_cli_loads_no_matplotlib_until_a_report_is_drawn() -> None:
    import subprocess
    import sys

    code = "import sys, llm_watchdog.cli; print('matplotlib' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_no_batch_counts_leave_the_batch_chart_out_with_one_note() -> None:
    from llm_watchdog.report.charts import charts_for
    from llm_watchdog.report.data import NO_BATCH_NOTE

    samples = [gpu(T0 + 10 * i, 60.0, 1800.0) for i in range(30)]
    bare = [probe(T0 + 10 * i, 100.0, batch_inflight=None, batch_allowance=None) for i in range(30)]
    r = from_rows(source="t", since_ts=T0, until_ts=T0 + 300, probes=bare, gpu=samples)
    assert r.no_batch and r.notes == [NO_BATCH_NOTE]
    assert [name for name, _ in charts_for(r)] == ["ttft", "gpu", "scatter"]
    page = report_html(r)
    assert 'id="chart-batch"' not in page and page.count(NO_BATCH_NOTE) == 1
    assert "<b>control actions</b>" not in page  # not "0", which reads as a calm loop
    # One count of either kind is a gateway watched: the chart stays, with no note.
    some = [dict(p) for p in bare]
    some[-1]["batch_inflight"] = 0
    r = from_rows(source="t", since_ts=T0, until_ts=T0 + 300, probes=some, gpu=samples)
    assert not r.no_batch and not r.notes and "batch" in [n for n, _ in charts_for(r)]
    assert "<b>control actions</b>" in report_html(r)


def test_a_canary_sent_to_an_idle_card_is_not_drawn_at_the_idle_clock() -> None:
    # The demo's hot phase with the batch cut to 0: between canaries the card idles at
    # 210 MHz with the thermal bit on; the canaries ran fast, at whatever clock it woke to.
    probes = [
        {"ts": T0 + 10 * i, "ok": 1, "cold": 0, "ttft_ms": 60.0, "batch_inflight": 0}
        for i in range(6)
    ]
    idle, busy = 0x1 | 0x20, 0x20  # GPU_IDLE | SW_THERMAL, SW_THERMAL
    gpu = [
        {"ts": T0 + 10 * i - 1, "gpu_index": 0, "sm_clock_mhz": 210.0 if i % 2 else 600.0,
         "throttle_reasons": idle if i % 2 else busy, "temp_c": 84.0}
        for i in range(6)
    ]  # fmt: skip
    r = from_rows(source="t", since_ts=T0 - 10, until_ts=T0 + 60, probes=probes, gpu=gpu)
    assert [p[0] for p in r.scatter] == [600.0, 600.0, 600.0]
    # The clock line is the working card's; the idle floor is a line of its own.
    assert r.sm_clock_mhz.values == [600.0, None, 600.0, None, 600.0, None]
    assert r.sm_clock_idle_mhz.values == [None, 210.0, None, 210.0, None, 210.0]
    fig = report_figure(r)
    labels = [line.get_label() for ax in fig.axes for line in ax.get_lines()]
    assert "SM clock MHz" in labels and "SM clock, card idle" in labels
    (idle_line,) = [
        line
        for ax in fig.axes
        for line in ax.get_lines()
        if line.get_label() == "SM clock, card idle"
    ]
    assert idle_line.get_linestyle() == ":"
    assert "dotted where the card was idle" in report_html(r)
