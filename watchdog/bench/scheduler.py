"""What the engine's scheduler did during a bench level, read from its own metrics.

Pure: Prometheus text (and llama.cpp's /slots JSON) in, numbers out; the poller that fetches
them is `llm_watchdog.bench.observe`. The flag you set is not the behaviour you get, so the
bench records what the engine says it ran and queued, per level:

    engine    queue depth / running           time queued vs prefilled (histograms)
    vllm      vllm:num_requests_waiting        vllm:request_queue_time_seconds
              vllm:num_requests_running        vllm:request_prefill_time_seconds
    llamacpp  llamacpp:requests_deferred       (none; prompt time from
              llamacpp:requests_processing     llamacpp:prompt_seconds_total per prompt)
              /slots: slots with is_processing
    sglang    sglang:num_queue_reqs            sglang:queue_time_seconds (newer versions)
              sglang:num_running_reqs
    tgi       tgi_queue_size                   tgi_request_queue_duration,
              tgi_batch_current_size           tgi_batch_forward_duration{method="prefill"}
    ollama    nothing: no metrics endpoint

The histograms mix every request the engine served, chat and batch alike; at batch level 0
they are chat's own. A mean over a level is (sum after - sum before) / (count after - count
before).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EngineMetrics:
    waiting: str | None = None
    running: str | None = None
    queue_hist: str | None = None
    prefill_hist: str | None = None
    prefill_labels: tuple[tuple[str, str], ...] = ()
    prefill_seconds_counter: str | None = None  # a total with no count beside it
    prefill_count_counter: str | None = None  # what to divide it by (llama.cpp: none)
    slots: bool = False  # llama.cpp's /slots


ENGINES: dict[str, EngineMetrics] = {
    "vllm": EngineMetrics(
        waiting="vllm:num_requests_waiting",
        running="vllm:num_requests_running",
        queue_hist="vllm:request_queue_time_seconds",
        prefill_hist="vllm:request_prefill_time_seconds",
    ),
    "llamacpp": EngineMetrics(
        waiting="llamacpp:requests_deferred",
        running="llamacpp:requests_processing",
        prefill_seconds_counter="llamacpp:prompt_seconds_total",
        slots=True,
    ),
    "sglang": EngineMetrics(
        waiting="sglang:num_queue_reqs",
        running="sglang:num_running_reqs",
        queue_hist="sglang:queue_time_seconds",
    ),
    "tgi": EngineMetrics(
        waiting="tgi_queue_size",
        running="tgi_batch_current_size",
        queue_hist="tgi_request_queue_duration",
        prefill_hist="tgi_batch_forward_duration",
        prefill_labels=(("method", "prefill"),),
    ),
}

NOTHING_EXPOSED = "the engine exposes no scheduler metrics"

Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse_prometheus(text: str) -> Samples:
    """Metric name -> [(labels, value)] from Prometheus text format; bad lines are skipped."""
    out: Samples = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, labels, rest = _split(line)
        if name is None:
            continue
        parts = rest.split()
        if not parts:
            continue
        try:
            value = float(parts[0])
        except ValueError:
            continue
        out.setdefault(name, []).append((labels, value))
    return out


def _split(line: str) -> tuple[str | None, dict[str, str], str]:
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        end = line.rfind("}")
        if end < brace:
            return None, {}, ""
        return line[:brace], _labels(line[brace + 1 : end]), line[end + 1 :]
    if space == -1:
        return None, {}, ""
    return line[:space], {}, line[space + 1 :]


def _labels(body: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    i = 0
    while i < len(body):
        eq = body.find("=", i)
        if eq == -1:
            break
        key = body[i:eq].strip().lstrip(",").strip()
        q1 = body.find('"', eq)
        if q1 == -1:
            break
        j = q1 + 1
        value = []
        while j < len(body) and body[j] != '"':
            if body[j] == "\\" and j + 1 < len(body):
                j += 1
            value.append(body[j])
            j += 1
        labels[key] = "".join(value)
        i = j + 1
    return labels


def _total(
    samples: Samples, name: str | None, where: Sequence[tuple[str, str]] = ()
) -> float | None:
    """The sum over every series of `name` whose labels include `where`; None when absent."""
    if name is None or name not in samples:
        return None
    values = [v for labels, v in samples[name] if all(labels.get(k) == w for k, w in where)]
    if not values or any(math.isnan(v) for v in values):
        return None
    return sum(values)


def snapshot(engine: str, metrics_text: str | None, slots: Any = None) -> dict[str, float | None]:
    """One reading of the engine's scheduler: depths now and the histogram totals so far."""
    spec = ENGINES.get(engine)
    empty: dict[str, float | None] = {
        k: None
        for k in (
            "waiting",
            "running",
            "queue_sum_s",
            "queue_count",
            "prefill_sum_s",
            "prefill_count",
            "busy_slots",
        )
    }
    if spec is None:
        return empty
    s = parse_prometheus(metrics_text) if metrics_text else {}
    snap = dict(empty)
    snap["waiting"] = _total(s, spec.waiting)
    snap["running"] = _total(s, spec.running)
    if spec.queue_hist:
        snap["queue_sum_s"] = _total(s, spec.queue_hist + "_sum")
        snap["queue_count"] = _total(s, spec.queue_hist + "_count")
    if spec.prefill_hist:
        snap["prefill_sum_s"] = _total(s, spec.prefill_hist + "_sum", spec.prefill_labels)
        snap["prefill_count"] = _total(s, spec.prefill_hist + "_count", spec.prefill_labels)
    elif spec.prefill_seconds_counter:
        snap["prefill_sum_s"] = _total(s, spec.prefill_seconds_counter)
    if spec.slots and isinstance(slots, list):
        snap["busy_slots"] = float(
            sum(1 for slot in slots if isinstance(slot, Mapping) and slot.get("is_processing"))
        )
    return snap


def summarise(
    engine: str, snapshots: Sequence[Mapping[str, float | None]], prompts: int = 0
) -> dict[str, Any]:
    """What the scheduler did over one level, from its snapshots in time order.

    `prompts` is the number of requests the bench sent during the level: llama.cpp gives the
    prompt time as a bare total, so its mean per request is that total's growth over them.
    """

    def series(key: str) -> list[float]:
        return [float(v) for snap in snapshots if (v := snap.get(key)) is not None]

    def delta(key: str) -> float | None:
        xs = series(key)
        return xs[-1] - xs[0] if len(xs) >= 2 else None

    out: dict[str, Any] = {"engine": engine}
    for key in ("waiting", "running", "busy_slots"):
        xs = series(key)
        out[f"{key}_mean"] = sum(xs) / len(xs) if xs else None
        out[f"{key}_max"] = max(xs) if xs else None
    q_sum, q_n = delta("queue_sum_s"), delta("queue_count")
    p_sum, p_n = delta("prefill_sum_s"), delta("prefill_count")
    out["engine_requests"] = q_n if q_n is not None else p_n
    out["queue_ms_mean"] = 1000 * q_sum / q_n if q_sum is not None and q_n else None
    if p_sum is not None and p_n:
        out["prefill_ms_mean"] = 1000 * p_sum / p_n
    elif p_sum is not None and p_n is None and prompts:
        out["prefill_ms_mean"] = 1000 * p_sum / prompts
    else:
        out["prefill_ms_mean"] = None
    exposed = (
        any(
            out[k] is not None
            for k in ("waiting_mean", "running_mean", "busy_slots_mean", "queue_ms_mean")
        )
        or out["prefill_ms_mean"] is not None
    )
    out["exposed"] = exposed
    if not exposed:
        out["note"] = (
            f"{engine}: {NOTHING_EXPOSED}"
            + ("" if engine in ENGINES else " (no known metrics endpoint)")
            + (" (llama.cpp needs --metrics)" if engine == "llamacpp" else "")
        )
    elif out["queue_ms_mean"] is None:
        out["note"] = f"{engine}: queue depth only in its metrics, no queue-time histogram"
    else:
        out["note"] = ""
    return out


def queue_share(summary: Mapping[str, Any]) -> float | None:
    """The share of time-to-first-token spent queued rather than prefilling, where both are
    known: the number that says whether a priority setting moved chat up the queue."""
    q, p = summary.get("queue_ms_mean"), summary.get("prefill_ms_mean")
    if q is None or p is None or q + p <= 0:
        return None
    return float(q / (q + p))
