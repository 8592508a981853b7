"""The direct path (direct.py) over real sockets: proxied requests answered from the client
protocol's callbacks, without ASGI. Keep-alive and pipelined clients, a mix with the
gateway's own paths (which stay on ASGI), clients that leave, a client that reads slowly,
HTTP/1.0 and Expect: 100-continue (left to ASGI), and a graceful stop mid-stream."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httptools
import httpx
import pytest

from llm_watchdog.gateway import GatewayServer, direct
from llm_watchdog.gateway import server as server_module
from tests.gateway.test_gateway import (
    CHAT_URL,
    FakeEngine,
    batch_state,
    chat_body,
    control,
    gateways,
    wait_for,
)


@pytest.fixture
def make_gateway(engine: FakeEngine) -> Iterator[Callable[..., GatewayServer]]:
    with gateways(engine, shutdown_timeout_s=2.0) as make:
        yield make


class Answer:
    def __init__(self) -> None:
        self.status = 0
        self.headers: dict[bytes, bytes] = {}
        self.body = b""
        self.complete = False


class Reader:
    """Answers read off a raw socket, in order, parsed with httptools."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.answers: list[Answer] = []
        self._parser = httptools.HttpResponseParser(self)
        self.closed = False

    def on_message_begin(self) -> None:
        self.answers.append(Answer())

    def on_header(self, name: bytes, value: bytes) -> None:
        self.answers[-1].headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        self.answers[-1].status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.answers[-1].body += body

    def on_message_complete(self) -> None:
        self.answers[-1].complete = True

    def read_until(self, done: Callable[[Reader], bool], timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not done(self):
            assert time.monotonic() < deadline, "timed out reading answers"
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            data = self.sock.recv(65536)
            if not data:
                self.closed = True
                return
            self._parser.feed_data(data)

    def read_answers(self, n: int) -> list[Answer]:
        self.read_until(lambda r: sum(a.complete for a in r.answers) >= n)
        return self.answers


def connect(gw: GatewayServer) -> socket.socket:
    assert gw.port is not None
    return socket.create_connection(("127.0.0.1", gw.port), timeout=10)


def post(path: str, body: Any, headers: dict[str, str] | None = None) -> bytes:
    raw = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    for key, value in (headers or {}).items():
        head += f"{key}: {value}\r\n"
    head += f"content-length: {len(raw)}\r\n\r\n"
    return head.encode() + raw


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nhost: x\r\n\r\n".encode()


def count_asgi_proxy_calls(gw: GatewayServer) -> list[str]:
    """Paths the ASGI proxy (proxy.py) is called for, from now on."""
    calls: list[str] = []
    proxy = gw.app.proxy  # type: ignore[attr-defined]
    inner = proxy.__call__

    async def counted(scope: Any, receive: Any, send: Any) -> None:
        calls.append(scope["path"])
        await inner(scope, receive, send)

    gw.app.proxy = counted  # type: ignore[attr-defined]
    return calls


# -- keep-alive and pipelining -----------------------------------------------------------


def test_proxied_requests_on_one_kept_alive_connection_skip_asgi(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway()
    calls = count_asgi_proxy_calls(gw)
    with connect(gw) as sock:
        reader = Reader(sock)
        for i in range(5):
            sock.sendall(post(CHAT_URL, chat_body(stream=i % 2 == 0)))
            answer = reader.read_answers(i + 1)[i]
            assert answer.status == 200
            if i % 2 == 0:
                assert answer.headers[b"transfer-encoding"] == b"chunked"
                assert answer.body.endswith(b"data: [DONE]\n\n")
            else:
                assert json.loads(answer.body)["object"] == "chat.completion"
    assert calls == []  # none went through ASGI
    assert len({seen.client_port for seen in engine.seen}) == 1  # one engine connection
    chat = control(http, gw)["classes"]["chat"]["observed"]
    assert (chat["requests_total"], chat["ok_total"], chat["ttft_count"]) == (5, 5, 3)


def test_pipelined_requests_are_answered_in_order_across_both_paths(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer]
) -> None:
    gw = make_gateway()
    calls = count_asgi_proxy_calls(gw)
    with connect(gw) as sock:
        # All at once: a stream, the gateway's own path (ASGI), a plain answer, metrics,
        # and a class error, each answered only after the one before it.
        sock.sendall(
            post(CHAT_URL, chat_body(max_tokens=5), {"X-Test-Delay-Ms": "30"})
            + get("/control")
            + post(CHAT_URL, chat_body(stream=False))
            + get("/metrics")
            + post(CHAT_URL, chat_body(), {"X-Traffic-Class": "nope"})
            + get("/v1/models")
        )
        answers = Reader(sock).read_answers(6)
    assert [a.status for a in answers] == [200, 200, 200, 200, 400, 200]
    assert answers[0].body.endswith(b"data: [DONE]\n\n")
    assert "classes" in json.loads(answers[1].body)
    assert json.loads(answers[2].body)["object"] == "chat.completion"
    assert b"llm_watchdog_gateway_requests_total" in answers[3].body
    assert json.loads(answers[4].body)["error"]["code"] == "unknown_traffic_class"
    assert json.loads(answers[5].body)["data"][0]["id"] == "fake-model"
    assert calls == []


def test_a_request_pipelined_behind_a_streaming_answer_waits_for_its_end(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway()
    with connect(gw) as sock:
        sock.sendall(
            post(CHAT_URL, chat_body(), {"X-Test-Hold": "h"})
            + post(CHAT_URL, chat_body(stream=False))
        )
        reader = Reader(sock)
        reader.read_until(lambda r: bool(r.answers) and b"data: " in r.answers[0].body)
        time.sleep(0.2)
        assert engine.count(path=CHAT_URL) == 1  # the second waits for the first's end
        engine.release("h")
        answers = reader.read_answers(2)
    assert answers[0].body.endswith(b"data: [DONE]\n\n")
    assert json.loads(answers[1].body)["object"] == "chat.completion"
    chat = control(http, gw)["classes"]["chat"]
    assert (chat["inflight"], chat["observed"]["ok_total"]) == (0, 2)


# -- clients that leave ------------------------------------------------------------------


def test_a_raw_client_closing_mid_stream_cancels_the_engine_and_frees_the_place(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway(batch_default_allowance=1)
    with connect(gw) as sock:
        sock.sendall(post(CHAT_URL, chat_body(), {"X-Traffic-Class": "batch", "X-Test-Hold": "b"}))
        reader = Reader(sock)
        reader.read_until(lambda r: bool(r.answers) and b"data: " in r.answers[0].body)
        assert batch_state(http, gw)["inflight"] == 1
    wait_for(lambda: engine.count("cancelled") == 1, what="engine saw the cancellation")
    wait_for(lambda: batch_state(http, gw)["inflight"] == 0, what="place given back")
    assert batch_state(http, gw)["observed"]["disconnected_total"] == 1
    answer = http.post(
        gw.url + CHAT_URL, json=chat_body(stream=False), headers={"X-Traffic-Class": "batch"}
    )
    assert answer.status_code == 200


def test_a_client_that_leaves_after_done_counts_as_ok(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway()
    with connect(gw) as sock:
        sock.sendall(post(CHAT_URL, chat_body(max_tokens=2)))
        reader = Reader(sock)
        reader.read_until(lambda r: bool(r.answers) and b"[DONE]" in r.answers[0].body)
    wait_for(lambda: control(http, gw)["classes"]["chat"]["observed"]["ok_total"] == 1)


# -- backpressure ------------------------------------------------------------------------


def test_a_slow_reader_pauses_the_engine_and_the_connection_is_reused_after(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], monkeypatch: Any
) -> None:
    # test_gateway.py's slow-client test shows the engine held back (48 MiB, past every
    # socket buffer); this one, that the pause comes from the client's write buffer and is
    # undone before the engine's connection goes back to the pool.
    pauses: list[int] = []
    original = direct.Exchange.pause

    def pause(self: direct.Exchange) -> None:
        pauses.append(1)
        original(self)

    monkeypatch.setattr(direct.Exchange, "pause", pause)
    gw = make_gateway()
    events, pad = 400, 16 * 1024  # 6.4 MiB
    headers = {"X-Test-Delay-Ms": "0", "X-Test-Pad-Bytes": str(pad)}
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    assert gw.port is not None
    sock.connect(("127.0.0.1", gw.port))
    with sock:
        sock.sendall(post(CHAT_URL, chat_body(max_tokens=events), headers))
        time.sleep(0.5)  # the client reads nothing for a while
        assert pauses  # the client's write buffer filled: the engine's reads stopped
        reader = Reader(sock)
        reader.read_answers(1)
        assert reader.answers[0].body.count(b"data: ") == events + 1
        # The engine's connection was read to its end and is reused: nothing is left paused.
        sock.sendall(post(CHAT_URL, chat_body(stream=False)))
        assert reader.read_answers(2)[1].status == 200
    assert engine.seen[0].client_port == engine.seen[1].client_port


def tiny_reader(gw: GatewayServer) -> socket.socket:
    """A client socket whose receive buffer fills at once: its answers back up in the
    gateway's write buffer unless it reads."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024)
    assert gw.port is not None
    sock.connect(("127.0.0.1", gw.port))
    return sock


BIG_STREAM = {"X-Test-Delay-Ms": "0", "X-Test-Pad-Bytes": str(16 * 1024)}


def test_a_client_that_stops_reading_loses_its_place_and_its_engine_connection(
    engine: FakeEngine,
    make_gateway: Callable[..., GatewayServer],
    http: httpx.Client,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="llm_watchdog.gateway")
    gw = make_gateway(batch_default_allowance=2, client_stall_timeout_s=0.5, max_queue_wait_s=1.0)
    # 64 MiB an answer: more than the kernel can hold between the engine and the gateway
    # (a send buffer of up to tcp_wmem's 4 MiB, a receive buffer autotuned up to tcp_rmem's
    # 32 MiB here), so the engine is still writing when the gateway ends the stream. At
    # 16 MiB both answers fitted in the buffers once, and the engine finished them.
    batch = {"X-Traffic-Class": "batch", **BIG_STREAM, "X-Test-Pad-Bytes": str(64 * 1024)}
    stalled = [tiny_reader(gw), tiny_reader(gw)]
    try:
        for sock in stalled:
            sock.sendall(post(CHAT_URL, chat_body(max_tokens=1000), batch))
        wait_for(lambda: engine.count(path=CHAT_URL) == 2, what="both streams at the engine")
        assert batch_state(http, gw)["inflight"] == 2
        # Backpressure holds the engine back and no upstream timeout fires; the stall
        # timeout ends both, however long the clients stay connected.
        wait_for(lambda: batch_state(http, gw)["inflight"] == 0, what="the places freed")
        wait_for(lambda: engine.count("cancelled") == 2, what="the engine's streams closed")
        observed = batch_state(http, gw)["observed"]
        assert (observed["stalled_total"], observed["disconnected_total"]) == (2, 0)
        for sock in stalled:  # the gateway dropped the connection, unread bytes and all
            sock.settimeout(5)
            with contextlib.suppress(ConnectionResetError):
                while sock.recv(65536):
                    pass
    finally:
        for sock in stalled:
            sock.close()
    lines = [r.getMessage() for r in caplog.records if "--client-stall-timeout" in r.getMessage()]
    assert (
        lines
        == [
            "batch request POST /v1/chat/completions ended: the client took no bytes of the answer "
            "for 0.5 s (--client-stall-timeout)"
        ]
        * 2
    )
    # A third batch request finds a place at once.
    with connect(gw) as sock:
        sock.sendall(post(CHAT_URL, chat_body(), {"X-Traffic-Class": "batch"}))
        assert Reader(sock).read_answers(1)[0].status == 200
    text = http.get(gw.url + "/metrics").text
    assert 'llm_watchdog_gateway_requests_total{class="batch",outcome="stalled"} 2.0' in text


def small_send_buffers(monkeypatch: Any) -> None:
    """Gateways started from now on give each client socket a 16 KiB send buffer: what the
    client has not taken stays in the gateway's write buffer, where the gateway sees it
    drain, instead of in the megabytes the kernel would otherwise hold for it."""
    made = server_module.protocol_for

    def protocol_for(*args: Any) -> Any:
        base = made(*args)

        class SmallSendBuffer(base):  # type: ignore[valid-type, misc]
            def connection_made(self, transport: Any) -> None:
                sock = transport.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 * 1024)
                super().connection_made(transport)

        return SmallSendBuffer

    monkeypatch.setattr(server_module, "protocol_for", protocol_for)


def test_a_slow_but_steady_reader_is_never_cut(
    engine: FakeEngine,
    make_gateway: Callable[..., GatewayServer],
    http: httpx.Client,
    monkeypatch: Any,
) -> None:
    small_send_buffers(monkeypatch)
    gw = make_gateway(client_stall_timeout_s=0.3)
    events = 60  # 960 KiB, read at about 200 KiB/s: many stall timeouts long
    sock = tiny_reader(gw)
    with sock:
        sock.sendall(post(CHAT_URL, chat_body(max_tokens=events), BIG_STREAM))
        reader = Reader(sock)
        started = time.monotonic()

        def slowly(r: Reader) -> bool:
            # At most 4 KiB per read (the receive buffer): the gateway's write buffer takes
            # longer than the stall timeout to drain from its high mark to its low one, so
            # the client's progress, not the buffer's marks, keeps the answer going.
            time.sleep(0.02)
            return bool(r.answers) and r.answers[0].complete

        reader.read_until(slowly, timeout_s=30)
        took = time.monotonic() - started
    answer = reader.answers[0]
    assert answer.status == 200 and answer.complete
    assert answer.body.count(b"data: ") == events + 1 and answer.body.endswith(b"[DONE]\n\n")
    assert took > 2.0  # it did read slowly: the stall timeout passed several times over
    observed = control(http, gw)["classes"]["chat"]["observed"]
    assert (observed["ok_total"], observed["stalled_total"]) == (1, 0)


# -- left to ASGI --------------------------------------------------------------------------


def test_http_1_0_and_expect_continue_are_proxied_through_asgi(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer]
) -> None:
    gw = make_gateway()
    calls = count_asgi_proxy_calls(gw)
    with connect(gw) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.0\r\nhost: x\r\n\r\n")
        answers = Reader(sock).read_answers(1)
    assert answers[0].status == 200
    raw = json.dumps(chat_body(stream=False)).encode()
    with connect(gw) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\n"
            b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(raw)
        )
        assert sock.recv(100).startswith(b"HTTP/1.1 100 ")
        sock.sendall(raw)
        answers = Reader(sock).read_answers(1)
    assert answers[0].status == 200
    assert calls == ["/v1/models", "/v1/chat/completions"]


# -- shutdown ----------------------------------------------------------------------------


def test_a_stream_in_flight_finishes_when_the_gateway_stops(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer]
) -> None:
    gw = make_gateway(shutdown_timeout_s=5.0)
    with connect(gw) as sock:
        sock.sendall(post(CHAT_URL, chat_body(max_tokens=20), {"X-Test-Delay-Ms": "50"}))
        reader = Reader(sock)
        reader.read_until(lambda r: bool(r.answers) and b"data: " in r.answers[0].body)
        stopping = threading.Thread(target=gw.stop)
        stopping.start()
        reader.read_answers(1)
        assert reader.answers[0].body.count(b"data: ") == 21
        reader.read_until(lambda r: r.closed)  # and then the connection closes
        stopping.join(10)
    # The engine records the outcome after its last write, which the client may read first.
    wait_for(lambda: engine.seen[0].outcome != "open", what="the engine's stream settled")
    assert engine.seen[0].outcome == "completed"


def test_past_the_grace_time_a_request_in_line_gets_503_and_a_held_stream_breaks(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway(batch_default_allowance=1, shutdown_timeout_s=1.0, max_queue_wait_s=30.0)
    batch = {"X-Traffic-Class": "batch", "X-Test-Hold": "held"}
    with connect(gw) as running, connect(gw) as waiting:
        running.sendall(post(CHAT_URL, chat_body(), batch))
        streaming = Reader(running)
        streaming.read_until(lambda r: bool(r.answers) and b"data: " in r.answers[0].body)
        waiting.sendall(post(CHAT_URL, chat_body(), batch))
        wait_for(lambda: batch_state(http, gw)["queued"] == 1, what="second request in line")
        started = time.monotonic()
        stopping = threading.Thread(target=gw.stop)
        stopping.start()
        queued = Reader(waiting)
        answers = queued.read_answers(1)
        assert answers[0].status == 503
        assert answers[0].headers[b"retry-after"] == b"1"
        assert answers[0].headers[b"connection"] == b"close"
        assert json.loads(answers[0].body)["error"]["code"] == "shutting_down"
        assert time.monotonic() - started >= 0.9  # not before the grace time
        streaming.read_until(lambda r: r.closed)
        assert not streaming.answers[0].complete  # broken off, not a clean end
        stopping.join(10)
    engine.release("held")
    assert engine.count(path=CHAT_URL) == 1  # the one in line never reached the engine


@pytest.mark.parametrize("end_seen", [True, False], ids=["end-seen", "end-not-yet-read"])
def test_an_engine_closing_a_fresh_connection_before_the_request_is_written_gets_a_502(
    engine: FakeEngine,
    make_gateway: Callable[..., GatewayServer],
    http: httpx.Client,
    monkeypatch: pytest.MonkeyPatch,
    end_seen: bool,
) -> None:
    # An engine that stops or restarts accepts and closes at once: about one request in 300
    # met that close between the connect and the write, and hung with no answer.
    import asyncio

    from llm_watchdog.gateway.upstream import Connection, Upstream

    connect = Upstream.connect

    async def closed_at_once(self: Upstream) -> Connection:
        conn = await connect(self)
        assert conn.transport is not None
        conn.transport.close()
        while end_seen and not conn.closed:
            await asyncio.sleep(0)
        return conn

    monkeypatch.setattr(Upstream, "connect", closed_at_once)
    gw = make_gateway()
    answer = http.post(f"{gw.url}{CHAT_URL}", json=chat_body(), timeout=5)
    assert answer.status_code == 502
    assert "closed the connection without answering" in answer.json()["error"]["message"]
