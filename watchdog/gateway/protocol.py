"""The gateway's HTTP/1.1 server side: uvicorn's httptools protocol with the limits a proxy
in front of a GPU needs.

- A client gets `header_timeout_s` to send its request line and headers, then
  `body_timeout_s` for the body. Past either (slowloris) it gets 408 and the connection
  closes, so a trickle of bytes cannot hold a connection, and its file descriptor, forever.
- Past `max_connections` open connections, a request is answered 503 with a line saying
  what to do, and its connection closes.
- A request line over `MAX_URL_BYTES` gets 414, a head over `MAX_HEAD_BYTES` or
  `MAX_HEADER_FIELDS` gets 431, and its connection closes; a chunked body's trailers past
  the same limits close the connection. Without them a client could send header lines for
  the whole header timeout (and trailers for the whole body timeout) and the gateway would
  hold every one.
- A client whose answer backs up gets `client_stall_timeout_s` to take some of it, counted
  in the kernel's send queue as well as the write buffer (`_pending`).

uvicorn's own `limit_concurrency` answers a bare "Service Unavailable" and counts tasks as
well as connections; uvicorn has no header or body timeout.

A proxied request leaves uvicorn's path once its headers are parsed: an `Exchange`
(direct.py) answers it from this protocol's callbacks, with no ASGI scope, request cycle or
task. The gateway's own paths (`is_own_path`), HTTP/1.0, `Expect: 100-continue` and
upgrades go through ASGI as uvicorn runs it. Pipelined requests of both kinds wait in one
line (`_waiting`), so answers leave in the order the requests came.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
from collections import deque
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.utils import get_local_addr, get_remote_addr, is_ssl

from llm_watchdog.gateway.config import GatewayConfig
from llm_watchdog.gateway.direct import Exchange
from llm_watchdog.gateway.proxy import CLIENT_GONE, ClientGone, is_own_path

if TYPE_CHECKING:
    from uvicorn._types import HTTPScope

    from llm_watchdog.gateway.app import Gateway

log = logging.getLogger("llm_watchdog.gateway")

try:  # SIOCOUTQ, tcp(7): Linux gives it TIOCOUTQ's number (include/uapi/linux/sockios.h)
    import fcntl
    import termios

    _SIOCOUTQ: int | None = termios.TIOCOUTQ
except (ImportError, AttributeError):  # Windows has neither module
    _SIOCOUTQ = None

# The request line's target, the whole head (request line and header lines), and its
# number of header fields. Apache's defaults are 8190 bytes a request line and 100 fields;
# nginx's large_client_header_buffers (4 x 8 KiB) bounds a request line to 8 KiB; h11
# (uvicorn's other protocol) takes 16 KiB of head and Node 16 KiB. 64 KiB leaves room for
# long tokens and cookies that a proxy in front adds. A chunked body's trailers get the
# same again.
MAX_URL_BYTES = 8 * 1024
MAX_HEAD_BYTES = 64 * 1024
MAX_HEADER_FIELDS = 100


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


def protocol_for(config: GatewayConfig, gateway: Gateway | None = None) -> type[HttpToolsProtocol]:
    """A protocol class carrying `config`'s limits (uvicorn builds one per connection).

    With `gateway`, proxied requests take the direct path (direct.py) and only the
    gateway's own paths go through ASGI; without, every request does.
    """
    header_s, body_s, limit = config.header_timeout_s, config.body_timeout_s, config.max_connections
    stall_s = config.client_stall_timeout_s
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
    url_too_long = _answer(
        414,
        b"URI Too Long",
        f"the request URL is over the gateway's limit of {MAX_URL_BYTES} bytes: send the "
        "parameters in the body",
        "uri_too_long",
        False,
    )
    head_too_large = _answer(
        431,
        b"Request Header Fields Too Large",
        f"the request headers are over the gateway's limit of {MAX_HEAD_BYTES} bytes or "
        f"{MAX_HEADER_FIELDS} fields: send fewer or shorter headers",
        "request_header_fields_too_large",
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
        _refused = False  # answered and closing: what else the client sends is not read
        # The head being parsed (or a chunked body's trailers): its bytes and fields.
        _head_bytes = 0
        _fields = 0
        # Bytes read since the parser last gave a whole head or body bytes. httptools holds
        # a header line in its own buffer until the line ends, and says nothing of trailers
        # until they end, so this bounds what no callback yet counts.
        _unparsed = 0
        _in_body = False
        _gone: ClientGone | None = None  # made only for a request that goes through ASGI
        # While the write buffer is over its high mark: the stall timer, and the bytes
        # pending when it last looked (fewer is bytes the client took; see _pending).
        _stall: asyncio.TimerHandle | None = None
        _stall_size = 0
        # The direct path (direct.py): the request whose body the parser reads now, the one
        # answered now, and what waits behind it (pipelined: Exchanges, and ASGI cycles with
        # their app), in order.
        _parsing: Exchange | None = None
        _active: Exchange | None = None
        _waiting: deque[Exchange | tuple[Any, Any]] | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            # uvicorn's own reads both socket addresses here, for every connection; only an
            # ASGI scope needs them, so they are read when one is built (_build_scope).
            self.connections.add(self)
            self.transport = transport
            self.flow = _Flow(transport)
            self.pipeline = _PIPELINE
            self.scheme = "https" if is_ssl(transport) else "http"
            self._arm(header_s, too_slow_head)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            self._unstall()
            super().connection_lost(exc)
            if self._gone is not None:
                self._gone.fire()
            for exchange in self._exchanges():
                exchange.client_gone()
            self._parsing = self._active = None
            self._waiting = None

        def _exchanges(self) -> list[Exchange]:
            found = [e for e in (self._parsing, self._active) if e is not None]
            if self._waiting:
                found += [e for e in self._waiting if isinstance(e, Exchange)]
            return found

        def data_received(self, data: bytes) -> None:
            self._unparsed += len(data)
            super().data_received(data)
            if self._unparsed > MAX_HEAD_BYTES and not self._refused:
                self._too_large()

        def on_message_begin(self) -> None:
            if self._refused:
                return
            # uvicorn's builds the ASGI scope here; the direct path needs none, so it is
            # built once the path says the request goes through ASGI.
            self._head_bytes = self._fields = 0
            self.url = b""
            self.expect_100_continue = False
            self.headers = []
            self._parsing = None
            if self._timer is None:  # a kept-alive connection's next request
                self._arm(header_s, too_slow_head)

        def _build_scope(self) -> None:
            if self.server is None:
                self.server = get_local_addr(self.transport)
                self.client = get_remote_addr(self.transport)
            # A plain dict, cast once: uvicorn's HTTPScope typing of "scheme" and
            # "extensions" changes between releases, and a per-key ignore breaks on one.
            scope: dict[str, Any] = {
                "type": "http",
                "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
                "http_version": "1.1",
                "server": self.server,
                "client": self.client,
                "scheme": self.scheme,
                "root_path": self.root_path,
                "headers": self.headers,
                "state": self.app_state.copy(),
                # ASGI extensions are dicts: {"llm_watchdog.client_gone": {"watch": ...}}.
                "extensions": {CLIENT_GONE: {"watch": self._watch()}},
            }
            self.scope = cast("HTTPScope", scope)

        def _watch(self) -> ClientGone:
            if self._gone is None:
                self._gone = ClientGone()
            return self._gone

        def on_url(self, url: bytes) -> None:
            if self._refused:
                return
            self.url += url
            self._head_bytes += len(url)
            if len(self.url) > MAX_URL_BYTES:
                self._refuse(url_too_long)

        def on_header(self, name: bytes, value: bytes) -> None:
            if self._refused:
                return
            self._fields += 1
            self._head_bytes += len(name) + len(value) + 4  # ": " and CRLF
            if self._fields > MAX_HEADER_FIELDS or self._head_bytes > MAX_HEAD_BYTES:
                self._too_large()
                return
            super().on_header(name, value)

        def _too_large(self) -> None:
            if not self._in_body:
                self._refuse(head_too_large)
                return
            # Trailers: the request's answer may be under way, too late for a status.
            self._refused = True
            self._disarm()
            log.warning(
                "a client sent a chunked body whose trailers are over %d bytes or %d fields: "
                "connection closed",
                MAX_HEAD_BYTES,
                MAX_HEADER_FIELDS,
            )
            self.transport.abort()  # nothing is owed it; connection_lost ends its exchanges

        def on_headers_complete(self) -> None:
            if self._refused:
                return
            self._disarm()
            self._in_body = True
            self._unparsed = self._head_bytes = self._fields = 0  # trailers count afresh
            if len(self.connections) > limit:
                self._refused = True  # what else this connection sends is not read
                self.transport.write(too_many)
                self.transport.close()
                return
            if gateway is not None and self._direct(gateway):
                self._arm(body_s, too_slow_body)
                return
            self._build_scope()
            if (self._active is not None or self._waiting) and (
                self.cycle is None or self.cycle.response_complete
            ):
                # Behind a direct answer: uvicorn queues this cycle as it would behind one
                # of its own, and it is moved to the line below.
                self.cycle = _Placeholder()  # type: ignore[assignment]
            super().on_headers_complete()
            if self.pipeline:
                self._enqueue(self.pipeline.pop())
            self._arm(body_s, too_slow_body)

        def _direct(self, gw: Gateway) -> bool:
            """Hand a proxied request to the direct path; False leaves it to ASGI."""
            parser = self.parser
            if self.expect_100_continue or parser.should_upgrade():
                return False
            if parser.get_http_version() != "1.1":
                return False  # 1.0's framing and keep-alive rules stay uvicorn's
            url = self.url
            raw_path, _, query = url.partition(b"?")
            if raw_path[:1] != b"/" or b"#" in url:
                return False  # absolute form or a fragment: uvicorn's URL parser reads it
            try:
                path = raw_path.decode("ascii")
            except UnicodeDecodeError:
                return False
            if "%" in path:
                path = unquote(path)
            if is_own_path(path):
                return False
            exchange = Exchange(
                self,
                gw,
                parser.get_method().decode("ascii"),
                raw_path + b"?" + query if query else raw_path,
                path,
                self.headers,
                parser.should_keep_alive(),
            )
            self._parsing = exchange
            self.headers = []  # the exchange holds them; trailers, if any, go here
            if (
                self._active is None
                and not self._waiting
                and (self.cycle is None or self.cycle.response_complete)
            ):
                self._unset_keepalive_if_required()
                self._active = exchange
                exchange.start()
            else:
                self._enqueue(exchange)
            return True

        def _enqueue(self, item: Exchange | tuple[Any, Any]) -> None:
            # Pipelined: what this client sends next is not read until the answers before
            # it are out (as uvicorn does for its own pipeline).
            if self._waiting is None:
                self._waiting = deque()
            self._waiting.append(item)
            self.flow.pause_reading()

        def _next(self) -> None:
            """The answer on this connection is out: start the next request, or wait."""
            self._unset_keepalive_if_required()
            self.flow.resume_reading()
            waiting = self._waiting
            if waiting:
                item = waiting.popleft()
                if isinstance(item, Exchange):
                    self._active = item
                    item.start()
                else:
                    self._start_asgi_task(*item)
                return
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

        # -- what an Exchange needs of its connection ---------------------------------

        def default_headers(self) -> list[tuple[bytes, bytes]]:
            return self.server_state.default_headers

        def exchange_done(self, exchange: Exchange) -> None:
            self.server_state.total_requests += 1
            if self._active is exchange:
                self._active = None
            if not exchange.keep_alive:
                self.transport.close()
            elif not self.transport.is_closing():
                self._next()

        def track(self, task: asyncio.Task[None]) -> None:
            # Counted with uvicorn's tasks: past the grace time at shutdown it cancels them.
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

        def on_response_complete(self) -> None:
            # An ASGI answer is out; uvicorn's pipeline is this protocol's line (_waiting).
            self.server_state.total_requests += 1
            if not self.transport.is_closing():
                self._next()

        def shutdown(self) -> None:
            active = self._active
            if active is not None and not active.finished:
                active.keep_alive = False  # the connection closes once this answer is out
                return
            super().shutdown()

        def pause_writing(self) -> None:
            super().pause_writing()
            if self._active is not None:
                self._active.pause()
            if stall_s > 0 and self._stall is None:
                self._stall_size = self._pending()
                self._stall = self.loop.call_later(stall_s, self._stall_check)

        def resume_writing(self) -> None:
            super().resume_writing()
            self._unstall()
            if self._active is not None:
                self._active.resume()

        def _unstall(self) -> None:
            if self._stall is not None:
                self._stall.cancel()
                self._stall = None

        def _pending(self) -> int:
            """Bytes of the answer the client has not taken: the write buffer, and the
            kernel's send queue (sent and not acknowledged, or not yet sent: SIOCOUTQ).

            The queue holds megabytes once Linux has tuned the socket's buffer up, and the
            kernel wakes the writer only once a good part of it drains, so a client reading
            8 KB/s leaves the write buffer unchanged for minutes. While writing is paused
            nothing more is written (the engine's reads and ASGI's sends wait on it), so
            the sum only shrinks as the client's acknowledgements come in; and those stop
            once its receive buffer is full. Where the ioctl fails (not Linux) the write
            buffer alone is counted."""
            size = self.transport.get_write_buffer_size()
            sock = self.transport.get_extra_info("socket")
            if _SIOCOUTQ is None or sock is None:
                return size
            try:
                queued = fcntl.ioctl(sock.fileno(), _SIOCOUTQ, b"\0\0\0\0")
            except (OSError, ValueError):  # not a TCP socket here, or closed
                return size
            return size + int(struct.unpack("i", queued)[0])

        def _stall_check(self) -> None:
            """The write buffer stayed over its high mark for `stall_s`: a client that took
            bytes meanwhile (fewer are pending) reads slowly and gets another `stall_s`; one
            that took none holds its answer, and whatever the answer holds, for nothing.
            Backpressure has paused the engine's reading, so no upstream timeout fires.

            A client's kernel acknowledges bytes once its receive window opens by about a
            segment, so one that takes a few bytes at a time shows as reading once it has
            taken that much."""
            self._stall = None
            transport = self.transport
            size = self._pending()
            if size < self._stall_size:
                self._stall_size = size
                self._stall = self.loop.call_later(stall_s, self._stall_check)
                return
            active = self._active
            if active is None or not active.stalled(stall_s):
                log.warning(
                    "a client took no bytes of its answer for %g s (--client-stall-timeout): "
                    "connection closed",
                    stall_s,
                )
            # abort, not close: close waits for the buffer to drain, which this client
            # never does. The ASGI path learns of it from connection_lost.
            transport.abort()

        def on_body(self, body: bytes) -> None:
            self._unparsed = 0
            if self._refused:
                return
            exchange = self._parsing
            if exchange is not None:
                exchange.on_body(body)
            else:
                super().on_body(body)

        def on_message_complete(self) -> None:
            self._disarm()
            if self._refused:
                return
            self._in_body = False
            self._unparsed = 0
            exchange = self._parsing
            if exchange is not None:
                self._parsing = None
                exchange.on_body_end()
                if (
                    exchange.finished  # answered before its body ended (400, 413)
                    and self._active is None
                    and not self._waiting
                    and self.timeout_keep_alive_task is None
                    and not self.transport.is_closing()
                ):
                    self.timeout_keep_alive_task = self.loop.call_later(
                        self.timeout_keep_alive, self.timeout_keep_alive_handler
                    )
            else:
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
            self._refuse(answer)

        def _refuse(self, answer: bytes) -> None:
            """Answer `answer` (408, 414, 431) in place of the request, and close."""
            self._disarm()
            self._refused = True
            if self.transport.is_closing():
                return
            for exchange in (self._parsing, self._active):
                if exchange is not None and not exchange.finished:
                    if exchange.answered:  # too late for a status: just close
                        self.transport.close()
                        return
                    exchange.client_gone()  # nothing of it reached the engine
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete:
                if cycle.response_started:  # too late for a status: just close
                    self.transport.close()
                    return
                # The app waits on the body: it sees the client gone, and writes nothing.
                cycle.disconnected = True
                cycle.message_event.set()
                if self._gone is not None:
                    self._gone.fire()
            self.transport.write(answer)
            self.transport.close()

    return GatewayProtocol


# uvicorn's pipeline, one deque per connection (each some 600 bytes), is only a way through
# here: what uvicorn queues in it is moved to `_waiting` in the same call (on_headers_complete),
# so one deque, always left empty, serves every connection.
_PIPELINE: deque[Any] = deque()


class _Flow(FlowControl):
    """uvicorn's FlowControl, with its asyncio.Event (and the Event's deque) made only when
    an ASGI answer waits for the client to drain: the direct path never does."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self.read_paused = False
        self.write_paused = False
        self._event: asyncio.Event | None = None

    @property
    def _is_writable_event(self) -> asyncio.Event:
        if self._event is None:
            self._event = asyncio.Event()
            if not self.write_paused:
                self._event.set()
        return self._event

    @_is_writable_event.setter
    def _is_writable_event(self, event: asyncio.Event) -> None:
        self._event = event


class _Placeholder:
    """Stands for an answer in progress on the direct path while uvicorn decides whether a
    new ASGI cycle must wait (it waits behind a cycle not complete)."""

    response_complete = False
    response_started = True
    disconnected = False
    keep_alive = True

    class message_event:  # noqa: N801 - uvicorn sets it on connection_lost
        @staticmethod
        def set() -> None:
            pass
