"""What a client says about itself, held to what the gateway can vouch for: the class its
key was given outranks the class its header claims, and a body the gateway adds `priority`
to reaches the engine as strict JSON or not at all. Both on the gateway's own server and on
its ASGI path (HTTP/1.0), over real sockets."""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from llm_watchdog.gateway import GatewayServer
from llm_watchdog.gateway.proxy import BodyError, inject_priority
from tests.gateway.test_gateway import (
    CHAT_URL,
    Background,
    FakeEngine,
    chat_body,
    control,
    gateways,
    wait_for,
)

KEYS = {"sk-batch-job": "batch", "sk-chat-app": "chat"}
BATCH_KEY = {"Authorization": "Bearer sk-batch-job"}
CHAT_KEY = {"Authorization": "Bearer sk-chat-app"}
BATCH_RANK = 10


@pytest.fixture
def make_gateway(engine: FakeEngine) -> Iterator[Callable[..., GatewayServer]]:
    with gateways(
        engine,
        key_classes=KEYS,
        priorities={"chat": 0, "batch": BATCH_RANK},
        max_queue_wait_s=0.3,
        shutdown_timeout_s=2.0,
    ) as make:
        yield make


def requests_total(http: httpx.Client, gw: GatewayServer) -> dict[str, int]:
    classes = control(http, gw)["classes"].items()
    return {cls: state["observed"]["requests_total"] for cls, state in classes}


def http10(gw: GatewayServer, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
    """One POST in HTTP/1.0, which the gateway leaves to its ASGI path (proxy.py); the
    status and body of its answer, read until the gateway closes the connection."""
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    raw = (
        f"POST {CHAT_URL} HTTP/1.0\r\nhost: x\r\ncontent-type: application/json\r\n{head}"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body
    port = int(gw.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(raw)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head_bytes, _, rest = answer.partition(b"\r\n\r\n")
    return int(head_bytes.split(b" ", 2)[1]), rest


# -- the key's class outranks the header -------------------------------------------------


def test_a_batch_key_claiming_chat_waits_for_the_batch_place_like_any_batch_request(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway(batch_default_allowance=1)
    holder = Background(
        http, gw.url + CHAT_URL, {**BATCH_KEY, "X-Test-Hold": "h"}, chat_body(max_tokens=3)
    )
    holder.first_chunk.wait(5)
    wait_for(lambda: control(http, gw)["classes"]["batch"]["inflight"] == 1, what="batch held")
    before = requests_total(http, gw)
    spoof = http.post(
        gw.url + CHAT_URL,
        json=chat_body(stream=False),
        headers={**BATCH_KEY, "X-Traffic-Class": "chat"},
    )
    # Counted and turned away as batch: the one batch place is taken.
    assert spoof.status_code == 429
    assert spoof.headers["x-traffic-class"] == "batch"
    assert spoof.json()["error"]["code"] == "batch_queue_timeout"
    after = requests_total(http, gw)
    assert {cls: after[cls] - before[cls] for cls in after} == {"chat": 0, "batch": 1}
    engine.release("h")
    assert holder.join().status == 200


@pytest.mark.parametrize("path", ["direct", "asgi"])
@pytest.mark.parametrize(
    ("headers", "cls"),
    [
        ({**BATCH_KEY, "X-Traffic-Class": "chat"}, "batch"),  # raising: refused
        ({**CHAT_KEY, "X-Traffic-Class": "batch"}, "batch"),  # lowering: allowed
        ({**CHAT_KEY, "X-Traffic-Class": "chat"}, "chat"),
        ({"Authorization": "Bearer sk-unmapped", "X-Traffic-Class": "chat"}, "chat"),
    ],
)
def test_the_engine_gets_the_class_the_gateway_gave_and_never_the_clients_claim(
    engine: FakeEngine,
    make_gateway: Callable[..., GatewayServer],
    http: httpx.Client,
    path: str,
    headers: dict[str, str],
    cls: str,
) -> None:
    gw = make_gateway(default_class="batch")
    before = requests_total(http, gw)
    body = json.dumps(chat_body(stream=False)).encode()
    if path == "direct":
        status = http.post(gw.url + CHAT_URL, content=body, headers=headers).status_code
    else:
        status, _ = http10(gw, headers, body)
    assert status == 200
    after = requests_total(http, gw)
    assert {c: after[c] - before[c] for c in after} == {c: int(c == cls) for c in after}
    seen = engine.seen[-1]
    assert seen.json()["priority"] == (BATCH_RANK if cls == "batch" else 0)
    assert "x-traffic-class" not in seen.headers
    assert seen.headers["authorization"] == headers["Authorization"]  # the engine's own keys


# -- priority into strict JSON -----------------------------------------------------------

TOO_MANY_DIGITS = b'{"n": ' + b"9" * (sys.get_int_max_str_digits() + 1) + b"}"


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b'{"max_tokens": 1e400, "messages": []}', "out of JSON's range"),
        (b'{"max_tokens": -1e400}', "out of JSON's range"),
        (b'{"temperature": NaN}', "out of JSON's range"),
        (TOO_MANY_DIGITS, f"longer than {sys.get_int_max_str_digits()} digits"),
        (b'  {"model": "m",}', "not valid JSON"),
        (b'\xef\xbb\xbf{"model": "m"', "not valid JSON"),
        (b'{"model": "\xff"}', "not UTF-8"),
    ],
)
def test_inject_priority_refuses_what_it_cannot_write_as_json(body: bytes, why: str) -> None:
    with pytest.raises(BodyError, match="cannot add 'priority'") as caught:
        inject_priority(body, "priority", 10)
    assert why in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"temperature": -0.0, "x": 1E5}', {"temperature": -0.0, "x": 100000.0}),
        (b'{"n": ' + b"9" * 400 + b"}", {"n": int("9" * 400)}),
        (b' \r\n{"priority": "high"}', {"priority": 10}),
        (b'\xef\xbb\xbf{"model": "m"}', {"model": "m"}),
    ],
)
def test_inject_priority_writes_strict_json(body: bytes, expected: dict[str, Any]) -> None:
    out = inject_priority(body, "priority", 10)
    assert json.loads(out, parse_constant=_no_constants) == {**expected, "priority": 10}


def _no_constants(name: str) -> Any:
    raise AssertionError(f"{name} is not JSON")


@pytest.mark.parametrize(
    "body", [b"[1, 2]", b"not json {", b"--boundary\r\n", b"\xff\xfe", b'"a string"']
)
def test_inject_priority_leaves_what_is_not_a_json_object_alone(body: bytes) -> None:
    assert inject_priority(body, "priority", 10) == body


@pytest.mark.parametrize("path", ["direct", "asgi"])
@pytest.mark.parametrize(
    "body", [b'{"max_tokens": 1e400, "messages": []}', TOO_MANY_DIGITS], ids=["inf", "digits"]
)
def test_a_body_the_gateway_cannot_add_priority_to_is_400_and_never_reaches_the_engine(
    engine: FakeEngine,
    make_gateway: Callable[..., GatewayServer],
    http: httpx.Client,
    path: str,
    body: bytes,
) -> None:
    gw = make_gateway()
    headers = {"X-Traffic-Class": "batch"}
    if path == "direct":
        response = http.post(gw.url + CHAT_URL, content=body, headers=headers)
        status, raw = response.status_code, response.content
    else:
        status, raw = http10(gw, headers, body)
    assert status == 400
    error = json.loads(raw)["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_body")
    assert error["message"].startswith("the gateway cannot add 'priority' to the JSON body")
    assert error["message"].endswith((": send finite numbers", "or the number as a string"))
    # Refused before the wait in line: no place taken, nothing sent.
    state = control(http, gw)["classes"]["batch"]
    assert (state["inflight"], state["queued"]) == (0, 0)
    time.sleep(0.05)
    assert engine.count() == 0


def test_without_priority_an_odd_body_still_goes_through_unchanged(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway(priorities={})
    body = b'{"max_tokens": 1e400, "messages": [], "stream": false}'
    response = http.post(gw.url + CHAT_URL, content=body, headers={"X-Traffic-Class": "batch"})
    assert response.status_code == 200
    assert engine.seen[-1].body == body  # never parsed, so never refused
