"""One bench level's figures from its raw rows. Pure: rows in, a dict out.

Chat latency is taken over right answers only: a failed request is counted as failed and a
wrong answer as wrong, never as a fast TTFT. The quality pass rate is right answers over
every chat request sent, so a server that answers quickly and wrongly shows it. A level with
fewer right answers than a p95 interval needs (`stats.min_values`) has its p95 but no
interval, and says so in `chat_interval_note`.

The per-class view comes from the engine's own timings of each request, where it gives them
(llama.cpp's `timings`: `prompt_ms`, its prefill time): a request's wait in the engine's queue
is its TTFT less its prefill, kept apart for chat and batch. The scheduler metrics from
/metrics (`engine_queue_ms_mean`, `engine_prefill_ms_mean`) mix the two classes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llm_watchdog.bench.stats import min_values, percentile, percentile_interval, rate, too_few_note
from llm_watchdog.stats import quantile

PERCENTILES = (50, 95, 99)
CLASSES = ("chat", "batch")
NO_TIMINGS_NOTE = (
    "the engine gives no per-request timings (llama.cpp does; vLLM, SGLang, TGI, Ollama do "
    "not): the engine queue and prefill figures mix chat and batch"
)


def engine_wait_ms(ttft_ms: Any, prompt_ms: Any) -> float | None:
    """How long a request waited in the engine's queue: its TTFT less the engine's prefill
    time. It also holds the HTTP and tokenising overhead (a few ms), so a request that did not
    queue reads a little above 0; a prefill reported longer than the TTFT reads 0."""
    if ttft_ms is None or prompt_ms is None:
        return None
    return max(0.0, float(ttft_ms) - float(prompt_ms))


def per_class(
    chat: Sequence[Mapping[str, Any]], batch: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """Per class: the engine-queue wait (p50, p95) and the prefill (p50) of the requests the
    engine timed, with how many they are; a note where no request of either class was."""
    out: dict[str, Any] = {}
    timed_any = False
    for cls, rows in (("chat", chat), ("batch", batch)):
        done = [
            r
            for r in rows
            if (r.get("ok") if cls == "chat" else r.get("outcome") == "ok")
            and r.get("engine_wait_ms") is not None
        ]
        waits = [float(r["engine_wait_ms"]) for r in done]
        prefills = [float(r["prompt_ms"]) for r in done]
        out[f"{cls}_timed"] = len(done)
        out[f"{cls}_engine_wait_p50_ms"] = quantile(waits, 0.5) if done else None
        out[f"{cls}_engine_wait_p95_ms"] = quantile(waits, 0.95) if done else None
        out[f"{cls}_prefill_p50_ms"] = quantile(prefills, 0.5) if done else None
        timed_any = timed_any or bool(done)
    out["per_class_note"] = None if timed_any else NO_TIMINGS_NOTE
    return out


def per_class_line(lv: Mapping[str, Any]) -> str:
    """One level's per-class view in one line."""
    head = f"batch {lv.get('batch_streams')}: "
    if lv.get("per_class_note") or not any(lv.get(f"{c}_timed") for c in CLASSES):
        return head + (lv.get("per_class_note") or NO_TIMINGS_NOTE)
    parts = []
    for cls in CLASSES:
        n = lv.get(f"{cls}_timed") or 0
        if not n:
            parts.append(f"{cls}: no timed requests")
            continue
        p50, p95 = lv.get(f"{cls}_engine_wait_p50_ms"), lv.get(f"{cls}_engine_wait_p95_ms")
        prefill = lv.get(f"{cls}_prefill_p50_ms")
        parts.append(
            f"{cls} waited {_ms(p50)} p50 / {_ms(p95)} p95 in the engine's queue, "
            f"prefilled {_ms(prefill)} p50 ({n} request{'' if n == 1 else 's'})"
        )
    return head + "; ".join(parts)


def _ms(value: Any) -> str:
    return f"{value:.0f} ms" if value is not None else "-"


def interval_note(right: int | None) -> str | None:
    """Why a level has no p95 interval (too few right answers), or None where it has one or
    has no p95 at all."""
    if right is None or right <= 0 or right >= min_values(95):
        return None
    return too_few_note(right, 95)


def stored_interval_note(lv: Mapping[str, Any]) -> str | None:
    """`interval_note` of a stored level; a level stored before `chat_right` was kept has its
    right answers counted back from its probes and quality pass rate."""
    right = lv.get("chat_right")
    if right is None:
        probes, quality = lv.get("chat_probes"), lv.get("quality_pass_rate")
        right = round(probes * quality) if probes is not None and quality is not None else None
    return interval_note(right)


def chat_latencies(chat: Sequence[Mapping[str, Any]]) -> list[float]:
    """TTFTs of the right answers: the latencies the percentiles are taken over."""
    return [
        float(r["ttft_ms"])
        for r in chat
        if r.get("ok") and r.get("quality_pass") and r.get("ttft_ms") is not None
    ]


def level_summary(
    batch_streams: int,
    chat: Sequence[Mapping[str, Any]],
    batch: Sequence[Mapping[str, Any]],
    measured_s: float,
    *,
    scheduler: Mapping[str, Any] | None = None,
    gpu: Mapping[str, Any] | None = None,
    complete: bool = True,
) -> dict[str, Any]:
    ttfts = chat_latencies(chat)
    failed = sum(1 for r in chat if not r.get("ok"))
    wrong = sum(1 for r in chat if r.get("ok") and not r.get("quality_pass"))
    out: dict[str, Any] = {
        "batch_streams": batch_streams,
        "measured_s": measured_s,
        "complete": complete,
        "chat_probes": len(chat),
        "chat_failed": failed,
        "chat_wrong": wrong,
        "quality_pass_rate": rate(len(ttfts), len(chat)),
        "chat_right": len(ttfts),
        "chat_interval_note": interval_note(len(ttfts)),
    }
    for q in PERCENTILES:
        iv = percentile_interval(ttfts, q)
        out[f"chat_p{q}_ms"] = iv.value if iv else None
        out[f"chat_p{q}_low_ms"] = iv.low if iv else None
        out[f"chat_p{q}_high_ms"] = iv.high if iv else None
    out["chat_max_ms"] = max(ttfts) if ttfts else None
    ok = [r for r in batch if r.get("outcome") == "ok"]
    tokens = [r["output_tokens"] for r in ok if r.get("output_tokens") is not None]
    chars = sum(int(r.get("output_chars") or 0) for r in ok)
    span = measured_s if measured_s > 0 else None
    out["batch_requests_ok"] = len(ok)
    if not ok:
        out["batch_output_per_s"] = None
        out["batch_output_unit"] = None
    elif tokens and len(tokens) == len(ok):
        out["batch_output_per_s"] = sum(tokens) / span if span else None
        out["batch_output_unit"] = "tokens"
    else:
        # The engine gave no usage counts: characters are all that can be counted.
        out["batch_output_per_s"] = chars / span if span else None
        out["batch_output_unit"] = "chars"
    out["batch_rejected"] = sum(1 for r in batch if r.get("outcome") == "rejected")
    out["batch_queue_cap_hits"] = sum(1 for r in batch if r.get("outcome") == "queue_cap")
    out["batch_errors"] = sum(1 for r in batch if r.get("outcome") == "error")
    waits = [float(r["wait_ms"]) for r in batch if r.get("wait_ms") is not None]
    out["batch_wait_p50_ms"] = percentile(waits, 50)
    out["batch_wait_p95_ms"] = percentile(waits, 95)
    sched = dict(scheduler or {})
    for key in ("waiting_mean", "waiting_max", "running_mean", "busy_slots_max"):
        out[f"engine_{key}"] = sched.get(key)
    out["engine_queue_ms_mean"] = sched.get("queue_ms_mean")
    out["engine_prefill_ms_mean"] = sched.get("prefill_ms_mean")
    out["engine_note"] = sched.get("note")
    out.update(per_class(chat, batch))
    out.update(gpu or {})
    return out


def cold_summary(cold: Mapping[str, Any]) -> str:
    """The cold start in one line, as it is printed apart from the levels."""
    if not cold.get("measured"):
        return f"cold start: not measured ({cold.get('note') or cold.get('mode')})"
    ttft = cold.get("ttft_ms")
    parts = [f"cold start ({cold.get('mode')}): first token {ttft:.0f} ms" if ttft else ""]
    if cold.get("ready_ms") is not None:
        parts.append(f"server ready after {cold['ready_ms']:.0f} ms")
    if cold.get("load_duration_ms") is not None:
        parts.append(f"model load {cold['load_duration_ms']:.0f} ms")
    if cold.get("quality_pass") is False:
        parts.append("WRONG answer")
    if cold.get("error"):
        parts.append(f"failed: {cold['error']}")
    return ", ".join(p for p in parts if p) or "cold start: measured, no answer"
