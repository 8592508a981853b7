"""The gateway over real sockets: a fake engine on 127.0.0.1, the gateway, real clients.

The fake engine is a stdlib HTTP/1.1 server in threads that speaks enough of OpenAI's API,
streams SSE slowly, and records every request it received and how it ended: "completed",
or "cancelled" when the other side closed the connection before the end. A request with
`X-Test-Hold: NAME` sends its first chunk and then waits until the test calls
`engine.release(NAME)`, so a test can hold requests in flight as long as it needs;
`X-Test-Hold-Prefill: NAME` waits the same way before sending anything, like a long prefill.
"""

from __future__ import annotations

import contextlib
import json
import logging
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import openai
import pytest

from llm_watchdog.gateway import GatewayConfig, GatewayServer
from tests.helpers.metrics import families, sample

TOKEN = "s3cret-control-token"
WORDS = ["The", " sky", " is", " blue", "."]


@dataclass
class Seen:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    outcome: str = "open"  # "open", "completed", "cancelled"
    chunks_sent: int = 0
    finished_at: float | None = None
    client_port: int = 0  # the gateway's end of the connection: equal ports, same connection

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class FakeEngine:
    chunk_delay_s: float = 0.01
    name: str = "engine"
    seen: list[Seen] = field(default_factory=list)
    _holds: dict[str, threading.Event] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> FakeEngine:
        engine = self

        class Handler(_Handler):
            pass

        Handler.engine = engine
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.02,), daemon=True
        )
        self._thread.start()
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        for event in list(self._holds.values()):
            event.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def hold(self, name: str) -> threading.Event:
        with self._lock:
            return self._holds.setdefault(name, threading.Event())

    def release(self, name: str) -> None:
        self.hold(name).set()

    def record(self, seen: Seen) -> None:
        with self._lock:
            self.seen.append(seen)

    def count(self, outcome: str | None = None, path: str | None = None) -> int:
        with self._lock:
            return sum(
                1
                for s in self.seen
                if (outcome is None or s.outcome == outcome) and (path is None or s.path == path)
            )


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    engine: FakeEngine

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self._handle()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_GET

    requests_on_connection = 0

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        path, _, query = self.path.partition("?")
        seen = Seen(
            self.command, path, query, {k.lower(): v for k, v in self.headers.items()}, body
        )
        seen.client_port = self.client_address[1]
        self.engine.record(seen)
        self.requests_on_connection += 1
        if "x-test-drop-reused" in seen.headers and self.requests_on_connection > 1:
            # An engine closing a kept-alive connection just as a request arrives on it.
            seen.outcome = "dropped"
            self.close_connection = True
            return
        prefill = seen.headers.get("x-test-hold-prefill")
        if prefill and not self._wait_hold(prefill):  # a long prefill: nothing sent yet
            seen.outcome = "cancelled"
            seen.finished_at = time.monotonic()
            self.close_connection = True
            return
        if path == "/v1/models":
            models = {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}
            if "x-test-close" in seen.headers:
                self.close_connection = True
                self._json(200, models, extra={"Connection": "close"})
            else:
                self._json(200, models)
        elif path in ("/v1/chat/completions", "/v1/completions") and self.command == "POST":
            request = json.loads(body or b"{}")
            if request.get("stream"):
                self._stream(seen, request)
                return
            text = "".join(WORDS)
            self._json(
                200, {"object": "chat.completion", "choices": [{"message": {"content": text}}]}
            )
        elif path.startswith("/status/"):
            status = int(path.rsplit("/", 1)[1])
            self._json(status, {"error": {"message": f"status {status}", "type": "test"}})
        elif path == "/v1/embeddings":
            self._json(200, {"object": "list", "data": [{"embedding": [0.1, 0.2]}]})
        else:
            echo = {"method": self.command, "path": path, "query": query, "body": body.decode()}
            self._json(201, echo, extra={"X-Echo": "yes", "Connection": "keep-alive, X-Hop"})
        seen.outcome = "completed"
        seen.finished_at = time.monotonic()

    def _json(self, status: int, data: Any, extra: dict[str, str] | None = None) -> None:
        raw = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(raw)

    def _stream(self, seen: Seen, request: dict[str, Any]) -> None:
        n = int(request.get("max_tokens") or len(WORDS))
        delay_s = (
            float(seen.headers.get("x-test-delay-ms", self.engine.chunk_delay_s * 1000)) / 1000
        )
        hold = seen.headers.get("x-test-hold")
        padding = " " * int(seen.headers.get("x-test-pad-bytes", 0))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for i in range(n):
                delta = {"content": WORDS[i % len(WORDS)] + padding}
                event = {
                    "id": "chatcmpl-1",
                    "object": "chat.completion.chunk",
                    "created": 1,
                    "model": "fake-model",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
                }
                # Counted before the write: the client may read the chunk before this
                # thread runs again.
                seen.chunks_sent += 1
                self._chunk(f"data: {json.dumps(event)}\n\n".encode())
                if i == 0 and hold and not self._wait_hold(hold):
                    raise ConnectionResetError("peer closed while held")
                time.sleep(delay_s)
            self._chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            seen.outcome = "cancelled"
            seen.finished_at = time.monotonic()
            self.close_connection = True
            return
        seen.outcome = "completed"
        seen.finished_at = time.monotonic()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _wait_hold(self, name: str) -> bool:
        """Wait for the test's release; False if the peer closed the connection first."""
        event = self.engine.hold(name)
        deadline = time.monotonic() + 20
        while not event.wait(0.01):
            readable, _, _ = select.select([self.connection], [], [], 0)
            if readable and self.connection.recv(1, socket.MSG_PEEK) == b"":
                return False
            if time.monotonic() > deadline:
                return False
        return True


# -- fixtures and helpers ----------------------------------------------------------------


@contextlib.contextmanager
def gateways(engine: FakeEngine, **defaults: Any) -> Iterator[Callable[..., GatewayServer]]:
    """Start gateways in front of `engine` (a module's defaults, then a test's overrides);
    every one started is stopped at the end."""
    started: list[GatewayServer] = []

    def make(**overrides: Any) -> GatewayServer:
        settings: dict[str, Any] = {
            "upstream_url": engine.url,
            "listen_port": 0,
            "control_token": TOKEN,
            "batch_default_allowance": 2,
            "batch_ceiling": 16,
            **defaults,
            **overrides,
        }
        server = GatewayServer(GatewayConfig(**settings)).start()
        started.append(server)
        return server

    try:
        yield make
    finally:
        for server in started:
            server.stop()


@pytest.fixture
def make_gateway(engine: FakeEngine) -> Iterator[Callable[..., GatewayServer]]:
    with gateways(engine, max_queue_wait_s=5.0, shutdown_timeout_s=2.0) as make:
        yield make


@pytest.fixture(scope="module")
def shared_engine() -> Iterator[FakeEngine]:
    e = FakeEngine().start()
    yield e
    e.stop()


@pytest.fixture(scope="module")
def shared_gw(shared_engine: FakeEngine) -> Iterator[GatewayServer]:
    """One gateway for tests that leave its state as they found it (refusals, counting)."""
    config = GatewayConfig(
        upstream_url=shared_engine.url,
        listen_port=0,
        control_token=TOKEN,
        batch_default_allowance=2,
        batch_ceiling=16,
        key_classes={"sk-batch-job": "batch"},
        default_class="chat",
        shutdown_timeout_s=2.0,
    )
    with GatewayServer(config) as server:
        yield server


CHAT_CLASS = {"class": "chat"}


def chat_body(stream: bool = True, max_tokens: int = 5) -> dict[str, Any]:
    return {
        "model": "fake-model",
        "messages": [{"role": "user", "content": "What colour is the sky?"}],
        "stream": stream,
        "max_tokens": max_tokens,
    }


class Background:
    """A request in its own thread: the test goes on while it waits or streams."""

    def __init__(self, client: httpx.Client, url: str, headers: dict[str, str], body: Any) -> None:
        self.status: int | None = None
        self.text = ""
        self.headers: httpx.Headers | None = None
        self.first_chunk = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(client, url, headers, body))
        self._thread.start()

    def _run(self, client: httpx.Client, url: str, headers: dict[str, str], body: Any) -> None:
        try:
            with client.stream("POST", url, headers=headers, json=body) as response:
                self.status = response.status_code
                self.headers = response.headers
                for text in response.iter_text():
                    self.first_chunk.set()
                    self.text += text
        except BaseException as exc:  # noqa: B036 - reported to the test through .error
            self.error = exc
        finally:
            self.first_chunk.set()

    def join(self, timeout_s: float = 10) -> Background:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "request did not finish"
        assert self.error is None, self.error
        return self


def wait_for(condition: Callable[[], bool], timeout_s: float = 5.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        time.sleep(0.01)


def control(http: httpx.Client, gw: GatewayServer) -> dict[str, Any]:
    response = http.get(gw.url + "/control")
    assert response.status_code == 200
    return response.json()  # type: ignore[no-any-return]


def batch_state(http: httpx.Client, gw: GatewayServer) -> dict[str, Any]:
    return control(http, gw)["classes"]["batch"]  # type: ignore[no-any-return]


def put_batch(http: httpx.Client, gw: GatewayServer, body: Any, token: str | None = TOKEN) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return http.put(gw.url + "/control/classes/batch", json=body, headers=headers)


CHAT_URL = "/v1/chat/completions"


def batch_headers(hold: str | None = None) -> dict[str, str]:
    headers = {"X-Traffic-Class": "batch"}
    if hold:
        headers["X-Test-Hold"] = hold
    return headers


# -- classes and admission -------------------------------------------------------------


def test_chat_passes_while_batch_is_held_at_its_allowance(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway(batch_default_allowance=2)
    held = [Background(http, gw.url + CHAT_URL, batch_headers("b"), chat_body()) for _ in range(2)]
    wait_for(lambda: engine.count("open") == 2, what="two batch streams at the engine")
    waiting = Background(http, gw.url + CHAT_URL, batch_headers(), chat_body())
    wait_for(lambda: batch_state(http, gw)["queued"] == 1, what="third batch request queued")

    started = time.monotonic()
    chat = http.post(
        gw.url + CHAT_URL, json=chat_body(stream=False), headers={"X-Traffic-Class": "chat"}
    )
    assert chat.status_code == 200
    assert time.monotonic() - started < 1.0
    state = batch_state(http, gw)
    assert (state["inflight"], state["queued"]) == (2, 1)
    assert engine.count(path=CHAT_URL) == 3  # two held batch + chat; the queued one never left

    engine.release("b")
    for request in (*held, waiting):
        request.join()
        assert request.status == 200
        assert "[DONE]" in request.text
    wait_for(lambda: engine.count("completed") == 4, what="four answers completed")
    observed = batch_state(http, gw)["observed"]
    assert observed["ok_total"] == 3
    assert observed["queue_wait_p95_ms"] > 10  # the third one really waited


def test_queue_wait_cap_answers_429_with_retry_after_in_openai_shape(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway(batch_default_allowance=1, max_queue_wait_s=0.3)
    held = Background(http, gw.url + CHAT_URL, batch_headers("b"), chat_body())
    wait_for(lambda: engine.count("open") == 1)

    started = time.monotonic()
    rejected = http.post(gw.url + CHAT_URL, json=chat_body(), headers=batch_headers())
    waited = time.monotonic() - started

    assert rejected.status_code == 429
    assert rejected.headers["retry-after"] == "1"
    error = rejected.json()["error"]
    assert error["type"] == "rate_limit_error"
    assert error["code"] == "batch_queue_timeout"
    assert "no batch place freed within 0.3 s" in error["message"]
    assert 0.25 <= waited < 2.0
    assert engine.count() == 1  # the rejected request never reached the engine
    engine.release("b")
    held.join()
    metrics = http.get(gw.url + "/metrics").text
    assert 'llm_watchdog_gateway_requests_total{class="batch",outcome="rejected"} 1' in metrics
    assert batch_state(http, gw)["observed"]["rejected_total"] == 1


def test_full_queue_rejects_at_once(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway(batch_default_allowance=1, max_queued=1, max_queue_wait_s=5.0)
    held = Background(http, gw.url + CHAT_URL, batch_headers("b"), chat_body())
    wait_for(lambda: engine.count("open") == 1)
    queued = Background(http, gw.url + CHAT_URL, batch_headers(), chat_body())
    wait_for(lambda: batch_state(http, gw)["queued"] == 1)

    started = time.monotonic()
    rejected = http.post(gw.url + CHAT_URL, json=chat_body(), headers=batch_headers())
    assert time.monotonic() - started < 1.0
    assert rejected.status_code == 429
    assert rejected.json()["error"]["code"] == "batch_queue_full"
    engine.release("b")
    assert held.join().status == 200
    assert queued.join().status == 200


def test_batch_rerouted_to_secondary_when_its_wait_runs_out(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    secondary = FakeEngine(name="secondary").start()
    try:
        gw = make_gateway(
            batch_default_allowance=1, max_queue_wait_s=0.2, secondary_upstream_url=secondary.url
        )
        held = Background(http, gw.url + CHAT_URL, batch_headers("b"), chat_body())
        wait_for(lambda: engine.count("open") == 1)
        rerouted = http.post(
            gw.url + CHAT_URL, json=chat_body(stream=False), headers=batch_headers()
        )
        assert rerouted.status_code == 200
        wait_for(lambda: secondary.count("completed", CHAT_URL) == 1, what="secondary answered")
        assert engine.count(path=CHAT_URL) == 1
        engine.release("b")
        held.join()
        assert batch_state(http, gw)["observed"]["rerouted_total"] == 1
    finally:
        secondary.stop()


def test_lowering_the_allowance_below_inflight_stops_admitting_but_kills_nothing(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway(batch_default_allowance=2, max_queue_wait_s=5.0)
    held = [Background(http, gw.url + CHAT_URL, batch_headers("b"), chat_body()) for _ in range(2)]
    wait_for(lambda: engine.count("open") == 2)
    assert put_batch(http, gw, {"allowance": 0, "lease_s": 30, "reason": "test"}).status_code == 200

    waiting = Background(http, gw.url + CHAT_URL, batch_headers(), chat_body())
    wait_for(lambda: batch_state(http, gw)["queued"] == 1)
    engine.release("b")
    for request in held:
        assert request.join().status == 200  # the two running ones finish whole
        assert "[DONE]" in request.text
    time.sleep(0.2)
    assert batch_state(http, gw)["queued"] == 1  # still waiting: allowance 0
    assert put_batch(http, gw, {"allowance": 1, "lease_s": 30}).status_code == 200
    assert waiting.join().status == 200


def test_a_raise_lets_queued_batch_in_one_at_a_time_at_the_ramp(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway(batch_default_allowance=1, batch_ramp_per_s=5.0, max_queue_wait_s=10.0)
    running = Background(http, gw.url + CHAT_URL, batch_headers("b"), chat_body())
    wait_for(lambda: engine.count("open") == 1)
    queued = [
        Background(http, gw.url + CHAT_URL, batch_headers("b"), chat_body()) for _ in range(3)
    ]
    wait_for(lambda: batch_state(http, gw)["queued"] == 3)
    started = time.monotonic()
    assert put_batch(http, gw, {"allowance": 4, "lease_s": 60}).status_code == 200
    state = batch_state(http, gw)
    assert (state["allowance"], state["ramp_per_s"]) == (4, 5.0)
    assert state["admitting"] < 4  # one more at once, then one every 0.2 s
    wait_for(lambda: engine.count("open") == 4, what="all three let in by the ramp")
    assert time.monotonic() - started >= 2 / 5.0 - 0.01
    assert batch_state(http, gw)["admitting"] == 4
    engine.release("b")
    for request in (running, *queued):
        assert request.join().status == 200


def test_a_batch_job_starting_into_an_idle_allowance_is_let_in_at_the_ramp(
    engine: FakeEngine,
    make_gateway: Callable[..., GatewayServer],
    http: httpx.Client,
) -> None:
    gw = make_gateway(
        batch_default_allowance=4,
        batch_ramp_per_s=5.0,
        batch_ramp_idle_s=0.3,
        max_queue_wait_s=10.0,
    )
    first = Background(http, gw.url + CHAT_URL, batch_headers("a"), chat_body())
    wait_for(lambda: engine.count("open") == 1)
    engine.release("a")  # the job goes quiet with its allowance of 4 unused
    assert first.join().status == 200
    time.sleep(0.5)
    state = batch_state(http, gw)
    assert (state["ramp_per_s"], state["ramp_idle_s"]) == (5.0, 0.3)
    started = time.monotonic()
    job = [Background(http, gw.url + CHAT_URL, batch_headers("b"), chat_body()) for _ in range(4)]
    wait_for(lambda: engine.count("open") == 4, what="the job's four streams let in by the ramp")
    # one at once, then one every 0.2 s: not four prefills at the same moment
    assert time.monotonic() - started >= 3 / 5.0 - 0.01
    engine.release("b")
    for request in job:
        assert request.join().status == 200


def test_a_job_the_idle_ramp_paces_is_not_turned_away_but_one_over_its_allowance_is(
    engine: FakeEngine,
    make_gateway: Callable[..., GatewayServer],
    http: httpx.Client,
) -> None:
    gw = make_gateway(
        batch_default_allowance=4,
        batch_ramp_per_s=4.0,
        batch_ramp_idle_s=0.2,
        max_queue_wait_s=0.3,
    )
    time.sleep(0.4)  # the allowance of 4 stands unused: the job's streams are ramped
    started = time.monotonic()
    job = [Background(http, gw.url + CHAT_URL, batch_headers("b"), chat_body()) for _ in range(4)]

    # All four in line before the fifth comes (one let in, three held by the ramp): on a
    # loaded machine a thread may send its request late, and the fifth would take its turn.
    def at_gateway() -> int:
        batch = batch_state(http, gw)
        return int(batch["inflight"] + batch["queued"])

    wait_for(lambda: at_gateway() == 4, what="the job's four streams at the gateway")
    over = http.post(gw.url + CHAT_URL, json=chat_body(), headers=batch_headers())
    assert over.status_code == 429  # a fifth has no room in the allowance: it waits 0.3 s
    # The ramp lets one in every 0.25 s: the fourth waits 0.75 s, past the queue wait, and
    # is let in all the same.
    wait_for(lambda: engine.count("open") == 4, what="the job's four streams let in by the ramp")
    assert time.monotonic() - started >= 3 / 4.0 - 0.01
    engine.release("b")
    for request in job:
        assert request.join().status == 200


def test_batch_is_held_under_the_engine_slots_chat_holds_and_let_in_as_chat_finishes(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    # Three slots, one kept free for chat: one chat and one batch reach the line of 2.
    gw = make_gateway(engine_slots=3, batch_default_allowance=4, batch_ramp_per_s=0)
    chat_headers = {"X-Traffic-Class": "chat", "X-Test-Hold": "c"}
    chat = Background(http, gw.url + CHAT_URL, chat_headers, chat_body())
    batch = Background(http, gw.url + CHAT_URL, batch_headers("b"), chat_body())
    wait_for(lambda: engine.count("open") == 2, what="one chat and one batch stream")
    waiting = Background(http, gw.url + CHAT_URL, batch_headers("b"), chat_body())
    wait_for(lambda: batch_state(http, gw)["queued"] == 1, what="batch queued at the line")
    state = batch_state(http, gw)
    assert (state["allowance"], state["inflight"], state["slot_line"]) == (4, 1, 2)
    assert 'llm_watchdog_gateway_slot_line{class="batch"} 2.0' in http.get(gw.url + "/metrics").text

    engine.release("c")  # chat finishes: its slot goes to the waiting batch request
    assert chat.join().status == 200
    wait_for(lambda: batch_state(http, gw)["inflight"] == 2, what="the queued batch let in")
    engine.release("b")
    for request in (batch, waiting):
        assert request.join().status == 200


# -- disconnects -------------------------------------------------------------------------


def test_client_leaving_mid_stream_cancels_upstream_and_frees_its_place(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway(batch_default_allowance=1)
    with httpx.Client(timeout=10) as leaving:
        with leaving.stream(
            "POST", gw.url + CHAT_URL, json=chat_body(), headers=batch_headers("b")
        ) as response:
            chunks = response.iter_raw()  # kept: dropping the iterator closes the connection
            assert next(chunks).startswith(b"data: ")
            assert batch_state(http, gw)["inflight"] == 1
        # leaving the block closes the connection half-way through the answer
    wait_for(lambda: engine.count("cancelled") == 1, what="engine saw the cancellation")
    wait_for(lambda: batch_state(http, gw)["inflight"] == 0, what="place given back")
    assert batch_state(http, gw)["observed"]["disconnected_total"] == 1

    started = time.monotonic()
    after = http.post(gw.url + CHAT_URL, json=chat_body(stream=False), headers=batch_headers())
    assert after.status_code == 200
    assert time.monotonic() - started < 1.0  # admitted at once: the place was free


def test_client_leaving_before_the_first_byte_cancels_upstream(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway(batch_default_allowance=1)
    headers = {"X-Traffic-Class": "batch", "X-Test-Hold-Prefill": "p"}
    with httpx.Client(timeout=0.5) as leaving, pytest.raises(httpx.ReadTimeout):
        leaving.post(gw.url + CHAT_URL, json=chat_body(), headers=headers)
    wait_for(lambda: engine.count("cancelled") == 1, what="engine saw the cancellation")
    wait_for(lambda: batch_state(http, gw)["inflight"] == 0, what="place given back")
    assert batch_state(http, gw)["observed"]["disconnected_total"] == 1


def test_client_leaving_the_queue_gives_its_place_back(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway(batch_default_allowance=1, max_queue_wait_s=10.0)
    held = Background(http, gw.url + CHAT_URL, batch_headers("b"), chat_body())
    wait_for(lambda: engine.count("open") == 1)

    body = json.dumps(chat_body()).encode()
    port = int(gw.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as raw:
        raw.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Traffic-Class: batch\r\n"
            b"Content-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        wait_for(lambda: batch_state(http, gw)["queued"] == 1, what="raw client queued")
    wait_for(lambda: batch_state(http, gw)["queued"] == 0, what="queue emptied by disconnect")
    assert batch_state(http, gw)["observed"]["disconnected_total"] == 1

    engine.release("b")
    held.join()
    assert engine.count(path=CHAT_URL) == 1  # the one that left never reached the engine
    assert batch_state(http, gw)["inflight"] == 0


# -- streaming ---------------------------------------------------------------------------


def test_chunks_reach_the_client_before_upstream_finishes(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway()
    stream = Background(http, gw.url + CHAT_URL, {"X-Test-Hold": "c"}, chat_body())
    assert stream.first_chunk.wait(5)
    assert stream.text.startswith("data: ")
    assert '"content": "The"' in stream.text
    assert engine.seen[0].outcome == "open"  # the engine is still holding the rest
    assert engine.seen[0].chunks_sent == 1
    engine.release("c")
    stream.join()
    assert stream.text.count("data: ") == len(WORDS) + 1
    assert stream.headers is not None
    assert stream.headers["content-type"] == "text/event-stream"
    assert "content-encoding" not in stream.headers


@pytest.mark.slow
def test_a_slow_client_slows_the_engine_instead_of_filling_the_gateway(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway()
    events, pad = 1500, 32 * 1024  # 48 MiB: more than every socket buffer on the way
    headers = {"X-Test-Delay-Ms": "0", "X-Test-Pad-Bytes": str(pad)}
    body = chat_body(max_tokens=events)
    with http.stream("POST", gw.url + CHAT_URL, json=body, headers=headers) as response:
        chunks = response.iter_raw()
        received = len(next(chunks))
        time.sleep(1.0)  # the client reads nothing for a while
        sent_while_paused = engine.seen[0].chunks_sent
        for chunk in chunks:
            received += len(chunk)
    assert sent_while_paused < events * 0.6  # the engine was held back, not read dry
    assert received > events * pad
    wait_for(lambda: engine.seen[0].outcome == "completed")


def test_openai_client_streams_through_the_gateway_unchanged(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer]
) -> None:
    gw = make_gateway(key_classes={"sk-batch-job": "batch"})

    def collect(base_url: str, key: str) -> list[str]:
        with openai.OpenAI(base_url=base_url + "/v1", api_key=key, max_retries=0) as client:
            stream = client.chat.completions.create(
                model="fake-model",
                messages=[{"role": "user", "content": "What colour is the sky?"}],
                stream=True,
            )
            return [chunk.choices[0].delta.content or "" for chunk in stream]

    direct = collect(engine.url, "sk-chat-user")
    through = collect(gw.url, "sk-chat-user")
    assert through == direct == WORDS
    by_key = collect(gw.url, "sk-batch-job")
    assert by_key == WORDS
    assert engine.seen[-1].headers["authorization"] == "Bearer sk-batch-job"
    observed = {
        cls: state["observed"]["ok_total"] for cls, state in control_raw(gw)["classes"].items()
    }
    assert observed == {"chat": 1, "batch": 1}


def control_raw(gw: GatewayServer) -> dict[str, Any]:
    return httpx.get(gw.url + "/control").json()  # type: ignore[no-any-return]


def test_other_paths_pass_through_with_method_query_headers_and_body(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway()
    response = http.request(
        "PATCH",
        gw.url + "/api/some/path?x=1&y=a%20b",
        content=b"raw body",
        headers={"X-Custom": "kept", "Connection": "keep-alive, X-Hop", "X-Hop": "dropped"},
    )
    assert response.status_code == 201
    assert response.json() == {
        "method": "PATCH",
        "path": "/api/some/path",
        "query": "x=1&y=a%20b",
        "body": "raw body",
    }
    assert response.headers["x-echo"] == "yes"
    seen = engine.seen[-1]
    assert seen.headers["x-custom"] == "kept"
    assert "x-hop" not in seen.headers  # named in Connection: hop-by-hop
    assert "user-agent" in seen.headers and "httpx" in seen.headers["user-agent"]  # the client's
    assert seen.headers["host"] == engine.url.removeprefix("http://")
    models = http.get(gw.url + "/v1/models")
    assert models.json()["data"][0]["id"] == "fake-model"
    embeddings = http.post(gw.url + "/v1/embeddings", json={"input": "x", "model": "m"})
    assert embeddings.json()["data"][0]["embedding"] == [0.1, 0.2]


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"X-Traffic-Class": "batch"}, "batch"),
        ({"X-Traffic-Class": "Chat", "Authorization": "Bearer sk-batch-job"}, "batch"),
        ({"X-Traffic-Class": "Chat", "Authorization": "Bearer sk-someone-else"}, "chat"),
        ({"Authorization": "Bearer sk-batch-job"}, "batch"),
        ({"Authorization": "Bearer sk-someone-else"}, "chat"),
        ({}, "chat"),
    ],
)
def test_class_comes_from_key_then_header_then_default(
    shared_gw: GatewayServer, http: httpx.Client, headers: dict[str, str], expected: str
) -> None:
    gw = shared_gw

    def counts() -> dict[str, int]:
        classes = control(http, gw)["classes"].items()
        return {cls: state["observed"]["requests_total"] for cls, state in classes}

    before = counts()
    assert http.post(gw.url + CHAT_URL, json=chat_body(), headers=headers).status_code == 200
    after = counts()
    assert {cls: after[cls] - before[cls] for cls in after} == {
        cls: int(cls == expected) for cls in after
    }


def test_unknown_class_header_is_400_naming_the_classes(
    shared_engine: FakeEngine, shared_gw: GatewayServer, http: httpx.Client
) -> None:
    gw, engine = shared_gw, shared_engine
    seen_before = engine.count()
    response = http.post(gw.url + CHAT_URL, json=chat_body(), headers={"X-Traffic-Class": "bulk"})
    assert response.status_code == 400
    assert response.json()["error"]["message"] == (
        "unknown traffic class 'bulk' in X-Traffic-Class: use one of chat, batch"
    )
    assert engine.count() == seen_before


@pytest.mark.parametrize(
    ("higher_first", "chat_value", "batch_value"), [(False, 0, 10), (True, 0, -10)]
)
def test_priority_is_injected_per_class_when_configured(
    engine: FakeEngine,
    make_gateway: Callable[..., GatewayServer],
    http: httpx.Client,
    higher_first: bool,
    chat_value: int,
    batch_value: int,
) -> None:
    gw = make_gateway(priorities={"chat": 0, "batch": 10}, priority_higher_first=higher_first)
    http.post(gw.url + CHAT_URL, json=chat_body(), headers={"X-Traffic-Class": "chat"})
    http.post(gw.url + CHAT_URL, json=chat_body(), headers=batch_headers())
    assert engine.seen[0].json()["priority"] == chat_value
    assert engine.seen[1].json()["priority"] == batch_value
    assert engine.seen[1].json()["messages"] == chat_body()["messages"]


def test_no_priority_injected_by_default(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway()
    raw = json.dumps(chat_body()).encode()
    http.post(gw.url + CHAT_URL, content=raw, headers=batch_headers())
    assert engine.seen[0].body == raw  # byte for byte


def test_upstream_connections_are_kept_alive_and_reused(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway()
    for _ in range(3):
        assert http.post(gw.url + CHAT_URL, json=chat_body()).status_code == 200
        assert http.get(gw.url + "/v1/models").status_code == 200
    assert len({seen.client_port for seen in engine.seen}) == 1


def test_an_engine_that_says_connection_close_gets_a_new_connection_each_time(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway()
    for _ in range(3):
        response = http.get(gw.url + "/v1/models", headers={"X-Test-Close": "1"})
        assert response.json()["data"][0]["id"] == "fake-model"
        assert "connection" not in response.headers  # hop-by-hop: not relayed
    assert len({seen.client_port for seen in engine.seen}) == 3


def test_a_kept_alive_connection_the_engine_drops_is_retried_on_a_fresh_one(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway()
    assert http.get(gw.url + "/v1/models").status_code == 200
    response = http.post(
        gw.url + CHAT_URL, json=chat_body(stream=False), headers={"X-Test-Drop-Reused": "1"}
    )
    assert response.status_code == 200
    first, dropped, retried = engine.seen
    assert dropped.outcome == "dropped" and dropped.client_port == first.client_port
    assert retried.client_port != first.client_port
    wait_for(lambda: retried.outcome == "completed", what="the retried request answered")
    assert control(http, gw)["classes"]["chat"]["observed"]["ok_total"] == 2


def test_head_and_error_statuses_are_relayed_with_their_framing(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway()
    head = http.head(gw.url + "/v1/models")
    assert head.status_code == 200
    assert int(head.headers["content-length"]) > 0 and head.content == b""
    missing = http.post(gw.url + "/status/404", json={})
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == "status 404"
    after = http.get(gw.url + "/v1/models")  # same connections: framing was right
    assert after.json()["data"][0]["id"] == "fake-model"
    observed = control(http, gw)["classes"]["chat"]["observed"]
    assert (observed["ok_total"], observed["upstream_status_total"]) == (2, 1)
    assert len({seen.client_port for seen in engine.seen}) == 1


def test_engine_silent_mid_answer_breaks_the_stream_and_frees_the_place(
    engine: FakeEngine,
    make_gateway: Callable[..., GatewayServer],
    http: httpx.Client,
    caplog: pytest.LogCaptureFixture,
) -> None:
    gw = make_gateway(upstream_read_timeout_s=0.3, batch_default_allowance=1)
    with pytest.raises(httpx.RemoteProtocolError):
        with http.stream(
            "POST", gw.url + CHAT_URL, json=chat_body(), headers=batch_headers("never")
        ) as response:
            for _ in response.iter_raw():
                pass
    wait_for(lambda: batch_state(http, gw)["inflight"] == 0, what="place given back")
    assert batch_state(http, gw)["observed"]["upstream_error_total"] == 1
    assert "broke mid-answer: no data for 0.3 s" in caplog.text


def test_unreachable_upstream_is_502_saying_what_to_check(
    make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    gw = make_gateway(upstream_url=dead)
    response = http.post(gw.url + CHAT_URL, json=chat_body())
    assert response.status_code == 502
    assert response.json()["error"]["message"] == (
        f"cannot reach upstream {dead} (connection refused): is the engine running? "
        f"try `curl {dead}/v1/models`"
    )
    assert control(http, gw)["classes"]["chat"]["observed"]["upstream_error_total"] == 1


# -- control API -------------------------------------------------------------------------


def test_put_sets_the_allowance_and_get_control_shows_the_contract_fields(
    make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway(batch_default_allowance=4, batch_ceiling=16, max_queue_wait_s=7.5)
    before = time.time()
    response = put_batch(http, gw, {"allowance": 3, "lease_s": 60, "reason": "chat p95 high"})
    assert response.status_code == 200
    state = control(http, gw)["classes"]["batch"]
    assert state["allowance"] == 3
    assert state["default_allowance"] == 4
    assert state["ceiling"] == 16
    assert state["inflight"] == 0
    assert state["queued"] == 0
    assert state["max_queue_wait_s"] == 7.5
    assert before + 59 < state["lease_expires_at"] < time.time() + 61
    assert state["reason"] == "chat p95 high"
    assert response.json()["allowance"] == 3
    assert http.get(gw.url + "/control/classes/batch").json()["allowance"] == 3


def test_lease_running_out_restores_the_default_and_logs_it(
    make_gateway: Callable[..., GatewayServer],
    http: httpx.Client,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="llm_watchdog.gateway")
    gw = make_gateway(batch_default_allowance=5)
    assert put_batch(http, gw, {"allowance": 1, "lease_s": 0.3, "reason": "hot"}).status_code == 200
    assert batch_state(http, gw)["allowance"] == 1
    wait_for(lambda: "lease ran out" in caplog.text, timeout_s=3, what="the lease timer's log line")
    state = control(http, gw)
    assert state["classes"]["batch"]["allowance"] == 5
    assert state["classes"]["batch"]["lease_expires_at"] is None
    assert [c["kind"] for c in state["changes"]] == ["set", "lease_expired"]
    assert state["changes"][-1]["allowance_after"] == 5
    assert "batch allowance lease ran out: 1 -> default 5 (it was set for: hot)" in caplog.text
    metrics = http.get(gw.url + "/metrics").text
    assert 'llm_watchdog_gateway_lease_expirations_total{class="batch"} 1' in metrics


def test_lease_end_admits_requests_queued_at_allowance_zero(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway(batch_default_allowance=2, max_queue_wait_s=5.0)
    assert put_batch(http, gw, {"allowance": 0, "lease_s": 0.5}).status_code == 200
    started = time.monotonic()
    response = http.post(gw.url + CHAT_URL, json=chat_body(stream=False), headers=batch_headers())
    assert response.status_code == 200
    assert 0.4 < time.monotonic() - started < 3.0  # waited for the lease, not the queue cap


def test_retry_after_while_paused_is_the_time_left_on_the_lease(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway(max_queue_wait_s=0.1)
    assert put_batch(http, gw, {"allowance": 0, "lease_s": 42}).status_code == 200
    response = http.post(gw.url + CHAT_URL, json=chat_body(), headers=batch_headers())
    assert response.status_code == 429
    assert response.headers["retry-after"] in ("42", "41")


@pytest.mark.parametrize(
    "auth",
    [
        None,
        "Bearer wrong-token",
        f"Basic {TOKEN}",
        f"Bearer {TOKEN}x",
        f"Bearer {TOKEN[:-1]}",
        "Bearer",
    ],
)
def test_put_without_a_valid_token_is_401_and_changes_nothing(
    shared_gw: GatewayServer, http: httpx.Client, auth: str | None
) -> None:
    gw = shared_gw
    before = control(http, gw)
    headers = {"Authorization": auth} if auth else {}
    response = http.put(
        gw.url + "/control/classes/batch", json={"allowance": 0, "lease_s": 60}, headers=headers
    )
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json()["error"]["message"] == (
        "missing or wrong control token: send Authorization: Bearer <token>"
    )
    after = control(http, gw)
    assert after["classes"]["batch"] == before["classes"]["batch"]
    assert after["changes"] == before["changes"] == []


def test_refused_control_writes_are_logged_once_a_minute_with_a_count(
    make_gateway: Callable[..., GatewayServer],
    http: httpx.Client,
    caplog: pytest.LogCaptureFixture,
) -> None:
    gw = make_gateway()
    wrong = {"Authorization": f"Bearer {TOKEN}x"}
    with caplog.at_level(logging.WARNING, logger="llm_watchdog.gateway"):
        for _ in range(3):
            response = http.put(
                gw.url + "/control/classes/batch", json={"allowance": 0}, headers=wrong
            )
            assert response.status_code == 401
        lines = [r.getMessage() for r in caplog.records if "refused a control write" in r.message]
        assert lines == [
            "refused a control write from 127.0.0.1 to /control/classes/batch: no valid token "
            "(1 refused since the last line)"
        ]
        gw.gateway.refused_logged_at -= 60.0  # a minute on: the next says how many came since
        http.put(gw.url + "/control/classes/batch", json={"allowance": 0}, headers=wrong)
        lines = [r.getMessage() for r in caplog.records if "refused a control write" in r.message]
    assert lines[1:] == [
        "refused a control write from 127.0.0.1 to /control/classes/batch: no valid token "
        "(3 refused since the last line)"
    ]


def test_gateway_without_a_token_refuses_every_change_and_says_how_to_set_one(
    make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway(control_token=None)
    for token in (None, "anything", TOKEN):
        response = put_batch(http, gw, {"allowance": 1}, token=token)
        assert response.status_code == 401
        assert response.json()["error"]["message"] == (
            "this gateway has no control token, so it accepts no changes: start it with "
            "--token-file FILE or LLM_WATCHDOG_GATEWAY_TOKEN set"
        )
    assert batch_state(http, gw)["allowance"] == 2


@pytest.mark.parametrize(
    "body",
    [
        {"allowance": -1},
        {"allowance": 17},
        {"allowance": 2.5},
        {"allowance": "3"},
        {"allowance": True},
        {"allowance": None},
        {},
    ],
)
def test_put_out_of_range_is_400_saying_the_range(
    shared_gw: GatewayServer, http: httpx.Client, body: dict[str, Any]
) -> None:
    gw = shared_gw  # ceiling 16, default allowance 2
    response = put_batch(http, gw, body)
    assert response.status_code == 400
    assert response.json()["error"]["message"] == (
        f"allowance must be an integer in [0, 16], got {body.get('allowance')!r}"
    )
    assert batch_state(http, gw)["allowance"] == 2
    assert control(http, gw)["changes"] == []


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("batch", {"allowance": 1, "lease_s": 0}, 400, "lease_s must be a positive number"),
        ("batch", {"allowance": 1, "lease_s": "1m"}, 400, "lease_s must be a positive number"),
        ("batch", [1], 400, "the body must be a JSON object"),
        ("chat", {"allowance": 1}, 400, "the chat class has no allowance to set"),
        ("bulk", {"allowance": 1}, 404, "no traffic class 'bulk'"),
    ],
)
def test_put_other_mistakes_are_refused_with_a_reason(
    shared_gw: GatewayServer, http: httpx.Client, path: str, body: Any, status: int, message: str
) -> None:
    gw = shared_gw
    response = http.put(
        gw.url + f"/control/classes/{path}", json=body, headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert response.status_code == status
    assert response.json()["error"]["message"].startswith(message)
    assert control(http, gw)["changes"] == []


# -- observation -------------------------------------------------------------------------


def test_chat_ttft_is_observed_on_metrics_and_in_the_ring(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway()
    start = time.time()
    for _ in range(3):
        http.post(gw.url + CHAT_URL, json=chat_body(), headers={"X-Test-Delay-Ms": "1"})
    http.post(gw.url + CHAT_URL, json=chat_body(stream=False))  # not streamed: no TTFT
    observed = http.get(gw.url + "/control/observed", params={"since": start}).json()
    chat = observed["ttft"]["chat"]
    assert len(chat) == 3
    assert all(start < item["ts"] <= observed["now"] and item["ttft_ms"] > 0 for item in chat)
    assert observed["ttft"]["batch"] == []
    later = http.get(gw.url + "/control/observed", params={"since": chat[1]["ts"]}).json()
    assert later["ttft"]["chat"] == chat[2:]
    assert http.get(gw.url + "/control/observed", params={"since": "soon"}).status_code == 400
    # work asked of the engine (POSTs), counted as it arrives
    counts = http.get(gw.url + "/control/observed", params={"since": start}).json()
    assert counts["work_requests_total"] == {"chat": 4, "batch": 0}
    assert counts["inflight"] == {"chat": 0, "batch": 0}

    summary = control(http, gw)["classes"]["chat"]["observed"]
    assert summary["ttft_count"] == 3
    assert summary["ttft_p50_ms"] == sorted(i["ttft_ms"] for i in chat)[1]
    # The TTFT histogram names the model the requests asked for and the engine the gateway
    # last read in the upstream's identity. A scrape that finds the engine unnamed starts
    # that read itself.
    fams = families(http.get(gw.url + "/metrics").text)
    wait_for(lambda: engine.count(path="/v1/models") >= 1, what="identity read on a scrape")
    engine_name = http.get(gw.url + "/control/identity").json()["engine"]
    fams = families(http.get(gw.url + "/metrics").text)
    ttft, labels = "llm_watchdog_gateway_ttft_seconds", {"model_name": "fake-model"}
    assert sample(fams, ttft, f"{ttft}_count", engine=engine_name, **labels, **CHAT_CLASS) == 3
    assert sample(fams, ttft, f"{ttft}_bucket", le="+Inf", **labels, **CHAT_CLASS) == 3
    requests = "llm_watchdog_gateway_requests"
    assert sample(fams, requests, f"{requests}_total", outcome="ok", **CHAT_CLASS) == 4
    allowance = "llm_watchdog_gateway_allowance"
    assert sample(fams, allowance, allowance, **{"class": "batch"}) == 2
    assert fams["llm_watchdog_gateway_queue_wait_seconds"].type == "histogram"

    # a chat request waiting for its first token already holds an engine slot: in flight
    held = Background(http, gw.url + CHAT_URL, {"X-Test-Hold-Prefill": "c"}, chat_body())

    def chat_inflight() -> int:
        data = http.get(gw.url + "/control/observed", params={"since": start}).json()
        return int(data["inflight"]["chat"])

    wait_for(lambda: chat_inflight() == 1, what="one chat request in flight")
    engine.release("c")
    held.join()
    assert chat_inflight() == 0
    http.get(gw.url + "/v1/models")  # reading models is not load
    counts = http.get(gw.url + "/control/observed", params={"since": start}).json()
    assert counts["work_requests_total"] == {"chat": 5, "batch": 0}
