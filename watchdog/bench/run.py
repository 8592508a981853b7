"""`llm-watchdog bench`: how chat TTFT on your server responds to batch concurrency.

For each batch level, an extraction-style batch job (llm_watchdog.bench.loadgen) keeps that many
streams busy while canary chat probes run back to back; the result is the curve a user
needs to set a batch allowance: chat p50/p95 TTFT and batch output against batch streams.
Measured on llama.cpp with SmolLM2-135M on 2 CPU cores, chat p95 went from 0.18 s alone to
6-10 s with 2-7 batch streams while p50 barely moved: watch p95.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from llm_watchdog.bench.loadgen import BatchLoad
from llm_watchdog.probe.client import Prober
from llm_watchdog.probe.sets import ProbeSet


@dataclass(frozen=True)
class BenchRow:
    batch_streams: int
    chat_probes: int
    chat_failed: int
    chat_p50_ms: float | None
    chat_p95_ms: float | None
    chat_max_ms: float | None
    batch_requests_ok: int
    batch_chars_per_s: float

    def as_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def run_bench(
    prober: Prober,
    probe_set: ProbeSet,
    batch_url: str,
    model: str,
    levels: Sequence[int],
    duration_s: float,
    *,
    warmup_s: float = 5.0,
    words: int = 700,
    api_key: str | None = None,
    progress: Callable[[BenchRow], None] | None = None,
) -> list[BenchRow]:
    rows = []
    for level in levels:
        load = BatchLoad(batch_url, model, level, words=words, api_key=api_key)
        load.start()
        try:
            time.sleep(warmup_s if level else 0.0)  # let the batch streams fill the engine
            load.stats.output_chars = 0
            load.stats.ok = 0
            load.stats.started_s = time.monotonic()
            ttfts, failed, i = [], 0, 0
            end = time.monotonic() + duration_s
            while time.monotonic() < end:
                prompt = probe_set.prompts[i % len(probe_set.prompts)]
                i += 1
                r = prober.probe(prompt, probe_set.name)
                if r.ok and r.ttft_ms is not None:
                    ttfts.append(r.ttft_ms)
                else:
                    failed += 1
                time.sleep(0.2)  # chat arrives now and then, not back to back
            stats = load.stats.as_dict()
        finally:
            load.stop()
        arr = np.asarray(ttfts) if ttfts else None
        row = BenchRow(
            batch_streams=level,
            chat_probes=len(ttfts) + failed,
            chat_failed=failed,
            chat_p50_ms=float(np.percentile(arr, 50)) if arr is not None else None,
            chat_p95_ms=float(np.percentile(arr, 95)) if arr is not None else None,
            chat_max_ms=float(arr.max()) if arr is not None else None,
            batch_requests_ok=stats["ok"],
            batch_chars_per_s=stats["chars_per_s"],
        )
        rows.append(row)
        if progress:
            progress(row)
    return rows
