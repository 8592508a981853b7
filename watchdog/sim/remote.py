"""A fake NVML over a heat lab in another process (`llm-watchdog sim serve`), through HTTP.

    nvml = remote_nvml("http://127.0.0.1:PORT")      # then NvmlReader(nvml=nvml)

Each reading GETs the lab's `/sim/gpu` (at most once per CACHE_S, since the reader asks for a
dozen fields per sample). A lab that cannot be reached reads as a lost GPU
(NVML_ERROR_GPU_IS_LOST), which the reader already turns into an event and a retry.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pynvml

from llm_watchdog.sim.fakenvml import FakeNvml
from llm_watchdog.sim.gpu import GpuSnapshot
from llm_watchdog.sim.scenario import GpuParams

CACHE_S = 0.05


class RemoteDevice:
    def __init__(self, url: str, transport: httpx.BaseTransport | None = None) -> None:
        self.url = url.rstrip("/") + "/sim/gpu"
        self._transport = transport
        doc = self._get()
        params = dict(doc["params"])
        params["fan_curve_c_pct"] = tuple(tuple(p) for p in params["fan_curve_c_pct"])
        self.params = GpuParams(**params)
        self._snap = GpuSnapshot(**doc["snapshot"])
        self._at = time.monotonic()

    def _get(self) -> dict[str, Any]:
        try:
            with httpx.Client(transport=self._transport, timeout=2.0, trust_env=False) as c:
                resp = c.get(self.url)
                resp.raise_for_status()
                doc: dict[str, Any] = resp.json()
                return doc
        except (httpx.HTTPError, ValueError) as exc:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST) from exc

    def read(self, now_s: float) -> GpuSnapshot:
        if time.monotonic() - self._at >= CACHE_S:
            self._snap = GpuSnapshot(**self._get()["snapshot"])
            self._at = time.monotonic()
        return self._snap


def remote_nvml(url: str, transport: httpx.BaseTransport | None = None) -> FakeNvml:
    """A pynvml-like module reading the lab at `url`; raises NVMLError if it is not there."""
    return FakeNvml([RemoteDevice(url, transport)], time.monotonic)


def lab_batch_streams(url: str, transport: httpx.BaseTransport | None = None) -> int | None:
    """How many batch streams the lab at `url` runs of its own (its /sim/state); None where
    the state cannot be read or says no count."""
    try:
        with httpx.Client(transport=transport, timeout=2.0, trust_env=False) as client:
            resp = client.get(url.rstrip("/") + "/sim/state")
            resp.raise_for_status()
            streams = resp.json().get("batch_streams")
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return streams if isinstance(streams, int) and not isinstance(streams, bool) else None
