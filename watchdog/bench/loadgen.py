"""An extraction-style batch job for the lab, the demo and `llm-watchdog bench`.

Each stream keeps one request in flight: a long document in, JSON out, sent as batch class
(`X-Traffic-Class: batch`) so a gateway admits it against the batch allowance. A 429 waits
its Retry-After, as a polite batch client does. Real HTTP over sockets, one thread a stream.
"""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from llm_watchdog.probe.engine import api_root

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
        body = {
            "model": self.model,
            "messages": extraction_messages(self._next_seed(), self.words),
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "stream": True,
        }
        with self._lock:
            self.stats.requests += 1
        try:
            with client.stream("POST", self.url, json=body, headers=self.headers) as resp:
                if resp.status_code == 429:
                    wait = float(resp.headers.get("Retry-After", "1") or 1)
                    with self._lock:
                        self.stats.rejected += 1
                    self._stop.wait(min(wait, 5.0))
                    return
                if resp.status_code >= 400:
                    with self._lock:
                        self.stats.errors += 1
                    self._stop.wait(1.0)
                    return
                chars = 0
                for line in resp.iter_lines():
                    if self._stop.is_set():
                        return
                    if not line.startswith("data:") or line.strip() == "data: [DONE]":
                        continue
                    try:
                        chunk = json.loads(line[5:])
                    except ValueError:
                        continue
                    for choice in chunk.get("choices") or []:
                        chars += len((choice.get("delta") or {}).get("content") or "")
            with self._lock:
                self.stats.ok += 1
                self.stats.output_chars += chars
        except httpx.HTTPError:
            with self._lock:
                self.stats.errors += 1
            self._stop.wait(1.0)
