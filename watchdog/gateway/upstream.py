"""The engine behind the gateway: kept-alive HTTP/1.1 connections, one request at a time each.

An asyncio Protocol per connection with httptools (llhttp, in C) for the framing. Why not
httpx: httpcore's pool scans its connections on every request, and its locks and stream
checkpoints yield to the event loop several times per request; under load each yield waits
behind every chunk being relayed, which adds to time to first token (docs/gateway.md has the
measurement, from tests/benchmarks/bench_gateway.py). Here a request waits for the loop only
when it waits for the network, and everything the engine sent in one read (several SSE
events, or the headers and the first event) is relayed in one write.
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
from typing import Protocol, cast
from urllib.parse import urlsplit

import httptools

from llm_watchdog.errors import EngineError
from llm_watchdog.gateway.config import GatewayConfig

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


class Listener(Protocol):
    """What a connection tells of its answer when a request relays from its callbacks."""

    def upstream_event(self, conn: Connection) -> None:
        """Bytes were parsed (`status`, `headers`, `body`, `done`, `error` say what came),
        or the connection closed (`closed`)."""


class Connection(asyncio.Protocol):
    """One TCP connection to the engine, fed by the event loop, read by one request.

    httptools (llhttp, the parser uvicorn and Node use) parses in C as bytes arrive; its
    callbacks only collect. A request waits for the loop only while nothing it needs has
    arrived yet.
    """

    # One per open stream: slots keep each a few hundred bytes smaller than a __dict__.
    __slots__ = (
        "transport",
        "closed",
        "idle_since",
        "parser",
        "status",
        "headers",
        "head_done",
        "done",
        "keep_alive",
        "until_eof",
        "head_only",
        "error",
        "body",
        "_waiter",
        "_timer",
        "_timer_s",
        "_wait_since",
        "_buffered",
        "_paused",
        "listener",
    )

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.parser: httptools.HttpResponseParser | None = None
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_done = False  # status and headers of the final (non-1xx) answer are in
        self.done = False  # the whole answer is in
        self.keep_alive = False
        self.until_eof = False  # no length and not chunked: the body ends with the connection
        self.head_only = False  # the answer to HEAD has no body whatever its headers say
        self.error: str | None = None
        self.body: list[bytes] = []
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_s = 0.0
        self._wait_since = 0.0
        self._buffered = 0
        self._paused = False
        # Set while a request relays from the callbacks (direct.py): told of every read
        # and of the end, instead of a waiter woken to read `body`.
        self.listener: Listener | None = None

    # -- called by the event loop --------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports quack like asyncio.Transport without inheriting from it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        parser = self.parser
        if parser is None or self.done:
            self.close()  # bytes nobody asked for: the connection is out of step
            self._wake()
            return
        try:
            parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.error = str(exc) or type(exc).__name__
            self.close()
        listener = self.listener
        if listener is not None:
            listener.upstream_event(self)
            return
        self._buffered += len(data)
        if self._buffered > READ_HIGH_WATER_BYTES and not self._paused and not self.closed:
            self._paused = True
            assert self.transport is not None
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.closed = True  # never handed out again; what was received is still read
        if self.head_done and self.until_eof:
            self.done = True
        self._wake()
        if self.listener is not None:
            self.listener.upstream_event(self)
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.head_done and self.until_eof:
            self.done = True
        self._wake()
        if self.listener is not None:
            self.listener.upstream_event(self)

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # -- httptools callbacks -------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        assert self.parser is not None
        status = self.parser.get_status_code()
        if status < 200:  # 100 Continue and the like: the real answer follows
            self.headers = []
            return
        self.status = status
        self.head_done = True
        self.keep_alive = self.parser.should_keep_alive()
        framed = any(k in (b"content-length", b"transfer-encoding") for k, _ in self.headers)
        self.until_eof = not framed and status not in (204, 304) and not self.head_only
        if self.until_eof:
            self.keep_alive = False
        # A fresh parser reads the next answer (begin()), so this one's idea of a body
        # to come, from the HEAD answer's Content-Length, is never acted on.
        self.done = self.head_only

    def on_body(self, body: bytes) -> None:
        if self.head_done and not self.head_only:
            self.body.append(body)

    def on_message_complete(self) -> None:
        if self.head_done:
            self.done = True

    # -- called by the request -----------------------------------------------------------

    def begin(self, head_only: bool) -> None:
        """Ready for the answer to the request about to be written."""
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers = []
        self.head_done = self.done = self.until_eof = False
        self.head_only = head_only
        self.error = None
        self.body = []

    def write(self, data: bytes) -> None:
        transport = self.transport
        assert transport is not None
        # One the engine has closed takes no more (uvloop raises); its end, when read,
        # answers the request as a connection closed before any answer.
        if not transport.is_closing():
            transport.write(data)

    def take_body(self) -> bytes:
        """All body bytes parsed so far, in one piece; lets the engine send more."""
        parts = self.body
        self.body = []
        self._buffered = 0
        if self._paused and self.transport is not None and not self.closed:
            self._paused = False
            self.transport.resume_reading()
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def wait_data(self, timeout_s: float | None) -> None:
        """Wait until more bytes (or the end) arrive; TimeoutError after `timeout_s`.

        One timer per connection outlives the waits: a timer armed and cancelled for every
        chunk cost more than relaying the chunk. When it fires early for this wait (it was
        armed for an earlier one) it is armed again for what is left.
        """
        if self.closed:
            raise _Closed
        loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        if timeout_s is not None:
            self._wait_since = loop.time()
            if self._timer is None or self._timer_s != timeout_s:
                self._arm(loop, timeout_s, timeout_s)
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _arm(self, loop: asyncio.AbstractEventLoop, delay_s: float, timeout_s: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_s = timeout_s
        self._timer = loop.call_later(delay_s, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # no one waits: the next wait arms it again
        loop = waiter.get_loop()
        left = self._timer_s - (loop.time() - self._wait_since)
        if left > 0.001:
            self._arm(loop, left, self._timer_s)
        else:
            waiter.set_exception(TimeoutError())

    def stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def reusable(self, now: float) -> bool:
        return not self.closed and now - self.idle_since < KEEPALIVE_S

    def close(self) -> None:
        self.closed = True
        self.stop_timer()
        if self.transport is not None:
            self.transport.close()


class UpstreamResponse:
    """Status and headers of one answer; `next_chunk()` its body; `aclose()` frees the
    connection."""

    __slots__ = ("status", "headers", "_upstream", "_conn", "_released")

    def __init__(self, upstream: Upstream, conn: Connection) -> None:
        self.status = conn.status
        self.headers = conn.headers  # names lower-case
        self._upstream = upstream
        self._conn = conn
        self._released = False

    def header(self, name: bytes) -> bytes:
        for key, value in self.headers:
            if key == name:
                return value
        return b""

    async def next_chunk(self) -> bytes | None:
        """Body bytes as they arrive: all that came since the last call, in one piece,
        undecoded; None at the end of the answer."""
        conn = self._conn
        while True:
            if conn.body:
                return conn.take_body()
            if conn.done:
                return None
            if conn.error is not None:  # e.g. a malformed chunk
                raise UpstreamBroken(conn.error)
            try:
                await conn.wait_data(self._upstream.read_timeout_s)
            except TimeoutError:
                raise UpstreamBroken(f"no data for {self._upstream.read_timeout_s:g} s") from None
            except _Closed:
                if conn.body or conn.done:
                    continue
                raise UpstreamBroken("the engine closed the connection") from None

    async def aclose(self) -> None:
        """Back to the pool if the answer was read to its end; closed otherwise, which is
        how the engine learns that the client went away."""
        if not self._released:
            self._released = True
            conn = self._conn
            self._upstream.release(conn, conn.done and not conn.body)


class Upstream:
    """One engine: where it is, and a stack of idle connections (most recent on top)."""

    def __init__(self, base_url: str, config: GatewayConfig) -> None:
        parts = urlsplit(base_url)
        self.base_url = base_url.rstrip("/")
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/").encode()
        # Written once: every request to this engine starts its headers with these bytes.
        self._host_line = b"\r\nhost: " + parts.netloc.encode() + b"\r\n"
        self.connect_timeout_s = config.upstream_connect_timeout_s
        self.first_byte_timeout_s = config.upstream_first_byte_timeout_s
        self.read_timeout_s = config.upstream_read_timeout_s
        # Idle connections kept; more than the engine runs at once is of no use.
        self.max_idle = config.upstream_pool_size
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self._idle: list[Connection] = []
        self._busy: set[Connection] = set()
        self.closing = False  # the gateway stops: no new connection to this engine

    @property
    def connections(self) -> int:
        return len(self._idle) + len(self._busy)

    async def _take(self, fresh: bool) -> tuple[Connection, bool]:
        """A connection for one request, and whether it served one before."""
        if self._idle and not fresh:
            now = time.monotonic()
            while self._idle:
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

    def take_idle(self) -> Connection | None:
        """A kept-alive connection fit for one more request, or None: no wait either way."""
        if not self._idle:
            return None
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if conn.reusable(now):
                self._busy.add(conn)
                return conn
            conn.close()
        return None

    async def connect(self) -> Connection:
        """A fresh connection, counted as busy; UpstreamError when the engine is not there."""
        conn, _ = await self._take(fresh=True)
        self._busy.add(conn)
        return conn

    def release(self, conn: Connection, complete: bool) -> None:
        self._busy.discard(conn)
        conn.listener = None
        conn.stop_timer()
        if complete and conn.keep_alive and not conn.closed:
            conn.parser = None  # bytes arriving now belong to no request
            conn.idle_since = time.monotonic()
            if len(self._idle) < self.max_idle:
                self._idle.append(conn)
                return
        conn.close()  # unfinished answer, Connection: close, or surplus

    def closed_early(self) -> UpstreamError:
        return UpstreamError(
            502, f"upstream {self.base_url} closed the connection without answering"
        )

    def malformed(self, conn: Connection) -> UpstreamError:
        return UpstreamError(502, f"upstream {self.base_url} sent a malformed answer: {conn.error}")

    def no_first_byte(self) -> UpstreamError:
        return UpstreamError(
            504,
            f"upstream {self.base_url} sent no answer within "
            f"{self.first_byte_timeout_s:g} s (--upstream-first-byte-timeout)",
        )

    def request_bytes(
        self, method: str, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> bytes:
        """The whole request, framed with Content-Length, ready for one write.

        The names and values come from the server's parser, which refuses CR, LF and NUL
        in them, so they are written as they are.
        """
        parts = [method.encode(), b" ", self.prefix, target, b" HTTP/1.1", self._host_line]
        for name, value in headers:
            parts += (name, b": ", value, b"\r\n")
        if body or method in ("POST", "PUT", "PATCH"):
            parts += (b"content-length: ", str(len(body)).encode(), b"\r\n")
        parts += (b"\r\n", body)
        return b"".join(parts)

    async def send(
        self, method: str, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> UpstreamResponse:
        """Send one request and wait for the status line and headers."""
        data = self.request_bytes(method, target, headers, body)
        for attempt in (1, 2):
            conn, reused = await self._take(fresh=attempt == 2)
            self._busy.add(conn)
            try:
                conn.begin(head_only=method == "HEAD")
                conn.write(data)  # the whole request in one write
                await self._response(conn)
                return UpstreamResponse(self, conn)
            except _Closed as exc:
                self.release(conn, complete=False)
                # A kept-alive connection the engine closed just as it was taken fails like
                # this, before any answer (docs/probe.md); once more on a fresh connection.
                if reused and attempt == 1:
                    continue
                raise self.closed_early() from exc
            except BaseException:  # an error answered above, or the client left: never reuse
                self.release(conn, complete=False)
                raise
        raise AssertionError("unreachable")

    async def _response(self, conn: Connection) -> None:
        """Wait for the status line and headers; the first byte has `first_byte_timeout_s`."""
        while not conn.head_done:
            if conn.error is not None:
                raise self.malformed(conn)
            try:
                await conn.wait_data(self.first_byte_timeout_s)
            except TimeoutError as exc:
                raise self.no_first_byte() from exc

    async def aclose(self) -> None:
        self.closing = True
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
