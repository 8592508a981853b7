"""`llm-watchdog bench`: the protocol. Chat TTFT against batch concurrency, on your server.

A cold start first (measured and kept apart, never averaged in), then for each batch level
an extraction-style batch job (`llm_watchdog.bench.loadgen`) keeps that many streams busy
while the fixed canary prompts run one after another; every chat and batch request leaves a
raw row, and the engine's scheduler metrics and the GPU are read once a second beside it
(`llm_watchdog.bench.observe`). `stop` (Ctrl-C in the CLI) ends the run between two
probes; what was measured is kept and the run is marked incomplete.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from llm_watchdog.bench.batchset import BatchSet
from llm_watchdog.bench.loadgen import BatchLoad
from llm_watchdog.bench.observe import Observer, gpu_summary
from llm_watchdog.bench.scheduler import summarise
from llm_watchdog.bench.stats import percentile
from llm_watchdog.bench.summary import chat_latencies, engine_wait_ms, level_summary
from llm_watchdog.errors import WatchdogError
from llm_watchdog.probe.client import EngineTimings, Prober
from llm_watchdog.probe.engine import api_root
from llm_watchdog.probe.sets import ProbeSet

COLD_AUTO, COLD_NONE = "auto", "none"
READY_TIMEOUT_S = 300.0


class BenchError(WatchdogError):
    """The bench cannot go on: one line, what to do."""


@dataclass(frozen=True)
class BenchPlan:
    levels: tuple[int, ...]
    duration_s: float
    warmup_s: float = 5.0
    queue_cap_s: float | None = None
    cold_start: str = COLD_AUTO  # "auto" | "none" | a restart command
    chat_gap_s: float = 0.2  # chat arrives now and then, not back to back
    observe_interval_s: float = 1.0


@dataclass(frozen=True)
class Progress:
    level_index: int
    batch_streams: int
    left_s: float
    probes: int
    p95_ms: float | None


@dataclass
class BenchResult:
    cold_start: dict[str, Any] = field(default_factory=dict)
    levels: list[dict[str, Any]] = field(default_factory=list)
    chat_rows: list[dict[str, Any]] = field(default_factory=list)
    batch_rows: list[dict[str, Any]] = field(default_factory=list)
    gpu_rows: list[dict[str, Any]] = field(default_factory=list)
    complete: bool = True
    stop_reason: str | None = None


def chat_row(level_index: int, r: Any, timings: EngineTimings | None = None) -> dict[str, Any]:
    prompt_ms = timings.prompt_ms if timings else None
    return {
        "level_index": level_index,
        "ts": r.ts,
        "prompt_id": r.prompt_id,
        "ok": bool(r.ok),
        "ttft_ms": r.ttft_ms,
        "total_ms": r.total_ms,
        "output_tokens": r.output_tokens,
        "quality_pass": r.quality_pass,
        "error_class": r.error_class,
        "error_detail": r.error_detail,
        "answer": (r.answer or "")[:200],
        "prompt_ms": prompt_ms,
        "prompt_n": timings.prompt_n if timings else None,
        "engine_wait_ms": engine_wait_ms(r.ttft_ms, prompt_ms),
    }


def batch_row(level_index: int, r: dict[str, Any]) -> dict[str, Any]:
    return dict(
        r,
        level_index=level_index,
        engine_wait_ms=engine_wait_ms(r.get("ttft_ms"), r.get("prompt_ms")),
    )


def run_bench(
    prober: Prober,
    probe_set: ProbeSet,
    batch_set: BatchSet,
    url: str,
    model: str,
    engine: str,
    plan: BenchPlan,
    *,
    api_key: str | None = None,
    reader: Any = None,
    stop: threading.Event | None = None,
    progress: Callable[[Progress], None] | None = None,
    level_done: Callable[[dict[str, Any]], None] | None = None,
    result: BenchResult | None = None,
    metrics_url: str | None = None,
) -> BenchResult:
    """Run the protocol; fills and returns `result` (pass one in to keep what a failure left).
    The engine's scheduler metrics are read at `metrics_url` (default: `url`; behind a
    gateway, the engine's own URL)."""
    stop = stop or threading.Event()
    out = result if result is not None else BenchResult()
    out.cold_start = measure_cold_start(prober, probe_set, url, model, engine, plan.cold_start)
    observer = Observer(
        metrics_url or url, engine, reader, plan.observe_interval_s, api_key
    ).start()
    try:
        for index, level in enumerate(plan.levels):
            if stop.is_set():
                break
            summary = _level(
                index,
                level,
                prober,
                probe_set,
                batch_set,
                url,
                model,
                engine,
                plan,
                api_key,
                observer,
                stop,
                progress,
                out,
            )
            out.levels.append(summary)
            if level_done:
                level_done(summary)
    finally:
        observer.stop()
    if stop.is_set():
        out.complete = False
        out.stop_reason = out.stop_reason or "interrupted"
    return out


def _level(
    index: int,
    level: int,
    prober: Prober,
    probe_set: ProbeSet,
    batch_set: BatchSet,
    url: str,
    model: str,
    engine: str,
    plan: BenchPlan,
    api_key: str | None,
    observer: Observer,
    stop: threading.Event,
    progress: Callable[[Progress], None] | None,
    out: BenchResult,
) -> dict[str, Any]:
    load = BatchLoad(
        url,
        model,
        level,
        max_tokens=batch_set.max_tokens,
        api_key=api_key,
        messages=batch_set.messages,
        queue_cap_s=plan.queue_cap_s,
        keep_rows=True,
    )
    load.tag = index
    load.start()
    chat: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        if level:
            stop.wait(plan.warmup_s)  # let the batch streams fill the engine
            _check_batch_accepted(load)
        load.take_rows()
        load.reset_stats()
        observer.take()
        started = time.monotonic()
        end = started + plan.duration_s
        i = 0
        while time.monotonic() < end and not stop.is_set():
            prompt = probe_set.prompts[i % len(probe_set.prompts)]
            i += 1
            r, timings = prober.probe_timed(prompt, probe_set.name)
            chat.append(chat_row(index, r, timings))
            if progress:
                progress(
                    Progress(
                        index,
                        level,
                        max(0.0, end - time.monotonic()),
                        len(chat),
                        percentile(chat_latencies(chat), 95),
                    )
                )
            stop.wait(plan.chat_gap_s)
            if level and i == 3:
                _check_batch_accepted(load)
    finally:
        measured_s = time.monotonic() - started
        load.stop()
        batch = [batch_row(index, r) for r in load.take_rows()]
        snaps, gpu = observer.take()
        out.chat_rows.extend(chat)
        out.batch_rows.extend(batch)
        out.gpu_rows.extend(dict(s.to_dict(), level_index=index) for s in gpu)
    complete = not stop.is_set()
    sent = len(chat) + sum(1 for r in batch if r.get("outcome") == "ok")
    return level_summary(
        level,
        chat,
        batch,
        measured_s,
        scheduler=summarise(engine, snaps, prompts=sent),
        gpu=gpu_summary(gpu, measured_s),
        complete=complete,
    )


def _check_batch_accepted(load: BatchLoad) -> None:
    """An engine that turns the batch set down (HTTP 4xx) would make every level a chat-only
    one: stop with the engine's reason instead."""
    s = load.stats
    if s.ok == 0 and s.errors and (s.last_error or "").startswith("HTTP 4"):
        raise BenchError(
            f"the server rejected the batch requests ({s.last_error}): check the batch set, "
            "its max_tokens and the model's context size"
        )


# -- the cold start --------------------------------------------------------------------------


def measure_cold_start(
    prober: Prober, probe_set: ProbeSet, url: str, model: str, engine: str, mode: str
) -> dict[str, Any]:
    """The first request after the model was unloaded or the server restarted."""
    if mode == COLD_NONE:
        return {"mode": COLD_NONE, "measured": False, "note": "--cold-start none"}
    ready_ms = None
    if mode == COLD_AUTO:
        if engine != "ollama":
            return {
                "mode": COLD_AUTO,
                "measured": False,
                "note": f"{engine} cannot unload its model over its API; pass --cold-start "
                "'COMMAND' that restarts the server to measure one",
            }
        _ollama_unload(url, model)
    else:
        ready_ms = _restart(url, mode)
    r = prober.probe(probe_set.prompts[0], probe_set.name)
    return {
        "mode": COLD_AUTO if mode == COLD_AUTO else "command",
        "command": None if mode == COLD_AUTO else mode,
        "measured": True,
        "ready_ms": ready_ms,
        "ttft_ms": r.ttft_ms,
        "total_ms": r.total_ms,
        "load_duration_ms": r.load_duration_ms,
        "quality_pass": r.quality_pass,
        "error": r.error_detail if not r.ok else None,
    }


def _ollama_unload(url: str, model: str) -> None:
    try:
        httpx.post(
            api_root(url) + "/api/generate",
            json={"model": model, "keep_alive": 0},
            timeout=30.0,
            trust_env=False,
        ).raise_for_status()
    except httpx.HTTPError as exc:
        raise BenchError(
            f"could not unload {model!r} from Ollama for the cold start ({exc}); "
            "use --cold-start none to skip it"
        ) from None


def _restart(url: str, command: str) -> float:
    """Run the restart command, then wait for the server to list its models; ms until then."""
    t0 = time.monotonic()
    try:
        # The user's own command line, run as they would type it.
        done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        raise BenchError(f"cold-start command did not finish within 600 s: {command}") from None
    if done.returncode != 0:
        tail = " ".join((done.stderr or done.stdout).split())[-160:]
        raise BenchError(
            f"cold-start command exited with {done.returncode}: {command} ({tail}); "
            "fix it or use --cold-start none"
        )
    deadline = time.monotonic() + READY_TIMEOUT_S
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        while time.monotonic() < deadline:
            try:
                if client.get(api_root(url) + "/v1/models").status_code == 200:
                    return (time.monotonic() - t0) * 1000
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
    raise BenchError(
        f"{url} did not answer /v1/models within {READY_TIMEOUT_S:.0f} s after the cold-start "
        "command"
    )


def parse_levels(text: str) -> list[int]:
    levels = [int(x) for x in text.split(",") if x.strip()]
    if not levels or min(levels) < 0:
        raise ValueError("--batch-streams needs levels >= 0, e.g. 0,2,4,8")
    return levels
