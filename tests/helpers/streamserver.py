"""A controllable OpenAI-compatible streaming server for tests, on 127.0.0.1, port 0.

    from tests.helpers.streamserver import StreamServer, closed_port_url

    with StreamServer(answer="Paris", first_token_delay_s=0.05) as srv:
        srv.url              # "http://127.0.0.1:PORT" (srv.v1 adds "/v1")
        ...                  # point a client at it
        srv.set(fault="status", status=503)   # change behaviour while it runs
        srv.requests[-1].json                  # the last request body the server received

It runs `http.server.ThreadingHTTPServer` in a thread, speaks HTTP/1.1 with keep-alive and
chunked streams, and stops cleanly on `close()` / leaving the `with` block (sockets shut down,
handler threads joined), also while a handler hangs on purpose.

Behaviour (keyword arguments of `StreamServer(...)` and `set(...)`; read once per request):

    answer              text streamed as content deltas, split before each space
    tokens              explicit list of deltas instead of splitting `answer`
    reasoning           text streamed first as `reasoning_content` deltas (a thinking model)
    model               id served by /v1/models and echoed in chunks
    engine              which info endpoints answer, like that engine: "generic" (only /v1),
                        "llamacpp" (/props, /health), "vllm" (/version), "sglang"
                        (/get_server_info), "tgi" (/info), "ollama" (/api/version, /api/tags,
                        native NDJSON /api/chat); also sets `owned_by` in /v1/models
    version             version string the info endpoints report
    headers_delay_s     wait before sending the status line and headers
    first_token_delay_s wait after the role-only chunk, before the first token
    first_token_jitter  σ of ln(delay): each first-token delay is drawn lognormal around
                        first_token_delay_s (seeded), the spread a real engine shows
    token_gap_s         wait between tokens
    role_chunk          send llama.cpp's role-only first chunk (`content: null`), default True
    usage               send the usage chunk when the request asks for it, default True
    load_duration_ms    Ollama native: `load_duration` reported on the final line
    prompt_ms           None, or llama.cpp's `timings` object (this `prompt_ms`, `prompt_n` 12)
                        on the usage chunk, or on the finish chunk when none is sent
    idle_close_s        close a keep-alive connection idle this long (llama.cpp answers with
                        `Keep-Alive: timeout=5, max=100` and closes idle ones)
    fault               None, or one of:
        "hang"               never answer: no status line, no headers
        "status"             answer `status` (default 500) with the JSON `error_body`
        "error_mid_stream"   after `fault_after_tokens` tokens send `data: {"error": ...}`
                             with HTTP 200, then `[DONE]` (what vLLM does)
        "garbage"            after `fault_after_tokens` tokens send a line that is not JSON
        "no_done"            end the stream without `data: [DONE]`
        "cut"                after `fault_after_tokens` tokens drop the connection mid-body
        "keepalive_forever"  after the role chunk send only `: keep-alive` comments and
                             empty-content chunks every `keepalive_every_s`, never a token
        "drop_reused"        a request arriving on a reused keep-alive connection is met by
                             closing that connection without any response: what a pooled
                             client sees when llama.cpp has dropped an idle connection
        "drop"               every request is met by closing its connection, no response
        "not_streaming"      answer with one `application/json` chat completion
    fault_after_tokens  tokens sent before the fault (default 1)
    hold_model          a request naming this model is held as "hang" holds every one: a
                        batch job's long generation keeping its slot, beside chat answered
    status, error_body  for fault="status"
    keepalive_every_s   for fault="keepalive_forever" (default 0.05 s)
    static              {path: (status, body bytes)} served as JSON before anything else
                        (e.g. a real `/props` capture)

Records: `srv.requests` lists every request (`Received`: method, path, headers, body, json,
reused, and t_request_ns, t_received_ns, t_first_token_ns from `time.perf_counter_ns()`);
`srv.chat_requests()` only the POSTs; `srv.clear()` empties the list.
`GET /_stats` returns the same timings as JSON, for a client in another process.

`closed_port_url()` gives the URL of a port nothing listens on (connection refused).
`unanswering_port(kind)` is a context manager giving the URL of a socket that never answers:
kind "full_backlog" (its accept queue is full, so connecting times out) or "silent" (the
connection is made, but no byte ever comes back).
Run as a script (`python tests/helpers/streamserver.py --first-token-delay-s 0.05`) it prints
its URL on the first line of stdout and serves until its stdin closes; each stdin line
`name=number` (e.g. `first_token_delay_s=0.2`) changes the behaviour and is answered `ok`. The
benchmarks use it so, in its own process.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import random
import re
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FAULTS = (
    None,
    "hang",
    "status",
    "error_mid_stream",
    "garbage",
    "no_done",
    "cut",
    "keepalive_forever",
    "drop_reused",
    "drop",
    "not_streaming",
)
ENGINES = ("generic", "llamacpp", "vllm", "sglang", "tgi", "ollama")
_OWNED_BY = {
    "generic": "owner",
    "llamacpp": "llamacpp",
    "vllm": "vllm",
    "sglang": "sglang",
    "tgi": "tgi",
    "ollama": "library",
}


@dataclass(frozen=True)
class Behaviour:
    answer: str = "The capital of France is Paris."
    tokens: tuple[str, ...] | None = None
    reasoning: str = ""
    model: str = "test-model"
    engine: str = "generic"
    version: str = "1.2.3"
    headers_delay_s: float = 0.0
    first_token_delay_s: float = 0.0
    first_token_jitter: float = 0.0
    token_gap_s: float = 0.0
    role_chunk: bool = True
    usage: bool = True
    load_duration_ms: float = 0.0
    prompt_ms: float | None = None
    idle_close_s: float | None = None
    fault: str | None = None
    fault_after_tokens: int = 1
    status: int = 500
    error_body: Any = field(
        default_factory=lambda: {
            "error": {"code": 500, "message": "model crashed", "type": "server_error"}
        }
    )
    keepalive_every_s: float = 0.05
    static: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    hold_model: str | None = None

    def __post_init__(self) -> None:
        if self.fault not in FAULTS:
            raise ValueError(f"unknown fault {self.fault!r}: expected one of {FAULTS}")
        if self.engine not in ENGINES:
            raise ValueError(f"unknown engine {self.engine!r}: expected one of {ENGINES}")

    def pieces(self, text: str) -> list[str]:
        return re.findall(r"\s*\S+", text) or ([text] if text else [])

    def answer_tokens(self) -> list[str]:
        return list(self.tokens) if self.tokens is not None else self.pieces(self.answer)


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    reused: bool  # arrived on a connection that had served a request before
    t_request_ns: int  # request line read
    t_received_ns: int  # headers and body read
    t_first_token_ns: int | None = None

    @property
    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None


class _ClientGone(Exception):
    """The client closed the connection, or the server is stopping."""


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # server_close() joins handler threads: no thread outlives a test
    block_on_close = True

    def __init__(self, owner: StreamServer) -> None:
        self.owner = owner
        super().__init__(("127.0.0.1", 0), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up (a probe timing out, a test closing its pool) is expected;
        # anything else is printed as usual.
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        owner = self.server.owner
        super().setup()
        # A timeout while waiting for the next request ends the connection, as llama.cpp's
        # keep-alive timeout does (http.server closes it on the socket timeout).
        self.connection.settimeout(owner.behaviour.idle_close_s)
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.served = 0
        owner._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.owner._track(self.connection, add=False)

    def parse_request(self) -> bool:
        # The request line has just been read: the closest this server gets to the moment
        # the request arrived (header parsing, in Python, takes a good part of a millisecond).
        self.t_request_ns = time.perf_counter_ns()
        return super().parse_request()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        self._serve("GET")

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        self._serve("POST")

    # -- dispatch ------------------------------------------------------------------------

    def _serve(self, method: str) -> None:
        owner = self.server.owner
        b = owner.behaviour
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        rec = Received(
            method=method,
            path=self.path,
            headers={k.lower(): v for k, v in self.headers.items()},
            body=body,
            reused=self.served > 0,
            t_request_ns=self.t_request_ns,
            t_received_ns=time.perf_counter_ns(),
        )
        owner._record(rec)
        self.served += 1
        try:
            if b.fault == "drop" or (b.fault == "drop_reused" and rec.reused):
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            route = self.path.split("?", 1)[0].rstrip("/")
            if route in b.static:
                status, data = b.static[route]
                self._raw(status, data)
            elif method == "POST" and route == "/v1/chat/completions":
                self._chat(b, rec, native=False)
            elif method == "POST" and route == "/api/chat" and b.engine == "ollama":
                self._chat(b, rec, native=True)
            elif method == "GET":
                self._info(b, route)
            else:
                self._json(404, {"error": {"code": 404, "message": "File Not Found"}})
        except _ClientGone:
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True

    def _info(self, b: Behaviour, route: str) -> None:
        owner = self.server.owner
        models = {
            "object": "list",
            "data": [{"id": b.model, "object": "model", "owned_by": _OWNED_BY[b.engine]}],
        }
        answers: dict[str, Any] = {"/v1/models": models, "/_stats": owner.stats()}
        if b.engine == "llamacpp":
            answers["/props"] = {
                "build_info": b.version,
                "total_slots": 4,
                "model_path": f"{b.model}.gguf",
                "default_generation_settings": {"n_ctx": 4096},
            }
            answers["/health"] = {"status": "ok"}
        elif b.engine == "vllm":
            answers["/version"] = {"version": b.version}
            answers["/health"] = {}
        elif b.engine == "sglang":
            answers["/get_server_info"] = {
                "version": b.version,
                "model_path": b.model,
                "max_running_requests": 48,
            }
            answers["/health"] = {}
        elif b.engine == "tgi":
            answers["/info"] = {"model_id": b.model, "version": b.version, "router": "tgi-router"}
        elif b.engine == "ollama":
            answers["/api/version"] = {"version": b.version}
            answers["/api/tags"] = {"models": [{"name": b.model, "model": b.model}]}
        if route in answers:
            self._json(200, answers[route])
        else:
            self._json(404, {"error": {"code": 404, "message": "File Not Found"}})

    # -- chat ----------------------------------------------------------------------------

    def _chat(self, b: Behaviour, rec: Received, native: bool) -> None:
        owner = self.server.owner
        if b.headers_delay_s:
            owner._sleep(b.headers_delay_s)
        request = rec.json if isinstance(rec.json, dict) else {}
        if b.fault == "hang" or (b.hold_model and request.get("model") == b.hold_model):
            owner._sleep(None)
            raise _ClientGone
        if b.fault == "status":
            self._json(b.status, b.error_body)
            return
        if b.fault == "not_streaming":
            self._json(200, _completion(b))
            return
        self.send_response(200)
        ctype = "application/x-ndjson" if native else "text/event-stream"
        self.send_header("Content-Type", ctype)
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if native:
            self._native_stream(b, rec)
        else:
            include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
            self._sse_stream(b, rec, include_usage)
        self._chunk(b"")  # the terminating zero-length chunk

    def _sse_stream(self, b: Behaviour, rec: Received, include_usage: bool) -> None:
        owner = self.server.owner
        cid = "chatcmpl-test"
        if b.role_chunk:
            self._event(_chunk_obj(cid, b.model, {"role": "assistant", "content": None}))
        if b.fault == "keepalive_forever":
            while True:
                owner._sleep(b.keepalive_every_s)
                self._chunk(b": keep-alive\n\n")
                owner._sleep(b.keepalive_every_s)
                self._event(_chunk_obj(cid, b.model, {"content": ""}))
        if b.first_token_delay_s:
            owner._sleep(owner._first_token_delay(b))
        deltas = [{"reasoning_content": r} for r in b.pieces(b.reasoning)]
        deltas += [{"content": t} for t in b.answer_tokens()]
        sent = 0
        for delta in deltas:
            if sent and b.token_gap_s:
                owner._sleep(b.token_gap_s)
            self._event(_chunk_obj(cid, b.model, delta))
            sent += 1
            if sent == 1:
                rec.t_first_token_ns = time.perf_counter_ns()
            if sent == b.fault_after_tokens and self._fault_mid_stream(b):
                return
        with_usage = include_usage and b.usage
        finish = _chunk_obj(cid, b.model, {}, finish="stop")
        if b.prompt_ms is not None and not with_usage:
            finish["timings"] = _timings(b, sent)
        self._event(finish)
        if with_usage:
            usage = {"completion_tokens": sent, "prompt_tokens": 12, "total_tokens": 12 + sent}
            last = {"id": cid, "object": "chat.completion.chunk", "choices": [], "usage": usage}
            if b.prompt_ms is not None:
                last["timings"] = _timings(b, sent)
            self._event(last)
        if b.fault != "no_done":
            self._chunk(b"data: [DONE]\n\n")

    def _fault_mid_stream(self, b: Behaviour) -> bool:
        """Apply a mid-stream fault; True when the stream must stop here."""
        if b.fault == "error_mid_stream":
            self._event({"error": {"message": "CUDA out of memory", "type": "InternalServerError"}})
            self._chunk(b"data: [DONE]\n\n")
            return True
        if b.fault == "garbage":
            self._chunk(b"data: <html>502 Bad Gateway</html>\n\n")
        if b.fault == "cut":
            self.close_connection = True
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            raise _ClientGone
        return False

    def _native_stream(self, b: Behaviour, rec: Received) -> None:
        owner = self.server.owner
        if b.first_token_delay_s:
            owner._sleep(owner._first_token_delay(b))
        stamp = "2024-01-01T00:00:00.000000Z"
        sent = 0
        for tok in b.answer_tokens():
            if sent and b.token_gap_s:
                owner._sleep(b.token_gap_s)
            line = {
                "model": b.model,
                "created_at": stamp,
                "message": {"role": "assistant", "content": tok},
                "done": False,
            }
            self._chunk(json.dumps(line).encode() + b"\n")
            sent += 1
            if sent == 1:
                rec.t_first_token_ns = time.perf_counter_ns()
        final = {
            "model": b.model,
            "created_at": stamp,
            "message": {"role": "assistant", "content": ""},
            "done_reason": "stop",
            "done": True,
            "total_duration": int(b.load_duration_ms * 1e6) + 1_000_000,
            "load_duration": int(b.load_duration_ms * 1e6),
            "prompt_eval_count": 12,
            "eval_count": sent,
            "eval_duration": 1_000_000,
        }
        self._chunk(json.dumps(final).encode() + b"\n")

    # -- writing -------------------------------------------------------------------------

    def _event(self, obj: Any) -> None:
        self._chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")

    def _chunk(self, data: bytes) -> None:
        if self.server.owner._stopping.is_set():
            raise _ClientGone
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _json(self, status: int, obj: Any) -> None:
        self._raw(status, json.dumps(obj).encode())

    def _raw(self, status: int, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _chunk_obj(cid: str, model: str, delta: dict[str, Any], finish: str | None = None) -> Any:
    return {
        "choices": [{"finish_reason": finish, "index": 0, "delta": delta}],
        "created": 1700000000,
        "id": cid,
        "model": model,
        "object": "chat.completion.chunk",
    }


def _timings(b: Behaviour, sent: int) -> dict[str, Any]:
    """llama.cpp's per-request `timings`, as it puts them on the last chunk."""
    return {
        "cache_n": 0,
        "prompt_n": 12,
        "prompt_ms": b.prompt_ms,
        "prompt_per_token_ms": (b.prompt_ms or 0.0) / 12,
        "predicted_n": sent,
        "predicted_ms": 1.0,
    }


def _completion(b: Behaviour) -> Any:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "model": b.model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": b.answer},
                "finish_reason": "stop",
            }
        ],
    }


class StreamServer:
    """See the module docstring."""

    def __init__(self, **behaviour: Any) -> None:
        self.behaviour = Behaviour(**_tupled(behaviour))
        self.requests: list[Received] = []
        self._lock = threading.Lock()
        self._rng = random.Random(0)  # first-token jitter, the same draws every run
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._server: _Server | None = None
        self._port: int | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> StreamServer:
        self._server = _Server(self)
        self._port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        if self._server is None:
            return
        self._stopping.set()
        self._server.shutdown()
        with self._lock:
            conns = list(self._connections)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._server.server_close()  # joins the handler threads
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None

    def __enter__(self) -> StreamServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- control --------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The port it listens on (still known after `close()`, for messages)."""
        assert self._port is not None, "server not started"
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    def set(self, **changes: Any) -> None:
        """Change the behaviour; requests already running keep the one they started with."""
        self.behaviour = dataclasses.replace(self.behaviour, **_tupled(changes))

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()

    def chat_requests(self) -> list[Received]:
        with self._lock:
            return [r for r in self.requests if r.method == "POST"]

    def stats(self) -> list[dict[str, Any]]:
        with self._lock:
            return [
                {
                    "path": r.path,
                    "t_request_ns": r.t_request_ns,
                    "t_received_ns": r.t_received_ns,
                    "t_first_token_ns": r.t_first_token_ns,
                }
                for r in self.requests
                if r.method == "POST"
            ]

    # -- used by handlers -------------------------------------------------------------------

    def _record(self, rec: Received) -> None:
        with self._lock:
            self.requests.append(rec)

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def _first_token_delay(self, b: Behaviour) -> float:
        if not b.first_token_jitter:
            return b.first_token_delay_s
        with self._lock:
            return b.first_token_delay_s * self._rng.lognormvariate(0.0, b.first_token_jitter)

    def _sleep(self, seconds: float | None) -> None:
        """Wait, but end at once when the server stops (a hanging handler must not block it)."""
        if self._stopping.wait(seconds):
            raise _ClientGone


def _tupled(kw: dict[str, Any]) -> dict[str, Any]:
    if isinstance(kw.get("tokens"), list):
        kw = {**kw, "tokens": tuple(kw["tokens"])}
    return kw


def closed_port_url() -> str:
    """URL of a loopback port that nothing listens on: connecting to it is refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def unanswering_port(kind: str = "silent") -> Iterator[str]:
    """URL of a loopback socket that never answers; see the module docstring."""
    if kind not in ("silent", "full_backlog"):
        raise ValueError(f"unknown kind {kind!r}: expected 'silent' or 'full_backlog'")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    fillers: list[socket.socket] = []
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0 if kind == "full_backlog" else 16)
        port = listener.getsockname()[1]
        if kind == "full_backlog":
            # Linux drops new SYNs while the accept queue is full: later connects time out.
            for _ in range(4):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setblocking(False)
                fillers.append(s)
                try:
                    s.connect(("127.0.0.1", port))
                except BlockingIOError:
                    pass
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        for s in fillers:
            s.close()
        listener.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Serve the test stream server until killed.")
    ap.add_argument("--answer", default=Behaviour.answer)
    ap.add_argument("--first-token-delay-s", type=float, default=0.0)
    ap.add_argument("--token-gap-s", type=float, default=0.0)
    args = ap.parse_args(argv)
    srv = StreamServer(
        answer=args.answer,
        first_token_delay_s=args.first_token_delay_s,
        token_gap_s=args.token_gap_s,
    ).start()
    print(srv.url, flush=True)
    try:
        for line in sys.stdin:  # commands: "first_token_delay_s=0.05"
            key, _, value = line.strip().partition("=")
            if key:
                srv.set(**{key: float(value)})
                print("ok", flush=True)
    finally:
        srv.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
