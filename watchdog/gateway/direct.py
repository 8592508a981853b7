"""The proxy path without ASGI: one request, from its parsed headers to its last byte.

The client connection's protocol (protocol.py) hands a proxied request here as soon as its
headers are parsed. Classes, admission, the body limit, priority injection and the errors
are the ASGI proxy's own (proxy.py); what differs is how the bytes move:

- no scope, no request cycle, no `send`, and no task on the way: the request goes upstream
  from the protocol callback that completed its body, and the engine's bytes go to the
  client from the upstream connection's `data_received`, in the same turn of the loop;
- a task only where something must wait: a batch request in line, or a fresh connection
  to the engine while the pool holds none;
- backpressure both ways: a client that does not read pauses the engine's connection
  (`pause`/`resume`, from the client transport's write-buffer marks), and a pipelined
  request waits with the client's reading paused until the answers before it are out;
- a client that goes cancels whatever runs for it: the wait in line, the connect, or the
  engine's answer (its connection is closed, so the engine stops generating);
- with pre-emption on (`--preempt-batch`), a cut of the batch allowance ends the newest
  batch requests in flight the same way, and tells their clients to retry (`preempt`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from llm_watchdog.gateway.observe import ClassStats, model_of
from llm_watchdog.gateway.proxy import (
    DONE,
    STREAM_TYPES,
    BodyError,
    BodyHold,
    ClassError,
    budget_full,
    classify,
    declared_length,
    error_body,
    forward_headers,
    inject_priority,
    preempted_body,
    rejection,
    relay_headers,
    too_large,
)
from llm_watchdog.gateway.upstream import Connection, Upstream, UpstreamError

if TYPE_CHECKING:
    from llm_watchdog.gateway.app import Gateway

log = logging.getLogger("llm_watchdog.gateway")

_TERMINATOR = b"0\r\n\r\n"
_NO_HEADERS: list[tuple[bytes, bytes]] = []  # shared, never added to


class Client(Protocol):
    """What an exchange needs of the client connection it answers on."""

    transport: asyncio.Transport

    def default_headers(self) -> list[tuple[bytes, bytes]]: ...

    def exchange_done(self, exchange: Exchange) -> None: ...

    def track(self, task: asyncio.Task[None]) -> None: ...


class Exchange:
    """One proxied request and its answer, driven by callbacks.

    The protocol calls `on_body`/`on_body_end` as the parser reads the body, `start` when
    the answers before this one are out, `pause`/`resume` from the client's write buffer,
    and `client_gone` when the connection is lost; the upstream connection calls
    `upstream_event` after every read.
    """

    # One per open stream: slots keep it small.
    __slots__ = (
        "client",
        "gw",
        "method",
        "target",
        "path",
        "headers",
        "keep_alive",
        "cls",
        "parts",
        "size",
        "too_big",
        "hold",
        "over_budget",
        "body",
        "body_done",
        "turn",
        "started",
        "answered",
        "finished",
        "gone",
        "gated",
        "admitted",
        "upstream",
        "conn",
        "reused",
        "attempt",
        "data",
        "sent",
        "status",
        "streamed",
        "chunked",
        "head_only",
        "done_seen",
        "chunks",
        "task",
        "timer",
        "wait_s",
        "last",
        "paused",
        "loop",
        "stats",
    )

    def __init__(
        self,
        client: Client,
        gw: Gateway,
        method: str,
        target: bytes,
        path: str,
        headers: list[tuple[bytes, bytes]],
        keep_alive: bool,
    ) -> None:
        self.client = client
        self.gw = gw
        self.method = method
        self.target = target
        self.path = path
        self.headers = headers
        self.keep_alive = keep_alive
        self.cls = ""
        self.parts: list[bytes] = []
        self.size = 0
        self.too_big = False
        # Body bytes counted in the gateway's budget: `take` holds more as they come (False
        # past it, and what was held goes back), `release` once the body is upstream or dropped.
        self.hold = BodyHold(gw)
        self.over_budget = False
        self.body = b""
        self.body_done = False
        self.turn = False  # the answers before this one are out
        self.started = False  # counted as a request: the body was read whole
        self.answered = False  # the answer's first bytes are written
        self.finished = False  # the answer is over, one way or another
        self.gone = False
        self.gated = False
        self.admitted = False
        self.upstream: Upstream | None = None
        self.conn: Connection | None = None
        self.reused = False
        self.attempt = 1
        self.data = b""
        self.sent = 0.0
        self.status = 0
        self.streamed = False
        self.chunked = False
        self.head_only = method == "HEAD"
        self.done_seen = False
        self.chunks = 0
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.wait_s = 0.0
        self.last = 0.0
        self.paused = False
        self.loop = asyncio.get_running_loop()
        self.stats: ClassStats | None = None

    # -- the request, from the client's parser -------------------------------------------

    def on_body(self, data: bytes) -> None:
        if self.answered or self.too_big or self.over_budget:
            return  # answered already (400, 413, 503): the rest of the body is read and dropped
        self.size += len(data)
        if self.size > self.gw.config.max_body_bytes:
            self.too_big = True
            self.parts = []
            self.hold.release()
            if self.turn:
                self._too_large()
            return
        if self.size > self.hold.held:
            # The declared length is held at the first bytes (a pipelined request's body
            # comes before its turn), then a chunked body's size as it grows.
            want = self.size if self.hold.held else max(self.size, declared_length(self.headers))
            if not self.hold.take(want):
                self.over_budget = True
                self.parts = []
                if self.turn:
                    self._over_budget()
                return
        self.parts.append(data)

    def on_body_end(self) -> None:
        self.body_done = True
        if self.turn and not self.answered and not self.gone:
            self._go()

    def start(self) -> None:
        """Its turn: the checks that need only the headers, then the work once the body is in."""
        self.turn = True
        if self.gone:
            return
        gw = self.gw
        try:
            self.cls = classify(self.headers, gw.config)
        except ClassError as exc:
            self._answer(400, str(exc), "invalid_request_error", "unknown_traffic_class")
            return
        declared = declared_length(self.headers)
        if self.too_big or declared > gw.config.max_body_bytes:
            self._too_large()
            return
        if self.over_budget or not self.hold.take(declared):
            self.over_budget = True
            self.parts = []
            self._over_budget()
            return
        if self.body_done:
            self._go()

    def _too_large(self) -> None:
        message = too_large(self.gw.config.max_body_bytes)
        self._answer(413, message, "invalid_request_error", "body_too_large")

    def _over_budget(self) -> None:
        message = budget_full(self.gw.config.max_body_total_bytes)
        self._answer(503, message, "gateway_error", "body_budget_full", [(b"retry-after", b"1")])

    # -- admission and the engine --------------------------------------------------------

    def _go(self) -> None:
        gw = self.gw
        parts = self.parts
        self.parts = []
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        cls = self.cls
        self.stats = stats = gw.observer[cls]
        stats.requests += 1
        self.started = True
        # Only a POST asks the engine for work (a completion, an embedding); listing models
        # or reading health costs nothing and never waits.
        self.gated = gated = self.method == "POST"
        priority = gw.priority_for(cls) if gated else None
        if priority is not None:  # before the wait in line: a body refused takes no place
            try:
                body = inject_priority(body, gw.config.priority_field, priority)
            except BodyError as exc:
                self._answer(400, str(exc), "invalid_request_error", "invalid_body")
                return
        self.body = body
        if not gated:
            self._send(gw.primary)
            return
        stats.work_requests += 1
        gw.expire_leases()
        if gw.gates[cls].try_acquire(self):
            stats.record_queue_wait(gw.wall(), 0.0)
            self.admitted = True
            self._send(gw.primary)
            return
        self._run(self._wait_in_line())

    def _run(self, coro: Coroutine[Any, Any, None]) -> None:
        task = self.loop.create_task(coro)
        self.task = task
        self.client.track(task)

    async def _wait_in_line(self) -> None:
        gw = self.gw
        cls = self.cls
        stats = gw.observer[cls]
        started = gw.clock()
        try:
            outcome = await gw.gates[cls].acquire(self)
        except asyncio.CancelledError:
            self.task = None
            if not self.gone and not self.finished:  # the server stops past its grace time
                self._shut_out()
            return
        self.task = None
        stats.record_queue_wait(gw.wall(), gw.clock() - started)
        if outcome == "admitted":
            self.admitted = True
            self._send(gw.primary)
        elif gw.secondary is None:
            stats.outcomes["rejected"] += 1
            message, code, headers = rejection(gw, cls, outcome)
            self._answer(429, message, "rate_limit_error", code, headers)
        else:
            self._send(gw.secondary)

    def _send(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.data = upstream.request_bytes(
            self.method, self.target, forward_headers(self.headers), self.body
        )
        self.headers = _NO_HEADERS  # all the rest needs is in `data`
        self.sent = self.gw.clock()
        conn = upstream.take_idle()
        if conn is None:
            self._run(self._connect())
            return
        self.reused = True
        self._write(conn)

    async def _connect(self) -> None:
        upstream = self.upstream
        assert upstream is not None
        try:
            conn = await upstream.connect()
        except asyncio.CancelledError:
            self.task = None
            if not self.gone and not self.finished:  # not pre-empted: the server stops
                self._shut_out()
            return
        except UpstreamError as exc:
            self.task = None
            self._upstream_error(exc)
            return
        self.task = None
        if self.gone:
            upstream.release(conn, False)
            return
        self.reused = False
        self._write(conn)

    def _write(self, conn: Connection) -> None:
        upstream = self.upstream
        assert upstream is not None
        self.conn = conn
        conn.listener = self
        conn.begin(head_only=self.head_only)
        if conn.closed:
            # The engine closed it between the connect and this write (it stops or
            # restarts), and its end came before this listener was set: answered now as a
            # connection closed before any answer. One still closing takes no write
            # (Connection.write), and its end, when read, answers the same.
            self.upstream_event(conn)
            return
        conn.write(self.data)  # the whole request in one write
        self.hold.release()  # the body is the engine connection's to send now
        self._arm(upstream.first_byte_timeout_s)
        if self.paused and conn.transport is not None:
            conn.transport.pause_reading()

    # -- the answer, from the engine's connection ----------------------------------------

    def upstream_event(self, conn: Connection) -> None:
        if conn is not self.conn or self.finished:
            return
        try:
            self._relay(conn)
        except Exception:  # a bug here must not leave both connections hanging
            log.exception("relaying %s %s", self.method, self.path)
            self._release(False)
            self._end("upstream_error")
            self.client.transport.close()

    def _relay(self, conn: Connection) -> None:
        upstream = self.upstream
        assert upstream is not None
        if self.timer is not None:
            self.last = self.loop.time()
        out: list[bytes] = []
        if not self.answered:
            if conn.error is not None and not conn.head_done:
                self._upstream_error(upstream.malformed(conn))
                return
            if not conn.head_done:
                if conn.closed:
                    self._release(False)
                    # A kept-alive connection the engine closed just as it was taken fails
                    # like this, before any answer (docs/probe.md); once more on a fresh one.
                    if self.reused and self.attempt == 1 and not upstream.closing:
                        self.attempt = 2
                        self._run(self._connect())
                        return
                    self._upstream_error(upstream.closed_early())
                return
            out.append(self._head(conn))
            conn.headers = []  # relayed: not needed for the rest of the answer
            self.answered = True
            self.data = b""  # no second try once an answer came
            if not self.streamed:
                self.body = b""  # kept only to name the model beside the TTFT
            self._arm(upstream.read_timeout_s)
        parts = conn.body
        if parts:
            conn.body = []
            chunk = parts[0] if len(parts) == 1 else b"".join(parts)
            stats = self.stats
            assert stats is not None
            if self.streamed:
                if not self.chunks:
                    gw = self.gw
                    stats.record_ttft(gw.wall(), gw.clock() - self.sent, model_of(self.body))
                    self.body = b""
                if chunk.endswith(DONE):
                    self.done_seen = True
            self.chunks += 1
            stats.chunks += 1
            if self.chunked:
                out += (b"%x\r\n" % len(chunk), chunk, b"\r\n")
            elif not self.head_only:
                out.append(chunk)
        if conn.done:
            if self.chunked:
                out.append(_TERMINATOR)
            if out:
                self.client.transport.write(b"".join(out))
            self._release(True)
            self._end("ok" if self.status < 400 else "upstream_status")
            self.client.exchange_done(self)
            return
        if out:
            self.client.transport.write(out[0] if len(out) == 1 else b"".join(out))
        if conn.error is not None:
            self._broken(conn.error)
        elif conn.closed:
            self._broken("the engine closed the connection")

    def _head(self, conn: Connection) -> bytes:
        """The answer's status line and headers, framed as uvicorn frames an ASGI answer."""
        self.status = status = conn.status
        line = STATUS_LINE.get(status) or b"HTTP/1.1 %d \r\n" % status
        parts = [line]
        for name, value in self.client.default_headers():
            parts += (name, b": ", value, b"\r\n")
        framed = False
        content_type = b""
        for name, value in relay_headers(conn.headers):  # names are lower-case already
            if name == b"content-length":
                framed = True
            elif name == b"content-type":
                content_type = value
            parts += (name, b": ", value, b"\r\n")
        if not self.keep_alive:
            parts.append(b"connection: close\r\n")
        self.chunked = not framed and not self.head_only and status not in (204, 304)
        if self.chunked:
            parts.append(b"transfer-encoding: chunked\r\n")
        parts.append(b"\r\n")
        self.streamed = status < 300 and content_type.startswith(STREAM_TYPES)
        return b"".join(parts)

    def _arm(self, wait_s: float | None) -> None:
        """One timer for the silence allowed now: to the status line, then between reads.
        It is not re-armed per read: when it fires, it checks the time of the last read."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if wait_s is None:
            return
        loop = self.loop
        self.wait_s = wait_s
        self.last = loop.time()
        self.timer = loop.call_later(wait_s, self._on_timer)

    def _on_timer(self) -> None:
        self.timer = None
        if self.finished or self.conn is None:
            return
        loop = self.loop
        left = self.wait_s - (loop.time() - self.last)
        if self.paused:  # the engine is held back for a slow client: its silence is ours
            left = self.wait_s
        if left > 0.001:
            self.timer = loop.call_later(left, self._on_timer)
            return
        upstream = self.upstream
        assert upstream is not None
        if not self.answered:
            self._release(False)
            self._upstream_error(upstream.no_first_byte())
        else:
            self._broken(f"no data for {self.wait_s:g} s")

    def _broken(self, reason: str) -> None:
        # Too late for a status: leave the answer unfinished, so the client sees a broken
        # stream rather than a clean end of a truncated one.
        upstream = self.upstream
        log.warning("upstream %s broke mid-answer: %s", upstream and upstream.base_url, reason)
        self._release(False)
        self._end("upstream_error")
        self.client.transport.close()

    def _upstream_error(self, exc: UpstreamError) -> None:
        log.warning("%s request %s %s: %s", self.cls, self.method, self.path, exc.message)
        self._release(False)
        self._answer(exc.status, exc.message, "upstream_error", "upstream_failed", outcome=True)

    # -- endings -------------------------------------------------------------------------

    def _release(self, complete: bool) -> None:
        """The engine's connection back to its pool (or closed), the timer off."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        conn = self.conn
        if conn is None:
            return
        self.conn = None
        if self.paused and conn.transport is not None and not conn.closed:
            conn.transport.resume_reading()  # the next request on it reads its answer
        assert self.upstream is not None
        self.upstream.release(conn, complete and conn.done and not conn.body)

    def _end(self, result: str) -> None:
        """The place back, the outcome counted; the answer is over."""
        self.finished = True
        if self.admitted:
            self.admitted = False
            self.gw.gates[self.cls].release(self)
            counted = result
        else:
            counted = "rerouted" if self.gated else result
        self.gw.observer[self.cls].outcomes[counted] += 1

    def _answer(
        self,
        status: int,
        message: str,
        kind: str,
        code: str,
        extra: list[tuple[bytes, bytes]] | None = None,
        *,
        outcome: bool = False,
    ) -> None:
        """An error in OpenAI's shape, as the whole answer; `outcome`: count upstream_error."""
        self.hold.release()
        self._reply(status, error_body(message, kind, code), extra)
        if outcome:
            self._end("upstream_error")
        else:
            self.finished = True
        self.client.exchange_done(self)

    def _reply(
        self, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        """A JSON answer, whole, written to the client."""
        parts = [STATUS_LINE[status]]
        for name, value in self.client.default_headers():
            parts += (name, b": ", value, b"\r\n")
        parts += (
            b"content-type: application/json\r\ncontent-length: ",
            b"%d" % len(body),
            b"\r\n",
        )
        for name, value in extra or ():
            parts += (name, b": ", value, b"\r\n")
        if not self.keep_alive:
            parts.append(b"connection: close\r\n")
        parts += (b"\r\n", body)
        self.answered = True
        self.client.transport.write(b"".join(parts))

    def _shut_out(self) -> None:
        """The server stops while this request waits: it never reached the engine."""
        if self.admitted:  # admitted, and waiting for a connection to the engine
            self.admitted = False
            self.gw.gates[self.cls].release(self)
        self._answer(
            503,
            "the gateway is shutting down: retry in a moment",
            "gateway_error",
            "shutting_down",
            [(b"retry-after", b"1")],
        )

    def client_gone(self) -> None:
        """The client's connection is lost (or timed out): stop what runs for it."""
        if self.gone or self.finished:
            self.gone = True
            return
        self.gone = True
        self.hold.release()
        if self.task is not None:
            self.task.cancel()
            self.task = None
        self._release(False)  # closing it tells the engine to stop generating
        if self.started:
            self.finished = True
            if self.admitted:
                self.admitted = False
                self.gw.gates[self.cls].release(self)
            # Clients (the openai library among them) close a stream once they read [DONE],
            # before the last empty chunk: that answer arrived whole.
            outcome = "ok" if self.done_seen else "disconnected"
            self.gw.observer[self.cls].outcomes[outcome] += 1
        self.finished = True

    def preempt(self) -> None:
        """The class's allowance was cut under what runs, and this request is among the
        newest: end it now. The gate has given its place back already.

        Before the answer's headers: 503 with Retry-After and the error in OpenAI's shape.
        Mid-stream: the error as the stream's last event, then the connection closes with
        the chunked body unfinished and no [DONE]. The openai library raises on an event
        that holds an "error"; a client that reads only the framing (httpx, requests) sees
        an incomplete body, which is an error too, where a clean end would read as a short
        answer. A non-streamed answer under way is cut off by the close alone.
        """
        self.admitted = False
        if self.finished or self.gone:
            return
        self.hold.release()
        if self.task is not None:  # granted and not yet running, or connecting upstream
            self.task.cancel()
            self.task = None
        self._release(False)  # closing it tells the engine to stop generating
        self.finished = True
        self.gw.observer[self.cls].outcomes["preempted"] += 1
        body, retry_s = preempted_body(self.gw, self.cls)
        if not self.answered:
            self._reply(503, body, [(b"retry-after", b"%d" % retry_s)])
            self.client.exchange_done(self)
            return
        transport = self.client.transport
        if self.streamed and self.chunked:
            event = b"data: " + body + b"\n\n"
            transport.write(b"%x\r\n%s\r\n" % (len(event), event))
        transport.close()

    def stalled(self, stall_s: float) -> bool:
        """The client took no bytes of the answer for `stall_s`: end the exchange, the
        engine's connection closed and the place given back (the protocol drops the client's
        connection). False if nothing runs for it any more."""
        if self.finished or self.gone:
            return False
        self.hold.release()
        log.warning(
            "%s request %s %s ended: the client took no bytes of the answer for %g s "
            "(--client-stall-timeout)",
            self.cls or "unclassified",
            self.method,
            self.path,
            stall_s,
        )
        if self.task is not None:
            self.task.cancel()
            self.task = None
        self._release(False)  # closing it tells the engine to stop generating
        if self.started:
            self._end("stalled")
        self.finished = True
        return True

    # -- backpressure from the client ----------------------------------------------------

    def pause(self) -> None:
        """The client's write buffer is full: stop reading the engine's answer."""
        if self.paused:
            return
        self.paused = True
        conn = self.conn
        if conn is not None and conn.transport is not None and not conn.closed:
            conn.transport.pause_reading()

    def resume(self) -> None:
        if not self.paused:
            return
        self.paused = False
        conn = self.conn
        if conn is not None and conn.transport is not None and not conn.closed:
            conn.transport.resume_reading()
