"""The control API and /metrics: what the daemon reads and writes.

    GET  /control                    every class: allowance, inflight, queued, lease, observed
    GET  /control/classes/{name}     one class, the same fields
    PUT  /control/classes/batch      {"allowance": 4, "lease_s": 60, "reason": "..."}
                                     with Authorization: Bearer <token>
    GET  /control/observed?since=TS  recent TTFTs (unix seconds, ms) per class, newer than TS;
                                     work requests (POSTs) so far and in flight now, per class
    GET  /control/identity           the upstream engine: name, version, models, launch
                                     command (secrets redacted) and where it was read
    GET  /metrics                    Prometheus text (prometheus-client's ASGI app, app.py)

A refused PUT (401 without a valid token, 400 for a bad value) changes nothing. Errors use
OpenAI's error shape, like the rest of the gateway.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import shlex
import time
import unicodedata
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from llm_watchdog.logs import printable

if TYPE_CHECKING:
    from llm_watchdog.gateway.app import Gateway

log = logging.getLogger("llm_watchdog.gateway")

MAX_REASON_CHARS = 500
# The longest lease accepted: a day. A cut that should outlive a day is a new default
# (--batch-allowance), not a lease; and the event loop's timer cannot hold 1e300 s.
MAX_LEASE_S = 86400.0
# C0 and C1 controls (newline, ESC of an ANSI sequence, ...), DEL, and Unicode's line and
# paragraph separators: a reason is logged, and must stay on one line and print as it reads.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# Unicode's format characters (category Cf: the bidi overrides and isolates U+202A-202E and
# U+2066-2069, zero-width U+200B-200F, U+FEFF, tags U+E0000-E007F, ...) print as nothing
# but reorder or hide what follows them; lone surrogates (Cs) cannot be written as UTF-8,
# to the log or in a JSON answer. Both are dropped.
_INVISIBLE = frozenset(("Cf", "Cs"))
# The engine's identity is re-read at most this often: it changes with a restart, not a request.
IDENTITY_TTL_S = 30.0


def _gw(request: Request) -> Gateway:
    return request.app.state.gateway


def _error(status: int, message: str, kind: str, code: str, **headers: str) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers or None)


async def get_control(request: Request) -> Response:
    return JSONResponse(_gw(request).control_state())


async def get_class(request: Request) -> Response:
    gw = _gw(request)
    name = request.path_params["name"]
    if name not in gw.gates:
        return _error(404, f"no traffic class {name!r}: the classes are chat and batch", *_NF)
    gw.expire_leases()
    return JSONResponse(gw.class_state(name))


_NF = ("invalid_request_error", "unknown_traffic_class")


# A refused control write is logged at most this often, with the count since the last line.
REFUSED_LOG_EVERY_S = 60.0


def _log_refused(gw: Gateway, request: Request) -> None:
    """One line for a refused write, or for the first of a run of them: who asked, and how
    many were refused since the last line. A wrong token is an operator's mistake or a
    stranger on the network; either wants to be seen."""
    gw.refused_writes += 1
    now = gw.clock()
    if now - gw.refused_logged_at < REFUSED_LOG_EVERY_S:
        return
    peer = request.client.host if request.client is not None else "an unknown peer"
    log.warning(
        "refused a control write from %s to %s: no valid token (%d refused since the last line)",
        peer,
        printable(request.url.path),
        gw.refused_writes,
    )
    gw.refused_writes = 0
    gw.refused_logged_at = now


async def put_class(request: Request) -> Response:
    gw = _gw(request)
    if not gw.authorized(request.headers.get("authorization")):
        _log_refused(gw, request)
        if gw.config.control_token:
            message = "missing or wrong control token: send Authorization: Bearer <token>"
        else:
            message = (
                "this gateway has no control token, so it accepts no changes: start it with "
                "--token-file FILE or LLM_WATCHDOG_GATEWAY_TOKEN set"
            )
        return _error(
            401, message, "authentication_error", "invalid_token", **{"WWW-Authenticate": "Bearer"}
        )
    name = request.path_params["name"]
    if name not in gw.gates:
        return _error(404, f"no traffic class {name!r}: the classes are chat and batch", *_NF)
    gate = gw.gates[name]
    if gate.allowance is None:
        return _error(
            400,
            f"the {name} class has no allowance to set: it is never queued",
            "invalid_request_error",
            "no_allowance",
        )
    limit = gw.config.max_control_body_bytes
    raw = bytearray()
    try:
        async for part in request.stream():
            raw += part
            if len(raw) > limit:
                return _error(
                    413,
                    f"the body is over the control API's limit of {limit} bytes: send only "
                    '{"allowance": ..., "lease_s": ..., "reason": ...}',
                    "invalid_request_error",
                    "body_too_large",
                )
    except ClientDisconnect:
        return Response(status_code=400)  # nobody is there to read it
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    except RecursionError:
        return _error(
            400,
            "the body nests JSON deeper than the gateway reads: send a flat object like "
            '{"allowance": 4, "lease_s": 60}',
            "invalid_request_error",
            "invalid_value",
        )
    parsed = parse_put(data, gate.allowance.ceiling)
    if isinstance(parsed, str):
        return _error(400, parsed, "invalid_request_error", "invalid_value")
    value, lease_s, reason = parsed
    gw.expire_leases()
    gw.set_allowance(name, value, lease_s, reason)
    return JSONResponse(gw.class_state(name))


def parse_put(data: Any, ceiling: int) -> tuple[int, float | None, str] | str:
    """(allowance, lease_s, reason) from a PUT body, or the one-line error to answer with."""
    example = '{"allowance": 4, "lease_s": 60, "reason": "chat p95 over target"}'
    if not isinstance(data, dict):
        return f"the body must be a JSON object like {example}"
    value = data.get("allowance")
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= ceiling:
        return f"allowance must be an integer in [0, {ceiling}], got {_short(value)}"
    lease_s = data.get("lease_s")
    if lease_s is not None and (
        not isinstance(lease_s, (int, float))
        or isinstance(lease_s, bool)
        # Compared, not converted: an integer of 400 digits has no float (nan and inf fail).
        or not 0 < lease_s <= MAX_LEASE_S
    ):
        return (
            f"lease_s must be a positive number of seconds up to {MAX_LEASE_S:g} (a day) "
            f"or null, got {_short(lease_s)}"
        )
    reason = data.get("reason", "")
    if reason is None:
        reason = ""
    if not isinstance(reason, str):
        return f"reason must be a string, got {_short(reason)}"
    return value, None if lease_s is None else float(lease_s), clean_reason(reason)


def clean_reason(reason: str) -> str:
    """`reason` on one printable line, cut short: control characters become spaces, and
    format characters and lone surrogates are dropped."""
    text = _UNPRINTABLE.sub(" ", reason[:MAX_REASON_CHARS])
    if text.isascii():  # the common case, and no ASCII character is Cf or Cs
        return text
    return "".join(ch for ch in text if unicodedata.category(ch) not in _INVISIBLE)


def _short(value: Any) -> str:
    # An error line repeats what was sent, at most a few dozen characters of it.
    try:
        text = repr(value)
    except ValueError:  # an integer past Python's digit limit for str()
        return "an integer too long to print"
    return text if len(text) <= 60 else text[:57] + "..."


async def get_observed(request: Request) -> Response:
    gw = _gw(request)
    raw = request.query_params.get("since", "0")
    try:
        since = float(raw)
    except ValueError:
        since = math.nan
    if not math.isfinite(since):
        return _error(
            400,
            f"since must be unix seconds, like since=1700000000.5, got {raw!r}",
            "invalid_request_error",
            "invalid_value",
        )
    return JSONResponse(
        {
            "now": gw.wall(),
            "since": since,
            "ttft": {
                cls: [{"ts": ts, "ttft_ms": round(ms, 3)} for ts, ms in gw.ttft_since(cls, since)]
                for cls in gw.gates
            },
            # Counters since the gateway started and gauges now: a reader takes differences.
            "work_requests_total": {cls: gw.observer[cls].work_requests for cls in gw.gates},
            "inflight": {cls: gate.inflight for cls, gate in gw.gates.items()},
        }
    )


def upstream_launch(
    upstream_url: str, engine_unit: str = ""
) -> tuple[list[str] | None, str, int | None]:
    """The upstream engine's command line, where it was read (or why not), and the pid that
    listens on its port (None unless on this machine); blocking: /proc, systemctl."""
    from llm_watchdog.probe.procinfo import launch_command, listening_pid, on_this_machine

    parts = urlsplit(upstream_url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    host = parts.hostname or ""
    if on_this_machine(host):
        argv, source = launch_command(port, host, engine_unit=engine_unit)
        # The daemon behind the gateway finds the engine's GPUs by this process's tree: the
        # port it probes is the gateway's own.
        return argv, source, listening_pid(port, host) if port is not None else None
    if engine_unit:
        argv, source = launch_command(None, host, engine_unit=engine_unit)
        return argv, source, None
    return None, f"unreadable: the upstream {host} is not on this machine", None


def upstream_identity(upstream_url: str, engine_unit: str = "") -> dict[str, Any]:
    """What serves behind the gateway, read now (blocking: HTTP to the engine, /proc)."""
    # Imported here: the identity is read rarely, and the hot path need not load the probe.
    from llm_watchdog.probe.engine import detect_engine
    from llm_watchdog.probe.fingerprint import redact_command

    info = detect_engine(upstream_url)
    argv, source, pid = upstream_launch(upstream_url, engine_unit)
    return {
        "gateway": "llm-watchdog",
        "upstream": upstream_url,
        "engine": info.engine,
        "version": info.version,
        "models": list(info.models),
        "model": info.models[0] if info.models else None,
        "launch_command": shlex.join(redact_command(argv)) if argv else None,
        "launch_command_source": source,
        "engine_pid": pid,
    }


async def read_identity(app_state: Any, gw: Gateway) -> dict[str, Any]:
    """The upstream's identity, re-read when older than IDENTITY_TTL_S; it also names the
    engine in the TTFT histogram's `engine` label.

    One read at a time: everyone who finds the cache stale waits on the read in progress.
    A read per request would hold a connection to the engine and a thread of the default
    pool (which engine-slots detection uses too) each, for as long as an engine that
    accepts and never answers keeps them, and anyone may ask: the path needs no token.
    """
    cached = getattr(app_state, "identity_cache", None)
    if cached is not None and time.monotonic() - cached[0] <= IDENTITY_TTL_S:
        return dict(cached[1])
    flight: asyncio.Task[dict[str, Any]] | None = getattr(app_state, "identity_flight", None)
    if flight is None:
        flight = asyncio.get_running_loop().create_task(_read_identity_once(app_state, gw))
        flight.add_done_callback(_retrieve)
        app_state.identity_flight = flight
    # Shielded: a waiter that goes (its client left) does not cancel the read for the rest.
    return dict(await asyncio.shield(flight))


async def _read_identity_once(app_state: Any, gw: Gateway) -> dict[str, Any]:
    try:
        now = time.monotonic()
        ident = await asyncio.to_thread(upstream_identity, gw.config.upstream_url, gw.engine_unit)
        app_state.identity_cache = (now, ident)
        gw.observer.engine = str(ident.get("engine") or "unknown")
        return ident
    finally:
        # The next reader after this one finds the cache, or (this read failed) starts anew.
        app_state.identity_flight = None


def _retrieve(flight: asyncio.Task[Any]) -> None:
    # A read whose waiters all left still fails quietly: asyncio would log it as never
    # retrieved. Those who waited got the error themselves.
    if not flight.cancelled():
        flight.exception()


async def get_identity(request: Request) -> Response:
    return JSONResponse(await read_identity(request.app.state, _gw(request)))
