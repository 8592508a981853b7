"""The gateway's HTTP/1.1 server side: uvicorn's httptools protocol with the limits a proxy
in front of a GPU needs.

- A client gets `header_timeout_s` to send its request line and headers, then
  `body_timeout_s` for the body. Past either (slowloris) it gets 408 and the connection
  closes, so a trickle of bytes cannot hold a connection, and its file descriptor, forever.
- Past `max_connections` open connections, a request is answered 503 with a line saying
  what to do, and its connection closes.

uvicorn's own `limit_concurrency` answers a bare "Service Unavailable" and counts tasks as
well as connections; uvicorn has no header or body timeout.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from llm_watchdog.gateway.config import GatewayConfig

# The scope extension holding a connection's ClientGone; the proxy waits on it instead of
# running a task per request that waits for ASGI's http.disconnect.
CLIENT_GONE = "llm_watchdog.client_gone"


class ClientGone:
    """Calls its callbacks once, when the client's connection is lost."""

    __slots__ = ("gone", "_callbacks")

    def __init__(self) -> None:
        self.gone = False
        self._callbacks: list[Callable[[], None]] = []

    def add(self, callback: Callable[[], None]) -> None:
        self._callbacks.append(callback)

    def remove(self, callback: Callable[[], None]) -> None:
        if callback in self._callbacks:
            self._callbacks.remove(callback)

    def fire(self) -> None:
        self.gone = True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()


def _answer(status: int, reason: bytes, message: str, code: str, retry: bool) -> bytes:
    error = {"message": message, "type": "gateway_error", "param": None, "code": code}
    body = json.dumps({"error": error}).encode()
    head = [
        b"HTTP/1.1 %d %s" % (status, reason),
        b"content-type: application/json",
        b"content-length: %d" % len(body),
        b"connection: close",
    ]
    if retry:
        head.append(b"retry-after: 1")
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def protocol_for(config: GatewayConfig) -> type[HttpToolsProtocol]:
    """A protocol class carrying `config`'s limits (uvicorn builds one per connection)."""
    header_s, body_s, limit = config.header_timeout_s, config.body_timeout_s, config.max_connections
    too_slow_head = _answer(
        408,
        b"Request Timeout",
        f"request headers not complete within {header_s:g} s: send the whole request at once",
        "request_timeout",
        False,
    )
    too_slow_body = _answer(
        408,
        b"Request Timeout",
        f"request body not complete within {body_s:g} s of its headers: send it at once",
        "request_timeout",
        False,
    )
    too_many = _answer(
        503,
        b"Service Unavailable",
        f"the gateway holds its limit of {limit} open connections: retry in a moment, or "
        "raise --max-connections (and the unit's LimitNOFILE)",
        "too_many_connections",
        True,
    )

    class GatewayProtocol(HttpToolsProtocol):
        _timer: asyncio.TimerHandle | None = None
        _refused = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._gone = ClientGone()
            self._arm(header_s, too_slow_head)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)
            self._gone.fire()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._timer is None:  # a kept-alive connection's next request
                self._arm(header_s, too_slow_head)

        def on_headers_complete(self) -> None:
            self._disarm()
            if len(self.connections) > limit:
                self._refused = True  # what else this connection sends is not read
                self.transport.write(too_many)
                self.transport.close()
                return
            # ASGI extensions are dicts: {"llm_watchdog.client_gone": {"watch": ClientGone}}.
            self.scope["extensions"] = {CLIENT_GONE: {"watch": self._gone}}
            super().on_headers_complete()
            self._arm(body_s, too_slow_body)

        def on_body(self, body: bytes) -> None:
            if not self._refused:
                super().on_body(body)

        def on_message_complete(self) -> None:
            self._disarm()
            if not self._refused:
                super().on_message_complete()

        def _arm(self, delay_s: float, answer: bytes) -> None:
            self._disarm()
            self._timer = self.loop.call_later(delay_s, self._time_out, answer)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _time_out(self, answer: bytes) -> None:
            self._timer = None
            if self.transport.is_closing():
                return
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete:
                if cycle.response_started:  # too late for a status: just close
                    self.transport.close()
                    return
                # The app waits on the body: it sees the client gone, and writes nothing.
                cycle.disconnected = True
                cycle.message_event.set()
                self._gone.fire()
            self.transport.write(answer)
            self.transport.close()

    return GatewayProtocol
