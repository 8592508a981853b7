"""Stored history for tests of the headroom map: probes with the load and the GPU sample
each was sent under, as the daemon writes them."""

from __future__ import annotations

import random

from llm_watchdog.models import GpuSample
from llm_watchdog.nvml.throttle import SW_THERMAL_SLOWDOWN
from llm_watchdog.store.db import Store
from tests.helpers.builders import probe_result


def fill_headroom_history(store: Store, now: float, fingerprint_id: str | None = None) -> None:
    """Two hours of probes every 10 s: cool with 0–8 batch in flight (chat slow above 6),
    then hot and throttled (slow above 3). A GPU sample a second before each probe."""
    rng = random.Random(7)
    ts = now - 7200.0
    i = 0
    while ts < now - 10:
        hot = ts > now - 3600.0
        inflight = i % 9
        limit = 3 if hot else 6
        slow = inflight > limit and rng.random() < 0.4
        store.record_gpu_samples(
            [
                GpuSample(
                    ts=ts - 1.0,
                    gpu_index=0,
                    temp_c=86.0 if hot else 60.0,
                    sm_clock_mhz=1600.0 if hot else 1980.0,
                    sm_clock_max_mhz=1980.0,
                    throttle_reasons=SW_THERMAL_SLOWDOWN if hot else 0,
                    temp_slowdown_c=90.0,
                )
            ]
        )
        store.record_probe(
            probe_result(ts=ts, ttft_ms=2600.0 if slow else 350.0, batch_inflight=inflight),
            fingerprint_id,
        )
        ts += 10.0
        i += 1
