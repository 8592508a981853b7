"""The control API against what a stranger or a careless writer sends: a crowd asking the
engine's identity at once, and lease reasons that would hide or garble a log line."""

from __future__ import annotations

import json
import logging
import threading
import time
import unicodedata
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from llm_watchdog.gateway import GatewayConfig, GatewayServer
from llm_watchdog.gateway.control import clean_reason
from tests.gateway.test_gateway import TOKEN, control, wait_for

# -- /control/identity: one read for everyone --------------------------------------------


class SlowEngine:
    """vLLM's /v1/models and /version, where /v1/models answers only once the test opens
    the gate: an engine slow to answer, held as long as the test needs. Counts the reads."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.models_asked = 0
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    engine.models_asked += 1  # the handler threads only add: no lost count
                    engine.gate.wait(10)
                    self._json(200, {"data": [{"id": "qwen", "owned_by": "vllm"}]})
                elif self.path == "/version":
                    self._json(200, {"version": "0.6.3"})
                else:
                    self._json(404, {"detail": "Not Found"})

            def _json(self, status: int, data: Any) -> None:
                raw = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,))
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        self.gate.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


@pytest.fixture
def slow_engine() -> Iterator[SlowEngine]:
    engine = SlowEngine()
    yield engine
    engine.stop()


def test_a_crowd_asking_the_identity_shares_one_read_of_the_engine(
    slow_engine: SlowEngine,
) -> None:
    config = GatewayConfig(upstream_url=slow_engine.url, listen_port=0, shutdown_timeout_s=2.0)
    answers: list[httpx.Response] = []

    def ask(url: str) -> None:
        answers.append(httpx.get(url + "/control/identity", timeout=10))

    with GatewayServer(config) as gw:
        crowd = [threading.Thread(target=ask, args=(gw.url,)) for _ in range(8)]
        for thread in crowd:
            thread.start()
        wait_for(lambda: slow_engine.models_asked >= 1, what="the first read at the engine")
        # Room for the rest of the crowd to reach the gateway while the engine is silent:
        # each one that started a read of its own would be counted at the engine now.
        time.sleep(0.3)
        assert slow_engine.models_asked == 1
        slow_engine.gate.set()
        for thread in crowd:
            thread.join(10)
        assert [a.status_code for a in answers] == [200] * 8
        idents = [a.json() for a in answers]
        assert all(ident == idents[0] for ident in idents)
        assert (idents[0]["engine"], idents[0]["version"]) == ("vllm", "0.6.3")
        # The read filled the cache: the next reader does not ask the engine.
        assert httpx.get(gw.url + "/control/identity").json() == idents[0]
        assert slow_engine.models_asked == 1


# -- lease reasons ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("\u202eevil\u200b", "evil"),  # right-to-left override, zero-width space
        ("a\u2066b\u2069c\u202ad\u202ce", "abcde"),  # isolates and embeddings
        ("\ufeffbom\u200d\u200e\u200f", "bom"),  # BOM, zero-width joiner, direction marks
        ("tag\U000e0041\U000e007f", "tag"),  # tag characters hide text from a reader
        ("soft\u00adhyphen", "softhyphen"),
        ("lone \ud800 surrogate", "lone  surrogate"),
        ("line\nbreak\u2028\x1b[31m", "line break  [31m"),  # as before: spaces
        ("chat p95 🔥 über café", "chat p95 🔥 über café"),  # printable text is kept
        ("e\u0301", "e\u0301"),  # a combining accent is printable
    ],
)
def test_clean_reason_drops_format_characters(reason: str, expected: str) -> None:
    cleaned = clean_reason(reason)
    assert cleaned == expected
    assert not any(unicodedata.category(ch) in ("Cf", "Cs", "Cc") for ch in cleaned)


@pytest.fixture
def gw() -> Iterator[GatewayServer]:
    config = GatewayConfig(
        upstream_url="http://127.0.0.1:9",
        listen_port=0,
        control_token=TOKEN,
        batch_default_allowance=2,
        batch_ceiling=16,
        shutdown_timeout_s=2.0,
    )
    with GatewayServer(config) as server:
        yield server


def put_raw(gw: GatewayServer, body: bytes) -> httpx.Response:
    # Raw bytes: a client's JSON encoder may refuse to write a lone surrogate at all.
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    return httpx.put(gw.url + "/control/classes/batch", content=body, headers=headers)


def test_a_reason_reaches_the_log_and_the_control_api_without_format_characters(
    gw: GatewayServer, http: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="llm_watchdog.gateway")
    body = b'{"allowance": 1, "reason": "\\u202eevil\\u200b \\u2066hot\\u2069\\ufeff"}'
    response = put_raw(gw, body)
    assert response.status_code == 200
    assert response.json()["reason"] == "evil hot"
    assert control(http, gw)["classes"]["batch"]["reason"] == "evil hot"
    wait_for(lambda: "batch allowance 2 -> 1" in caplog.text, what="the change's log line")
    line = next(
        r.getMessage() for r in caplog.records if "batch allowance 2 -> 1" in r.getMessage()
    )
    assert line.endswith("(no lease): evil hot")


def test_a_reason_with_a_lone_surrogate_leaves_the_control_api_readable(
    gw: GatewayServer, http: httpx.Client
) -> None:
    response = put_raw(gw, b'{"allowance": 1, "reason": "hot \\ud800 chat"}')
    assert response.status_code == 200
    state = control(http, gw)  # UTF-8 cannot hold a lone surrogate: kept, this was a 500
    assert state["classes"]["batch"]["reason"] == "hot  chat"
    assert state["changes"][-1]["reason"] == "hot  chat"
