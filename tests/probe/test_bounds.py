"""The probe's bounds against an engine that ignores max_tokens: it stops reading at a token
and a byte bound, stores a bounded answer and records the probe as `over_length`."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import pytest

from llm_watchdog.models import ProbeResult
from llm_watchdog.probe.client import (
    ProbeOptions,
    Prober,
    answer_bound,
    byte_bound,
    token_bound,
)
from llm_watchdog.probe.sets import Prompt
from llm_watchdog.probe.streams import PROTOCOL_ERROR, parse_all
from tests.helpers.streamserver import StreamServer

PROMPT = Prompt(
    "capital-france",
    ({"role": "user", "content": "What is the capital of France?"},),
    expect_any_of=("paris",),
    max_tokens=16,
)
OPTS = ProbeOptions(connect_timeout_s=1.0, first_token_timeout_s=2.0, total_timeout_s=10.0)


def probe(url: str, prompt: Prompt = PROMPT) -> ProbeResult:
    with Prober(url, "test-model", OPTS) as prober:
        return prober.probe(prompt, "default")


class EndlessEngine:
    """Answers every chat request with an SSE stream that never ends: one `delta` after
    another until the client goes away. Counts the bytes it managed to send."""

    def __init__(self, delta: str = "Paris ", done_after: int | None = None) -> None:
        self.delta = delta
        self.done_after = done_after
        self.sent_bytes = 0
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self._sock.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(10)
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(
                next(
                    line.split(b":")[1]
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
            )
            while len(body) < length:
                body += conn.recv(65536)
            conn.sendall(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n"
            )
            chunk = json.dumps({"choices": [{"index": 0, "delta": {"content": self.delta}}]})
            event = f"data: {chunk}\n\n".encode()
            frame = f"{len(event):x}\r\n".encode() + event + b"\r\n"
            n = 0
            try:
                while self.done_after is None or n < self.done_after:
                    conn.sendall(frame)
                    self.sent_bytes += len(frame)
                    n += 1
                done = b"data: [DONE]\n\n"
                conn.sendall(f"{len(done):x}\r\n".encode() + done + b"\r\n0\r\n\r\n")
            except OSError:
                pass

    def close(self) -> None:
        self._sock.close()
        self._thread.join(timeout=10)


@pytest.fixture
def endless() -> Iterator[EndlessEngine]:
    engine = EndlessEngine()
    yield engine
    engine.close()


def test_the_bounds_sit_a_few_kib_past_max_tokens() -> None:
    for max_tokens in (1, 16, 256, 4096):
        assert max_tokens < token_bound(max_tokens) <= 2 * max_tokens + 16
        assert byte_bound(max_tokens) - max_tokens * 300 >= 16 * 1024
        assert answer_bound(max_tokens) >= 16 * max_tokens


def test_an_endless_stream_is_cut_at_the_token_bound(endless: EndlessEngine) -> None:
    r = probe(endless.url)
    assert (r.ok, r.error_class) == (False, "over_length")
    assert r.error_detail is not None and "ignores max_tokens" in r.error_detail
    assert "more than 48 tokens" in r.error_detail
    assert r.ttft_ms is not None  # the timings are kept
    assert r.answer is not None and len(r.answer) <= answer_bound(16)
    # The client stopped reading: the engine could not push more than the socket buffers.
    endless.close()
    assert endless.sent_bytes < 16 * 1024 * 1024


def test_one_huge_delta_is_cut_at_the_byte_bound() -> None:
    engine = EndlessEngine(delta="x" * 100_000)
    try:
        r = probe(engine.url)
    finally:
        engine.close()
    assert (r.ok, r.error_class) == (False, "over_length")
    assert r.error_detail is not None and f"more than {byte_bound(16)} bytes" in r.error_detail
    assert r.answer is not None and len(r.answer) <= answer_bound(16)


def test_a_20_mb_answer_ending_in_done_is_not_ok() -> None:
    engine = EndlessEngine(delta="y" * 20_000, done_after=1000)
    try:
        r = probe(engine.url)
    finally:
        engine.close()
    assert (r.ok, r.error_class) == (False, "over_length")


def test_an_answer_within_the_bounds_is_ok_even_past_max_tokens() -> None:
    # 20 deltas for max_tokens 16: engines count tokens their own way, so this is no fault.
    with StreamServer(tokens=tuple(["Paris"] + [" x"] * 19)) as srv:
        r = probe(srv.url)
    assert r.ok and r.quality_pass is True and r.error_class is None


def test_the_stored_answer_is_cut_at_the_answer_bound() -> None:
    # Few deltas, each long: under the byte and token bounds, over the answer bound.
    long = "Paris " + "z" * 900
    with StreamServer(tokens=tuple([long] * 8)) as srv:
        r = probe(srv.url)
    assert r.ok
    assert r.answer is not None and len(r.answer) == answer_bound(16)


def test_many_unparseable_lines_keep_a_bounded_detail() -> None:
    with StreamServer(fault="garbage", fault_after_tokens=1) as srv:
        r = probe(srv.url)
    assert (r.ok, r.error_class) == (False, "protocol_error")
    assert r.error_detail is not None and len(r.error_detail) < 1000


def test_ansi_escapes_in_an_error_body_are_stored_escaped() -> None:
    body = {"error": {"message": "boom\x1b[31m red\x1b[0m\x07", "type": "x"}}
    with StreamServer(fault="status", status=500, error_body=body) as srv:
        r = probe(srv.url)
    assert r.error_class == "http_status"
    assert r.error_detail is not None
    assert "\x1b" not in r.error_detail and "\x07" not in r.error_detail
    assert "\\x1b[31m" in r.error_detail


@pytest.mark.parametrize("api", ["openai", "ollama"])
def test_deeply_nested_json_is_a_protocol_error_not_a_crash(api: str) -> None:
    nested = b"[" * 200_000 + b"]" * 200_000
    line = (b"data: " + nested + b"\n\n") if api == "openai" else nested + b"\n"
    events = parse_all(line, api)
    assert [e.kind for e in events] == [PROTOCOL_ERROR]
