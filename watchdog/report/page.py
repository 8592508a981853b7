"""The report as one self-contained HTML page: charts as embedded PNGs, tables as HTML.

Nothing is fetched when the page is viewed (no scripts, fonts or images from elsewhere), so
it opens from a mail attachment or an air-gapped box. Charts sit at fixed positions and
carry their box in `data-box="x,y,width,height"` (CSS pixels), so a screenshot can be
checked chart by chart.
"""

from __future__ import annotations

import base64
import html
from datetime import datetime, timezone
from typing import Any

from llm_watchdog import __version__
from llm_watchdog.report.charts import CHARTS, DPI, HEIGHT_IN, WIDTH_IN, chart_pngs
from llm_watchdog.report.data import Report

LEFT_PX = 20
HEADER_PX = 130
GAP_PX = 24
CHART_W_PX = int(WIDTH_IN * DPI)
CHART_H_PX = int(HEIGHT_IN * DPI)

CAPTIONS = {
    "ttft": "Chat TTFT p50 and p95 per window (canary probes), the target dashed; drift "
    "events shaded orange, control actions dotted.",
    "gpu": "GPU temperature and SM clock (dotted where the card was idle, at its floor "
    "whatever the heat); periods slowed by heat (a thermal clock-event reason set) shaded "
    "purple, periods at the power cap and not hot shaded green.",
    "batch": "The batch allowance the watchdog set and the batch requests in flight.",
    "scatter": "Each canary's TTFT against the SM clock at that moment, coloured by the batch "
    "requests in flight: heat moves points left, load moves them up and yellow.",
}


def chart_boxes(
    names: list[str] | None = None, header_px: int = HEADER_PX
) -> dict[str, tuple[int, int, int, int]]:
    """Where each chart's image lies on the page, in CSS pixels (all of CHARTS by default)."""
    boxes = {}
    for i, name in enumerate(names if names is not None else [n for n, _ in CHARTS]):
        top = header_px + i * (CHART_H_PX + GAP_PX)
        boxes[name] = (LEFT_PX, top, CHART_W_PX, CHART_H_PX)
    return boxes


# Room in the header for each note: two lines of 14 px text at the charts' width.
NOTE_PX = 44


# The facts that come from NVML's readings, left out where there were none.


def _fmt_ts(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _table(rows: list[dict[str, Any]], limit: int = 200) -> str:
    if not rows:
        return ""
    cols = list(rows[0])
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in cols)
    body = []
    for r in rows[:limit]:
        cells = "".join(f"<td>{html.escape(_cell(r.get(c)))}</td>" for c in cols)
        body.append(f"<tr>{cells}</tr>")
    more = f"<p>… {len(rows) - limit} more rows</p>" if len(rows) > limit else ""
    return f"<table><tr>{head}</tr>{''.join(body)}</table>{more}"


def _cell(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def report_html(r: Report) -> str:
    header_px = HEADER_PX + NOTE_PX * len(r.notes)
    pngs = chart_pngs(r)
    boxes = chart_boxes([name for name, _, _ in pngs], header_px)
    figures = []
    for name, png, drawn in pngs:
        x, y, w, h = boxes[name]
        data = base64.b64encode(png).decode()
        figures.append(
            f'<figure id="chart-{name}" class="chart" data-box="{x},{y},{w},{h}" '
            f'data-drawn="{int(drawn)}" style="left:{x}px;top:{y}px;width:{w}px">'
            f'<img alt="{html.escape(CAPTIONS[name])}" width="{w}" height="{h}" '
            f'src="data:image/png;base64,{data}"><figcaption>{html.escape(CAPTIONS[name])}'
            "</figcaption></figure>"
        )
    tables_top = header_px + len(pngs) * (CHART_H_PX + GAP_PX) + 20
    facts = r.facts()
    fact_html = " · ".join(f"<b>{html.escape(k)}</b> {html.escape(v)}" for k, v in facts)
    notes = "".join(f"<p class=note>{html.escape(n)}</p>" for n in r.notes)
    drift_rows = [
        {"start": _fmt_ts(p.start_ts), "end": _fmt_ts(p.end_ts), "event": p.label} for p in r.drift
    ]
    action_rows = [{"time": _fmt_ts(m.ts), "action": m.label} for m in r.actions]
    rule = (
        f"<p>batch in flight that keeps {html.escape(r.headroom_rule)}</p>"
        if r.headroom_rule
        else ""
    )
    headroom = "<h2>Headroom</h2>" + rule + _table(r.headroom) if r.headroom else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>llm-watchdog report {html.escape(_fmt_ts(r.since_ts))}</title>
<style>
body {{ margin:0; font:14px/1.4 system-ui, sans-serif; color:#222; background:#fff; }}
header {{ position:absolute; left:{LEFT_PX}px; top:0; width:{CHART_W_PX}px;
  height:{header_px - 10}px; overflow:hidden; }}
h1 {{ font-size:20px; margin:14px 0 4px; }} h2 {{ font-size:16px; margin:18px 0 6px; }}
.chart {{ position:absolute; margin:0; }} .chart img {{ display:block; }}
figcaption {{ font-size:12px; color:#555; }}
#tables {{ position:absolute; left:{LEFT_PX}px; top:{tables_top}px; width:{CHART_W_PX}px; }}
table {{ border-collapse:collapse; font-size:12px; }}
td, th {{ border:1px solid #ccc; padding:2px 6px; text-align:left; }}
.note {{ color:#a33; margin:2px 0; }}
</style></head><body>
<header><h1>llm-watchdog report</h1>
<div>{html.escape(r.source)}; {html.escape(_fmt_ts(r.since_ts))} to
{html.escape(_fmt_ts(r.until_ts))}</div><div>{fact_html}</div>{notes}</header>
{"".join(figures)}
<div id="tables">
{headroom}
<h2>Drift events</h2>{_table(drift_rows) or "<p>none</p>"}
<h2>Control actions</h2>{_table(action_rows) or "<p>none</p>"}
<p style="color:#888">llm-watchdog {html.escape(__version__)}</p>
</div></body></html>
"""
