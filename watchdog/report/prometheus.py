"""Reads llm-watchdog's series from a Prometheus server's HTTP API (`/api/v1/query_range`).

The fleet path: every box's daemon and gateway are scraped by one Prometheus, and `report`
or `history --prometheus URL` read them from there. With an `instance`, one box; without,
the fleet at once: TTFT quantiles over every box's histogram, the hottest GPU, the slowest
clock, allowances and in-flight counts summed.
"""

from __future__ import annotations

import math
from typing import Any

import httpx

from llm_watchdog.durations import human_duration
from llm_watchdog.errors import WatchdogError
from llm_watchdog.report.data import (
    HEAT,
    NO_GPU_NOTE,
    POWER,
    Mark,
    Period,
    Report,
    Series,
    mark_no_batch,
    window_s,
)

HEAT_REASONS = "sw_thermal_slowdown|hw_thermal_slowdown|hw_slowdown"
POWER_REASONS = "sw_power_cap|hw_power_brake_slowdown"
THROTTLE_REASONS = f"{HEAT_REASONS}|{POWER_REASONS}"


class PrometheusError(WatchdogError):
    """Prometheus could not be reached or refused a query; the text says which."""


class PrometheusClient:
    def __init__(
        self, url: str, *, timeout_s: float = 30.0, transport: httpx.BaseTransport | None = None
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise PrometheusError(f"{url!r}: give the Prometheus URL as http://host:9090")
        self.url = url.rstrip("/")
        self._client = httpx.Client(timeout=timeout_s, transport=transport)

    def close(self) -> None:
        self._client.close()

    def _get(self, path: str, params: dict[str, Any]) -> Any:
        try:
            r = self._client.get(self.url + path, params=params)
        except httpx.HTTPError as exc:
            raise PrometheusError(
                f"cannot reach Prometheus at {self.url} ({type(exc).__name__}): "
                "is it up and the URL right?"
            ) from None
        try:
            body = r.json()
        except ValueError:
            raise PrometheusError(
                f"{self.url}{path} answered {r.status_code} without JSON: is this Prometheus?"
            ) from None
        if body.get("status") != "success":
            raise PrometheusError(
                f"Prometheus refused {params.get('query')!r}: {body.get('error', r.status_code)}"
            )
        return body["data"]

    def range(self, query: str, start: float, end: float, step_s: float) -> list[dict[str, Any]]:
        """Matrix result: [{"metric": {labels}, "values": [[ts, "value"], ...]}, ...]."""
        data = self._get(
            "/api/v1/query_range", {"query": query, "start": start, "end": end, "step": step_s}
        )
        return list(data.get("result") or [])

    def instant(self, query: str, at: float | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"query": query}
        if at is not None:
            params["time"] = at
        return list(self._get("/api/v1/query", params).get("result") or [])


def _value(text: str) -> float | None:
    v = float(text)
    return None if math.isnan(v) or math.isinf(v) else v


def _series(result: list[dict[str, Any]], scale: float = 1.0) -> Series:
    out = Series()
    if result:
        for ts, text in result[0]["values"]:
            v = _value(text)
            out.add(float(ts), None if v is None else v * scale)
    return out


def _periods(
    result: list[dict[str, Any]], step_s: float, label_of: Any, kind: str | None = None
) -> list[Period]:
    periods = []
    for item in result:
        start = last = None
        for ts_text, text in item["values"]:
            ts, v = float(ts_text), _value(text)
            on = v is not None and v > 0
            if start is not None and (not on or ts - (last or ts) > 1.5 * step_s):
                # A point stands for its step: a period of one point is a step long, not none.
                end = ts if ts - (last or ts) <= 1.5 * step_s else (last or start) + step_s
                periods.append(Period(start, end, label_of(item["metric"]), kind))
                start = None
            if on:
                start = ts if start is None else start
                last = ts
        if start is not None:
            periods.append(Period(start, (last or start) + step_s, label_of(item["metric"]), kind))
    return sorted(periods, key=lambda p: p.start_ts)


def from_prometheus(
    url: str,
    since_ts: float,
    until_ts: float,
    *,
    instance: str | None = None,
    target_p95_ms: float | None = None,
    transport: httpx.BaseTransport | None = None,
) -> Report:
    client = PrometheusClient(url, transport=transport)
    try:
        return _report(client, since_ts, until_ts, instance, target_p95_ms)
    finally:
        client.close()


def _report(
    client: PrometheusClient,
    since_ts: float,
    until_ts: float,
    instance: str | None,
    target_p95_ms: float | None,
) -> Report:
    sel = f'instance="{_escape(instance)}"' if instance else ""
    # Prometheus steps are points, not windows: four a window, no finer than its scrapes.
    step = max(15.0, window_s(since_ts, until_ts) / 4)
    rate_window = f"{int(max(300.0, 2 * step))}s"

    def q(query: str) -> list[dict[str, Any]]:
        return client.range(query, since_ts, until_ts, step)

    def m(name: str, extra: str = "") -> str:
        inner = ",".join(x for x in (sel, extra) if x)
        return f"{name}{{{inner}}}"

    source = f"Prometheus {client.url}" + (f", instance {instance}" if instance else ", fleet")
    report = Report(source, since_ts, until_ts, target_p95_ms=target_p95_ms)
    buckets = f"sum by (le) (rate({m('llm_watchdog_ttft_seconds_bucket')}[{rate_window}]))"
    report.ttft_p50_ms = _series(q(f"histogram_quantile(0.5, {buckets})"), 1000.0)
    report.ttft_p95_ms = _series(q(f"histogram_quantile(0.95, {buckets})"), 1000.0)
    report.window_label = f"over the {human_duration(float(rate_window[:-1]))} before each point"
    report.temp_c = _series(q(f"max({m('llm_watchdog_gpu_temperature_celsius')})"))
    report.sm_clock_mhz = _series(q(f"min({m('llm_watchdog_gpu_sm_clock_mhz')})"))
    # Heat, and the power cap where heat does not hold too: one kind at a time, as the
    # store's periods are (report.data.throttled_periods).
    heat_sel = 'reason=~"' + HEAT_REASONS + '"'
    power_sel = 'reason=~"' + POWER_REASONS + '"'
    heat_q = f"max({m('llm_watchdog_gpu_clock_event_active', heat_sel)})"
    power_q = f"max({m('llm_watchdog_gpu_clock_event_active', power_sel)})"
    report.throttled = sorted(
        _periods(q(heat_q), step, lambda labels: f"{HEAT}: {HEAT_REASONS.replace('|', ',')}", HEAT)
        + _periods(
            q(f"{power_q} unless ({heat_q} > 0)"),
            step,
            lambda labels: f"{POWER}: {POWER_REASONS.replace('|', ',')}",
            POWER,
        ),
        key=lambda p: p.start_ts,
    )
    report.allowance = _series(q(f"sum({m('llm_watchdog_batch_allowance')})"))
    report.inflight = _series(q(f"sum({m('llm_watchdog_batch_inflight')})"))
    drift = q(f"max by (kind, cause) ({m('llm_watchdog_drift_open')})")
    report.drift = _periods(
        drift, step, lambda labels: f"{labels.get('kind', '?')} ({labels.get('cause', '?')})"
    )
    not_hold = m("llm_watchdog_control_actions_total", 'reason!="hold"')
    actions = q(f"sum by (reason) (increase({not_hold}[{int(step)}s]))")
    for item in actions:
        for ts, text in item["values"]:
            v = _value(text)
            if v is not None and v >= 0.5:
                reason = item["metric"].get("reason", "?")
                report.actions.append(Mark(float(ts), f"{reason} ×{v:.0f}"))
    report.actions.sort(key=lambda a: a.ts)
    if target_p95_ms is None:
        target = _series(q(f"max({m('llm_watchdog_target_ttft_p95_seconds')})"), 1000.0)
        known = [v for v in target.values if v is not None]
        report.target_p95_ms = known[-1] if known else None
    clock = dict(zip(report.sm_clock_mhz.ts, report.sm_clock_mhz.values, strict=True))
    inflight = dict(zip(report.inflight.ts, report.inflight.values, strict=True))
    for ts, v in zip(report.ttft_p95_ms.ts, report.ttft_p95_ms.values, strict=True):
        c = clock.get(ts)
        if v is not None and c is not None:
            report.scatter.append((c, v, inflight.get(ts)))
    if report.ttft_p95_ms and not report.temp_c and not report.sm_clock_mhz:
        report.latency_only = True
        report.notes.append(NO_GPU_NOTE)
    mark_no_batch(report)
    if not report.ttft_p95_ms and not report.temp_c:
        where = f"instance {instance!r}" if instance else "any instance"
        report.notes.append(
            f"Prometheus has no llm-watchdog series for {where} in this span: "
            "is it scraping the daemon (api.listen) and the gateway?"
        )
    return report


FLEET_QUERIES = {
    "up": 'max by (instance) (up{job=~".*watchdog.*"})',
    "canary_p95_ms": "1000 * histogram_quantile(0.95, sum by (instance, le) "
    "(rate(llm_watchdog_ttft_seconds_bucket[10m])))",
    "temp_c": "max by (instance) (llm_watchdog_gpu_temperature_celsius)",
    "sm_clock_mhz": "min by (instance) (llm_watchdog_gpu_sm_clock_mhz)",
    "throttled": "max by (instance) (llm_watchdog_gpu_clock_event_active"
    f'{{reason=~"{THROTTLE_REASONS}"}})',
    "allowance": "sum by (instance) (llm_watchdog_batch_allowance)",
    "inflight": "sum by (instance) (llm_watchdog_batch_inflight)",
    "drift_open": "sum by (instance) (llm_watchdog_drift_open)",
}


def fleet(
    url: str, at: float | None = None, *, transport: httpx.BaseTransport | None = None
) -> list[dict[str, Any]]:
    """One row per instance: what each box shows now (or at `at`), for `history --prometheus`."""
    client = PrometheusClient(url, transport=transport)
    rows: dict[str, dict[str, Any]] = {}
    try:
        for column, query in FLEET_QUERIES.items():
            for item in client.instant(query, at):
                name = item["metric"].get("instance", "?")
                rows.setdefault(name, {"instance": name, **dict.fromkeys(FLEET_QUERIES)})
                rows[name][column] = _value(item["value"][1])
    finally:
        client.close()
    return [rows[k] for k in sorted(rows)]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')
