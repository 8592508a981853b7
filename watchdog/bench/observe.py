"""Beside a bench level: the engine's scheduler metrics and the GPU, read once a second.

The HTTP and NVML edge of the bench's observation; what the readings mean is
`llm_watchdog.bench.scheduler` (engine) and `gpu_summary` below (card). One thread polls
until stopped; `take()` hands over what a level saw and starts the next level's list.

The engine's figures are read on the engine: behind an llm-watchdog gateway the URL the bench
measures answers /metrics with the gateway's own, so `metrics_source` picks the engine the
gateway names in /control/identity (`upstream`), or the URL given with --metrics-url.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from llm_watchdog.bench.scheduler import ENGINES, snapshot
from llm_watchdog.models import GpuSample
from llm_watchdog.probe.engine import api_root
from llm_watchdog.urls import is_loopback_host


def metrics_source(
    url: str, identity: Mapping[str, Any] | None, given: str | None = None
) -> tuple[str, str | None]:
    """Where the engine's /metrics (and llama.cpp's /slots) are read, and one line to print
    about it (None: nothing to say). `identity` is the gateway's /control/identity where
    `url` is an llm-watchdog gateway, else None."""
    if given:
        return given, None
    if identity is None:
        return url, None
    upstream = identity.get("upstream")
    if not isinstance(upstream, str) or not upstream.strip():
        return url, (
            f"engine queue figures: {url} is an llm-watchdog gateway that does not name its "
            "engine, so its /metrics are the gateway's, not the engine's: pass --metrics-url "
            "with the engine's URL (e.g. http://127.0.0.1:8080)"
        )
    seen = on_gateway_host(upstream, url)
    if seen != upstream:
        return seen, (
            f"engine queue figures: read on the engine at {api_root(seen)}/metrics: the gateway "
            f"at {url} names {api_root(upstream)}, a loopback address of its own machine "
            "(--metrics-url to read them elsewhere)"
        )
    return upstream, (
        f"engine queue figures: read on the engine at {api_root(upstream)}/metrics, which the "
        f"gateway at {url} names (--metrics-url to read them elsewhere)"
    )


def on_gateway_host(upstream: str, gateway_url: str) -> str:
    """`upstream` as this machine reaches it: a gateway names its engine as it reaches it,
    usually on its own loopback (http://127.0.0.1:8000), which from another machine is that
    machine's own. There the gateway's host stands in for the loopback one; the port and path
    stay. Unchanged where either is on this machine's loopback or the engine is elsewhere."""
    try:
        up, gw = httpx.URL(upstream), httpx.URL(gateway_url)
    except (httpx.InvalidURL, TypeError):
        return upstream
    if not is_loopback_host(up.host) or is_loopback_host(gw.host) or not gw.host:
        return upstream
    return str(up.copy_with(host=gw.host))


def unreachable_line(metrics_url: str, url: str, named: str | None = None) -> str:
    """What to print where the engine a gateway names (`named`, where it was tried at
    another address: `on_gateway_host`) does not answer from this machine."""
    where = (
        f"the engine at {metrics_url} that the gateway at {url} names"
        if named is None or named == metrics_url
        else f"the engine the gateway at {url} names ({named}, tried here at {metrics_url})"
    )
    return (
        f"engine queue figures: {where} does not answer from here, so there are none: pass "
        "--metrics-url with the engine's URL as this machine reaches it"
    )


def answers(url: str, api_key: str | None = None, timeout_s: float = 2.0) -> bool:
    """Whether anything answers HTTP at `url`'s /metrics (any status: an engine without
    metrics still answers)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with httpx.Client(timeout=timeout_s, trust_env=False, headers=headers) as client:
            client.get(api_root(url) + "/metrics")
    except (httpx.HTTPError, ValueError):
        return False
    return True


class Observer:
    def __init__(
        self,
        url: str,
        engine: str,
        reader: Any = None,  # a started llm_watchdog.nvml.reader.NvmlReader, or None
        interval_s: float = 1.0,
        api_key: str | None = None,
    ) -> None:
        self.root = api_root(url)
        self.engine = engine
        self.reader = reader
        self.interval_s = interval_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=2.0, trust_env=False, headers=headers)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._snaps: list[dict[str, float | None]] = []
        self._gpu: list[GpuSample] = []
        self._metrics_ok = engine in ENGINES
        self._slots_ok = ENGINES.get(engine) is not None and ENGINES[engine].slots
        self._thread = threading.Thread(target=self._run, name="bench-observe", daemon=True)

    def start(self) -> Observer:
        self.poll()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5.0)
        self._client.close()

    def take(self) -> tuple[list[dict[str, float | None]], list[GpuSample]]:
        """This level's readings, with one fresh reading at the end; the next level starts
        from that reading, so a histogram's growth is split between levels without a gap."""
        self.poll()
        with self._lock:
            snaps, gpu = self._snaps, self._gpu
            self._snaps, self._gpu = snaps[-1:], []
        return snaps, gpu

    def poll(self) -> None:
        metrics = self._get("/metrics") if self._metrics_ok else None
        slots = self._get_json("/slots") if self._slots_ok else None
        snap = snapshot(self.engine, metrics, slots)
        samples: list[GpuSample] = []
        if self.reader is not None and getattr(self.reader, "available", False):
            samples, _events = self.reader.sample()
        with self._lock:
            self._snaps.append(snap)
            self._gpu.extend(samples)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()

    def _get(self, path: str) -> str | None:
        try:
            r = self._client.get(self.root + path)
        except httpx.HTTPError:
            return None
        return r.text if r.status_code == 200 else None

    def _get_json(self, path: str) -> Any:
        try:
            r = self._client.get(self.root + path)
            return r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None


def gpu_summary(samples: Sequence[GpuSample], span_s: float | None = None) -> dict[str, Any]:
    """Temperature, SM clock and time throttled (thermal and power) over a level."""

    def vals(name: str) -> list[float]:
        return [float(v) for s in samples if (v := getattr(s, name)) is not None]

    temps, clocks = vals("temp_c"), vals("sm_clock_mhz")
    thermal, power = vals("thermal_violation_ms"), vals("power_violation_ms")
    if span_s is None and len(samples) >= 2:
        span_s = samples[-1].ts - samples[0].ts
    throttled_ms = sum(thermal) + sum(power) if (thermal or power) else None
    return {
        "gpu_samples": len(samples),
        "temp_c_min": min(temps) if temps else None,
        "temp_c_max": max(temps) if temps else None,
        "sm_clock_mhz_mean": sum(clocks) / len(clocks) if clocks else None,
        "sm_clock_mhz_min": min(clocks) if clocks else None,
        "thermal_throttle_ms": sum(thermal) if thermal else None,
        "power_throttle_ms": sum(power) if power else None,
        "throttled_share": throttled_ms / (1000 * span_s)
        if throttled_ms is not None and span_s
        else None,
    }
