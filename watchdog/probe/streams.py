"""Incremental parsers for streamed chat answers. Pure: bytes in, events out, no I/O.

Two wire formats:

* OpenAI-compatible Server-Sent Events (`text/event-stream`), as served by vLLM, llama.cpp,
  SGLang, TGI and Ollama's `/v1`: `data: {json}` events separated by a blank line, ended by
  `data: [DONE]`. Parsed per the WHATWG SSE rules: LF, CRLF and lone CR all end a line (also
  when CR and LF arrive in different reads), lines starting with `:` are comments (servers
  send them as keep-alives), several `data:` lines of one event are joined with a newline,
  and one optional space after the colon is dropped.
* Ollama's native `/api/chat`: newline-delimited JSON objects, the last with `"done": true`
  and the counters (`eval_count`, durations in nanoseconds).

Feed bytes as they arrive with `feed()`, call `close()` at the end of the body. Each returns
the events completed so far, in order. Bytes may be split anywhere, also inside a UTF-8
character.

What the parsers decide (the probe builds on these rules):

* A role-only first chunk, `content: null` and `content: ""` give a `chunk` event with no token:
  it counts as the first event, not as the first token.
* A token is non-empty `content`, non-empty `reasoning_content`/`reasoning` (vLLM, SGLang,
  llama.cpp, Ollama `/v1`), Ollama's `thinking`, or any tool-call delta.
* A usage chunk (`choices: []`) gives `completion_tokens`; Ollama's final line gives
  `eval_count` and `load_duration` (ns, turned into ms).
* `data: {"error": ...}` (string or object; also vLLM's older top-level
  `{"object": "error", ...}`) or an SSE `event: error` gives a `server_error` event.
* A data line that is not JSON, or JSON that is not an object, gives a `protocol_error` event
  and parsing goes on: the caller decides whether one bad line spoils the answer (the probe
  says it does, because the official OpenAI client raises on such a line too).
* `[DONE]` (or Ollama's `done: true`) gives a `done` event. A stream that just ends gives no
  `done`: the caller sees that it is missing.
"""

from __future__ import annotations

import codecs
import json
import re
from dataclasses import dataclass
from typing import Any, Protocol

from llm_watchdog.logs import printable

CHUNK = "chunk"
DONE = "done"
SERVER_ERROR = "server_error"
PROTOCOL_ERROR = "protocol_error"
_MAX_SNIPPET = 120
_EOL = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True)
class StreamEvent:
    """One parsed event. `kind` is chunk, done, server_error or protocol_error."""

    kind: str
    content: str = ""
    reasoning: str = ""
    tool_call: bool = False
    finish_reason: str | None = None
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    load_duration_ms: float | None = None  # Ollama native: time spent loading the model
    # llama.cpp's `timings` on the last chunk: its prefill time and prompt tokens evaluated
    prompt_ms: float | None = None
    prompt_n: int | None = None
    message: str = ""  # what went wrong, for server_error and protocol_error

    @property
    def has_token(self) -> bool:
        """True when the event carries generated output: the first one ends TTFT."""
        return bool(self.content or self.reasoning or self.tool_call)


class StreamParser(Protocol):
    def feed(self, data: bytes) -> list[StreamEvent]: ...

    def close(self) -> list[StreamEvent]: ...


def parser_for(api: str) -> StreamParser:
    """A fresh parser for `api`: "openai" (SSE) or "ollama" (native NDJSON)."""
    if api == "openai":
        return SseParser()
    if api == "ollama":
        return NdjsonParser()
    raise ValueError(f"unknown api {api!r}: expected 'openai' or 'ollama'")


def parse_all(data: bytes, api: str = "openai") -> list[StreamEvent]:
    """Parse a whole captured body at once."""
    parser = parser_for(api)
    return parser.feed(data) + parser.close()


class _LineSplitter:
    """Bytes to text lines; LF, CRLF and CR end a line, even split across reads."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buf = ""
        self._skip_lf = False  # the previous read ended in CR: an LF right after belongs to it

    def feed(self, data: bytes, final: bool = False) -> list[str]:
        text = self._decoder.decode(data, final=final)
        if self._skip_lf and text:
            if text[0] == "\n":
                text = text[1:]
            self._skip_lf = False
        buf = self._buf + text
        lines: list[str] = []
        start = 0
        for m in _EOL.finditer(buf):
            lines.append(buf[start : m.start()])
            start = m.end()
            if m.end() == len(buf) and m.group() == "\r":
                self._skip_lf = True
        self._buf = buf[start:]
        if final and self._buf:
            lines.append(self._buf)
            self._buf = ""
        return lines


class SseParser:
    """OpenAI-compatible chat completion stream over Server-Sent Events."""

    def __init__(self) -> None:
        self._lines = _LineSplitter()
        self._data: list[str] = []
        self._event_type = ""
        self.comments = 0  # keep-alive comment lines seen
        self.events = 0  # events dispatched, of any kind

    def feed(self, data: bytes) -> list[StreamEvent]:
        return self._consume(self._lines.feed(data))

    def close(self) -> list[StreamEvent]:
        out = self._consume(self._lines.feed(b"", final=True))
        # The SSE rules drop an event the stream ends before its blank line; a server that
        # omits the last blank line still said something, so it is dispatched here.
        out.extend(self._dispatch())
        return out

    def _consume(self, lines: list[str]) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        for line in lines:
            if not line:
                out.extend(self._dispatch())
            elif line.startswith(":"):
                self.comments += 1
            else:
                name, sep, value = line.partition(":")
                if sep and value.startswith(" "):
                    value = value[1:]
                if name == "data":
                    self._data.append(value)
                elif name == "event":
                    self._event_type = value
                # `id`, `retry` and unknown fields carry nothing a probe needs.
        return out

    def _dispatch(self) -> list[StreamEvent]:
        if not self._data:
            self._event_type = ""
            return []
        data = "\n".join(self._data)
        event_type = self._event_type
        self._data = []
        self._event_type = ""
        self.events += 1
        if data.strip() == "[DONE]":
            return [StreamEvent(DONE)]
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError):  # deeply nested JSON exhausts the stack
            if event_type == "error":
                return [StreamEvent(SERVER_ERROR, message=_snippet(data))]
            return [StreamEvent(PROTOCOL_ERROR, message=f"data is not JSON: {_snippet(data)}")]
        if not isinstance(obj, dict):
            return [StreamEvent(PROTOCOL_ERROR, message=f"data is not an object: {_snippet(data)}")]
        error = error_message(obj)
        if error is not None or event_type == "error":
            return [StreamEvent(SERVER_ERROR, message=error or _snippet(data))]
        return [_openai_chunk(obj)]


class NdjsonParser:
    """Ollama's native `/api/chat` stream: one JSON object per line."""

    def __init__(self) -> None:
        self._lines = _LineSplitter()
        self.events = 0

    def feed(self, data: bytes) -> list[StreamEvent]:
        return self._consume(self._lines.feed(data))

    def close(self) -> list[StreamEvent]:
        return self._consume(self._lines.feed(b"", final=True))

    def _consume(self, lines: list[str]) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        for line in lines:
            if not line.strip():
                continue
            self.events += 1
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError):  # deeply nested JSON exhausts the stack
                out.append(
                    StreamEvent(PROTOCOL_ERROR, message=f"line is not JSON: {_snippet(line)}")
                )
                continue
            if not isinstance(obj, dict):
                out.append(
                    StreamEvent(PROTOCOL_ERROR, message=f"line is not an object: {_snippet(line)}")
                )
                continue
            error = error_message(obj)
            if error is not None:
                out.append(StreamEvent(SERVER_ERROR, message=error))
                continue
            out.extend(_ollama_line(obj))
        return out


def _openai_chunk(obj: dict[str, Any]) -> StreamEvent:
    content: list[str] = []
    reasoning: list[str] = []
    tool_call = False
    finish: str | None = None
    choices = obj.get("choices")
    if isinstance(choices, list):
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            delta: Any = choice.get("delta")
            if not isinstance(delta, dict):
                # Some servers answer `stream: true` with whole messages; read them the same way.
                delta = choice.get("message")
                if not isinstance(delta, dict):
                    delta = {}
            content.append(_text(delta.get("content")))
            reasoning.append(_text(delta.get("reasoning_content")) or _text(delta.get("reasoning")))
            if delta.get("tool_calls") or delta.get("function_call"):
                tool_call = True
            if isinstance(choice.get("finish_reason"), str):
                finish = choice["finish_reason"]
    completion, prompt = _usage(obj.get("usage"))
    prompt_ms, prompt_n = engine_timings(obj)
    return StreamEvent(
        CHUNK,
        content="".join(content),
        reasoning="".join(reasoning),
        tool_call=tool_call,
        finish_reason=finish,
        completion_tokens=completion,
        prompt_tokens=prompt,
        prompt_ms=prompt_ms,
        prompt_n=prompt_n,
    )


def engine_timings(obj: Any) -> tuple[float | None, int | None]:
    """(prompt_ms, prompt_n) from llama.cpp's `timings` object on a chunk or a whole answer;
    (None, None) where the engine sends none (vLLM, SGLang, TGI, Ollama)."""
    timings = obj.get("timings") if isinstance(obj, dict) else None
    if not isinstance(timings, dict):
        return None, None
    return _number(timings.get("prompt_ms")), _count(timings.get("prompt_n"))


def _ollama_line(obj: dict[str, Any]) -> list[StreamEvent]:
    message = obj.get("message")
    if not isinstance(message, dict):
        message = {}
    done = obj.get("done") is True
    load_ns = _number(obj.get("load_duration"))
    event = StreamEvent(
        CHUNK,
        content=_text(message.get("content")),
        reasoning=_text(message.get("thinking")),
        tool_call=bool(message.get("tool_calls")),
        finish_reason=obj.get("done_reason") if isinstance(obj.get("done_reason"), str) else None,
        completion_tokens=_count(obj.get("eval_count")) if done else None,
        prompt_tokens=_count(obj.get("prompt_eval_count")) if done else None,
        load_duration_ms=load_ns / 1e6 if load_ns is not None else None,  # Ollama reports ns
    )
    return [event, StreamEvent(DONE)] if done else [event]


def error_message(obj: dict[str, Any]) -> str | None:
    """The server's error text when `obj` is an error report, else None."""
    err = obj.get("error")
    if err is None and obj.get("object") == "error":
        err = obj  # vLLM before 0.10 streamed `{"object": "error", "message": ...}`
    if err is None or err is False:
        return None
    if isinstance(err, str):
        return _snippet(err)
    if isinstance(err, dict):
        msg = err.get("message") or err.get("msg") or err.get("detail")
        kind = err.get("type") or err.get("code")
        text = str(msg) if msg else json.dumps(err)
        return _snippet(f"{text} ({kind})" if kind and msg else text)
    return _snippet(json.dumps(err))


def _usage(usage: Any) -> tuple[int | None, int | None]:
    if not isinstance(usage, dict):
        return None, None
    return _count(usage.get("completion_tokens")), _count(usage.get("prompt_tokens"))


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return None
    return float(value)


def _snippet(text: str) -> str:
    one_line = printable(" ".join(text.split()))
    return one_line if len(one_line) <= _MAX_SNIPPET else one_line[: _MAX_SNIPPET - 1] + "…"
