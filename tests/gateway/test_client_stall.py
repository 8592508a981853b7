"""--client-stall-timeout over real sockets with the kernel's own send buffers: a client that
reads slowly and steadily keeps its answer however long the kernel's send queue takes to
drain, and one that stops reading is still cut."""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from llm_watchdog.gateway import GatewayServer
from tests.gateway.test_direct import BIG_STREAM, post, tiny_reader
from tests.gateway.test_gateway import (
    CHAT_URL,
    FakeEngine,
    chat_body,
    control,
    gateways,
    wait_for,
)

STALL_S = 2.0


@pytest.fixture
def make_gateway(engine: FakeEngine) -> Iterator[Callable[..., GatewayServer]]:
    with gateways(engine, shutdown_timeout_s=1.0) as make:
        yield make


def read_slowly(sock: socket.socket, rate_bps: int, duration_s: float) -> int:
    """Reads at about `rate_bps` for `duration_s`, a little at a time; the bytes read.
    Fails if the gateway closes the connection meanwhile."""
    got = 0
    started = time.monotonic()
    sock.settimeout(1.0)
    while (elapsed := time.monotonic() - started) < duration_s:
        if got > rate_bps * elapsed:
            time.sleep(0.05)
            continue
        with contextlib.suppress(TimeoutError):
            data = sock.recv(1024)
            assert data, f"the gateway closed the connection after {elapsed:.1f} s"
            got += len(data)
    return got


def stalled(http: httpx.Client, gw: GatewayServer) -> int:
    return int(control(http, gw)["classes"]["chat"]["observed"]["stalled_total"])


def test_a_slow_steady_reader_with_the_kernels_buffers_is_not_cut_and_a_stopped_one_is(
    engine: FakeEngine,
    make_gateway: Callable[..., GatewayServer],
    http: httpx.Client,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="llm_watchdog.gateway")
    gw = make_gateway(client_stall_timeout_s=STALL_S)
    # A small receive buffer, so the client's window opens a few KiB at a time as it reads;
    # the gateway's send buffer is left to the kernel, which grows it to megabytes.
    sock = tiny_reader(gw)
    with sock:
        sock.sendall(post(CHAT_URL, chat_body(max_tokens=1000), BIG_STREAM))  # 16 MiB
        got = read_slowly(sock, rate_bps=8000, duration_s=2.5 * STALL_S)
        assert got > 8000 * STALL_S  # it did read, steadily, for more than two timeouts
        assert stalled(http, gw) == 0
        # Now it stops reading: its window closes and stays closed.
        started = time.monotonic()
        wait_for(lambda: stalled(http, gw) == 1, 4 * STALL_S, "the stopped client cut")
        assert time.monotonic() - started < 3 * STALL_S
        sock.settimeout(5)
        with contextlib.suppress(ConnectionResetError):  # dropped, unread bytes and all
            while sock.recv(65536):
                pass
    observed = control(http, gw)["classes"]["chat"]["observed"]
    assert (observed["stalled_total"], observed["ok_total"]) == (1, 0)
    lines = [r.getMessage() for r in caplog.records if "--client-stall-timeout" in r.getMessage()]
    assert lines == [
        "chat request POST /v1/chat/completions ended: the client took no bytes of the answer "
        "for 2 s (--client-stall-timeout)"
    ]
