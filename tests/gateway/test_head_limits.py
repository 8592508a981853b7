"""Request heads and trailers over real sockets: a URL, headers or trailers past the
gateway's limits (protocol.py) get 414 or 431, or a closed connection, at once, never the
whole header or body timeout of bytes held; requests within them pass."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from llm_watchdog.gateway import GatewayServer
from llm_watchdog.gateway.protocol import MAX_HEAD_BYTES, MAX_HEADER_FIELDS, MAX_URL_BYTES
from tests.gateway.test_gateway import CHAT_URL, FakeEngine, chat_body, gateways
from tests.gateway.test_limits import error_of, raw_connection, read_all, read_answer

# Far past any limit and the kernel's buffers on both ends: a client that sends this much
# was never stopped.
FLOOD_BYTES = 32 * 1024 * 1024


@pytest.fixture
def make_gateway(engine: FakeEngine) -> Iterator[Callable[..., GatewayServer]]:
    # Timeouts far longer than the tests: what ends a flood is the limit, not the timer.
    with gateways(engine, shutdown_timeout_s=1.0, header_timeout_s=60.0, body_timeout_s=60.0) as (
        make
    ):
        yield make


def flood(sock: socket.socket, piece: bytes, timeout_s: float = 10.0) -> int:
    """Sends `piece` over and over until the gateway stops taking it (it closed the
    connection) or FLOOD_BYTES are out; the bytes sent."""
    sent = 0
    sock.settimeout(timeout_s)
    try:
        while sent < FLOOD_BYTES:
            sock.sendall(piece)
            sent += len(piece)
    except (BrokenPipeError, ConnectionResetError):
        pass
    return sent


def answer_after_flood(sock: socket.socket) -> bytes:
    """What the gateway wrote before it closed: a reset can follow the answer, as the
    client's unread flood meets a closed socket."""
    out = b""
    sock.settimeout(5)
    try:
        while data := sock.recv(65536):
            out += data
    except ConnectionResetError:
        pass
    return out


def head(lines: list[bytes], target: bytes = b"/v1/models") -> bytes:
    return b"GET %s HTTP/1.1\r\nhost: x\r\n%s\r\n" % (target, b"".join(lines))


# -- the URL -----------------------------------------------------------------------------


def test_a_url_over_the_limit_gets_414_and_the_connection_closes(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer]
) -> None:
    gw = make_gateway()
    with raw_connection(gw) as sock:
        sock.sendall(b"GET /v1/models?q=" + b"a" * MAX_URL_BYTES + b" HTTP/1.1\r\nhost: x\r\n\r\n")
        head_, error = error_of(read_all(sock))
    assert head_.startswith(b"HTTP/1.1 414 URI Too Long\r\n")
    assert b"connection: close" in head_
    assert error == {
        "message": "the request URL is over the gateway's limit of 8192 bytes: send the "
        "parameters in the body",
        "type": "gateway_error",
        "param": None,
        "code": "uri_too_long",
    }
    assert engine.count() == 0


def test_an_endless_url_is_cut_off_at_once(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer]
) -> None:
    gw = make_gateway()
    with raw_connection(gw) as sock:
        sock.sendall(b"GET /v1/models?q=")
        started = time.monotonic()
        sent = flood(sock, b"a" * 65536)
        answer = answer_after_flood(sock)
    assert sent < FLOOD_BYTES
    assert time.monotonic() - started < 5.0
    assert answer.startswith(b"HTTP/1.1 414 ")
    assert engine.count() == 0


def test_a_url_just_under_the_limit_is_served(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway()
    target = "/v1/models?q=" + "a" * (MAX_URL_BYTES - len("/v1/models?q="))
    assert http.get(gw.url + target).status_code == 200
    assert engine.seen[-1].query.endswith("a" * 100)


# -- the headers -------------------------------------------------------------------------


HEADERS_TOO_LARGE = {
    "message": "the request headers are over the gateway's limit of 65536 bytes or 100 "
    "fields: send fewer or shorter headers",
    "type": "gateway_error",
    "param": None,
    "code": "request_header_fields_too_large",
}


@pytest.mark.parametrize(
    "lines",
    [
        pytest.param([b"x-a: b\r\n"] * MAX_HEADER_FIELDS, id="one-field-too-many"),
        pytest.param([b"x-big: " + b"v" * MAX_HEAD_BYTES + b"\r\n"], id="one-value-too-long"),
        pytest.param([b"x-%d: %s\r\n" % (i, b"v" * 1000) for i in range(70)], id="many-long"),
    ],
)
def test_headers_over_the_limit_get_431_and_reach_no_engine(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], lines: list[bytes]
) -> None:
    gw = make_gateway()
    with raw_connection(gw) as sock:
        sock.sendall(head(lines))  # with host: one field over, or bytes over
        head_, error = error_of(answer_after_flood(sock))
    assert head_.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    assert b"connection: close" in head_
    assert error == HEADERS_TOO_LARGE
    assert engine.count() == 0


@pytest.mark.parametrize(
    ("opening", "piece"),
    [
        pytest.param(b"", b"x-a: b\r\n" * 8192, id="endless-lines"),
        pytest.param(b"x-big: ", b"v" * 65536, id="endless-value"),
    ],
)
def test_an_endless_head_is_answered_431_at_once_and_read_no_further(
    engine: FakeEngine,
    make_gateway: Callable[..., GatewayServer],
    http: httpx.Client,
    opening: bytes,
    piece: bytes,
) -> None:
    gw = make_gateway()
    with raw_connection(gw) as sock:
        sock.sendall(b"POST %s HTTP/1.1\r\nhost: x\r\n%s" % (CHAT_URL.encode(), opening))
        started = time.monotonic()
        sent = flood(sock, piece)
        answer = answer_after_flood(sock)
    # The gateway stopped reading: the kernel's buffers took the rest, not the gateway.
    assert sent < FLOOD_BYTES
    assert time.monotonic() - started < 5.0
    assert answer.startswith(b"HTTP/1.1 431 ")
    assert engine.count() == 0
    assert http.post(gw.url + CHAT_URL, json=chat_body(stream=False)).status_code == 200


def test_endless_blank_lines_where_a_request_line_should_be_get_431(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer]
) -> None:
    # The parser skips them without a callback: only the bytes read count.
    gw = make_gateway()
    with raw_connection(gw) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
        assert read_answer(sock)[0].startswith(b"HTTP/1.1 200 ")
        sent = flood(sock, b"\r\n" * 32768)
        answer = answer_after_flood(sock)
    assert sent < FLOOD_BYTES
    assert answer.startswith(b"HTTP/1.1 431 ")


def test_heads_within_the_limits_pass_and_each_request_counts_afresh(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer]
) -> None:
    gw = make_gateway()
    # Together the two heads hold more fields and bytes than one may; each alone is within.
    fields = [b"x-%d: %s\r\n" % (i, b"v" * 500) for i in range(MAX_HEADER_FIELDS - 3)]
    raw = json.dumps(chat_body(stream=False)).encode()
    request = b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n%s\r\n%s" % (
        CHAT_URL.encode(),
        len(raw),
        b"".join(fields),
        raw,
    )
    with raw_connection(gw) as sock:
        sock.sendall(request)
        assert read_answer(sock)[0].startswith(b"HTTP/1.1 200 ")
        sock.sendall(request)
        assert read_answer(sock)[0].startswith(b"HTTP/1.1 200 ")
    assert engine.count(path=CHAT_URL) == 2
    assert engine.seen[-1].headers["x-96"] == "v" * 500


# -- trailers ----------------------------------------------------------------------------


def chunked_head(target: str = CHAT_URL) -> bytes:
    return (
        f"POST {target} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        "transfer-encoding: chunked\r\n\r\n"
    ).encode()


def test_endless_trailers_close_the_connection_at_once_with_one_line_logged(
    engine: FakeEngine,
    make_gateway: Callable[..., GatewayServer],
    http: httpx.Client,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="llm_watchdog.gateway")
    gw = make_gateway()
    raw = json.dumps(chat_body(stream=False)).encode()
    with raw_connection(gw) as sock:
        sock.sendall(chunked_head() + b"%x\r\n%s\r\n0\r\n" % (len(raw), raw))
        started = time.monotonic()
        sent = flood(sock, b"x-t: b\r\n" * 8192)
        answer = answer_after_flood(sock)
    assert sent < FLOOD_BYTES
    assert time.monotonic() - started < 5.0
    assert answer == b""  # the request never ended, so nothing answered it
    assert engine.count() == 0
    lines = [r.getMessage() for r in caplog.records if "trailers" in r.getMessage()]
    assert lines == [
        "a client sent a chunked body whose trailers are over 65536 bytes or 100 fields: "
        "connection closed"
    ]
    assert http.post(gw.url + CHAT_URL, json=chat_body(stream=False)).status_code == 200


def test_one_endless_trailer_value_closes_the_connection(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer]
) -> None:
    gw = make_gateway()
    raw = json.dumps(chat_body(stream=False)).encode()
    with raw_connection(gw) as sock:
        sock.sendall(chunked_head() + b"%x\r\n%s\r\n0\r\nx-t: " % (len(raw), raw))
        sent = flood(sock, b"v" * 65536)
        assert answer_after_flood(sock) == b""
    assert sent < FLOOD_BYTES
    assert engine.count() == 0


def test_a_few_trailers_pass(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer]
) -> None:
    gw = make_gateway()
    raw = json.dumps(chat_body(stream=False)).encode()
    trailers = b"".join(b"x-t%d: %s\r\n" % (i, b"v" * 100) for i in range(MAX_HEADER_FIELDS))
    # A body of many small chunks: their framing is not trailer bytes.
    chunks = b"".join(b"1\r\n%s\r\n" % raw[i : i + 1] for i in range(len(raw)))
    with raw_connection(gw) as sock:
        sock.sendall(chunked_head() + chunks + b"0\r\n" + trailers + b"\r\n")
        assert read_answer(sock)[0].startswith(b"HTTP/1.1 200 ")
    assert engine.count(path=CHAT_URL) == 1
