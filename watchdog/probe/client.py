"""The canary probe: one streaming chat request to the engine, measured. The HTTP edge.

`Prober.probe(prompt, probe_set)` sends one deterministic chat request (temperature 0, fixed
seed, the prompt's `max_tokens`) and returns a `ProbeResult`. Every failure is a result with
`ok=False`, an `error_class` from `llm_watchdog.models.ERROR_CLASSES` and a one-line
`error_detail` that says what to try; no exception escapes `probe()`. `probe_timed()` returns
the same result with the engine's own timings of the request beside it (`EngineTimings`: what
llama.cpp reports in its `timings` object; every field None for the engines that report none).

Clocks: `time.perf_counter_ns()` for every duration, `now()` (UTC unix seconds) for the stamp.
TTFT runs from "request sent" (the request headers handed to the kernel; connection set-up
excluded, so a fresh and a reused connection measure the same thing) to the socket read that
brought the first delta with non-empty content, reasoning or a tool call (each read of the
connection is stamped, so HTTP parsing in Python does not count). A role-only first chunk,
empty deltas and keep-alive comments do not end it; the first event of any kind is kept
apart as `first_event_ms`.

Timeouts, all separate:
    connect_timeout_s      TCP connection (httpx connect timeout)
    first_token_timeout_s  request sent -> first token; fires even while the server sends
                           keep-alive comments or role-only chunks (a watchdog timer shuts
                           the socket down at the deadline; a per-read timeout would not)
    total_timeout_s        request sent -> end of the answer

Prompt cache (measured on llama.cpp: 17 ms cached vs 158 ms busted TTFT p50, docs/probe.md):
    cache_mode "bust" with engine hint "llamacpp": `cache_prompt: false`, llama.cpp's own
        per-request switch; the prompt stays byte-identical     -> cache_bust "cache_prompt_false"
    cache_mode "bust" otherwise: a random nonce opens a leading system message (a nonce
        prefixed to the question changed a small model's answers, 37/40; in a system
        message 40/40)                                            -> cache_bust "system_nonce"
    cache_mode "cached": the prompt as it is                      -> cache_bust "none"

Keep-alive: llama.cpp closes idle keep-alive connections, and a pooled client's next request
then dies with "Server disconnected without sending a response". When a reused connection dies
before any response byte, the probe retries once on a fresh connection and records
`connection="retried_stale"`.

Stream rules (see `llm_watchdog.probe.streams`): a server error event inside a 200 stream is
`server_error`; a line that is not JSON is `protocol_error` even when the answer finished (the
official OpenAI client raises on such a line, so a chat user would have seen a failure too),
with the timings kept; a stream that ends without `[DONE]` is accepted when a choice had
finished (`finish_reason`), else it is a `protocol_error`.

Bounds: the engine decides how much it sends, so the probe stops reading at a token bound
(`token_bound(max_tokens)` deltas) and a byte bound (`byte_bound(max_tokens)` bytes of body),
both a few KiB past what `max_tokens` allows, and fails the probe as `over_length`; the stored
answer is cut at `answer_bound(max_tokens)` characters. An engine that ignores `max_tokens`
costs one bounded row, not the disk.
"""

from __future__ import annotations

import json
import secrets
import socket
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from llm_watchdog.logs import printable
from llm_watchdog.models import ProbeResult
from llm_watchdog.probe.engine import api_root, connect_reason, models_url
from llm_watchdog.probe.sets import Prompt
from llm_watchdog.probe.streams import (
    DONE,
    PROTOCOL_ERROR,
    SERVER_ERROR,
    StreamEvent,
    error_message,
    parser_for,
)

CACHE_MODES = ("bust", "cached")
APIS = ("openai", "ollama")
_ERROR_BODY_MAX = 64 * 1024
_PROTOCOL_ERRORS_KEPT = 3


def token_bound(max_tokens: int) -> int:
    """Deltas read before the answer is `over_length`: engines count tokens their own way
    (one delta may hold several, a stop sequence may add one), so there is slack."""
    return 2 * max_tokens + 16


def byte_bound(max_tokens: int) -> int:
    """Body bytes read before the answer is `over_length`: one SSE chunk per token is about
    300 bytes of JSON around the text, so 1 KiB a token plus 16 KiB for the rest."""
    return 1024 * max_tokens + 16 * 1024


def answer_bound(max_tokens: int) -> int:
    """Characters of the answer kept for the quality check and the store."""
    return 32 * max_tokens + 4 * 1024


@dataclass(frozen=True)
class ProbeOptions:
    connect_timeout_s: float = 3.0
    first_token_timeout_s: float = 30.0
    total_timeout_s: float = 60.0
    cache_mode: str = "bust"  # "bust" | "cached"
    api: str = "openai"  # "openai" (SSE, /v1/chat/completions) | "ollama" (NDJSON, /api/chat)
    seed: int = 1234
    engine: str | None = None  # engine hint, e.g. "llamacpp" (from detect_engine or config)

    def __post_init__(self) -> None:
        for name in ("connect_timeout_s", "first_token_timeout_s", "total_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"probe option {name} must be a positive number, got {value!r}")
        if self.cache_mode not in CACHE_MODES:
            raise ValueError(
                f"probe option cache_mode must be 'bust' or 'cached', got {self.cache_mode!r}"
            )
        if self.api not in APIS:
            raise ValueError(f"probe option api must be 'openai' or 'ollama', got {self.api!r}")


@dataclass(frozen=True)
class EngineTimings:
    """The engine's own account of one request, where it gives one (llama.cpp's `timings`)."""

    prompt_ms: float | None = None  # prefill: the prompt's evaluation
    prompt_n: int | None = None  # prompt tokens evaluated (the uncached part)


class _Failure(Exception):
    """Raised inside the probe, turned into a failed ProbeResult at its edge."""

    def __init__(self, error_class: str, detail: str, http_status: int | None = None) -> None:
        super().__init__(detail)
        self.error_class = error_class
        self.detail = detail
        self.http_status = http_status
        self.measure: _Measure | None = None  # what was measured before it failed
        self.connection = "fresh"  # when it failed before a response
        self.waited_ms: float | None = None  # request start -> failure, when before a response


class _StaleConnection(Exception):
    """A reused keep-alive connection died before any response byte."""


@dataclass
class _Measure:
    """What one attempt saw, filled in as the stream arrives."""

    t0_ns: int
    connection: str = "fresh"
    first_event_ns: int | None = None
    token_ns: list[int] = field(default_factory=list)
    end_ns: int | None = None
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    usage_tokens: int | None = None
    load_duration_ms: float | None = None
    prompt_ms: float | None = None
    prompt_n: int | None = None
    finished: bool = False  # a choice reported finish_reason
    done: bool = False  # [DONE] or Ollama's done: true
    server_error: str | None = None
    protocol_errors: list[str] = field(default_factory=list)
    protocol_error_count: int = 0
    events: int = 0
    body_bytes: int = 0
    answer_max: int = 1 << 62  # characters of content and of reasoning kept, each
    content_chars: int = 0
    reasoning_chars: int = 0

    def take(self, event: StreamEvent, t_ns: int) -> None:
        if event.kind == DONE:
            self.done = True
            return
        self.events += 1
        if self.first_event_ns is None:
            self.first_event_ns = t_ns
        if event.kind == SERVER_ERROR:
            self.server_error = self.server_error or event.message
            return
        if event.kind == PROTOCOL_ERROR:
            self.protocol_error_count += 1
            if len(self.protocol_errors) < _PROTOCOL_ERRORS_KEPT:
                self.protocol_errors.append(event.message)
            return
        if event.has_token:
            self.token_ns.append(t_ns)
        if event.content and self.content_chars < self.answer_max:
            kept = event.content[: self.answer_max - self.content_chars]
            self.content.append(kept)
            self.content_chars += len(kept)
        if event.reasoning and self.reasoning_chars < self.answer_max:
            kept = event.reasoning[: self.answer_max - self.reasoning_chars]
            self.reasoning.append(kept)
            self.reasoning_chars += len(kept)
        if event.finish_reason:
            self.finished = True
        if event.completion_tokens is not None:
            self.usage_tokens = event.completion_tokens
        if event.load_duration_ms is not None:
            self.load_duration_ms = event.load_duration_ms
        if event.prompt_ms is not None:
            self.prompt_ms = event.prompt_ms
        if event.prompt_n is not None:
            self.prompt_n = event.prompt_n


class _ReadClock:
    """Stamps every network read of a connection, so that a token is timed when its bytes came
    off the socket rather than after the HTTP layers parsed them (measured: about 0.2 ms of
    Python per read on a busy 2-core machine, see tests/benchmarks/bench_ttft.py)."""

    def __init__(self) -> None:
        self.last_ns = 0

    def watch(self, stream: Any) -> None:
        read = getattr(stream, "read", None)
        if read is None or getattr(read, "watchdog_clock", None) is self:
            return

        def stamped(max_bytes: int, timeout: float | None = None) -> bytes:
            data: bytes = read(max_bytes, timeout)
            self.last_ns = time.perf_counter_ns()
            return data

        stamped.watchdog_clock = self  # type: ignore[attr-defined]
        try:
            stream.read = stamped
        except AttributeError:  # a stream type that does not take attributes: time it later
            pass

    def stamp(self, not_before_ns: int) -> int:
        """When the bytes just handed up arrived: the last read, if it is recent enough."""
        last = self.last_ns
        return last if last >= not_before_ns else time.perf_counter_ns()


class _Trace:
    """httpcore trace hook: whether a TCP connection was opened, when the request went out;
    new connections get their reads stamped by the clock."""

    def __init__(self, clock: _ReadClock) -> None:
        self.clock = clock
        self.seen = False
        self.connected = False
        self.headers_ns: int | None = None
        self.sent_ns: int | None = None

    def __call__(self, name: str, info: dict[str, Any]) -> None:
        self.seen = True
        if name == "connection.connect_tcp.complete":
            self.connected = True
            self.clock.watch(info.get("return_value"))
        elif name == "connection.start_tls.complete":
            self.clock.watch(info.get("return_value"))
        elif name.endswith("send_request_headers.started") and self.headers_ns is None:
            self.headers_ns = time.perf_counter_ns()
        elif name.endswith("send_request_headers.complete"):
            self.sent_ns = time.perf_counter_ns()


class _Deadline:
    """Shuts the socket down when a deadline passes, so that a blocked read returns at once.

    One thread per probe, started and armed before the request goes out. Moving the deadline
    later (first token -> end of answer) does not wake it, so nothing runs beside the reading
    thread while tokens arrive; it wakes at the old deadline, sees the new one and sleeps on.
    Before a socket is attached (the response headers) it does nothing: the read timeout
    covers that phase.
    """

    def __init__(self, kind: str, at_ns: int) -> None:
        self._cond = threading.Condition()
        self._sock: socket.socket | None = None
        self._kind = kind
        self._at_ns: int | None = at_ns
        self._stopped = False
        self.fired: str | None = None
        self._thread = threading.Thread(target=self._run, name="probe-deadline", daemon=True)
        self._thread.start()

    def arm(self, kind: str, at_ns: int, sock: socket.socket | None = None) -> None:
        with self._cond:
            if sock is not None:
                self._sock = sock
            earlier = self._at_ns is None or at_ns < self._at_ns
            self._kind, self._at_ns = kind, at_ns
            if earlier:
                self._cond.notify()

    def disarm(self) -> None:
        with self._cond:
            self._at_ns = None

    def _run(self) -> None:
        with self._cond:
            while not self._stopped:
                if self._at_ns is None:
                    self._cond.wait()
                    continue
                remaining_s = (self._at_ns - time.perf_counter_ns()) / 1e9
                if remaining_s > 0:
                    self._cond.wait(remaining_s)
                    continue
                self._at_ns = None
                if self._sock is not None:
                    self.fired = self._kind
                    try:
                        self._sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

    def cancel(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join()


class Prober:
    """Sends canary probes to one server and model. Use from one thread at a time."""

    def __init__(
        self,
        base_url: str,
        model: str,
        options: ProbeOptions | None = None,
        api_key: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.options = options or ProbeOptions()
        self.model = model
        self.root = api_root(base_url)
        ollama = self.options.api == "ollama"
        self.endpoint = f"{self.root}/api/chat" if ollama else f"{self.root}/v1/chat/completions"
        self.shown_url = self.root if ollama else f"{self.root}/v1"
        self._try_url = models_url(self.root, self.options.api)
        headers = {
            "Accept": "application/x-ndjson" if ollama else "text/event-stream",
            "Accept-Encoding": "identity",
        }
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        # trust_env=False: a proxy from the environment would measure itself, not the engine.
        self._client = httpx.Client(transport=transport, headers=headers, trust_env=False)
        self._sent = 0
        self._clock = _ReadClock()

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Prober:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the probe ------------------------------------------------------------------------

    def probe(
        self, prompt: Prompt, probe_set: str, now: Callable[[], float] = time.time
    ) -> ProbeResult:
        return self.probe_timed(prompt, probe_set, now)[0]

    def probe_timed(
        self, prompt: Prompt, probe_set: str, now: Callable[[], float] = time.time
    ) -> tuple[ProbeResult, EngineTimings]:
        """`probe()`, with the engine's timings of the request beside its result."""
        body, cache_bust = self.request_body(prompt)
        ts = now()
        base = {
            "ts": ts,
            "prompt_id": prompt.id,
            "probe_set": probe_set,
            "url": self.endpoint,
            "model": self.model,
            "cache_mode": self.options.cache_mode,
            "cache_bust": cache_bust,
        }
        try:
            try:
                m = self._attempt(body, prompt.max_tokens)
            except _StaleConnection:
                m = self._attempt(body, prompt.max_tokens, retry=True)
            return self._success(base, m, prompt), _timings(m)
        except _Failure as exc:
            return self._failure(base, exc, exc.measure), _timings(exc.measure)
        except Exception as exc:  # the contract: no exception escapes a probe
            detail = f"unexpected {type(exc).__name__} while probing {self.endpoint}: {exc}"
            failure = _Failure("protocol_error", " ".join(detail.split()))
            return self._failure(base, failure, None), EngineTimings()

    def request_body(self, prompt: Prompt) -> tuple[dict[str, Any], str]:
        """The JSON body for `prompt` and how it busts the prompt cache."""
        messages = [dict(m) for m in prompt.messages]
        bust = self.options.cache_mode == "bust"
        cache_bust = "none"
        extra: dict[str, Any] = {}
        if bust and self.options.engine == "llamacpp" and self.options.api == "openai":
            extra["cache_prompt"] = False
            cache_bust = "cache_prompt_false"
        elif bust:
            nonce = f"[{secrets.token_hex(8)}]"
            if messages[0]["role"] == "system":
                messages[0]["content"] = f"{nonce} {messages[0]['content']}"
            else:
                messages.insert(
                    0, {"role": "system", "content": f"{nonce} You are a helpful assistant."}
                )
            cache_bust = "system_nonce"
        if self.options.api == "ollama":
            options = {
                "temperature": 0,
                "seed": self.options.seed,
                "num_predict": prompt.max_tokens,
            }
            body = {"model": self.model, "messages": messages, "stream": True, "options": options}
        else:
            body = {
                "model": self.model,
                "messages": messages,
                "stream": True,
                "stream_options": {"include_usage": True},
                "temperature": 0,
                "seed": self.options.seed,
                "max_tokens": prompt.max_tokens,
            }
        body.update(extra)
        return body, cache_bust

    # -- one HTTP exchange ------------------------------------------------------------------

    def _attempt(self, body: dict[str, Any], max_tokens: int, retry: bool = False) -> _Measure:
        o = self.options
        first_deadline_s = min(o.first_token_timeout_s, o.total_timeout_s)
        # The read timeout bounds the wait for the response headers: nothing can be a token
        # before them, so the first-token deadline applies.
        timeout = httpx.Timeout(
            connect=o.connect_timeout_s,
            read=first_deadline_s,
            write=o.connect_timeout_s,
            pool=o.connect_timeout_s,
        )
        trace = _Trace(self._clock)
        request = self._client.build_request(
            "POST", self.endpoint, json=body, timeout=timeout, extensions={"trace": trace}
        )
        # Started and armed now (the request may take up to the connect timeout to go out;
        # the deadline is set again from the moment it did), so that nothing costly happens
        # between the arrival of a token and the clock reading for it.
        deadline = _Deadline("first_token", time.perf_counter_ns() + int(first_deadline_s * 1e9))
        try:
            m = self._exchange(request, trace, deadline, first_deadline_s, retry, max_tokens)
        finally:
            deadline.cancel()
        return m

    def _exchange(
        self,
        request: httpx.Request,
        trace: _Trace,
        deadline: _Deadline,
        first_deadline_s: float,
        retry: bool,
        max_tokens: int,
    ) -> _Measure:
        t_start = time.perf_counter_ns()
        try:
            response = self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            dropped = isinstance(
                exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
            )
            if dropped and not retry and self._reused(trace, sent_before=self._sent):
                raise _StaleConnection from exc
            failure = self._send_failure(exc, retry, first_deadline_s)
            failure.connection = "retried_stale" if retry else self._label(trace, self._sent)
            failure.waited_ms = (time.perf_counter_ns() - t_start) / 1e6
            raise failure from exc
        label = self._label(trace, self._sent)
        self._sent += 1
        # "Request sent": the headers are with the kernel. The server cannot answer before the
        # body, which goes out after this stamp, so a stalled client thread cannot make TTFT
        # read short; only the body's few microseconds of sending are counted in.
        t0 = trace.sent_ns or trace.headers_ns or t_start
        m = _Measure(
            t0_ns=t0,
            connection="retried_stale" if retry else label,
            answer_max=answer_bound(max_tokens),
        )
        try:
            self._read(response, request, m, deadline, max_tokens)
        except _Failure as exc:
            exc.measure = m
            raise
        finally:
            response.close()
        return m

    def _send_failure(self, exc: httpx.HTTPError, retry: bool, first_deadline_s: float) -> _Failure:
        """What a failure before any response byte means, and what to try."""
        o = self.options
        if isinstance(exc, httpx.ConnectTimeout):
            return _Failure(
                "connect_timeout",
                f"cannot reach {self.shown_url} (no connection within {o.connect_timeout_s:g} s, "
                f"connect_timeout_s): is the host and port right and reachable? "
                f"try `curl -m 5 {self._try_url}`",
            )
        if isinstance(exc, httpx.ConnectError):
            return _Failure(
                "connect_refused",
                f"cannot reach {self.shown_url} ({connect_reason(exc)}): is the server running? "
                f"try `curl {self._try_url}`",
            )
        if isinstance(exc, httpx.TimeoutException):
            return _Failure(
                "first_token_timeout",
                f"no response from {self.endpoint} within {first_deadline_s:g} s "
                f"(first_token_timeout_s): the server is overloaded, hung or still loading "
                f"the model; check its log, or raise the timeout if that is expected",
            )
        if retry:
            return _Failure(
                "stale_connection",
                f"{self.endpoint} closed a kept-alive connection without answering, and then "
                f"a new one too ({exc}): the server drops connections; check its log and "
                "keep-alive settings",
            )
        if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
            return _Failure(
                "protocol_error",
                f"{self.endpoint} closed a new connection without answering ({exc}): is "
                "something other than an LLM server listening there, or a proxy failing?",
            )
        return _Failure(
            "protocol_error",
            f"request to {self.endpoint} failed: {type(exc).__name__}: {_snip(str(exc))}",
        )

    @staticmethod
    def _reused(trace: _Trace, sent_before: int) -> bool:
        """Whether the request went out on a kept-alive connection. The trace says so; a
        transport without one (a test's MockTransport) is taken as pooling like httpx does."""
        return (not trace.connected) if trace.seen else sent_before > 0

    def _label(self, trace: _Trace, sent_before: int) -> str:
        return "reused" if self._reused(trace, sent_before) else "fresh"

    def _read(
        self,
        response: httpx.Response,
        request: httpx.Request,
        m: _Measure,
        deadline: _Deadline,
        max_tokens: int,
    ) -> None:
        o = self.options
        if not 200 <= response.status_code < 300:
            raise self._http_error(response)
        ctype = response.headers.get("content-type", "").lower()
        if o.api == "openai" and ctype.startswith("application/json"):
            text = _read_some(response)
            raise _Failure(
                "protocol_error",
                f"{self.endpoint} answered application/json, not a stream ({_snip(text)}): "
                "does the server support stream=true?",
            )
        # Body reads: the deadline timer enforces the limits, so the per-read timeout only
        # has to outlast the whole answer (httpcore takes this value when the body starts).
        timeouts = request.extensions.get("timeout")
        if isinstance(timeouts, dict):
            timeouts["read"] = o.total_timeout_s + 1.0
        stream = response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        first_ns = m.t0_ns + int(min(o.first_token_timeout_s, o.total_timeout_s) * 1e9)
        total_ns = m.t0_ns + int(o.total_timeout_s * 1e9)
        deadline.arm("first_token", first_ns, sock if isinstance(sock, socket.socket) else None)
        parser = parser_for(o.api)
        chunks = response.iter_bytes()
        max_bytes, max_deltas = byte_bound(max_tokens), token_bound(max_tokens)
        over: str | None = None
        try:
            for chunk in chunks:
                t = self._clock.stamp(m.t0_ns)
                had_token = bool(m.token_ns)
                m.body_bytes += len(chunk)
                if m.body_bytes > max_bytes:
                    over = f"more than {max_bytes} bytes"
                    break
                for event in parser.feed(chunk):
                    m.take(event, t)
                if len(m.token_ns) > max_deltas:
                    over = f"more than {max_deltas} tokens"
                    break
                if not had_token and m.token_ns:
                    if t > first_ns:
                        deadline.fired = "first_token"
                        break
                    deadline.arm("total", total_ns)
                if t > (total_ns if m.token_ns else first_ns):
                    deadline.fired = "total" if m.token_ns else "first_token"
                    break
                if m.done or m.server_error is not None:
                    break
            else:
                for event in parser.close():
                    m.take(event, time.perf_counter_ns())
        except httpx.TransportError as exc:  # timeouts included
            if deadline.fired is None and isinstance(exc, httpx.TimeoutException):
                deadline.fired = "total" if m.token_ns else "first_token"
            if deadline.fired is None:
                raise _Failure(
                    "protocol_error",
                    f"connection to {self.endpoint} lost mid-stream after "
                    f"{_tokens(len(m.token_ns))} ({exc or type(exc).__name__}): the server "
                    "crashed or a proxy cut the stream; check the server log",
                ) from exc
        m.end_ns = time.perf_counter_ns()
        if over is not None:
            deadline.disarm()
            raise _Failure(
                "over_length",
                f"{self.endpoint} sent {over} for max_tokens {max_tokens} and was cut off "
                f"after {_tokens(len(m.token_ns))}: the engine ignores max_tokens; check its "
                "settings (a stop sequence or n_predict override)",
            )
        if m.done and deadline.fired is None:
            # Read the rest of the body (the end of the chunked encoding) so the connection
            # can be kept alive; a server that stalls here is not waited for.
            deadline.arm("drain", m.end_ns + 500_000_000)
            try:
                for _ in chunks:
                    pass
            except httpx.TransportError:
                pass
        deadline.disarm()
        self._judge_stream(m, deadline.fired)

    def _judge_stream(self, m: _Measure, fired: str | None) -> None:
        o = self.options
        if fired == "first_token":
            limit = min(o.first_token_timeout_s, o.total_timeout_s)
            raise _Failure(
                "first_token_timeout",
                f"no token from {self.endpoint} within {limit:g} s (first_token_timeout_s), "
                f"{m.events} events without one: the server is overloaded or stuck; check its "
                "queue and log, or raise the timeout if that is expected",
            )
        if fired == "total":
            raise _Failure(
                "total_timeout",
                f"answer from {self.endpoint} not finished within {o.total_timeout_s:g} s "
                f"(total_timeout_s) after {_tokens(len(m.token_ns))}: generation is slow; check "
                "the GPU and the load, or raise the timeout",
            )
        if m.server_error is not None:
            raise _Failure(
                "server_error",
                f"{self.endpoint} reported an error inside the stream (HTTP 200) after "
                f"{_tokens(len(m.token_ns))}: {m.server_error}; check the server log",
            )
        if m.protocol_errors:
            n = m.protocol_error_count
            raise _Failure(
                "protocol_error",
                f"{self.endpoint} sent {n} unparseable line{'s' if n > 1 else ''} "
                f"({m.protocol_errors[0]}): a proxy may be rewriting the stream",
            )
        if not m.token_ns:
            raise _Failure(
                "protocol_error",
                f"{self.endpoint} finished the stream without any token ({m.events} events): "
                "the model gave an empty answer, or the server does not stream deltas",
            )
        if not m.done and not (m.finished and o.api == "openai"):
            missing = "done: true" if o.api == "ollama" else "[DONE] or a finish_reason"
            raise _Failure(
                "protocol_error",
                f"stream from {self.endpoint} ended after {_tokens(len(m.token_ns))} without "
                f"{missing}: the server dropped the connection; check its log",
            )

    def _http_error(self, response: httpx.Response) -> _Failure:
        code = response.status_code
        text = _read_some(response)
        message = _error_text(text)
        if code in (401, 403):
            hint = "check the API key"
        elif code == 404:
            hint = f"check the URL and the model name {self.model!r}: try `curl {self._try_url}`"
        elif code in (400, 422):
            hint = "the server rejected the request: check the model name and max_tokens"
        elif code in (429, 503):
            hint = "the server is overloaded or still loading the model"
        elif code >= 500:
            hint = "the server failed: check its log"
        else:
            hint = "unexpected status for a chat request"
        return _Failure("http_status", f"HTTP {code} from {self.endpoint}: {message}; {hint}", code)

    # -- results ------------------------------------------------------------------------------

    def _success(self, base: dict[str, Any], m: _Measure, prompt: Prompt) -> ProbeResult:
        answer = _answer(m)
        return ProbeResult(**base, ok=True, quality_pass=prompt.check(answer), **_numbers(m))

    def _failure(self, base: dict[str, Any], exc: _Failure, m: _Measure | None) -> ProbeResult:
        if m is not None:
            numbers = _numbers(m)
        else:  # total_ms: how long it waited for an answer that did not come
            numbers = {"connection": exc.connection, "total_ms": exc.waited_ms}
        return ProbeResult(
            **base,
            ok=False,
            error_class=exc.error_class,
            error_detail=exc.detail,
            http_status=exc.http_status,
            quality_pass=None,
            **numbers,
        )


def _numbers(m: _Measure) -> dict[str, Any]:
    end = m.end_ns if m.end_ns is not None else time.perf_counter_ns()
    gaps = [(b - a) / 1e6 for a, b in zip(m.token_ns, m.token_ns[1:], strict=False)]
    return {
        "connection": m.connection,
        "ttft_ms": (m.token_ns[0] - m.t0_ns) / 1e6 if m.token_ns else None,
        "first_event_ms": (m.first_event_ns - m.t0_ns) / 1e6
        if m.first_event_ns is not None
        else None,
        "total_ms": (end - m.t0_ns) / 1e6,
        "output_tokens": m.usage_tokens if m.usage_tokens is not None else len(m.token_ns),
        "gap_p50_ms": statistics.median(gaps) if gaps else None,
        "gap_max_ms": max(gaps) if gaps else None,
        "answer": _answer(m),
        "load_duration_ms": m.load_duration_ms,
    }


def _timings(m: _Measure | None) -> EngineTimings:
    if m is None:
        return EngineTimings()
    return EngineTimings(prompt_ms=m.prompt_ms, prompt_n=m.prompt_n)


def _tokens(n: int) -> str:
    return f"{n} token" if n == 1 else f"{n} tokens"


def _answer(m: _Measure) -> str:
    """The content; a thinking model that spent every token on reasoning is judged on that."""
    content = "".join(m.content)
    return content if content.strip() else "".join(m.reasoning)


def _read_some(response: httpx.Response) -> str:
    data = b""
    try:
        for chunk in response.iter_bytes():
            data += chunk
            if len(data) >= _ERROR_BODY_MAX:
                break
    except httpx.HTTPError:
        pass
    return data.decode("utf-8", errors="replace")


def _error_text(text: str) -> str:
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):  # deeply nested JSON exhausts the stack
        return _snip(text) or "(empty body)"
    if isinstance(obj, dict):
        msg = error_message(obj)
        if msg is None and isinstance(obj.get("detail"), str):
            msg = obj["detail"]
        if msg is None and isinstance(obj.get("message"), str):
            msg = obj["message"]
        if msg:
            return _snip(msg)
    return _snip(text)


def _snip(text: str, limit: int = 160) -> str:
    one = printable(" ".join(text.split()))
    return one if len(one) <= limit else one[: limit - 1] + "…"
