"""An extraction-style batch job for the lab, the demo and `llm-watchdog bench`.

Each stream keeps one request in flight: a long document in, JSON out, sent as batch class
(`X-Traffic-Class: batch`) so a gateway admits it against the batch allowance. A 429 waits
its Retry-After, as a polite batch client does. Real HTTP over sockets, one thread a stream.

Output is counted in tokens from the stream's usage chunk (`stream_options.include_usage`);
an engine that sends none is counted in characters, and `tokens_known` says which. Where the
engine puts its own `timings` on the stream (llama.cpp), the row keeps its prefill time and
prompt tokens (`prompt_ms`, `prompt_n`). With a
queue cap, a request whose response has not begun within the cap is given up and counted as a
queue rejection, as a gateway's `--max-queue-wait` would. Every request leaves a row in
`BatchLoad.rows` (for the bench's stored run).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from llm_watchdog.probe.engine import api_root
from llm_watchdog.probe.streams import engine_timings

_WORDS = (
    "invoice contract supplier delivery payment amount total customer order shipment date "
    "warehouse quantity price discount tax account reference signed agreed terms balance due "
    "received issued project clause party schedule report quarter revenue cost margin region"
).split()


def document(seed: int, words: int = 700) -> str:
    """A deterministic, unique business document of about `words` words."""
    rnd = random.Random(seed)
    out = []
    for i in range(words):
        w = rnd.choice(_WORDS)
        if rnd.random() < 0.05:
            w = f"{rnd.randint(1, 28):02d}.{rnd.randint(1, 12):02d}.2026"
        elif rnd.random() < 0.05:
            w = f"EUR {rnd.randint(100, 99999)}.{rnd.randint(0, 99):02d}"
        out.append(w.capitalize() if i % 12 == 0 else w)
    return " ".join(out) + "."


def extraction_messages(seed: int, words: int) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You extract data. Answer with JSON only."},
        {
            "role": "user",
            "content": "Extract every date, amount and party from this document as JSON "
            '{"dates": [], "amounts": [], "parties": []}.\n\n' + document(seed, words),
        },
    ]


@dataclass
class LoadStats:
    requests: int = 0
    ok: int = 0
    rejected: int = 0  # 429 from the gateway: over the allowance for too long
    errors: int = 0
    output_chars: int = 0
    output_tokens: int = 0
    tokens_known: int = 0  # requests whose output tokens came from the usage chunk
    queue_rejected: int = 0  # given up at the queue cap before the response began
    last_error: str | None = None  # one line: the latest HTTP error, for a rejected batch set
    started_s: float = field(default_factory=time.monotonic)

    def as_dict(self) -> dict[str, Any]:
        elapsed = max(1e-9, time.monotonic() - self.started_s)
        return {
            "requests": self.requests,
            "ok": self.ok,
            "rejected": self.rejected,
            "errors": self.errors,
            "output_chars": self.output_chars,
            "chars_per_s": self.output_chars / elapsed,
            "output_tokens": self.output_tokens,
            "tokens_per_s": self.output_tokens / elapsed if self.tokens_known else None,
            "queue_rejected": self.queue_rejected,
        }


class BatchLoad:
    """`streams` concurrent extraction requests against `url`, until `stop()`."""

    def __init__(
        self,
        url: str,
        model: str,
        streams: int,
        *,
        words: int = 700,
        max_tokens: int = 64,
        api_key: str | None = None,
        seed: int = 1,
        ramp_s: float = 0.0,
        messages: Callable[[int], list[dict[str, str]]] | None = None,
        queue_cap_s: float | None = None,
        keep_rows: bool = False,
    ) -> None:
        self.url = api_root(url) + "/v1/chat/completions"
        self.model = model
        self.words = words
        self.max_tokens = max_tokens
        self.headers = {"X-Traffic-Class": "batch"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.stats = LoadStats()
        self._seed = seed * 1_000_003
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._wanted = streams
        # Workers of a real batch job come up over some seconds, not in one instant.
        self.ramp_s = ramp_s
        self._messages = messages
        self.queue_cap_s = queue_cap_s
        self.keep_rows = keep_rows
        self.rows: list[dict[str, Any]] = []
        self.tag: Any = None  # copied into each row: which bench level sent it

    def start(self) -> BatchLoad:
        self._grow()
        return self

    def set_streams(self, n: int) -> None:
        with self._lock:
            self._wanted = n
        self._grow()

    def _grow(self) -> None:
        with self._lock:
            while len(self._threads) < self._wanted:
                t = threading.Thread(
                    target=self._run,
                    args=(len(self._threads),),
                    daemon=True,
                    name=f"batch-{len(self._threads)}",
                )
                self._threads.append(t)
                t.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> BatchLoad:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _next_seed(self) -> int:
        with self._lock:
            self._seed += 1
            return self._seed

    def _run(self, index: int) -> None:
        if self.ramp_s and self._wanted:
            self._stop.wait(self.ramp_s * index / self._wanted)
        timeout = httpx.Timeout(120.0, connect=5.0)
        with httpx.Client(timeout=timeout, trust_env=False) as client:
            while not self._stop.is_set():
                with self._lock:
                    if index >= self._wanted:
                        idle = True
                    else:
                        idle = False
                if idle:
                    self._stop.wait(0.2)
                    continue
                self._one(client)

    def _one(self, client: httpx.Client) -> None:
        seed = self._next_seed()
        messages = (self._messages or (lambda n: extraction_messages(n, self.words)))(seed)
        body = {
            "model": self.model,
            "messages": messages,
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        with self._lock:
            self.stats.requests += 1
        row: dict[str, Any] = {"ts": time.time(), "outcome": "error", "tag": self.tag}
        t0 = time.perf_counter()
        # The read timeout first bounds the wait for the response to begin (the queue cap),
        # then the whole answer once it has.
        cap = self.queue_cap_s
        timeout = httpx.Timeout(120.0 if cap is None else cap, connect=5.0)
        request = client.build_request(
            "POST", self.url, json=body, headers=self.headers, timeout=timeout
        )
        try:
            try:
                resp = client.send(request, stream=True)
            except httpx.ReadTimeout:
                if cap is None:
                    raise
                row["outcome"] = "queue_cap"
                with self._lock:
                    self.stats.queue_rejected += 1
                return
            try:
                row["wait_ms"] = (time.perf_counter() - t0) * 1000
                row["http_status"] = resp.status_code
                timeouts = request.extensions.get("timeout")
                if isinstance(timeouts, dict):
                    timeouts["read"] = 120.0
                if resp.status_code == 429:
                    wait = float(resp.headers.get("Retry-After", "1") or 1)
                    row["outcome"] = "rejected"
                    with self._lock:
                        self.stats.rejected += 1
                    self._stop.wait(min(wait, 5.0))
                    return
                if resp.status_code >= 400:
                    resp.read()
                    detail = " ".join(resp.text.split())[:200]
                    row["detail"] = detail
                    with self._lock:
                        self.stats.errors += 1
                        self.stats.last_error = f"HTTP {resp.status_code}: {detail}"
                    self._stop.wait(1.0)
                    return
                chars, tokens = self._read_stream(resp, row, t0)
                if tokens is None and self._stop.is_set():
                    row["outcome"] = "stopped"
                    return
            finally:
                resp.close()
            row.update(outcome="ok", output_chars=chars, output_tokens=tokens)
            row["total_ms"] = (time.perf_counter() - t0) * 1000
            with self._lock:
                self.stats.ok += 1
                self.stats.output_chars += chars
                if tokens is not None:
                    self.stats.output_tokens += tokens
                    self.stats.tokens_known += 1
        except httpx.HTTPError as exc:
            row["detail"] = f"{type(exc).__name__}: {exc}"[:200]
            with self._lock:
                self.stats.errors += 1
            self._stop.wait(1.0)
        finally:
            if self.keep_rows:
                with self._lock:
                    self.rows.append(row)

    def _read_stream(
        self, resp: httpx.Response, row: dict[str, Any], t0: float
    ) -> tuple[int, int | None]:
        chars, tokens = 0, None
        for line in resp.iter_lines():
            if self._stop.is_set():
                return chars, None
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            try:
                chunk = json.loads(line[5:])
            except ValueError:
                continue
            if not isinstance(chunk, dict):
                continue
            usage = chunk.get("usage")
            if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                tokens = usage["completion_tokens"]
            prompt_ms, prompt_n = engine_timings(chunk)
            if prompt_ms is not None:
                row["prompt_ms"], row["prompt_n"] = prompt_ms, prompt_n
            for choice in chunk.get("choices") or []:
                text = (choice.get("delta") or {}).get("content") or ""
                if text and "ttft_ms" not in row:
                    row["ttft_ms"] = (time.perf_counter() - t0) * 1000
                chars += len(text)
        return chars, tokens

    def take_rows(self) -> list[dict[str, Any]]:
        """The rows so far, emptying the list."""
        with self._lock:
            rows, self.rows = self.rows, []
        return rows

    def reset_stats(self) -> None:
        """Start counting afresh (after a warm-up)."""
        with self._lock:
            self.stats = LoadStats()
