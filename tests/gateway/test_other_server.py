"""The gateway's app under a plain uvicorn (h11, no ClientGone in the scope): the proxy falls
back to a task that waits for ASGI's http.disconnect, and a client that leaves still
cancels the engine's work."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn

from llm_watchdog.gateway import GatewayConfig, create_app
from llm_watchdog.gateway.server import bind_socket
from tests.gateway.test_gateway import CHAT_URL, FakeEngine, batch_headers, chat_body, wait_for


@pytest.fixture
def plain_server(engine: FakeEngine) -> Iterator[str]:
    app = create_app(GatewayConfig(upstream_url=engine.url, listen_port=0))
    sock = bind_socket("127.0.0.1", 0)
    config = uvicorn.Config(app, http="h11", loop="asyncio", log_config=None, lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(10)
    sock.close()


def test_a_client_leaving_mid_stream_cancels_upstream_under_another_server(
    engine: FakeEngine, plain_server: str
) -> None:
    with httpx.Client(timeout=10) as http:
        answer = http.post(plain_server + CHAT_URL, json=chat_body(stream=False))
        assert answer.status_code == 200
        with http.stream(
            "POST", plain_server + CHAT_URL, json=chat_body(), headers=batch_headers("b")
        ) as response:
            chunks = response.iter_raw()
            assert next(chunks).startswith(b"data: ")
    wait_for(lambda: engine.count("cancelled") == 1, what="engine saw the cancellation")
    with httpx.Client(timeout=10) as http:
        batch = http.get(plain_server + "/control").json()["classes"]["batch"]
    assert (batch["inflight"], batch["observed"]["disconnected_total"]) == (0, 1)
