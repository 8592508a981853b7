"""One bench level's figures from its raw rows. Pure: rows in, a dict out.

Chat latency is taken over right answers only: a failed request is counted as failed and a
wrong answer as wrong, never as a fast TTFT. The quality pass rate is right answers over
every chat request sent, so a server that answers quickly and wrongly shows it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llm_watchdog.bench.stats import percentile_interval, rate

PERCENTILES = (50, 95, 99)


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
    w50, w95 = percentile_interval(waits, 50), percentile_interval(waits, 95)
    out["batch_wait_p50_ms"] = w50.value if w50 else None
    out["batch_wait_p95_ms"] = w95.value if w95 else None
    sched = dict(scheduler or {})
    for key in ("waiting_mean", "waiting_max", "running_mean", "busy_slots_max"):
        out[f"engine_{key}"] = sched.get(key)
    out["engine_queue_ms_mean"] = sched.get("queue_ms_mean")
    out["engine_prefill_ms_mean"] = sched.get("prefill_ms_mean")
    out["engine_note"] = sched.get("note")
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
