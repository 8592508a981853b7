"""What the gateway saw, per class: counters, histograms, and rings of recent values.

Pure bookkeeping (no clock, no I/O): callers pass the times. `Observer.families()` gives the
prometheus-client metric families that `metrics_registry()` serves on /metrics (the gateway
mounts prometheus-client's ASGI app over it), `ClassStats.summary()` the figures shown under
`observed` in GET /control.

TTFT here is the time from sending the request upstream to the first body chunk coming
back, measured on streamed answers (SSE or NDJSON) only: for a non-streamed answer the
first byte arrives with the last, which is not a time to first token.
"""

from __future__ import annotations

import json
import math
import platform
import re
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from llm_watchdog import __version__

# Seconds. TTFT spans a cached 17 ms answer to a multi-second prefill under load (see
# docs/probe.md), the same edges as the daemon's canary histogram from 10 ms to 60 s, so
# real chat and canary quantiles compare edge for edge; queue waits span 0 to
# max_queue_wait_s.
TTFT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
QUEUE_WAIT_BUCKETS_S = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

# The `model_name` label (vLLM's name for the served model) is the request body's "model": at
# most this many names a class, the rest counted as "other", so clients that send made-up
# names cannot grow the gateway's memory or a Prometheus server's series without end.
MODEL_NAMES_MAX = 16
MODEL_NAME_MAX_CHARS = 128
# A JSON key "model" with a string value. Quotes inside a JSON string are escaped, so the
# text of a message can never match; the first match is the request's own key.
_MODEL_KEY = re.compile(rb'"model"\s*:\s*"((?:[^"\\]|\\.){1,512})"')


def model_of(body: bytes) -> str:
    """The "model" a request body names, or "unknown"; read with one regular-expression scan,
    not a JSON parse of a body that may hold a whole document."""
    m = _MODEL_KEY.search(body)
    if m is None:
        return "unknown"
    name = m.group(1).decode("utf-8", "replace")
    if "\\" in name:
        try:
            name = json.loads(f'"{name}"')
        except ValueError:
            return "unknown"
    return name[:MODEL_NAME_MAX_CHARS] or "unknown"


# Ways a request can end, the `outcome` label of llm_watchdog_gateway_requests_total.
OUTCOMES = (
    "ok",  # upstream answered 1xx-3xx and it was relayed to the end
    "upstream_status",  # upstream answered 4xx/5xx (relayed as it was)
    "rejected",  # 429 from the gateway: queue wait ran out or queue full
    "rerouted",  # sent to the secondary upstream instead of waiting longer
    "disconnected",  # the client left before the answer was complete
    "upstream_error",  # upstream unreachable, timed out, or broke mid-answer
    "preempted",  # ended by the gateway when its class's allowance was cut (--preempt-batch)
    "stalled",  # ended by the gateway: the client took no bytes (--client-stall-timeout)
)


class Histogram:
    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)  # the last one is +Inf
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1

    def lines(self, name: str, labels: str) -> Iterable[str]:
        cumulative = 0
        for bound, n in zip(self.buckets, self.counts, strict=False):
            cumulative += n
            yield f'{name}_bucket{{{labels},le="{bound:g}"}} {cumulative}'
        yield f'{name}_bucket{{{labels},le="+Inf"}} {self.count}'
        yield f"{name}_sum{{{labels}}} {self.total:.6f}"
        yield f"{name}_count{{{labels}}} {self.count}"

    def cumulative(self) -> list[tuple[str, float]]:
        """(le, cumulative count) pairs ending with +Inf, as prometheus-client takes them."""
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip(self.buckets, self.counts, strict=False):
            running += n
            out.append((repr(float(bound)), running))
        out.append(("+Inf", self.count))
        return out


def quantile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank quantile (no interpolation): a value that was actually seen."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


class ClassStats:
    """Everything observed for one class."""

    def __init__(self, ring_size: int) -> None:
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.requests = 0
        # Requests that ask the engine for work (POST): what the controller counts as
        # arrivals; reading models or health is not load.
        self.work_requests = 0
        self.chunks = 0
        self.ttft: dict[str, Histogram] = {}  # model_name -> histogram
        self.queue_wait = Histogram(QUEUE_WAIT_BUCKETS_S)
        # (unix seconds, milliseconds), newest last; bounded so a busy day costs nothing.
        self.recent_ttft: deque[tuple[float, float]] = deque(maxlen=ring_size)
        self.recent_queue_wait: deque[tuple[float, float]] = deque(maxlen=ring_size)

    def record_ttft(self, wall: float, ttft_s: float, model: str = "unknown") -> None:
        hist = self.ttft.get(model)
        if hist is None:
            if len(self.ttft) >= MODEL_NAMES_MAX:
                model = "other"
            hist = self.ttft.setdefault(model, Histogram(TTFT_BUCKETS_S))
        hist.observe(ttft_s)
        self.recent_ttft.append((wall, ttft_s * 1000.0))

    def record_queue_wait(self, wall: float, wait_s: float) -> None:
        self.queue_wait.observe(wait_s)
        self.recent_queue_wait.append((wall, wait_s * 1000.0))

    # list(deque) copies in one step under the GIL, so a reader on another thread (the
    # daemon, a test) never sees the ring change under its feet.
    def ttft_since(self, since: float) -> list[tuple[float, float]]:
        return [item for item in list(self.recent_ttft) if item[0] > since]

    def summary(self, wall: float, window_s: float) -> dict[str, object]:
        since = wall - window_s
        ttfts = [ms for ts, ms in list(self.recent_ttft) if ts > since]
        waits = [ms for ts, ms in list(self.recent_queue_wait) if ts > since]
        out: dict[str, object] = {"requests_total": self.requests}
        out.update({f"{k}_total": v for k, v in self.outcomes.items()})
        out.update(
            {
                "window_s": window_s,
                "ttft_count": len(ttfts),
                "ttft_p50_ms": _round(quantile(ttfts, 0.50)),
                "ttft_p95_ms": _round(quantile(ttfts, 0.95)),
                "queue_wait_count": len(waits),
                "queue_wait_p50_ms": _round(quantile(waits, 0.50)),
                "queue_wait_p95_ms": _round(quantile(waits, 0.95)),
            }
        )
        return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


class Observer:
    def __init__(self, classes: Iterable[str], ring_size: int) -> None:
        self.classes = {name: ClassStats(ring_size) for name in classes}
        # The upstream engine's name ("vllm", "llamacpp", ...), from the last identity read
        # (GET /control/identity): the `engine` label of the TTFT histogram.
        self.engine = "unknown"

    def __getitem__(self, cls: str) -> ClassStats:
        return self.classes[cls]

    def families(self, gauges: dict[str, dict[str, float | None]]) -> Iterator[Metric]:
        """Metric families; `gauges` maps a GAUGE_HELP name to per-class values."""
        p = "llm_watchdog_gateway"
        requests = CounterMetricFamily(
            f"{p}_requests", "Requests by class and how they ended.", labels=["class", "outcome"]
        )
        chunks = CounterMetricFamily(
            f"{p}_relayed_chunks",
            "Body pieces relayed to clients: one per upstream read, holding all it brought.",
            labels=["class"],
        )
        ttft = HistogramMetricFamily(
            f"{p}_ttft_seconds",
            "Request sent upstream to first body chunk back, streamed answers only.",
            labels=["class", "model_name", "engine"],
        )
        wait = HistogramMetricFamily(
            f"{p}_queue_wait_seconds",
            "Time spent waiting for an allowance place.",
            labels=["class"],
        )
        for cls, st in self.classes.items():
            for outcome, n in st.outcomes.items():
                requests.add_metric([cls, outcome], n)
            chunks.add_metric([cls], st.chunks)
            # A class with no streamed answer yet still shows its (empty) histogram.
            for model, hist in (st.ttft or {"unknown": Histogram(TTFT_BUCKETS_S)}).items():
                ttft.add_metric([cls, model, self.engine], hist.cumulative(), hist.total)
            wait.add_metric([cls], st.queue_wait.cumulative(), st.queue_wait.total)
        yield from (requests, chunks, ttft, wait)
        for name, (kind, text) in GAUGE_HELP.items():
            values = gauges.get(name, {})
            fam: Metric
            if kind == "counter":
                fam = CounterMetricFamily(f"{p}_{name}", text, labels=["class"])
            else:
                fam = GaugeMetricFamily(f"{p}_{name}", text, labels=["class"])
            for cls, value in values.items():
                fam.add_metric([cls], math.nan if value is None else float(value))
            yield fam

    def prometheus(self, gauges: dict[str, dict[str, float | None]]) -> str:
        """The text exposition format (0.0.4) of `families(gauges)`."""
        return generate_latest(_Once(self.families(gauges))).decode()


class _Once(Collector):
    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


class GatewayCollector(Collector):
    """Build info and the observer's families, read at scrape time on the gateway's loop."""

    def __init__(
        self, observer: Observer, gauges: Callable[[], dict[str, dict[str, float | None]]]
    ) -> None:
        self.observer = observer
        self.gauges = gauges

    def collect(self) -> Iterator[Metric]:
        info = InfoMetricFamily("llm_watchdog_build", "llm-watchdog's version and Python.")
        info.add_metric([], {"version": __version__, "python": platform.python_version()})
        yield info
        yield from self.observer.families(self.gauges())


def metrics_registry(
    observer: Observer, gauges: Callable[[], dict[str, dict[str, float | None]]]
) -> CollectorRegistry:
    """A registry of the gateway's own (two gateways in one test process stay apart)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GatewayCollector(observer, gauges))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


GAUGE_HELP = {
    "inflight": ("gauge", "Requests admitted and not yet finished."),
    "admitting": ("gauge", "What the ramp admits now, on its way to the allowance."),
    "queued": ("gauge", "Requests waiting for an allowance place."),
    "allowance": ("gauge", "Concurrency allowance now (NaN: unlimited)."),
    "allowance_default": ("gauge", "Allowance that a lease returns to."),
    "allowance_ceiling": ("gauge", "Highest allowance the control API accepts."),
    "lease_expires_timestamp_seconds": (
        "gauge",
        "Unix time the current lease ends (NaN: no lease).",
    ),
    "slot_line": (
        "gauge",
        "Batch is let in only while batch and chat in flight stay under this (NaN: no line).",
    ),
    "lease_expirations": ("counter", "Leases that ran out and restored the default."),
    "control_changes": ("counter", "Allowance changes accepted by the control API."),
    "preempted": (
        "counter",
        "Requests in flight ended when the allowance was cut under them (--preempt-batch).",
    ),
}
