"""The gateway's limits over real sockets: slow or oversized requests, too many connections,
absurd control values, control characters in reasons, deep JSON, an engine that never
answers. Each is refused with a status and one line saying what to do, never a 500."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from llm_watchdog.gateway import GatewayConfig, GatewayServer
from tests.gateway.test_gateway import (
    CHAT_URL,
    TOKEN,
    Background,
    FakeEngine,
    batch_headers,
    batch_state,
    chat_body,
    control,
    gateways,
    put_batch,
    wait_for,
)


@pytest.fixture
def make_gateway(engine: FakeEngine) -> Iterator[Callable[..., GatewayServer]]:
    with gateways(engine, shutdown_timeout_s=1.0) as make:
        yield make


def raw_connection(gw: GatewayServer) -> socket.socket:
    assert gw.port is not None
    sock = socket.create_connection(("127.0.0.1", gw.port), timeout=5)
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Everything the gateway writes until it closes the connection."""
    out = b""
    while True:
        data = sock.recv(65536)
        if not data:
            return out
        out += data


def error_of(answer: bytes) -> tuple[bytes, dict[str, Any]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return head, json.loads(body)["error"]


# -- slow clients ------------------------------------------------------------------------


def test_headers_not_finished_in_time_get_408_and_the_connection_closes(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer]
) -> None:
    gw = make_gateway(header_timeout_s=0.3)
    with raw_connection(gw) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-slow: ")
        started = time.monotonic()
        answer = read_all(sock)
    waited = time.monotonic() - started
    head, error = error_of(answer)
    assert head.startswith(b"HTTP/1.1 408 ")
    assert b"connection: close" in head
    assert error["message"] == (
        "request headers not complete within 0.3 s: send the whole request at once"
    )
    assert 0.2 <= waited < 3.0
    assert engine.count() == 0


def test_a_kept_alive_connection_whose_next_request_stalls_gets_408(
    make_gateway: Callable[..., GatewayServer],
) -> None:
    gw = make_gateway(header_timeout_s=0.3)
    with raw_connection(gw) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
        time.sleep(0.5)  # past the header timeout, but idle between requests is keep-alive's
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n")  # the second stalls
        answer = read_all(sock)
    first, _, rest = answer.partition(b"HTTP/1.1 408 ")
    assert first.startswith(b"HTTP/1.1 200 ") and first.endswith(b'"object": "model"}]}')
    assert b"request headers not complete within 0.3 s" in rest


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(
    make_gateway: Callable[..., GatewayServer],
) -> None:
    gw = make_gateway(header_timeout_s=0.3)
    with raw_connection(gw) as sock:
        assert read_all(sock).startswith(b"HTTP/1.1 408 ")


def test_a_body_trickled_too_slowly_gets_408_and_reaches_no_engine(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway(body_timeout_s=0.3)
    with raw_connection(gw) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
            b'content-type: application/json\r\ncontent-length: 100\r\n\r\n{"model"'
        )
        head, error = error_of(read_all(sock))
    assert head.startswith(b"HTTP/1.1 408 ")
    assert "request body not complete within 0.3 s" in error["message"]
    assert engine.count() == 0
    # The gateway goes on serving.
    assert http.post(gw.url + CHAT_URL, json=chat_body(stream=False)).status_code == 200


def test_a_long_stream_is_not_cut_by_the_request_timeouts(
    make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway(header_timeout_s=0.2, body_timeout_s=0.2)
    answer = http.post(
        gw.url + CHAT_URL, json=chat_body(max_tokens=8), headers={"X-Test-Delay-Ms": "100"}
    )
    assert answer.status_code == 200
    assert "[DONE]" in answer.text


# -- connection limit --------------------------------------------------------------------


def test_past_the_connection_limit_a_request_gets_503_saying_what_to_do(
    make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway(max_connections=2, header_timeout_s=5.0)
    held = [raw_connection(gw), raw_connection(gw)]
    try:
        time.sleep(0.1)  # both accepted
        with raw_connection(gw) as sock:
            sock.sendall(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
            head, error = error_of(read_all(sock))
        assert head.startswith(b"HTTP/1.1 503 ")
        assert b"retry-after: 1" in head
        assert error["code"] == "too_many_connections"
        assert error["message"] == (
            "the gateway holds its limit of 2 open connections: retry in a moment, or raise "
            "--max-connections (and the unit's LimitNOFILE)"
        )
    finally:
        for sock in held:
            sock.close()
    wait_for(lambda: http.get(gw.url + "/v1/models").status_code == 200, what="served again")


# -- body limits -------------------------------------------------------------------------


def test_a_body_over_the_limit_is_413_and_never_forwarded(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway(max_body_bytes=1000)
    big = {**chat_body(), "padding": "x" * 2000}
    declared = http.post(gw.url + CHAT_URL, json=big)
    assert declared.status_code == 413
    assert declared.json()["error"]["message"] == (
        "the request body is over the gateway's limit of 1000 bytes: send less, or raise --max-body"
    )
    # Chunked, with no Content-Length to refuse it by: counted as it arrives.
    raw = json.dumps(big).encode()
    chunked = http.post(gw.url + CHAT_URL, content=iter([raw[:600], raw[600:]]))
    assert chunked.status_code == 413
    assert engine.count() == 0
    assert http.post(gw.url + CHAT_URL, json=chat_body(stream=False)).status_code == 200


def test_a_control_body_over_its_limit_is_413_and_changes_nothing(
    make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway(max_control_body_bytes=1024)
    answer = put_batch(http, gw, {"allowance": 5, "reason": "x" * 5000})
    assert answer.status_code == 413
    assert "over the control API's limit of 1024 bytes" in answer.json()["error"]["message"]
    assert batch_state(http, gw)["allowance"] == 2


def read_answer(sock: socket.socket) -> tuple[bytes, bytes]:
    """One answer's head and body off a kept-alive connection (the body by content-length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        more = sock.recv(65536)
        assert more, "the connection closed before an answer"
        data += more
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        more = sock.recv(65536)
        assert more, "the connection closed mid-answer"
        body += more
    return head, body


def padded_body(size: int) -> bytes:
    """A non-streamed chat request of about `size` bytes."""
    return json.dumps({**chat_body(stream=False), "padding": "x" * size}).encode()


def post_head(length: int | None) -> bytes:
    framing = f"content-length: {length}" if length is not None else "transfer-encoding: chunked"
    return (
        f"POST {CHAT_URL} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"{framing}\r\n\r\n"
    ).encode()


def http10_head(length: int) -> bytes:
    """A POST head in HTTP/1.0, which the gateway leaves to its ASGI path (proxy.py)."""
    return post_head(length).replace(b" HTTP/1.1\r\n", b" HTTP/1.0\r\n")


def held_body_bytes(gw: GatewayServer) -> int:
    return gw.gateway.body_bytes


BUDGET_FULL = (
    "the gateway holds its limit of 60000 bytes of request bodies being received: retry in "
    "a moment, or raise --max-body-total"
)


def test_a_body_declared_past_the_total_budget_is_503_until_another_is_done(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer]
) -> None:
    gw = make_gateway(max_body_bytes=40_000, max_body_total_bytes=60_000)
    raw = padded_body(30_000)
    with raw_connection(gw) as holding, raw_connection(gw) as refused:
        # One client sends its headers and a little of its body, and holds the rest: its
        # declared length is held from the headers on.
        holding.sendall(post_head(len(raw)) + raw[:100])
        wait_for(lambda: held_body_bytes(gw) == len(raw), what="the declared length held")
        refused.sendall(post_head(len(raw)) + raw)
        head, body = read_answer(refused)
        assert head.startswith(b"HTTP/1.1 503 ")
        assert b"retry-after: 1" in head
        assert json.loads(body) == {
            "error": {
                "message": BUDGET_FULL,
                "type": "gateway_error",
                "param": None,
                "code": "body_budget_full",
            }
        }
        assert engine.count() == 0
        # The first body goes upstream: its bytes go back, and the refused client's retry
        # on the same connection passes.
        holding.sendall(raw[100:])
        assert read_answer(holding)[0].startswith(b"HTTP/1.1 200 ")
        assert held_body_bytes(gw) == 0
        refused.sendall(post_head(len(raw)) + raw)
        assert read_answer(refused)[0].startswith(b"HTTP/1.1 200 ")
    assert engine.count(path=CHAT_URL) == 2
    wait_for(lambda: held_body_bytes(gw) == 0, what="nothing held")


def test_the_budget_holds_on_the_asgi_path_too(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer]
) -> None:
    # HTTP/1.0 (and Expect: 100-continue) is left to the ASGI cycle and proxy.py: bodies
    # there were bounded by --max-body alone.
    gw = make_gateway(max_body_bytes=40_000, max_body_total_bytes=60_000)
    raw = padded_body(30_000)
    head = http10_head(len(raw))
    with raw_connection(gw) as holding:
        holding.sendall(head + raw[:100])
        wait_for(lambda: held_body_bytes(gw) == len(raw), what="the declared length held")
        with raw_connection(gw) as refused:
            refused.sendall(head + raw)
            answer, body = read_answer(refused)
        assert answer.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1" in answer
        assert json.loads(body)["error"] == {
            "message": BUDGET_FULL,
            "type": "gateway_error",
            "param": None,
            "code": "body_budget_full",
        }
        assert engine.count() == 0
        # A client that waits for 100 Continue before its body gets the 503 instead.
        expecting = post_head(len(raw)).replace(b"\r\n\r\n", b"\r\nexpect: 100-continue\r\n\r\n")
        with raw_connection(gw) as asking:
            asking.sendall(expecting)
            answer, body = read_answer(asking)
        assert answer.startswith(b"HTTP/1.1 503 "), answer
        assert json.loads(body)["error"]["code"] == "body_budget_full"
        holding.sendall(raw[100:])
        assert read_answer(holding)[0].startswith(b"HTTP/1.1 200 ")
    wait_for(lambda: held_body_bytes(gw) == 0, what="the body upstream, its bytes back")
    with raw_connection(gw) as again:
        again.sendall(head + raw)
        assert read_answer(again)[0].startswith(b"HTTP/1.1 200 ")
    wait_for(lambda: held_body_bytes(gw) == 0, what="nothing held")
    assert engine.count(path=CHAT_URL) == 2


def test_a_client_that_leaves_mid_body_on_the_asgi_path_gives_its_bytes_back(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer]
) -> None:
    gw = make_gateway(max_body_bytes=40_000, max_body_total_bytes=60_000)
    raw = padded_body(30_000)
    head = http10_head(len(raw))
    with raw_connection(gw) as leaving:
        leaving.sendall(head + raw[:100])
        wait_for(lambda: held_body_bytes(gw) == len(raw), what="the declared length held")
    wait_for(lambda: held_body_bytes(gw) == 0, what="the bytes back with the connection")
    assert engine.count() == 0


def test_a_chunked_body_growing_past_the_budget_is_503_and_a_closed_connection_gives_back(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway(max_body_bytes=40_000, max_body_total_bytes=60_000)
    raw = padded_body(30_000)
    holding = raw_connection(gw)
    try:
        holding.sendall(post_head(len(raw)) + raw[:100])
        wait_for(lambda: held_body_bytes(gw) == len(raw), what="the declared length held")
        with raw_connection(gw) as growing:
            piece = b"x" * 20_000
            growing.sendall(post_head(None) + b"%x\r\n%s\r\n" % (len(piece), piece))
            wait_for(lambda: held_body_bytes(gw) == len(raw) + len(piece), what="both held")
            growing.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))  # 70,000 in all
            head, body = read_answer(growing)
            assert head.startswith(b"HTTP/1.1 503 ")
            assert b"retry-after: 1" in head
            assert json.loads(body)["error"]["code"] == "body_budget_full"
            wait_for(lambda: held_body_bytes(gw) == len(raw), what="the refused body dropped")
    finally:
        holding.close()  # its body never came whole: its bytes go back with the connection
    wait_for(lambda: held_body_bytes(gw) == 0, what="the budget empty again")
    assert http.post(gw.url + CHAT_URL, content=raw).status_code == 200
    assert engine.count() == 1


# -- control values ----------------------------------------------------------------------


@pytest.mark.parametrize("lease_s", ["1e300", "86400.5", "1" + "0" * 400, "-1", "NaN", "Infinity"])
def test_an_absurd_lease_is_400_naming_the_range(
    make_gateway: Callable[..., GatewayServer], http: httpx.Client, lease_s: str
) -> None:
    gw = make_gateway()
    body = '{"allowance": 1, "lease_s": ' + lease_s + "}"
    answer = http.put(
        gw.url + "/control/classes/batch",
        content=body,
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert answer.status_code == 400
    message = answer.json()["error"]["message"]
    assert message.startswith(
        "lease_s must be a positive number of seconds up to 86400 (a day) or null, got "
    )
    assert len(message) < 160
    assert batch_state(http, gw)["allowance"] == 2


def test_a_number_too_long_for_python_to_read_is_400(
    make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway()
    answer = http.put(
        gw.url + "/control/classes/batch",
        content='{"allowance": 1, "lease_s": 1' + "0" * 5000 + "}",
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["message"].startswith("the body must be a JSON object like")
    assert batch_state(http, gw)["allowance"] == 2


def test_a_lease_of_a_day_is_accepted(
    make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway()
    assert put_batch(http, gw, {"allowance": 1, "lease_s": 86400}).status_code == 200
    assert batch_state(http, gw)["allowance"] == 1


def test_control_characters_in_a_reason_never_reach_the_log(
    make_gateway: Callable[..., GatewayServer],
    http: httpx.Client,
    caplog: pytest.LogCaptureFixture,
) -> None:
    gw = make_gateway()
    reason = "chat slow\n2026-01-01 INFO forged line\x1b[31m red\r\u2028end\x00"
    with caplog.at_level(logging.INFO, logger="llm_watchdog.gateway"):
        assert put_batch(http, gw, {"allowance": 1, "reason": reason}).status_code == 200
    lines = [r.getMessage() for r in caplog.records if "allowance 2 -> 1" in r.getMessage()]
    assert len(lines) == 1
    assert not any(ch in lines[0] for ch in "\n\r\x1b\x00\u2028")
    assert lines[0].endswith("chat slow 2026-01-01 INFO forged line [31m red  end ")
    assert batch_state(http, gw)["reason"] == "chat slow 2026-01-01 INFO forged line [31m red  end "


# -- deep JSON ---------------------------------------------------------------------------


def nested(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


def test_deeply_nested_json_to_the_control_api_is_400_not_500(
    make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway()
    answer = http.put(
        gw.url + "/control/classes/batch",
        content=nested(10000),
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert answer.status_code == 400
    assert "nests JSON deeper than the gateway reads" in answer.json()["error"]["message"]
    assert control(http, gw)["classes"]["batch"]["allowance"] == 2


def test_deeply_nested_json_through_priority_injection_is_400_and_takes_no_place(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway(priorities={"batch": 10})
    answer = http.post(gw.url + CHAT_URL, content=nested(20000), headers=batch_headers())
    assert answer.status_code == 400
    assert answer.json()["error"]["message"] == (
        "the JSON body nests deeper than the gateway reads: flatten it"
    )
    assert engine.count() == 0
    state = batch_state(http, gw)
    assert (state["inflight"], state["queued"]) == (0, 0)
    assert http.post(gw.url + CHAT_URL, json=chat_body(stream=False)).status_code == 200


# -- an engine that never answers --------------------------------------------------------


def test_an_engine_that_never_answers_is_504_after_the_first_byte_timeout(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway(upstream_first_byte_timeout_s=0.3, upstream_read_timeout_s=600.0)
    started = time.monotonic()
    answer = http.post(
        gw.url + CHAT_URL,
        json=chat_body(),
        headers={**batch_headers(), "X-Test-Hold-Prefill": "never"},
    )
    waited = time.monotonic() - started
    assert answer.status_code == 504
    assert answer.json()["error"]["message"] == (
        f"upstream {engine.url} sent no answer within 0.3 s (--upstream-first-byte-timeout)"
    )
    assert 0.25 <= waited < 5.0
    wait_for(lambda: batch_state(http, gw)["inflight"] == 0, what="place given back")
    wait_for(lambda: engine.count("cancelled") == 1, what="the engine sees the request go")


def test_the_upstream_pool_keeps_at_most_its_size_idle(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway(upstream_pool_size=1)
    held = [Background(http, gw.url + CHAT_URL, batch_headers("b"), chat_body()) for _ in range(2)]
    wait_for(lambda: engine.count("open") == 2, what="two streams at the engine")
    assert gw.gateway.primary.connections == 2
    engine.release("b")
    for request in held:
        assert request.join().status == 200
    wait_for(lambda: gw.gateway.primary.connections == 1, what="one connection kept")
    ports = {seen.client_port for seen in engine.seen}
    assert http.post(gw.url + CHAT_URL, json=chat_body(stream=False)).status_code == 200
    assert engine.seen[-1].client_port in ports  # the one kept was reused


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"upstream_first_byte_timeout_s": 0}, "upstream_first_byte_timeout_s must be > 0"),
        ({"header_timeout_s": -1}, "header_timeout_s must be > 0 seconds"),
        ({"max_connections": 0}, "max_connections must be an integer >= 1"),
        ({"max_body_bytes": 1.5}, "max_body_bytes must be an integer >= 1"),
        ({"max_body_total_bytes": 0}, "max_body_total_bytes must be an integer >= 1"),
        (
            {"max_body_bytes": 2000, "max_body_total_bytes": 1000},
            r"max_body_total_bytes \(1000\) must be at least max_body_bytes \(2000\)",
        ),
    ],
)
def test_limits_that_cannot_work_are_refused_in_one_line(
    overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        GatewayConfig(**overrides)
