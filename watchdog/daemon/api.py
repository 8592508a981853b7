"""The daemon's read side over HTTP: `/metrics` (prometheus-client) and `/status` (JSON).

A scrape reads values the daemon already holds in memory (the last probe, the last GPU
samples, the judge's state, the counters below), so it never touches the engine. Names and
labels follow the ecosystem: dcgm-exporter's `gpu`, `UUID`, `modelName`, `Hostname` on GPU
series, vLLM's `model_name` (with `engine`) on the canary TTFT histogram.

The server is one asyncio loop on one thread, whatever the number of clients: an idle
connection costs a socket, never a thread. At most `max_connections` are open; a new one
past that closes the longest-idle one (one waiting for its request), so a burst of idle or
half-open connections cannot lock a scrape out. A client that leaves mid-answer is dropped
without a word in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import platform
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from llm_watchdog import __version__
from llm_watchdog.errors import ConfigError
from llm_watchdog.models import GpuSample
from llm_watchdog.nvml.throttle import REASON_NAMES

log = logging.getLogger("llm_watchdog.daemon.api")

# Histogram buckets for TTFT in seconds: 10 ms (a cached prompt on a small model) to 60 s
# (a chat stuck behind a batch prefill on a throttled card). The gateway uses the same ones,
# so canary and real chat quantiles come from the same edges.
TTFT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _Histogram:
    def __init__(self) -> None:
        self.buckets = [0] * len(TTFT_BUCKETS_S)  # cumulative: observations <= each edge
        self.count = 0
        self.sum_s = 0.0

    def observe(self, s: float) -> None:
        self.count += 1
        self.sum_s += s
        for i, edge in enumerate(TTFT_BUCKETS_S):
            if s <= edge:
                self.buckets[i] += 1


class ProbeMetrics:
    """Counters over every probe and GPU sample since start; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.total: dict[tuple[str, str], int] = {}  # (outcome, error_class) -> count
        self.ttft: dict[tuple[str, str], _Histogram] = {}  # (model_name, engine) -> histogram
        self.cold_total = 0
        self.quality_fail_total = 0
        # (gpu index, "thermal"|"power") -> seconds throttled, summed from NVML's
        # per-sample violation times: a counter, as dcgm-exporter exports them.
        self.violation_s: dict[tuple[int, str], float] = {}

    def add(
        self,
        ok: bool,
        error_class: str | None,
        ttft_ms: float | None,
        cold: bool,
        quality_pass: bool | None,
        *,
        model_name: str | None = None,
        engine: str | None = None,
    ) -> None:
        with self._lock:
            key = ("ok" if ok else "failed", error_class or "")
            self.total[key] = self.total.get(key, 0) + 1
            self.cold_total += int(cold)
            self.quality_fail_total += int(quality_pass is False)
            if ok and ttft_ms is not None and not cold:
                labels = (model_name or "unknown", engine or "unknown")
                self.ttft.setdefault(labels, _Histogram()).observe(ttft_ms / 1000.0)

    def add_gpu(self, samples: Iterable[GpuSample]) -> None:
        with self._lock:
            for s in samples:
                for kind, ms in (
                    ("thermal", s.thermal_violation_ms),
                    ("power", s.power_violation_ms),
                ):
                    if ms is not None and ms >= 0:
                        key = (s.gpu_index, kind)
                        self.violation_s[key] = self.violation_s.get(key, 0.0) + ms / 1000.0

    def families(self) -> list[Metric]:
        with self._lock:
            probes = CounterMetricFamily(
                "llm_watchdog_probes",
                "Canary probes by outcome and error class.",
                labels=["outcome", "error"],
            )
            for (outcome, err), n in sorted(self.total.items()):
                probes.add_metric([outcome, err], n)
            cold = CounterMetricFamily(
                "llm_watchdog_cold_probes", "Probes recorded as cold starts.", value=self.cold_total
            )
            quality = CounterMetricFamily(
                "llm_watchdog_quality_failures",
                "Answers that missed the expectation.",
                value=self.quality_fail_total,
            )
            ttft = HistogramMetricFamily(
                "llm_watchdog_ttft_seconds",
                "Warm canary time to first token.",
                labels=["model_name", "engine"],
            )
            for labels, h in sorted(self.ttft.items()):
                buckets = [(repr(e), n) for e, n in zip(TTFT_BUCKETS_S, h.buckets, strict=True)]
                buckets.append(("+Inf", h.count))
                ttft.add_metric(list(labels), buckets, h.sum_s)
            return [probes, cold, quality, ttft]

    def violations(self) -> dict[tuple[int, str], float]:
        with self._lock:
            return dict(self.violation_s)


GPU_GAUGES = (
    ("temp_c", "llm_watchdog_gpu_temperature_celsius", "GPU temperature."),
    ("temp_slowdown_c", "llm_watchdog_gpu_slowdown_temperature_celsius", "Slowdown threshold."),
    ("sm_clock_mhz", "llm_watchdog_gpu_sm_clock_mhz", "SM clock."),
    ("sm_clock_max_mhz", "llm_watchdog_gpu_sm_clock_max_mhz", "Maximum SM clock."),
    ("mem_clock_mhz", "llm_watchdog_gpu_mem_clock_mhz", "Memory clock."),
    ("power_w", "llm_watchdog_gpu_power_watts", "Power draw."),
    ("power_limit_w", "llm_watchdog_gpu_power_limit_watts", "Enforced power limit."),
    ("util_gpu_pct", "llm_watchdog_gpu_utilization_percent", "GPU utilisation."),
    ("fan_pct", "llm_watchdog_gpu_fan_speed_percent", "Fan speed."),
    ("throttle_reasons", "llm_watchdog_gpu_clock_event_reasons", "NVML clock-event bitmask."),
)
GPU_LABELS = ["gpu", "UUID", "modelName", "Hostname"]


def heat_eta_s(
    temp_c: float | None, slowdown_c: float | None, slope_c_per_min: float | None
) -> float | None:
    """Seconds until the slowdown threshold at the current warming rate; None when not warming."""
    if temp_c is None or slowdown_c is None or not slope_c_per_min or slope_c_per_min <= 0:
        return None
    return max(0.0, slowdown_c - temp_c) / slope_c_per_min * 60.0


class DaemonCollector(Collector):
    """Everything `/metrics` shows, built at scrape time from `status()` and the counters."""

    def __init__(
        self,
        status: Callable[[], dict[str, Any]],
        probes: ProbeMetrics,
        hostname: str | None = None,
    ) -> None:
        self.status = status
        self.probes = probes
        self.hostname = hostname or socket.gethostname()

    def collect(self) -> Iterator[Metric]:
        st = self.status()
        info = InfoMetricFamily("llm_watchdog_build", "llm-watchdog's version and Python.")
        info.add_metric([], {"version": __version__, "python": platform.python_version()})
        yield info
        yield from self.probes.families()
        yield from self._probe_state(st)
        yield from self._gpus(st)
        yield from self._drift(st)
        yield from self._control(st)
        yield from self._alerts(st)

    def _probe_state(self, st: dict[str, Any]) -> Iterator[Metric]:
        last = st.get("last_probe") or {}
        if last.get("ts") is not None:
            yield GaugeMetricFamily(
                "llm_watchdog_last_probe_timestamp_seconds",
                "Unix time of the last canary probe.",
                value=float(last["ts"]),
            )
            yield GaugeMetricFamily(
                "llm_watchdog_last_probe_ok",
                "1 when the last canary probe succeeded.",
                value=1.0 if last.get("ok") else 0.0,
            )
        yield GaugeMetricFamily(
            "llm_watchdog_nvml_available",
            "1 while NVML answers; 0 when the daemon runs on latency alone.",
            value=1.0 if st.get("nvml") else 0.0,
        )

    def _gpus(self, st: dict[str, Any]) -> Iterator[Metric]:
        gpus = st.get("gpus") or []
        names = {g.get("index"): g.get("name") for g in st.get("gpu_info") or []}

        def labels(g: dict[str, Any]) -> list[str]:
            i = g["gpu_index"]
            return [str(i), g.get("uuid") or "", names.get(i) or "", self.hostname]

        by_index = {g["gpu_index"]: labels(g) for g in gpus}
        for key, name, help_text in GPU_GAUGES:
            values = [(g, g.get(key)) for g in gpus if g.get(key) is not None]
            if not values:
                continue
            fam = GaugeMetricFamily(name, help_text, labels=GPU_LABELS)
            for g, v in values:
                fam.add_metric(labels(g), float(v))
            yield fam
        if gpus:
            ts = GaugeMetricFamily(
                "llm_watchdog_gpu_last_sample_timestamp_seconds",
                "Unix time of the last NVML sample.",
                labels=GPU_LABELS,
            )
            reasons = GaugeMetricFamily(
                "llm_watchdog_gpu_clock_event_active",
                "1 for each NVML clock-event (throttle) reason now set.",
                labels=[*GPU_LABELS, "reason"],
            )
            for g in gpus:
                ts.add_metric(labels(g), float(g["ts"]))
                mask = g.get("throttle_reasons")
                if mask is None:
                    continue
                for bit, reason in REASON_NAMES.items():
                    reasons.add_metric([*labels(g), reason], 1.0 if mask & bit else 0.0)
            yield ts
            yield reasons
        violations = self.probes.violations()
        for kind in ("thermal", "power"):
            counter = CounterMetricFamily(
                f"llm_watchdog_gpu_{kind}_violation_seconds",
                f"Time the clocks were held down by {kind} limits (NVML violation counters).",
                labels=GPU_LABELS,
            )
            for (index, k), seconds in sorted(violations.items()):
                if k == kind and index in by_index:
                    counter.add_metric(by_index[index], seconds)
            yield counter

    def _drift(self, st: dict[str, Any]) -> Iterator[Metric]:
        drift = st.get("drift") or {}
        baseline = drift.get("baseline") or {}
        if baseline.get("ttft_p95_ms") is not None:
            yield GaugeMetricFamily(
                "llm_watchdog_baseline_ttft_p95_seconds",
                "The baseline canary TTFT p95.",
                value=baseline["ttft_p95_ms"] / 1000.0,
            )
        if drift.get("recent_p95_ms") is not None:
            yield GaugeMetricFamily(
                "llm_watchdog_recent_ttft_p95_seconds",
                "Canary TTFT p95 over the detector's recent window; a canary that got no "
                "first token within the timeout counts as the time it waited.",
                value=drift["recent_p95_ms"] / 1000.0,
            )
        learning = drift.get("learning") or {}
        if drift:
            yield GaugeMetricFamily(
                "llm_watchdog_baseline_learning",
                "1 while the baseline is still being learned.",
                value=1.0 if not baseline and learning else 0.0,
            )
        fam = GaugeMetricFamily(
            "llm_watchdog_drift_open",
            "Open drift events by kind and cause.",
            labels=["kind", "cause"],
        )
        counts: dict[tuple[str, str], int] = {}
        for ev in drift.get("open_events") or []:
            k = (str(ev.get("kind") or "unknown"), str(ev.get("cause") or "unknown"))
            counts[k] = counts.get(k, 0) + 1
        for (kind, cause), n in sorted(counts.items()):
            fam.add_metric([kind, cause], n)
        yield fam
        slope = drift.get("temp_slope_c_per_min")
        gpus = st.get("gpus") or []
        if gpus:
            g = gpus[0]  # drift is judged against the first GPU
            eta = heat_eta_s(g.get("temp_c"), g.get("temp_slowdown_c"), slope)
            if eta is not None:
                yield GaugeMetricFamily(
                    "llm_watchdog_heat_eta_seconds",
                    "Seconds until the slowdown temperature at the current warming rate.",
                    value=eta,
                )

    def _control(self, st: dict[str, Any]) -> Iterator[Metric]:
        control = st.get("control") or {}
        target = control.get("target_p95_ms")
        if target is not None:
            yield GaugeMetricFamily(
                "llm_watchdog_target_ttft_p95_seconds",
                "The chat TTFT p95 the control loop holds.",
                value=target / 1000.0,
            )
        if control.get("allowance") is not None:
            yield GaugeMetricFamily(
                "llm_watchdog_batch_allowance",
                "The batch allowance last set.",
                value=control["allowance"],
            )
        if control.get("inflight") is not None:
            yield GaugeMetricFamily(
                "llm_watchdog_batch_inflight",
                "Batch requests in flight, as the actuator last read them.",
                value=control["inflight"],
            )
        if control:
            actions = CounterMetricFamily(
                "llm_watchdog_control_actions",
                "Control decisions by kind (the law's reason: cut, halve, shed, grow, hold…).",
                labels=["reason"],
            )
            for reason, n in sorted((control.get("actions") or {}).items()):
                actions.add_metric([reason], n)
            yield actions
            last = control.get("last") or {}
            yield GaugeMetricFamily(
                "llm_watchdog_control_not_effective",
                "1 while the actuator's read-back disagrees with the last write.",
                value=1.0 if control.get("not_effective") else 0.0,
            )
            if last.get("p95_est_ms") is not None:
                yield GaugeMetricFamily(
                    "llm_watchdog_control_chat_p95_estimate_seconds",
                    "The chat TTFT p95 estimate the last control decision used.",
                    value=last["p95_est_ms"] / 1000.0,
                )

    def _alerts(self, st: dict[str, Any]) -> Iterator[Metric]:
        deliveries = st.get("alert_deliveries")
        if deliveries is None:
            return
        fam = CounterMetricFamily(
            "llm_watchdog_alert_deliveries",
            "Alert deliveries by sink and outcome (ok, failed), counted once each.",
            labels=["sink", "outcome"],
        )
        for sink, outcomes in sorted(deliveries.items()):
            for outcome, n in sorted(outcomes.items()):
                fam.add_metric([sink, outcome], n)
        yield fam


def build_registry(
    status: Callable[[], dict[str, Any]], probes: ProbeMetrics, hostname: str | None = None
) -> CollectorRegistry:
    """A registry of its own (not the global one): two daemons in one process stay apart."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DaemonCollector(status, probes, hostname))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


# A request head bigger than this is not a scrape.
MAX_HEAD_BYTES = 16 * 1024


def _bind(host: str, port: int, family: socket.AddressFamily) -> socket.socket:
    """The listening socket for `api.listen`, or a ConfigError naming the setting.

    A ConfigError is exit 78 (EX_CONFIG), which the unit's RestartPreventExitStatus=78 does
    not restart: a port that another process holds stays taken however often systemd
    retries (with RestartSec=5s the restarts never reach the start limit, so any other
    status would loop for good), and what frees it is a person choosing another port or
    stopping the other process, then `systemctl restart llm-watchdog`. The gateway words its
    own port-in-use error in these words (llm_watchdog.gateway.server.bind_socket).
    """
    try:
        return socket.create_server((host, port), family=family, backlog=256)
    except OSError as exc:
        hint = (
            "is another llm-watchdog running? pick another port with api.listen "
            '("" turns the endpoint off), or stop the process that holds it'
            if exc.errno == errno.EADDRINUSE
            else "check the api.listen address: HOST:PORT on this machine"
        )
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        # create_server() appends "(while attempting to bind on …)" to strerror: the
        # address is said once, here.
        reason = (exc.strerror or str(exc)).split(" (while attempting")[0]
        raise ConfigError(f"api.listen: cannot listen on {where} ({reason}): {hint}") from exc


class ApiServer:
    """Serves `/metrics` and `/status` on one asyncio thread with bounded connections."""

    def __init__(
        self,
        host: str,
        port: int,
        status: Callable[[], dict[str, Any]],
        probes: ProbeMetrics,
        *,
        max_connections: int = 128,
        idle_timeout_s: float = 30.0,
        hostname: str | None = None,
    ) -> None:
        self.status = status
        self.probes = probes
        self.registry = build_registry(status, probes, hostname)
        self.max_connections = max_connections
        self.idle_timeout_s = idle_timeout_s
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # Bound here, so a port in use fails start-up with the caller's error handling.
        self._sock = _bind(host, port, family)
        self._loop = asyncio.new_event_loop()
        self._stopped: asyncio.Event | None = None
        # Open connections, oldest first; True while waiting for a request (idle).
        self._conns: dict[asyncio.StreamWriter, bool] = {}
        self.thread = threading.Thread(target=self._run, name="api", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._sock.getsockname()[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    def start(self) -> ApiServer:
        ready = threading.Event()
        self._ready = ready
        self.thread.start()
        ready.wait(5)
        return self

    def stop(self) -> None:
        if self.thread.is_alive() and self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
            self.thread.join(timeout=5)
        with contextlib.suppress(OSError):
            self._sock.close()

    # ---- the loop's thread --------------------------------------------------------------

    def _run(self) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        loop.set_exception_handler(_quiet_exceptions)
        try:
            loop.run_until_complete(self._serve())
        finally:
            loop.close()

    async def _serve(self) -> None:
        self._stopped = asyncio.Event()
        server = await asyncio.start_server(self._handle, sock=self._sock, limit=MAX_HEAD_BYTES)
        self._ready.set()
        try:
            await self._stopped.wait()
        finally:
            server.close()
            for writer in list(self._conns):
                writer.transport.abort()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 2)

    def _make_room(self) -> bool:
        """Close the longest-idle connection when at the cap; False if none is idle."""
        if len(self._conns) < self.max_connections:
            return True
        for writer, idle in self._conns.items():
            if idle:
                writer.transport.abort()
                self._conns.pop(writer, None)
                return True
        return False

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._make_room():
            writer.transport.abort()
            return
        self._conns[writer] = True
        wait = self.idle_timeout_s
        try:
            while True:
                self._conns[writer] = True
                try:
                    head = await asyncio.wait_for(
                        reader.readuntil(b"\r\n\r\n"), self.idle_timeout_s
                    )
                except asyncio.LimitOverrunError:
                    await _write(
                        writer, *_plain(431, "request head too large"), keep=False, timeout_s=wait
                    )
                    return
                except (asyncio.TimeoutError, asyncio.IncompleteReadError, OSError):
                    return
                if writer not in self._conns:  # closed to make room
                    return
                self._conns[writer] = False
                request = _parse_head(head)
                if request is None:
                    await _write(writer, *_plain(400, "bad request"), keep=False, timeout_s=wait)
                    return
                method, target, version, headers = request
                length = headers.get("content-length", "0")
                if not length.isdigit() or int(length) > MAX_HEAD_BYTES:
                    await _write(
                        writer, *_plain(413, "no request body expected"), keep=False, timeout_s=wait
                    )
                    return
                if int(length):
                    await asyncio.wait_for(reader.readexactly(int(length)), self.idle_timeout_s)
                keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
                status, ctype, body = self._answer(method, target, headers)
                answer = b"" if method == "HEAD" else body
                await _write(writer, status, ctype, answer, keep=keep, timeout_s=wait)
                if not keep:
                    return
        except (OSError, asyncio.IncompleteReadError):
            return  # the client left mid-request or mid-answer
        except asyncio.TimeoutError:
            # A client that stopped reading: close() would wait for its unread answer.
            writer.transport.abort()
        finally:
            self._conns.pop(writer, None)
            writer.close()

    def _answer(self, method: str, target: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
        if method not in ("GET", "HEAD"):
            return _plain(405, "only GET and HEAD")
        path = target.split("?", 1)[0]
        try:
            if path == "/metrics":
                encoder, ctype = choose_encoder(headers.get("accept", ""))
                return 200, ctype, encoder(self.registry)
            if path in ("/status", "/"):
                body = json.dumps(self.status(), default=str, indent=1).encode()
                return 200, "application/json", body
        except Exception:
            log.exception("serving %s failed", path)
            return _plain(500, "internal error; see the daemon's log")
        return _plain(404, "try /metrics or /status")


def _plain(status: int, text: str) -> tuple[int, str, bytes]:
    return status, "text/plain; charset=utf-8", (text + "\n").encode()


REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
}


async def _write(
    writer: asyncio.StreamWriter,
    status: int,
    ctype: str,
    body: bytes,
    *,
    keep: bool,
    timeout_s: float = 30.0,
) -> None:
    head = (
        f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\n"
        f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
        f"Date: {time.strftime('%a, %d %b %Y %H:%M:%S GMT', time.gmtime())}\r\n"
        f"Connection: {'keep-alive' if keep else 'close'}\r\n\r\n"
    )
    writer.write(head.encode("latin-1") + body)
    if writer.transport.get_write_buffer_size() == 0:
        # All of it is in the kernel: returning without a yield puts the connection back to
        # idle at once, so a burst of quick answers never makes every connection look busy
        # and shut a newcomer out.
        return
    # A client that sends and never reads fills the socket: past the idle timeout it is
    # dropped, or it would hold its place among max_connections for ever (a busy connection
    # is never closed to make room).
    await asyncio.wait_for(writer.drain(), timeout_s)


def _parse_head(head: bytes) -> tuple[str, str, str, dict[str, str]] | None:
    try:
        lines = head.decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ")
    except ValueError:
        return None
    if not version.startswith("HTTP/1."):
        return None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            return None
        headers[name.strip().lower()] = value.strip()
    return method, target, version, headers


def _quiet_exceptions(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    # A peer that resets or leaves is normal for a scrape endpoint; anything else is logged.
    exc = context.get("exception")
    if isinstance(exc, (ConnectionError, asyncio.TimeoutError)):
        log.debug("api connection: %s", exc)
        return
    loop.default_exception_handler(context)
