"""`--engine-slots auto`: the gateway asks the engine for its slots, over real sockets.

A fake engine on 127.0.0.1 answers llama.cpp's /props (`total_slots`) or vLLM's /version
(which says no slot count); the gateway in front of it reads the slots while it runs and
draws its slot line from them, and GET /control says what it holds. A vLLM-like engine in
a process of its own has its slots read from its command line.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from llm_watchdog.gateway import GatewayConfig, GatewayServer
from llm_watchdog.gateway import app as gateway_app
from llm_watchdog.gateway.config import ENGINE_SLOTS_AUTO
from tests.helpers.streamserver import StreamServer


def props(slots: int) -> dict[str, tuple[int, bytes]]:
    body = {"build_info": "b1-test", "total_slots": slots, "model_path": "m.gguf"}
    return {"/props": (200, json.dumps(body).encode())}


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ask every 0.1 s, so a test sees a change of the engine within a second."""
    monkeypatch.setattr(gateway_app, "SLOTS_ASK_UNTIL_KNOWN_S", 0.1)
    monkeypatch.setattr(gateway_app, "SLOTS_ASK_KNOWN_S", 0.1)


@pytest.fixture
def engine() -> Iterator[StreamServer]:
    with StreamServer(engine="llamacpp", static=props(16)) as srv:
        yield srv


def gateway_in_front(url: str, **changes: Any) -> GatewayServer:
    settings: dict[str, Any] = {
        "upstream_url": url,
        "listen_port": 0,
        "batch_default_allowance": 32,
        "batch_ceiling": 64,
        "batch_ramp_per_s": 0,
        "engine_slots": ENGINE_SLOTS_AUTO,
        **changes,
    }
    config = GatewayConfig(**settings)
    return GatewayServer(config).start()


def batch_state(gw: GatewayServer) -> dict[str, Any]:
    state: dict[str, Any] = httpx.get(f"{gw.url}/control", timeout=5).json()
    return dict(state["classes"]["batch"])


def wait_for(gw: GatewayServer, key: str, value: object, within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while batch_state(gw)[key] != value:
        assert time.monotonic() < deadline, f"{key} is {batch_state(gw)[key]}, not {value}"
        time.sleep(0.05)


def test_the_gateway_draws_its_slot_line_from_what_llama_cpp_says(engine: StreamServer) -> None:
    gw = gateway_in_front(engine.url)
    try:
        wait_for(gw, "engine_slots", 16)
        state = batch_state(gw)
        assert state["slot_line"] == 14  # 16 less min(4, 16/8)
        assert "/props" in {r.path for r in engine.requests}
        metrics = httpx.get(f"{gw.url}/metrics", timeout=5).text
        assert 'llm_watchdog_gateway_slot_line{class="batch"} 14.0' in metrics
    finally:
        gw.stop()


def test_the_line_follows_an_engine_restarted_with_other_slots(
    engine: StreamServer, quick: None
) -> None:
    gw = gateway_in_front(engine.url)
    try:
        wait_for(gw, "slot_line", 14)
        engine.set(static=props(8))  # restarted with --parallel 8
        wait_for(gw, "slot_line", 7)
        assert batch_state(gw)["engine_slots"] == 8
    finally:
        gw.stop()


def test_an_engine_that_does_not_say_holds_no_line_until_it_does(quick: None) -> None:
    with StreamServer(engine="vllm") as srv:
        gw = gateway_in_front(srv.url)
        try:
            deadline = time.monotonic() + 1.0
            while not any(r.path == "/version" for r in srv.requests):
                assert time.monotonic() < deadline, "the engine was never asked"
                time.sleep(0.05)
            state = batch_state(gw)
            assert state["engine_slots"] is None and state["slot_line"] is None
            # The same port now answers as llama.cpp does: the line appears.
            srv.set(engine="llamacpp", static=props(32))
            wait_for(gw, "slot_line", 28)
        finally:
            gw.stop()


def test_given_slots_are_kept_and_the_engine_is_not_asked(engine: StreamServer) -> None:
    gw = gateway_in_front(engine.url, engine_slots=24)
    try:
        time.sleep(0.3)
        state = batch_state(gw)
        assert (state["engine_slots"], state["slot_line"]) == (24, 21)  # 24 less min(4, 24/8)
        assert "/props" not in {r.path for r in engine.requests}
    finally:
        gw.stop()


# A vLLM-like engine in its own process, launched with --max-num-seqs 24 on its command line:
# vLLM does not publish its slots, so the gateway reads them from the process (/proc).
VLLM_LIKE = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

class H(BaseHTTPRequestHandler):
    def do_GET(self):
        docs = {"/v1/models": {"object": "list", "data": [{"id": "m", "owned_by": "vllm"}]},
                "/version": {"version": "0.9.0"}}
        body = json.dumps(docs.get(self.path, {})).encode()
        self.send_response(200 if self.path in docs else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

server = HTTPServer(("127.0.0.1", 0), H)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def test_vllm_slots_are_read_from_its_launch_command() -> None:
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-c", VLLM_LIKE, "serve", "m", "--max-num-seqs", "24"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        gw = gateway_in_front(f"http://127.0.0.1:{port}")
        try:
            wait_for(gw, "engine_slots", 24)
            assert batch_state(gw)["slot_line"] == 21  # 24 less min(4, 24/8)
        finally:
            gw.stop()
    finally:
        proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_a_read_that_fails_outright_is_tried_again(
    quick: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first read of the engine's command line raises; the next gives it (as a systemd
    # unit's ExecStart would, for an engine run by another user).
    calls: list[str] = []

    def launch(upstream_url: str, engine_unit: str = "") -> tuple[list[str], str, None]:
        calls.append(engine_unit)
        if len(calls) == 1:
            raise OSError("/proc went away")
        return ["vllm", "serve", "m", "--max-num-seqs", "40"], "systemd unit vllm.service", None

    monkeypatch.setattr(gateway_app.control, "upstream_launch", launch)
    with StreamServer(engine="vllm") as srv:
        gw = gateway_in_front(srv.url)
        try:
            wait_for(gw, "slot_line", 36)  # 40 less min(4, 40/8)
        finally:
            gw.stop()
    assert len(calls) >= 2
