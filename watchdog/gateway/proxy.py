"""The reverse proxy's rules, and the raw ASGI app that applies them where ASGI serves.

The rules are shared with the direct path (direct.py): the class from the headers
(`classify`), the headers forwarded and relayed, `priority` injection, the 429 of a request
not admitted, the errors in OpenAI's shape.

The ASGI app (`Proxy`) serves what the gateway's own protocol leaves to ASGI (HTTP/1.0,
Expect: 100-continue, upgrades, unusual request targets) and every proxied request under
another ASGI server. Flow of one request: class from the headers -> body read -> place
taken from the class's gate (batch may wait in line) -> request sent upstream (upstream.py)
-> answer relayed chunk by chunk as it arrives -> place given back. When the client goes
(in line or mid-stream), the work is cancelled, which gives the place back and closes the
upstream connection, so the engine stops generating.

Raw ASGI instead of Starlette's Request/StreamingResponse keeps the per-chunk path to one
`send` and lets the disconnect watch cover the wait in line, not only the streaming.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from llm_watchdog.gateway.config import BATCH, CLASSES, GatewayConfig
from llm_watchdog.gateway.observe import model_of
from llm_watchdog.gateway.upstream import Upstream, UpstreamBroken, UpstreamError

if TYPE_CHECKING:
    from llm_watchdog.gateway.app import Gateway

Scope = dict[str, Any]

log = logging.getLogger("llm_watchdog.gateway")

CLASS_HEADER = b"x-traffic-class"

# RFC 9110 section 7.6.1: meant for one connection, never forwarded. Host and the body's
# length are set again for the upstream connection; Expect was answered here.
_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
# X-Traffic-Class is the client's claim, read here and settled by `classify`; the engine
# (or a gateway behind this one) must not take it for the class the gateway gave.
_DROP_REQUEST = _HOP_BY_HOP | {b"host", b"content-length", b"expect", CLASS_HEADER}
# uvicorn writes its own Date header; two would confuse clients.
_DROP_RESPONSE = _HOP_BY_HOP | {b"date"}
STREAM_TYPES = (b"text/event-stream", b"application/x-ndjson")


# The last event of an OpenAI-style stream.
DONE = b"data: [DONE]\n\n"


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


def is_own_path(path: str) -> bool:
    """The gateway's own paths (control API, metrics); every other path is proxied."""
    return path == "/metrics" or path == "/control" or path.startswith("/control/")


class Progress:
    """How far an answer got, read after its work was cancelled."""

    done_seen = False
    started = False  # the status line and headers went to the client
    streamed = False


class Held:
    """A request on the ASGI path holding a place: pre-empting it cancels its task, and the
    task answers for it (`Proxy._preempted`)."""

    __slots__ = ("task", "preempted")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task
        self.preempted = False

    def preempt(self) -> None:
        self.preempted = True
        self.task.cancel()


class ClassError(ValueError):
    """The client named a class that does not exist."""


def classify(headers: list[tuple[bytes, bytes]], config: GatewayConfig) -> str:
    """The class of the bearer key, else X-Traffic-Class, else the default class.

    A key's class is the operator's word and the header the client's, so where the key has
    a class the header may only lower it to batch (a chat key marking a bulk job), never
    raise it: a batch key claiming chat would skip the batch allowance and `priority`.
    """
    named: bytes | None = None
    auth: bytes | None = None
    for key, value in headers:
        if key == CLASS_HEADER:
            named = value
        elif key == b"authorization":
            auth = value
    claimed: str | None = None
    if named is not None:
        claimed = named.decode("latin-1").strip().lower()
        if claimed not in CLASSES:
            raise ClassError(
                f"unknown traffic class {claimed!r} in X-Traffic-Class: "
                f"use one of {', '.join(CLASSES)}"
            )
    keyed: str | None = None
    if auth is not None and config.key_classes:
        scheme, _, api_key = auth.decode("latin-1").partition(" ")
        if scheme.lower() == "bearer":
            keyed = config.key_classes.get(api_key.strip())
    if keyed is not None:
        return BATCH if claimed == BATCH else keyed
    return claimed if claimed is not None else config.default_class


def forward_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    named = _connection_tokens(headers)
    return [(k, v) for k, v in headers if k not in _DROP_REQUEST and k not in named]


def relay_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    named = _connection_tokens(headers)
    return [(k, v) for k, v in headers if k not in _DROP_RESPONSE and k not in named]


def _connection_tokens(headers: list[tuple[bytes, bytes]]) -> frozenset[bytes]:
    # Headers listed in Connection are hop-by-hop too (RFC 9110 section 7.6.1).
    tokens: set[bytes] = set()
    for key, value in headers:
        if key.lower() == b"connection":
            tokens.update(t.strip().lower() for t in value.split(b","))
    return frozenset(tokens)


class BodyError(ValueError):
    """A request body the gateway will not forward; str() is the one line to answer."""


def inject_priority(body: bytes, field: str, value: int) -> bytes:
    """`body` with `field` set to `value` when it is a JSON object; otherwise unchanged.

    Raises BodyError for a body that opens like a JSON object but does not parse here (an
    integer past Python's digit limit, JSON nested deeper than the parser's recursion
    limit, a typo), and for one whose numbers have no JSON form once parsed (1e400 reads
    as infinity). Forwarded as it came, such a body would skip `priority` where the
    engine's parser is more lenient than this one, or reach the engine as `Infinity`.
    """
    try:
        data = json.loads(body)
    except RecursionError:
        raise BodyError("the JSON body nests deeper than the gateway reads: flatten it") from None
    except ValueError as exc:  # includes UnicodeDecodeError
        if not _opens_an_object(body):
            return body  # not JSON (a form, a file): nothing to add a field to
        raise BodyError(_unreadable(exc, field)) from None
    if not isinstance(data, dict):
        return body
    data[field] = value
    try:
        return json.dumps(data, separators=(",", ":"), allow_nan=False).encode()
    except ValueError:
        raise BodyError(
            f"the gateway cannot add {field!r} to the JSON body: it holds a number out of "
            "JSON's range (1e400 reads as infinity; NaN): send finite numbers"
        ) from None
    except RecursionError:
        raise BodyError("the JSON body nests deeper than the gateway reads: flatten it") from None


def _opens_an_object(body: bytes) -> bool:
    # JSON's whitespace (RFC 8259 section 2), after the BOM json.loads accepts.
    return body.removeprefix(b"\xef\xbb\xbf").lstrip(b" \t\r\n").startswith(b"{")


def _unreadable(exc: ValueError, field: str) -> str:
    """The one line for a body that opens like a JSON object and does not parse."""
    if isinstance(exc, json.JSONDecodeError):
        why = f"it is not valid JSON ({exc.msg} at character {exc.pos})"
        fix = "send a valid JSON object"
    elif isinstance(exc, UnicodeDecodeError):
        why, fix = "it is not UTF-8", "send it encoded as UTF-8"
    else:
        # Python parses at most sys.get_int_max_str_digits() digits into an int (4300 unless
        # set; CVE-2020-10735). The limit and this error came in the same releases.
        why = f"it holds an integer longer than {sys.get_int_max_str_digits()} digits"
        fix = "send fewer digits, or the number as a string"
    return f"the gateway cannot add {field!r} to the JSON body: {why}: {fix}"


def error_body(message: str, kind: str, code: str) -> bytes:
    """OpenAI's error shape, which clients (the openai library among them) parse."""
    error = {"message": message, "type": kind, "param": None, "code": code}
    return json.dumps({"error": error}).encode()


def preempted_body(gw: Gateway, cls: str) -> tuple[bytes, int]:
    """The error of a request pre-empted now (the whole body of its 503, or the data of its
    stream's last event) and the seconds for its Retry-After."""
    retry_s = gw.preempt_retry_after_s(cls)
    allowance = gw.gates[cls].allowance
    cut = "" if allowance is None else f" ({cls} allowance cut to {allowance.value})"
    error = {
        "message": f"{cls} request pre-empted for chat{cut}: retry after {retry_s} s",
        "type": "preempted",
        "param": None,
        "code": 503,
    }
    return json.dumps({"error": error}).encode(), retry_s


async def send_error(
    send: Any,
    status: int,
    message: str,
    kind: str,
    code: str,
    extra_headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    body = error_body(message, kind, code)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *(extra_headers or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def rejection(gw: Gateway, cls: str, outcome: str) -> tuple[str, str, list[tuple[bytes, bytes]]]:
    """The 429's message, code and headers for a request the gate did not admit."""
    gate = gw.gates[cls]
    retry_s = gw.retry_after_s(cls)
    if outcome == "full":
        message = (
            f"the {cls} queue is full ({gate.max_queued} waiting): "
            f"retry after {retry_s} s or lower the request rate"
        )
    else:
        message = (
            f"no {cls} place freed within {gate.max_queue_wait_s:g} s "
            f"(allowance {gate.allowance.value if gate.allowance else 'unlimited'}, "
            f"{gate.inflight} in flight): retry after {retry_s} s"
        )
    headers = [(b"retry-after", str(retry_s).encode()), (b"x-traffic-class", cls.encode())]
    return message, f"{cls}_queue_{outcome}", headers


class Proxy:
    """ASGI app for every path the gateway does not answer itself."""

    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        gw = self.gw
        try:
            cls = classify(scope["headers"], gw.config)
        except ClassError as exc:
            await send_error(send, 400, str(exc), "invalid_request_error", "unknown_traffic_class")
            return
        limit = gw.config.max_body_bytes
        declared = declared_length(scope["headers"])
        if declared > limit:
            await send_error(send, 413, too_large(limit), "invalid_request_error", "body_too_large")
            return
        # Under --max-body-total as on the direct path: the declared length from the
        # headers on, a chunked body's size as it grows, until the body is upstream.
        hold = BodyHold(gw)
        try:
            body = await _read_body(receive, limit, hold, declared)
            if body is None:
                return  # the client left while sending its request
            if body is _TOO_LARGE:
                await send_error(
                    send, 413, too_large(limit), "invalid_request_error", "body_too_large"
                )
                return
            if body is _OVER_BUDGET:
                await send_error(
                    send,
                    503,
                    budget_full(gw.config.max_body_total_bytes),
                    "gateway_error",
                    "body_budget_full",
                    [(b"retry-after", b"1")],
                )
                return
            await self._serve(scope, receive, send, cls, body, hold)
        finally:
            hold.release()

    async def _serve(
        self, scope: Scope, receive: Any, send: Any, cls: str, body: bytes, hold: BodyHold
    ) -> None:
        gw = self.gw
        stats = gw.observer[cls]
        stats.requests += 1
        progress = Progress()
        task = asyncio.current_task()
        assert task is not None
        held = Held(task)
        left = False

        def on_gone() -> None:
            nonlocal left
            left = True
            if not held.preempted:  # cancelled already
                task.cancel()

        # The work runs right here (no extra task: one fewer turn of the event loop before
        # the request goes upstream); when the client goes away, on_gone cancels it. The
        # gateway's own server says so directly (protocol.py); under another server a task
        # waits for ASGI's http.disconnect.
        gone: ClientGone | None = scope.get("extensions", {}).get(CLIENT_GONE, {}).get("watch")
        watch: asyncio.Future[None] | None = None
        if gone is not None:
            if gone.gone:
                return
            gone.add(on_gone)
        else:
            watch = asyncio.ensure_future(_until_disconnect(receive))

            def on_watch_done(done: asyncio.Future[None]) -> None:
                if not done.cancelled() and done.exception() is None:
                    on_gone()

            watch.add_done_callback(on_watch_done)
        try:
            await self._handle(scope, send, cls, body, progress, held, hold)
        except asyncio.CancelledError:
            if not left and not held.preempted:
                raise  # the server is shutting down past its grace time
            uncancel = getattr(task, "uncancel", None)
            if uncancel is not None:  # Python 3.11+: this cancellation was ours, and handled
                uncancel()
            if held.preempted:
                stats.outcomes["preempted"] += 1
                if not left:
                    await self._preempted(send, cls, progress)
            else:
                # Clients (the openai library among them) close a stream once they read
                # [DONE], before the last empty chunk: that answer arrived whole.
                stats.outcomes["ok" if progress.done_seen else "disconnected"] += 1
        finally:
            if gone is not None:
                gone.remove(on_gone)
            if watch is not None:
                watch.remove_done_callback(on_watch_done)
                watch.cancel()

    async def _handle(
        self,
        scope: Scope,
        send: Any,
        cls: str,
        body: bytes,
        progress: Progress,
        held: Held,
        hold: BodyHold,
    ) -> None:
        gw = self.gw
        stats = gw.observer[cls]
        gate = gw.gates[cls]
        upstream = gw.primary
        # Only a POST asks the engine for work (a completion, an embedding); listing models
        # or reading health costs nothing and never waits.
        gated = scope["method"] == "POST"
        admitted = False
        priority = gw.priority_for(cls) if gated else None
        if priority is not None:  # before the wait in line: a body refused takes no place
            try:
                body = inject_priority(body, gw.config.priority_field, priority)
            except BodyError as exc:
                await send_error(send, 400, str(exc), "invalid_request_error", "invalid_body")
                return
        if gated:
            stats.work_requests += 1
            gw.expire_leases()
            started = gw.clock()
            outcome = await gate.acquire(held)
            stats.record_queue_wait(gw.wall(), gw.clock() - started)
            admitted = outcome == "admitted"
            if not admitted:
                if gw.secondary is None:
                    await self._reject(send, cls, outcome)
                    stats.outcomes["rejected"] += 1
                    return
                upstream = gw.secondary
        try:
            result = await self._forward(scope, send, cls, body, upstream, progress, hold)
        finally:
            if admitted:
                gate.release(held)  # nothing if pre-empted: the gate took its place then
        stats.outcomes["rerouted" if gated and not admitted else result] += 1

    async def _preempted(self, send: Any, cls: str, progress: Progress) -> None:
        """Tell a pre-empted request's client, as the direct path does (Exchange.preempt):
        503 before the headers; once they are out, the error as the stream's last event,
        and the answer left unfinished (the server closes the connection)."""
        body, retry_s = preempted_body(self.gw, cls)
        if not progress.started:
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(body)),
                (b"retry-after", b"%d" % retry_s),
            ]
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": False})
        elif progress.streamed:
            event = b"data: " + body + b"\n\n"
            await send({"type": "http.response.body", "body": event, "more_body": True})

    async def _reject(self, send: Any, cls: str, outcome: str) -> None:
        message, code, headers = rejection(self.gw, cls, outcome)
        await send_error(send, 429, message, "rate_limit_error", code, headers)

    async def _forward(
        self,
        scope: Scope,
        send: Any,
        cls: str,
        body: bytes,
        upstream: Upstream,
        progress: Progress,
        hold: BodyHold,
    ) -> str:
        """Send upstream and relay the answer; returns the outcome to count."""
        gw = self.gw
        stats = gw.observer[cls]
        target = scope.get("raw_path") or scope["path"].encode()
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        sent = gw.clock()
        try:
            response = await upstream.send(
                scope["method"], target, forward_headers(scope["headers"]), body
            )
        except UpstreamError as exc:
            hold.release()
            log.warning("%s request %s %s: %s", cls, scope["method"], scope["path"], exc.message)
            await send_error(send, exc.status, exc.message, "upstream_error", "upstream_failed")
            return "upstream_error"
        hold.release()  # the body is the engine's now
        try:
            status = response.status
            headers = relay_headers(response.headers)  # names are lower-case already
            streamed = status < 300 and response.header(b"content-type").startswith(STREAM_TYPES)
            progress.streamed = streamed
            progress.started = True  # before the send: a pre-empted answer gets no second start
            await send({"type": "http.response.start", "status": status, "headers": headers})
            chunks = 0
            next_chunk = response.next_chunk
            try:
                chunk = await next_chunk()
                if chunk is not None and streamed:
                    stats.record_ttft(gw.wall(), gw.clock() - sent, model_of(body))
                while chunk is not None:
                    chunks += 1
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    if streamed and chunk.endswith(DONE):
                        progress.done_seen = True
                    chunk = await next_chunk()
            except UpstreamBroken as exc:
                # Too late for a status: leave the answer unfinished, so the client sees a
                # broken stream rather than a clean end of a truncated one.
                log.warning("upstream %s broke mid-answer: %s", upstream.base_url, exc)
                return "upstream_error"
            finally:
                stats.chunks += chunks
        finally:
            await response.aclose()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return "ok" if status < 400 else "upstream_status"


_TOO_LARGE = b"\0too large"  # sentinels: compared by identity
_OVER_BUDGET = b"\0over budget"


def budget_full(limit: int) -> str:
    return (
        f"the gateway holds its limit of {limit} bytes of request bodies being received: "
        "retry in a moment, or raise --max-body-total"
    )


class BodyHold:
    """One request's bytes in the gateway's body budget (Gateway.hold_body)."""

    __slots__ = ("gw", "held")

    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway
        self.held = 0

    def take(self, want: int) -> bool:
        """Hold `want` bytes in all; False, letting go of what it held, past the budget."""
        more = want - self.held
        if more <= 0:
            return True
        if not self.gw.hold_body(more):
            self.release()
            return False
        self.held = want
        return True

    def release(self) -> None:
        if self.held:
            self.gw.let_body_go(self.held)
            self.held = 0


def too_large(limit: int) -> str:
    return (
        f"the request body is over the gateway's limit of {limit} bytes: send less, "
        "or raise --max-body"
    )


def declared_length(headers: list[tuple[bytes, bytes]]) -> int:
    for key, value in headers:
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 0  # the server's parser refuses it before the app sees it
    return 0


async def _read_body(receive: Any, limit: int, hold: BodyHold, declared: int = 0) -> bytes | None:
    """The whole body; None if the client left; _TOO_LARGE past `limit` bytes; _OVER_BUDGET
    when holding it would go past the gateway's body budget."""
    if declared and not hold.take(declared):
        return _OVER_BUDGET
    message = await receive()
    if message["type"] == "http.disconnect":
        return None
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        if len(body) > limit:
            return _TOO_LARGE
        return body if hold.take(len(body)) else _OVER_BUDGET
    parts = [body]
    size = len(body)
    while True:
        if not hold.take(size):
            return _OVER_BUDGET
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        part = message.get("body", b"")
        size += len(part)
        if size > limit:
            return _TOO_LARGE
        parts.append(part)
        if not message.get("more_body", False):
            return b"".join(parts) if hold.take(size) else _OVER_BUDGET


async def _until_disconnect(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def retry_after_from(wait_s: float, lease_left_s: float | None, allowance: int) -> int:
    """Seconds for Retry-After: the lease's end when batch is paused, else one queue wait."""
    if allowance == 0 and lease_left_s is not None:
        return max(1, min(3600, math.ceil(lease_left_s)))
    return max(1, math.ceil(wait_s))
