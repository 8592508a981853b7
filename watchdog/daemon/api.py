"""The daemon's read side over HTTP: `/metrics` (Prometheus text format 0.0.4) and `/status`.

A stdlib threading server on its own thread: a scrape reads values the daemon already holds
in memory (the last probe, the last GPU samples, the judge's state), so it never touches the
engine and costs microseconds. Binds 127.0.0.1 by default.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger("llm_watchdog.daemon.api")

# Histogram buckets for TTFT in seconds: 10 ms (a cached prompt on a small model) to 60 s
# (a chat stuck behind a batch prefill on a throttled card).
TTFT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ProbeMetrics:
    """Counters and a TTFT histogram over every probe since start; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.total: dict[tuple[str, str], int] = {}  # (outcome, error_class) -> count
        self.buckets = [0] * len(TTFT_BUCKETS_S)
        self.count = 0
        self.sum_s = 0.0
        self.cold_total = 0
        self.quality_fail_total = 0

    def add(
        self,
        ok: bool,
        error_class: str | None,
        ttft_ms: float | None,
        cold: bool,
        quality_pass: bool | None,
    ) -> None:
        with self._lock:
            key = ("ok" if ok else "failed", error_class or "")
            self.total[key] = self.total.get(key, 0) + 1
            self.cold_total += int(cold)
            self.quality_fail_total += int(quality_pass is False)
            if ok and ttft_ms is not None and not cold:
                s = ttft_ms / 1000.0
                self.count += 1
                self.sum_s += s
                for i, edge in enumerate(TTFT_BUCKETS_S):
                    if s <= edge:
                        self.buckets[i] += 1

    def lines(self) -> list[str]:
        with self._lock:
            out = [
                "# HELP llm_watchdog_probes_total Canary probes by outcome and error class.",
                "# TYPE llm_watchdog_probes_total counter",
            ]
            for (outcome, err), n in sorted(self.total.items()):
                out.append(f'llm_watchdog_probes_total{{outcome="{outcome}",error="{err}"}} {n}')
            out += [
                "# HELP llm_watchdog_cold_probes_total Probes recorded as cold starts.",
                "# TYPE llm_watchdog_cold_probes_total counter",
                f"llm_watchdog_cold_probes_total {self.cold_total}",
                "# HELP llm_watchdog_quality_failures_total Answers that missed the expectation.",
                "# TYPE llm_watchdog_quality_failures_total counter",
                f"llm_watchdog_quality_failures_total {self.quality_fail_total}",
                "# HELP llm_watchdog_ttft_seconds Warm canary time to first token.",
                "# TYPE llm_watchdog_ttft_seconds histogram",
            ]
            for edge, n in zip(TTFT_BUCKETS_S, self.buckets, strict=True):
                out.append(f'llm_watchdog_ttft_seconds_bucket{{le="{edge}"}} {n}')
            out += [
                f'llm_watchdog_ttft_seconds_bucket{{le="+Inf"}} {self.count}',
                f"llm_watchdog_ttft_seconds_sum {self.sum_s:.6f}",
                f"llm_watchdog_ttft_seconds_count {self.count}",
            ]
            return out


GPU_GAUGES = (
    ("temp_c", "llm_watchdog_gpu_temperature_celsius", "GPU temperature."),
    ("sm_clock_mhz", "llm_watchdog_gpu_sm_clock_mhz", "SM clock."),
    ("sm_clock_max_mhz", "llm_watchdog_gpu_sm_clock_max_mhz", "Maximum SM clock."),
    ("power_w", "llm_watchdog_gpu_power_watts", "Power draw."),
    ("power_limit_w", "llm_watchdog_gpu_power_limit_watts", "Enforced power limit."),
    ("util_gpu_pct", "llm_watchdog_gpu_utilization_percent", "GPU utilisation."),
    ("throttle_reasons", "llm_watchdog_gpu_clock_event_reasons", "NVML clock-event bitmask."),
)


def render_metrics(probes: ProbeMetrics, status: dict[str, Any]) -> str:
    out = probes.lines()
    gpus = status.get("gpus") or []
    for key, name, help_text in GPU_GAUGES:
        values = [(g["gpu_index"], g.get(key)) for g in gpus if g.get(key) is not None]
        if not values:
            continue
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        out += [f'{name}{{gpu="{i}"}} {v}' for i, v in values]
    drift = status.get("drift") or {}
    baseline = drift.get("baseline") or {}
    if baseline:
        out += [
            "# HELP llm_watchdog_baseline_ttft_p95_seconds The baseline chat TTFT p95.",
            "# TYPE llm_watchdog_baseline_ttft_p95_seconds gauge",
            f"llm_watchdog_baseline_ttft_p95_seconds {baseline['ttft_p95_ms'] / 1000.0}",
        ]
    open_kinds = drift.get("open_events") or []
    out += [
        "# HELP llm_watchdog_drift_open Open drift events by kind and cause.",
        "# TYPE llm_watchdog_drift_open gauge",
    ]
    counts: dict[tuple[str, str], int] = {}
    for ev in open_kinds:
        k = (ev.get("kind", "unknown"), ev.get("cause", "unknown"))
        counts[k] = counts.get(k, 0) + 1
    for (kind, cause), n in sorted(counts.items()):
        out.append(f'llm_watchdog_drift_open{{kind="{kind}",cause="{cause}"}} {n}')
    control = status.get("control") or {}
    if control.get("allowance") is not None:
        out += [
            "# HELP llm_watchdog_batch_allowance The batch allowance last set.",
            "# TYPE llm_watchdog_batch_allowance gauge",
            f"llm_watchdog_batch_allowance {control['allowance']}",
        ]
    return "\n".join(out) + "\n"


class ApiServer:
    """Serves `/metrics` and `/status` from `status()` (a dict) and the probe counters."""

    def __init__(
        self, host: str, port: int, status: Callable[[], dict[str, Any]], probes: ProbeMetrics
    ) -> None:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - stdlib name
                path = self.path.split("?", 1)[0]
                try:
                    if path == "/metrics":
                        body = render_metrics(api.probes, api.status()).encode()
                        ctype = "text/plain; version=0.0.4; charset=utf-8"
                    elif path in ("/status", "/"):
                        body = json.dumps(api.status(), default=str, indent=1).encode()
                        ctype = "application/json"
                    else:
                        self.send_error(404, "try /metrics or /status")
                        return
                except Exception:
                    log.exception("serving %s failed", path)
                    self.send_error(500)
                    return
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.status = status
        self.probes = probes
        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="api", daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        name = host.decode() if isinstance(host, bytes) else host
        return f"http://{name}:{port}"

    def start(self) -> ApiServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
