"""What a report shows, as plain values, from the daemon's rows or from Prometheus series.

Pure: rows and series in, a `Report` out; no clock, no files, no sockets. `charts.py` draws
it and `page.py` lays it out.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from llm_watchdog.durations import human_duration
from llm_watchdog.nvml.throttle import is_idle, is_power, is_thermal, reason_names


@dataclass
class Series:
    """Points over time: unix seconds and a value (None where nothing was measured)."""

    ts: list[float] = field(default_factory=list)
    values: list[float | None] = field(default_factory=list)

    def add(self, ts: float, value: float | None) -> None:
        self.ts.append(ts)
        self.values.append(value)

    def __bool__(self) -> bool:
        return any(v is not None for v in self.values)


@dataclass(frozen=True)
class Period:
    start_ts: float
    end_ts: float
    label: str  # the throttle reasons, or the drift event's kind and cause
    # HEAT or POWER for a throttle period, None for a drift event: set where the period is
    # made, from the reasons themselves, so no reader has to parse the label back.
    kind: str | None = None


@dataclass(frozen=True)
class Mark:
    ts: float
    label: str  # a control action: "cut 8 -> 4"


@dataclass
class Report:
    source: str  # "database /var/lib/…/watchdog.db" or "Prometheus http://…, instance box1"
    since_ts: float
    until_ts: float
    target_p95_ms: float | None = None
    ttft_p50_ms: Series = field(default_factory=Series)
    ttft_p95_ms: Series = field(default_factory=Series)
    temp_c: Series = field(default_factory=Series)
    sm_clock_mhz: Series = field(default_factory=Series)  # a working card's (None where idle)
    # The clock of samples with GpuIdle set: the card's floor, whatever the heat. Drawn apart,
    # or the demo's hot phase with the batch cut to 0 read as heat taking the clock to 210 MHz.
    sm_clock_idle_mhz: Series = field(default_factory=Series)
    throttled: list[Period] = field(default_factory=list)
    allowance: Series = field(default_factory=Series)
    inflight: Series = field(default_factory=Series)
    drift: list[Period] = field(default_factory=list)
    actions: list[Mark] = field(default_factory=list)
    # (SM clock MHz, TTFT ms, batch in flight) per canary, or per step from Prometheus.
    # (SM clock MHz, TTFT ms, batch in flight: None where nothing counted it, no gateway)
    scatter: list[tuple[float, float, float | None]] = field(default_factory=list)
    headroom: list[dict[str, Any]] = field(default_factory=list)
    headroom_rule: str = ""  # what "chat holds" means in the headroom rows (rule_words)
    notes: list[str] = field(default_factory=list)
    # Canaries and no GPU telemetry at all: a daemon without NVML, or without an NVIDIA GPU.
    # The GPU charts are left out and NO_GPU_NOTE says why. A span with neither is a daemon
    # that did not run, and keeps its empty charts.
    latency_only: bool = False
    # Canaries and no batch counts at all: a daemon that watches no gateway (control off, or
    # the engine served directly). The batch chart is left out and NO_BATCH_NOTE says why.
    no_batch: bool = False
    # What one p95 point stands for, as its legend says: "per 10 s window", and where a window
    # holds fewer than 20 probes its nearest-rank p95 is its slowest probe, which it says too.
    window_label: str = ""

    def facts(self) -> list[tuple[str, str]]:
        """The span in figures, as the page's header and the picture's title give them."""
        s = self.summary()
        facts = [
            ("worst window p95", _ms(s["worst_p95_ms"])),
            ("windows over target", f"{s['windows_over_target']} of {s['windows']}"),
            ("target p95", _ms(self.target_p95_ms)),
            ("peak temperature", "–" if s["peak_temp_c"] is None else f"{s['peak_temp_c']:.0f} °C"),
            ("time slowed by heat", f"{s['heat_s'] / 60:.1f} min"),
            ("at the power cap", f"{s['power_s'] / 60:.1f} min"),
            ("drift events", str(s["drift_events"])),
            ("control actions", str(s["control_actions"])),
        ]
        if self.latency_only:
            # Nothing measured the card: "0.0 min slowed by heat" would read as a cool card.
            facts = [f for f in facts if f[0] not in GPU_FACTS]
        if self.no_batch:
            # No gateway was watched: "0 control actions" would read as a calm control loop.
            facts = [f for f in facts if f[0] != "control actions"]
        return facts

    def summary(self) -> dict[str, Any]:
        p95 = [v for v in self.ttft_p95_ms.values if v is not None]
        temps = [v for v in self.temp_c.values if v is not None]
        return {
            # Windows with probes in them: a span that runs past the data has empty ones.
            "windows": len(p95),
            "worst_p95_ms": max(p95) if p95 else None,
            "windows_over_target": sum(
                1 for v in p95 if self.target_p95_ms and v > self.target_p95_ms
            ),
            "peak_temp_c": max(temps) if temps else None,
            "throttled_s": sum(p.end_ts - p.start_ts for p in self.throttled),
            "heat_s": sum(p.end_ts - p.start_ts for p in self.throttled if p.kind == HEAT),
            "power_s": sum(p.end_ts - p.start_ts for p in self.throttled if p.kind == POWER),
            "drift_events": len(self.drift),
            "control_actions": len(self.actions),
        }


# The facts that only a GPU reading can give: left out of a latency-only report.
GPU_FACTS = frozenset({"peak temperature", "time slowed by heat", "at the power cap"})


def _ms(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v / 1000:.2f} s" if v >= 1000 else f"{v:.0f} ms"


def window_s(since_ts: float, until_ts: float, probe_interval_s: float | None = None) -> float:
    """The quantile window for a span: at most 100 windows, and about 10 probes in each (a
    p95 of two probes is noise)."""
    span = max(60.0, until_ts - since_ts)
    least = 10.0 * (probe_interval_s or 0.0)
    for step in (10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400):
        if span / step <= 100 and step >= least:
            return float(step)
    return 86400.0


def probe_interval_s(probes: Sequence[dict[str, Any]]) -> float | None:
    """The median time between probes; None with fewer than two."""
    gaps = sorted(b["ts"] - a["ts"] for a, b in zip(probes, probes[1:], strict=False))
    return gaps[len(gaps) // 2] if gaps else None


def nearest_rank(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def ttft_windows(
    probes: Sequence[dict[str, Any]], since_ts: float, until_ts: float, step_s: float
) -> tuple[Series, Series, list[int]]:
    """Warm, successful canary TTFT p50 and p95 per window (window mid-points), and how many
    probes each window with probes in it holds."""
    buckets: dict[int, list[float]] = {}
    for p in probes:
        if p.get("ok") and not p.get("cold") and p.get("ttft_ms") is not None:
            buckets.setdefault(int((p["ts"] - since_ts) // step_s), []).append(p["ttft_ms"])
    p50, p95 = Series(), Series()
    for i in range(int(math.ceil((until_ts - since_ts) / step_s))):
        mid = since_ts + (i + 0.5) * step_s
        values = buckets.get(i, [])
        p50.add(mid, nearest_rank(values, 0.50))
        p95.add(mid, nearest_rank(values, 0.95))
    return p50, p95, [len(v) for v in buckets.values()]


def window_label(counts: Sequence[int], step_s: float) -> str:
    """The p95 legend's words for `ttft_windows`' windows, given the probes in each: "per
    60 s window", and where the usual window holds fewer than 20 probes, that its p95 is its
    slowest probe (the nearest rank of 19 at 95 % is the 19th), so a spike reads as one slow
    probe, not a tail."""
    label = f"per {human_duration(step_s)} window"
    if counts:
        usual = sorted(counts)[len(counts) // 2]
        if usual < 20:
            label += f" of ~{usual} probes: its slowest"
    return label


# Said once, at the top of a latency-only report, in place of GPU charts with nothing in them.
NO_GPU_NOTE = (
    "No GPU telemetry was recorded in this span (latency-only mode: no NVML, or no NVIDIA "
    "GPU). Chat latency is shown, but a slowdown cannot be put down to heat or the power cap: "
    "nothing measured the card's temperature, clocks or power. GPU charts are left out."
)

NO_BATCH_NOTE = (
    "No batch allowance or batch in flight was recorded in this span: the daemon reads them "
    "from the gateway, and watched none (control off, or chat served by the engine directly). "
    "The batch chart is left out."
)

HEAT, POWER = "heat", "power cap"  # the two kinds of throttle a period is of


def throttle_kind(mask: int | None) -> str | None:
    """HEAT, POWER or None (not held down). Heat wins where both hold: it is what slows."""
    if is_thermal(mask):
        return HEAT
    if is_power(mask):
        return POWER
    return None


def throttled_periods(gpu: Sequence[dict[str, Any]]) -> list[Period]:
    """Runs of samples held down by heat, or by the power cap, each run of one kind; the
    label is the kind and the reasons seen ("heat: sw_thermal_slowdown"). A power cap that
    comes and goes at full load is not heat, and a report that shades both alike reads a
    cool card's cap as throttling."""
    periods: list[Period] = []
    start: float | None = None
    kind: str | None = None
    last_ts = 0.0
    names: set[str] = set()
    gaps = [b["ts"] - a["ts"] for a, b in zip(gpu, gpu[1:], strict=False)]
    usual = sorted(gaps)[len(gaps) // 2] if gaps else 0.0
    max_gap = 3.0 * usual if gaps else math.inf
    for g in gpu:
        mask = g.get("throttle_reasons")
        now = throttle_kind(mask)
        if start is not None and (now != kind or g["ts"] - last_ts > max_gap):
            # A sample stands for the time until the next one: a run of one sample is a
            # second at the cap, not none. Where the samples stopped, a usual gap.
            end = g["ts"] if g["ts"] - last_ts <= max_gap else last_ts + usual
            periods.append(_throttled(start, end, kind, names))
            start, names = None, set()
        if now is not None:
            if start is None:
                start, kind = g["ts"], now
            names.update(n for n in reason_names(mask) if n != "gpu_idle")
            last_ts = g["ts"]
    if start is not None:
        periods.append(_throttled(start, last_ts + usual, kind, names))
    return periods


def _throttled(start_ts: float, end_ts: float, kind: str | None, names: set[str]) -> Period:
    return Period(start_ts, end_ts, f"{kind}: {','.join(sorted(names))}", kind)


def _row_at(
    ts_sorted: list[float], rows: Sequence[dict[str, Any]], ts: float
) -> dict[str, Any] | None:
    """The row nearest before or at `ts` (None before the first)."""
    i = bisect.bisect_right(ts_sorted, ts) - 1
    return rows[i] if i >= 0 else None


def from_rows(
    *,
    source: str,
    since_ts: float,
    until_ts: float,
    probes: Sequence[dict[str, Any]],
    gpu: Sequence[dict[str, Any]],
    actions: Sequence[dict[str, Any]] = (),
    events: Sequence[dict[str, Any]] = (),
    headroom: Sequence[dict[str, Any]] = (),
    target_p95_ms: float | None = None,
    gpu_index: int | None = None,
    headroom_rule: str = "",
) -> Report:
    """A report from the daemon's own rows (one GPU: the first, or `gpu_index`).

    The span starts at the first row when the data starts later (a daemon started an hour
    ago, asked for a day), so the charts show the data rather than an empty left side.
    """
    firsts = [rows[0]["ts"] for rows in (probes, gpu) if rows]
    if firsts and min(firsts) > since_ts:
        since_ts = max(since_ts, min(firsts) - 0.02 * (until_ts - min(firsts)))
    if gpu:
        index = gpu_index if gpu_index is not None else min(g["gpu_index"] for g in gpu)
        gpu = [g for g in gpu if g["gpu_index"] == index]
    report = Report(source, since_ts, until_ts, target_p95_ms=target_p95_ms)
    step = window_s(since_ts, until_ts, probe_interval_s(probes))
    report.ttft_p50_ms, report.ttft_p95_ms, counts = ttft_windows(probes, since_ts, until_ts, step)
    report.window_label = window_label(counts, step)
    for g in gpu:
        report.temp_c.add(g["ts"], g.get("temp_c"))
        clock = g.get("sm_clock_mhz")
        idle = is_idle(g.get("throttle_reasons"))
        report.sm_clock_mhz.add(g["ts"], None if idle else clock)
        report.sm_clock_idle_mhz.add(g["ts"], clock if idle else None)
    report.throttled = throttled_periods(gpu)
    for p in probes:
        report.inflight.add(p["ts"], p.get("batch_inflight"))
        if not actions:
            report.allowance.add(p["ts"], p.get("batch_allowance"))
    for a in actions:
        if a.get("applied") == 0:
            continue
        report.allowance.add(a["ts"], a.get("allowance_after"))
        if a.get("kind") != "hold" and a.get("allowance_after") != a.get("allowance_before"):
            report.actions.append(
                Mark(a["ts"], f"{a['kind']} {a['allowance_before']}→{a['allowance_after']}")
            )
    # What the daemon last saw: an event still open then, or an allowance still in force,
    # is drawn up to there, not on past a daemon that stopped.
    last_ts = max([rows[-1]["ts"] for rows in (probes, gpu) if rows], default=until_ts)
    if actions and report.allowance.ts:
        report.allowance.add(max(last_ts, report.allowance.ts[-1]), report.allowance.values[-1])
    for e in events:
        end = e.get("end_ts") or max(last_ts, e["start_ts"])
        report.drift.append(
            Period(max(e["start_ts"], since_ts), min(end, until_ts), f"{e['kind']} ({e['cause']})")
        )
    gpu_ts = [g["ts"] for g in gpu]
    for p in probes:
        if not p.get("ok") or p.get("cold") or p.get("ttft_ms") is None:
            continue
        sample = _row_at(gpu_ts, gpu, p["ts"]) or {}
        clock = sample.get("sm_clock_mhz")
        # A card idle before the canary reads its clock floor (210 MHz, thermal bit or not),
        # not the clock the canary ran at: such a point would put fast chat at the lowest clock.
        if clock is not None and not is_idle(sample.get("throttle_reasons")):
            report.scatter.append((clock, p["ttft_ms"], p.get("batch_inflight")))
    report.headroom = list(headroom)
    report.headroom_rule = headroom_rule
    if not probes:
        report.notes.append("No canary probes in this span: is the daemon running?")
    if probes and not gpu:
        report.latency_only = True
        report.notes.append(NO_GPU_NOTE)
    mark_no_batch(report)
    return report


def mark_no_batch(report: Report) -> None:
    """Leave the batch chart out, with a note, where chat was measured and batch never was."""
    if report.ttft_p95_ms and not report.allowance and not report.inflight and not report.actions:
        report.no_batch = True
        report.notes.append(NO_BATCH_NOTE)


def merge_series(points: Iterable[tuple[float, float]]) -> Series:
    out = Series()
    for ts, v in sorted(points):
        out.add(ts, v)
    return out
