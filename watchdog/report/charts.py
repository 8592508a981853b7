"""The report's charts, drawn with matplotlib's Agg canvas (no display, no pyplot state).

Each `draw_*` function draws one chart of a `Report` on the axes it is given, so the same
drawing makes the HTML page's separate images and the PNG's one tall picture.
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter, date2num
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from llm_watchdog.report.data import HEAT, Report, Series

P50 = "#1f77b4"
P95 = "#d62728"
TARGET = "#2ca02c"
TEMP = "#e6550d"
CLOCK = "#3182bd"
THROTTLE = "#9e9ac8"  # slowed by heat
POWER_CAP = "#c7e9c0"  # at the power cap: a cool card at full load touches it too
DRIFT = "#fdae6b"
ALLOWANCE = "#31a354"
INFLIGHT = "#756bb1"
ACTION = "#636363"

WIDTH_IN, HEIGHT_IN, DPI = 10.5, 3.2, 100


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, timezone.utc)


def _x(ts: float) -> float:
    """Matplotlib's date number for unix seconds (the axis shows UTC)."""
    return float(date2num(_dt(ts)))


def _xy(series: Series, scale: float = 1.0) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for ts, v in zip(series.ts, series.values, strict=True):
        xs.append(_x(ts))
        ys.append(float("nan") if v is None else v * scale)
    return xs, ys


def _time_axis(ax: Axes, r: Report) -> None:
    locator = AutoDateLocator()
    ax.xaxis.set_major_locator(locator)
    # Seconds-level ticks read 13:18:30, not a bare "30" beside 13:18.
    formats = ["%Y", "%b", "%d", "%H:%M", "%H:%M", "%H:%M:%S"]
    # No offset label: the page title carries the date, and "2026-Dec-06 01:28" under the
    # right end of the axis reads as one more tick.
    ax.xaxis.set_major_formatter(ConciseDateFormatter(locator, formats=formats, show_offset=False))
    ax.set_xlim(_x(r.since_ts), _x(r.until_ts))
    ax.set_xlabel("UTC")
    ax.grid(True, alpha=0.3)


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")


def _action_marks(ax: Axes, r: Report) -> None:
    for i, m in enumerate(r.actions):
        label = "control action" if i == 0 else None
        ax.axvline(_x(m.ts), color=ACTION, lw=0.8, ls=":", label=label)


def draw_ttft(ax: Axes, r: Report) -> bool:
    """Chat (canary) TTFT p50/p95 per window against the target; drift events shaded."""
    ax.set_title("Chat TTFT (canary) p50 / p95 against the target")
    ax.set_ylabel("seconds")
    _time_axis(ax, r)
    for i, p in enumerate(r.drift):
        ax.axvspan(_x(p.start_ts), _x(p.end_ts), color=DRIFT, alpha=0.3,
                   label="drift event" if i == 0 else None)  # fmt: skip
    _action_marks(ax, r)
    if not r.ttft_p95_ms:
        _empty(ax, "no canary TTFT in this span")
        return False
    ax.plot(*_xy(r.ttft_p50_ms, 0.001), color=P50, lw=1.5, marker=".", label="p50")
    p95 = f"p95 {r.window_label}" if r.window_label else "p95"
    ax.plot(*_xy(r.ttft_p95_ms, 0.001), color=P95, lw=1.5, marker=".", label=p95)
    if r.target_p95_ms:
        ax.axhline(r.target_p95_ms / 1000.0, color=TARGET, ls="--", lw=1.2, label="target p95")
    ax.set_ylim(bottom=0)
    # Where it hides the fewest points: upper left covers the first windows of a span.
    ax.legend(loc="best", fontsize=8)
    return True


def draw_gpu(ax: Axes, r: Report) -> bool:
    """GPU temperature (left) and SM clock (right); periods slowed by heat shaded, and apart
    from them, periods at the power cap."""
    ax.set_title("GPU temperature and SM clock", loc="left")
    _time_axis(ax, r)
    said: set[str] = set()
    for p in r.throttled:
        heat = p.kind == HEAT
        label = "slowed by heat" if heat else "at the power cap"
        # The edge keeps a period of one sample (start = end) in sight, as a line.
        ax.axvspan(_x(p.start_ts), _x(p.end_ts), color=THROTTLE if heat else POWER_CAP,
                   alpha=0.35 if heat else 0.6, lw=0.8,
                   label=None if label in said else label)  # fmt: skip
        said.add(label)
    if not r.temp_c and not r.sm_clock_mhz and not r.sm_clock_idle_mhz:
        _empty(ax, "no GPU samples in this span")
        return False
    ax.plot(*_xy(r.temp_c), color=TEMP, lw=1.5, label="temperature °C")
    ax.set_ylabel("°C", color=TEMP)
    right = ax.twinx()
    right.plot(*_xy(r.sm_clock_mhz), color=CLOCK, lw=1.2, label="SM clock MHz")
    if r.sm_clock_idle_mhz:
        # An idle card sits at its floor whatever the heat: drawn faint and dotted, apart
        # from the clock it works at, so a cut to 0 does not read as heat taking the clock.
        right.plot(*_xy(r.sm_clock_idle_mhz), color=CLOCK, lw=1.0, ls=":", alpha=0.6,
                   label="SM clock, card idle")  # fmt: skip
    right.set_ylabel("MHz", color=CLOCK)
    # The clock from zero: a fall reads at its true share (to half the clock, half the
    # height), and a steady clock sits near the top instead of on a steady temperature, where
    # each axis centred on its own constant drew one line over the other.
    clocks = [v for s in (r.sm_clock_mhz, r.sm_clock_idle_mhz) for v in s.values if v is not None]
    if clocks:
        right.set_ylim(0, max(clocks) * 1.15)
    lines = ax.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    # Above the plot, right of the title: inside, it hid the trace wherever it was put.
    ax.legend(lines[0] + more[0], lines[1] + more[1], loc="lower right",
              bbox_to_anchor=(1.0, 1.0), ncol=4, fontsize=8, frameon=False,
              borderaxespad=0.2)  # fmt: skip
    return True


def draw_batch(ax: Axes, r: Report) -> bool:
    """The batch allowance (steps) and the batch requests in flight; control actions marked."""
    ax.set_title("Batch allowance and batch in flight; control actions marked")
    ax.set_ylabel("requests")
    _time_axis(ax, r)
    _action_marks(ax, r)
    if not r.allowance and not r.inflight:
        _empty(ax, "no batch allowance or in-flight counts in this span")
        return False
    if r.allowance:
        ax.plot(*_xy(r.allowance), color=ALLOWANCE, lw=1.8, drawstyle="steps-post",
                label="allowance")  # fmt: skip
    if r.inflight:
        ax.plot(*_xy(r.inflight), color=INFLIGHT, lw=1.0, marker=".", ms=3, label="in flight")
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # counts of requests
    ax.legend(loc="best", fontsize=8)  # upper left covers the allowance where it starts
    return True


def _seconds_text(v: float, _pos: int | None = None) -> str:
    """A TTFT tick: "20 ms", "500 ms", "1.5 s", not 2×10⁻²."""
    if v <= 0:
        return "0"
    return f"{v * 1000:.3g} ms" if v < 1 else f"{v:.3g} s"


def draw_scatter(ax: Axes, r: Report) -> bool:
    """TTFT against SM clock, one point per canary, coloured by batch in flight."""
    ax.set_title("Canary TTFT against SM clock, coloured by batch in flight")
    ax.set_xlabel("SM clock MHz")
    ax.set_ylabel("TTFT")
    ax.grid(True, alpha=0.3)
    if not r.scatter:
        _empty(ax, "no canaries with a GPU sample beside them")
        return False
    ys = [p[1] / 1000.0 for p in r.scatter]
    known = [p for p in r.scatter if p[2] is not None]
    unknown = [p for p in r.scatter if p[2] is None]
    counts = [p[2] for p in known if p[2] is not None]
    # A colour bar needs counts that vary: one count throughout, or none (no gateway counts
    # batch), reads as a bar from -0.1 to 0.1; the title says it instead.
    varies = bool(counts) and min(counts) != max(counts)
    if not counts:
        ax.set_title("Canary TTFT against SM clock; batch in flight not counted (no gateway)")
    elif not varies:
        where = "wherever counted" if unknown else "throughout"
        ax.set_title(f"Canary TTFT against SM clock; batch in flight {counts[0]:g} {where}")
    if unknown:
        ax.scatter([p[0] for p in unknown], [p[1] / 1000.0 for p in unknown],
                   color="tab:gray" if counts else "tab:blue", s=14, alpha=0.6,
                   label="batch not counted" if counts else None)  # fmt: skip
    if varies:
        points = ax.scatter([p[0] for p in known], [p[1] / 1000.0 for p in known], c=counts,
                            cmap="viridis", s=14, alpha=0.8)  # fmt: skip
    elif known:
        ax.scatter([p[0] for p in known], [p[1] / 1000.0 for p in known], color="tab:blue",
                   s=14, alpha=0.8)  # fmt: skip
    if unknown and counts:
        # Heat moves points left and load moves them up: upper left is where the slowest,
        # hottest canaries land, so the legend goes where it hides the fewest.
        ax.legend(loc="best", fontsize=8)
    if min(ys) > 0 and max(ys) / min(ys) > 20:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(FuncFormatter(_seconds_text))
    # Beside the plot, in the margin the charts above keep for their right axes: a bar
    # that takes its room from the plot leaves this chart narrower than the others and
    # the bar far off at the page's edge.
    if varies:
        bar = ax.figure.colorbar(points, cax=ax.inset_axes((1.01, 0.0, 0.015, 1.0)))
        bar.set_label("batch in flight")
        bar.ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # a count: no 2.5 requests
    return True


CHARTS: list[tuple[str, Callable[[Axes, Report], bool]]] = [
    ("ttft", draw_ttft),
    ("gpu", draw_gpu),
    ("batch", draw_batch),
    ("scatter", draw_scatter),
]
# The charts that draw NVML's readings: the scatter's x axis is the SM clock.
GPU_CHARTS = frozenset({"gpu", "scatter"})


def charts_for(r: Report) -> list[tuple[str, Callable[[Axes, Report], bool]]]:
    """The charts a report draws: all of them, less the GPU charts in latency-only mode and
    the batch chart where nothing counted batch, which could only be empty frames (the
    report's notes say why, once each)."""
    return [
        (name, draw)
        for name, draw in CHARTS
        if not (r.latency_only and name in GPU_CHARTS) and not (r.no_batch and name == "batch")
    ]


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    FigureCanvasAgg(fig)
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def chart_pngs(r: Report) -> list[tuple[str, bytes, bool]]:
    """(id, PNG bytes, drawn) per chart, each WIDTH_IN × HEIGHT_IN inches at DPI."""
    out = []
    for name, draw in charts_for(r):
        fig = Figure(figsize=(WIDTH_IN, HEIGHT_IN), layout="constrained")
        drawn = draw(fig.add_subplot(), r)
        out.append((name, _png(fig), drawn))
    return out


# A note's lines in the PNG: 10 pt DejaVu Sans runs about 7.4 px a character at 100 dpi,
# so 135 characters leave a margin in the 1050 px picture.
NOTE_CHARS, NOTE_LINE_IN = 135, 0.2


def report_png(r: Report) -> bytes:
    """`report_figure` as PNG bytes."""
    return _png(report_figure(r))


def report_figure(r: Report) -> Figure:
    """Every chart in one tall picture, with the source and span as its title and the
    report's notes under it (the picture has no page around it to say them)."""
    charts = charts_for(r)
    # The page's header facts and its headroom table, as lines: the picture has no page.
    said = [" · ".join(f"{k} {v}" for k, v in r.facts())]
    if r.headroom:
        holds = f"that keeps {r.headroom_rule}" if r.headroom_rule else "chat holds at"
        said.append(f"headroom (batch in flight {holds}): " + headroom_text(r.headroom))
    said += r.notes
    notes = [line for note in said for line in textwrap.wrap(note, NOTE_CHARS)]
    height = HEIGHT_IN * len(charts) + 0.5 + NOTE_LINE_IN * len(notes)
    fig = Figure(figsize=(WIDTH_IN, height), layout="constrained")
    title = "\n".join([f"llm-watchdog report: {r.source}, {_span(r)}", *notes])
    fig.suptitle(title, fontsize=10)
    axes = fig.subplots(len(charts), 1, squeeze=False)[:, 0]
    for ax, (_, draw) in zip(axes, charts, strict=True):
        draw(ax, r)
    return fig


def headroom_text(rows: list[dict[str, Any]]) -> str:
    """`llm-watchdog headroom`'s rows on one line: "cool ≥ 4 (likely, 93 probes) · ..."."""
    out = []
    for row in rows:
        allowance = row.get("allowance")
        if allowance is None:
            answer = "not enough data yet"
        else:
            mark = {"at least": "≥ ", "at most": "≤ "}.get(str(row.get("bound")), "")
            how = f"{row.get('confidence')}, {row.get('n')} {row.get('unit')}"
            answer = f"{mark}{allowance} ({how})"
        out.append(f"{row.get('state')} {answer}")
    return " · ".join(out)


def _span(r: Report) -> str:
    """The span to the second where it is under a day ("01:11 to 01:14" of a 3.5-minute demo
    loses half of it), the end without its date where it is the start's."""
    start, end = _dt(r.since_ts), _dt(r.until_ts)
    fmt = "%Y-%m-%d %H:%M" if r.until_ts - r.since_ts >= 86400 else "%Y-%m-%d %H:%M:%S"
    end_fmt = fmt[9:] if start.date() == end.date() else fmt
    return f"{start.strftime(fmt)} to {end.strftime(end_fmt)} UTC"
