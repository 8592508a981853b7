"""The engine behind the gateway: kept-alive HTTP/1.1 connections, one request at a time each.

An asyncio Protocol per connection with h11 (the HTTP/1.1 state machine httpx and uvicorn
use) for the framing. Why not httpx: httpcore's pool scans its connections on every request,
and its locks and stream checkpoints yield to the event loop several times per request;
under load each yield waits behind every chunk being relayed, which adds to time to first
token (docs/gateway.md has the measurement, from tests/benchmarks/bench_gateway.py). Here a
request waits for the loop only when it waits for the network, and everything the engine
sent in one read (several SSE events, or the headers and the first event) is relayed in one
write.
A proxy uses nothing httpx adds on top (cookies, redirects, auth); a client's cookie jar
would even carry one user's cookies into the next user's requests.

Errors become `UpstreamError` (no answer: what the gateway answers instead, and why) or
`UpstreamBroken` (an answer that broke off after it started).
"""

from __future__ import annotations

import asyncio
import os
import ssl
import time
from collections.abc import AsyncGenerator
from typing import cast
from urllib.parse import urlsplit

import h11

from llm_watchdog.errors import EngineError
from llm_watchdog.gateway.config import GatewayConfig

# Idle connections kept per engine; more than the engine runs at once is of no use.
MAX_IDLE_CONNECTIONS = 256
# A connection idle longer than this is closed rather than reused: engines close idle
# connections on their own timers (docs/probe.md, "Keep-alive"), and uvicorn's default is 5 s.
KEEPALIVE_S = 4.0
# Stop reading from the engine while this much of its answer waits for a slow client.
READ_HIGH_WATER_BYTES = 256 * 1024


class UpstreamError(EngineError):
    """No answer from the engine. `status` is what the gateway answers instead."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class UpstreamBroken(Exception):
    """The engine's answer broke off after it started."""


class _Closed(Exception):
    """The connection closed before the event we waited for."""


class Connection(asyncio.Protocol):
    """One TCP connection to the engine, fed by the event loop, read by one request."""

    def __init__(self) -> None:
        self.h11 = h11.Connection(h11.CLIENT)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._waiter: asyncio.Future[None] | None = None
        self._buffered = 0
        self._paused = False
        self._unparsed = False  # bytes (or the end) arrived since h11 last said NEED_DATA

    # -- called by the event loop --------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports quack like asyncio.Transport without inheriting from it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.h11.receive_data(data)
        self._unparsed = True
        self._buffered += len(data)
        if self._buffered > READ_HIGH_WATER_BYTES and not self._paused:
            self._paused = True
            assert self.transport is not None
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.closed = True  # never handed out again; what was received is still parsed
        self.h11.receive_data(b"")
        self._unparsed = True
        self._wake()
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # -- called by the request -----------------------------------------------------------

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def next_event(self) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        """The next event that is already complete, without waiting."""
        event = self.h11.next_event()
        if event is h11.NEED_DATA:
            # All that was received is parsed: let the engine send more.
            self._unparsed = False
            self._buffered = 0
            if self._paused and self.transport is not None:
                self._paused = False
                self.transport.resume_reading()
        return event

    async def wait_data(self, timeout_s: float | None) -> None:
        """Wait until more bytes (or the end) arrive; TimeoutError after `timeout_s`.

        Returns at once if something arrived since h11 last needed data (the caller was
        busy meanwhile, e.g. relaying to a slow client). After an EOF h11 never needs
        data, so a closed connection here was reset without one: _Closed.
        """
        if self._unparsed:
            return
        if self.closed:
            raise _Closed
        loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        timer = None if timeout_s is None else loop.call_later(timeout_s, self._time_out)
        try:
            await self._waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    def _time_out(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(TimeoutError())

    def reusable(self, now: float) -> bool:
        return (
            not self.closed
            and self.h11.our_state is h11.IDLE
            and self.h11.their_state is h11.IDLE
            and now - self.idle_since < KEEPALIVE_S
        )

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class UpstreamResponse:
    """Status and headers of one answer; `chunks()` its body; `aclose()` frees the connection."""

    def __init__(self, upstream: Upstream, conn: Connection, response: h11.Response) -> None:
        self.status = response.status_code
        self.headers: list[tuple[bytes, bytes]] = list(response.headers)  # names lower-case
        self._upstream = upstream
        self._conn = conn
        self._complete = False
        self._released = False

    def header(self, name: bytes) -> bytes:
        for key, value in self.headers:
            if key == name:
                return value
        return b""

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        """Body bytes as they arrive: all that one read brought, in one piece, undecoded."""
        conn = self._conn
        parts: list[bytes] = []
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:  # e.g. closed inside a chunked body
                raise UpstreamBroken(str(exc)) from None
            if type(event) is h11.Data:
                parts.append(event.data)
                continue
            if parts:
                # While the client takes these, more may arrive: ask h11 again after.
                yield b"".join(parts) if len(parts) > 1 else parts[0]
                parts = []
            if type(event) is h11.EndOfMessage:
                self._complete = True
                return
            if event is h11.NEED_DATA:
                try:
                    await conn.wait_data(self._upstream.read_timeout_s)
                except TimeoutError:
                    raise UpstreamBroken(
                        f"no data for {self._upstream.read_timeout_s:g} s"
                    ) from None
                except _Closed:
                    raise UpstreamBroken("the engine closed the connection") from None
                continue
            raise UpstreamBroken(f"unexpected {type(event).__name__} in the answer")

    async def aclose(self) -> None:
        """Back to the pool if the answer was read to its end; closed otherwise, which is
        how the engine learns that the client went away."""
        if not self._released:
            self._released = True
            self._upstream.release(self._conn, self._complete)


class Upstream:
    """One engine: where it is, and a stack of idle connections (most recent on top)."""

    def __init__(self, base_url: str, config: GatewayConfig) -> None:
        parts = urlsplit(base_url)
        self.base_url = base_url.rstrip("/")
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.host_header = parts.netloc.encode()
        self.prefix = parts.path.rstrip("/").encode()
        self.connect_timeout_s = config.upstream_connect_timeout_s
        self.read_timeout_s = config.upstream_read_timeout_s
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self._idle: list[Connection] = []
        self._busy: set[Connection] = set()

    @property
    def connections(self) -> int:
        return len(self._idle) + len(self._busy)

    async def _take(self, fresh: bool) -> tuple[Connection, bool]:
        """A connection for one request, and whether it served one before."""
        now = time.monotonic()
        while self._idle and not fresh:
            conn = self._idle.pop()
            if conn.reusable(now):
                return conn, True
            conn.close()
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    Connection,
                    self.host,
                    self.port,
                    ssl=self._ssl,
                    server_hostname=self.host if self._ssl else None,
                ),
                self.connect_timeout_s,
            )
        except (TimeoutError, asyncio.TimeoutError) as exc:
            raise UpstreamError(
                504,
                f"cannot reach upstream {self.base_url} (no connection within "
                f"{self.connect_timeout_s:g} s): is the engine running?",
            ) from exc
        except OSError as exc:
            raise UpstreamError(
                502,
                f"cannot reach upstream {self.base_url} ({_reason(exc)}): is the engine "
                f"running? try `curl {self.base_url}/v1/models`",
            ) from exc
        return conn, False

    def release(self, conn: Connection, complete: bool) -> None:
        self._busy.discard(conn)
        if complete and conn.h11.our_state is h11.DONE and conn.h11.their_state is h11.DONE:
            conn.h11.start_next_cycle()
            conn.idle_since = time.monotonic()
            if len(self._idle) < MAX_IDLE_CONNECTIONS:
                self._idle.append(conn)
                return
        conn.close()  # unfinished answer, Connection: close, or surplus

    async def send(
        self, method: str, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> UpstreamResponse:
        """Send one request and wait for the status line and headers."""
        headers = [(b"host", self.host_header), *headers]
        if body or method in ("POST", "PUT", "PATCH"):
            headers.append((b"content-length", str(len(body)).encode()))
        request = h11.Request(method=method, target=self.prefix + target, headers=headers)
        for attempt in (1, 2):
            conn, reused = await self._take(fresh=attempt == 2)
            self._busy.add(conn)
            try:
                try:
                    head = conn.h11.send(request) or b""
                except h11.LocalProtocolError as exc:
                    raise UpstreamError(400, f"cannot forward this request: {exc}") from exc
                middle = (conn.h11.send(h11.Data(data=body)) or b"") if body else b""
                end = conn.h11.send(h11.EndOfMessage()) or b""
                conn.write(head + middle + end)  # the whole request in one write
                return UpstreamResponse(self, conn, await self._response(conn))
            except _Closed as exc:
                self.release(conn, complete=False)
                # A kept-alive connection the engine closed just as it was taken fails like
                # this, before any answer (docs/probe.md); once more on a fresh connection.
                if reused and attempt == 1:
                    continue
                raise UpstreamError(
                    502, f"upstream {self.base_url} closed the connection without answering"
                ) from exc
            except BaseException:  # an error answered above, or the client left: never reuse
                self.release(conn, complete=False)
                raise
        raise AssertionError("unreachable")

    async def _response(self, conn: Connection) -> h11.Response:
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                if conn.h11.their_state is h11.CLOSED or conn.closed:
                    raise _Closed from exc
                raise UpstreamError(
                    502, f"upstream {self.base_url} sent a malformed answer: {exc}"
                ) from exc
            if type(event) is h11.Response:
                return event
            if type(event) is h11.InformationalResponse:
                continue  # 100 Continue and the like
            if event is h11.NEED_DATA:
                try:
                    await conn.wait_data(self.read_timeout_s)
                except TimeoutError as exc:
                    raise UpstreamError(
                        504,
                        f"upstream {self.base_url} sent no answer within {self.read_timeout_s:g} s",
                    ) from exc
                continue
            if type(event) is h11.ConnectionClosed:
                raise _Closed
            raise UpstreamError(
                502, f"upstream {self.base_url} answered with {type(event).__name__}"
            )

    async def aclose(self) -> None:
        for conn in [*self._idle, *self._busy]:
            conn.close()
        self._idle.clear()
        self._busy.clear()


def _reason(exc: BaseException) -> str:
    """The OS's words for why a connection failed."""
    pending: list[BaseException] = [exc]
    seen = 0
    while pending and seen < 20:
        current = pending.pop(0)
        seen += 1
        if isinstance(current, OSError) and current.errno:
            # asyncio's own strerror ("Connect call failed (...)") hides the errno's meaning.
            return os.strerror(current.errno).lower()
        pending.extend(getattr(current, "exceptions", ()))  # an ExceptionGroup's members
        for linked in (current.__cause__, current.__context__):
            if linked is not None:
                pending.append(linked)
    return str(exc) or type(exc).__name__
