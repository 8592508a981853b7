"""An engine whose info answers never end: detect_engine and gateway_identity give up at a
byte cap and a deadline, over real sockets, instead of reading into memory for ever."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from llm_watchdog.probe.engine import MAX_DOC_BYTES, detect_engine, gateway_identity


def _serve(mode: str) -> Iterator[str]:
    """A raw HTTP server: "flood" streams a JSON prefix then endless bytes, chunked, as fast
    as the client takes them; "trickle" sends a byte every 0.2 s; "big" declares a length
    past the cap."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    sent = [0]

    def handle(conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                if mode == "big":
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        + f"Content-Length: {MAX_DOC_BYTES * 4}\r\n\r\n".encode()
                        + b'{"data": ['
                    )
                    stop.wait(10)
                    return
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n"
                )
                piece = b" " * 65536 if mode == "flood" else b" "
                frame = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
                while not stop.is_set():
                    conn.sendall(frame)
                    sent[0] += len(piece)
                    if mode == "trickle":
                        time.sleep(0.2)
            except OSError:
                pass

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", sent  # type: ignore[misc]
    finally:
        stop.set()
        listener.close()


@pytest.fixture
def engine(request: pytest.FixtureRequest) -> Iterator[tuple[str, list[int]]]:
    yield from _serve(request.param)  # type: ignore[misc]


@pytest.mark.parametrize("engine", ["flood", "big"], indirect=True)
def test_an_endless_models_answer_is_given_up_at_the_byte_cap(engine) -> None:
    url, sent = engine
    started = time.monotonic()
    info = detect_engine(url, timeout_s=3.0)
    assert time.monotonic() - started < 10.0
    assert info.engine == "unknown" and info.models == ()
    assert (
        "answered more than 1 MiB" in info.detail and "is this URL the LLM server?" in info.detail
    )
    # Read no further than the cap and what was in flight: a few MiB, not the stream.
    assert sent[0] < 64 * MAX_DOC_BYTES
    assert gateway_identity(url, timeout_s=3.0) is None


@pytest.mark.parametrize("engine", ["trickle"], indirect=True)
def test_an_answer_that_trickles_for_ever_ends_at_the_deadline(engine) -> None:
    url, _ = engine
    started = time.monotonic()
    info = detect_engine(url, timeout_s=1.0)
    # Each read gets a byte within its 1 s timeout, so only the whole-answer deadline (2 s
    # a request, one request per endpoint tried) ends it.
    assert time.monotonic() - started < 20.0
    assert info.engine == "unreachable"
    assert "no answer from" in info.detail
    started = time.monotonic()
    assert gateway_identity(url, timeout_s=1.0) is None
    assert time.monotonic() - started < 5.0
