"""How the batch allowance reaches the serving layer, and the read-back that proves it did.

The flag you set is not the behaviour you get: after every write the daemon reads back what
the serving layer reports (`read_back`) and, a drain time later, `verify`s that the allowance
is in force and that batch in-flight is not above it. A mismatch is a `Verification` with
`kind="not_effective"`, which the daemon turns into a "control not effective" event.

    Actuator (protocol): apply(allowance, lease_s, reason) -> ApplyResult
                         read_back() -> ReadBack          (raises ActuatorError)
                         verify(expected) -> Verification (never raises)
    ├── GatewayActuator   the project's gateway (actuators.gateway): PUT /control/classes/batch,
    │                     GET /control, and the chat it observed (GET /control/observed)
    ├── HaproxyActuator   HAProxy's runtime API (actuators.haproxy): set maxconn server, show stat
    ├── HttpActuator      any HTTP endpoint (actuators.http): method, URL, JSON template, headers
    └── CommandActuator   any program (actuators.command): the allowance in its environment

    ActuatorError(ControlError): one line that says what happened and what to try.

`apply` never raises for what the network or the serving layer does: a failed write is an
`ApplyResult(ok=False, detail=<one line>)`. Foreign exceptions (httpx, OSError, subprocess)
are mapped here, at the edge.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from llm_watchdog.alerts.events import AlertEvent
from llm_watchdog.errors import ControlError

ENV_ALLOWANCE = "LLM_WATCHDOG_ALLOWANCE"
ENV_LEASE_S = "LLM_WATCHDOG_LEASE_S"
ENV_REASON = "LLM_WATCHDOG_REASON"


class ActuatorError(ControlError):
    """The serving layer could not be written or read. str() is one line."""


@dataclass(frozen=True)
class ApplyResult:
    ok: bool
    allowance: int  # what was asked for
    detail: str  # one line: what was done, or what went wrong
    lease_s: float | None = None  # the lease the serving layer took; None: it keeps no lease
    lease_expires_at: float | None = None  # unix seconds, when the serving layer says


@dataclass(frozen=True)
class ReadBack:
    """What the serving layer reports now. None: not reported (for allowance: no limit)."""

    allowance: int | None
    inflight: int | None = None
    queued: int | None = None
    max_queue_wait_s: float | None = None
    lease_expires_at: float | None = None
    detail: str = ""
    # Batch requests a second the serving layer lets in after a raise (the gateway's ramp);
    # None: not reported, a raise is taken to act at once.
    ramp_per_s: float | None = None
    # Batch is let in only while batch + chat in flight stay under this (the gateway's slot
    # line), and the engine slots it was drawn from; None: the serving layer holds no line.
    slot_line: int | None = None
    engine_slots: int | None = None


@dataclass(frozen=True)
class Verification:
    ok: bool
    kind: str  # "ok" | "not_effective" | "unreadable" | "unverified" (no read-back exists)
    detail: str  # one line
    read_back: ReadBack | None = None


class Actuator(Protocol):
    name: str  # where the allowance goes, for messages: "gateway http://127.0.0.1:8090"

    def apply(self, allowance: int, lease_s: float, reason: str) -> ApplyResult: ...

    def read_back(self) -> ReadBack: ...

    def verify(self, expected: int, *, check_inflight: bool = True) -> Verification: ...

    def close(self) -> None: ...


def check(name: str, expected: int, rb: ReadBack, check_inflight: bool = True) -> Verification:
    """Compare a read-back with the allowance that should be in force."""
    if rb.allowance != expected:
        shown = "no limit" if rb.allowance is None else f"allowance {rb.allowance}"
        return Verification(
            False,
            "not_effective",
            f"control not effective: {name} reports {shown}, expected {expected}",
            rb,
        )
    if check_inflight and rb.inflight is not None and rb.inflight > expected:
        return Verification(
            False,
            "not_effective",
            f"control not effective: {name} has {rb.inflight} batch requests in flight, "
            f"over the allowance {expected}",
            rb,
        )
    return Verification(True, "ok", f"{name}: allowance {expected} in force", rb)


def verify_with(actuator: Actuator, expected: int, check_inflight: bool = True) -> Verification:
    try:
        rb = actuator.read_back()
    except ActuatorError as exc:
        return Verification(False, "unreadable", f"cannot verify the allowance: {exc}")
    return check(actuator.name, expected, rb, check_inflight)


def not_effective_key(target: str) -> str:
    """The alert key of `target`'s control not taking effect: one alert per actuator."""
    return f"control:not_effective:{target}"


def not_effective_event(v: Verification, *, ts: float, target: str) -> AlertEvent | None:
    """The alert for a failed verification (None when it passed or could not be checked)."""
    if v.kind not in ("not_effective", "unreadable"):
        return None
    rb = v.read_back
    return AlertEvent(
        key=not_effective_key(target),
        kind="control_not_effective",
        state="firing",
        ts=ts,
        title="The batch allowance did not take effect",
        message=v.detail,
        cause="load",
        fields={} if rb is None else {"allowance": rb.allowance, "inflight": rb.inflight},
    )


def effective_event(v: Verification, *, ts: float, target: str) -> AlertEvent | None:
    """The end of a not-effective alert: a verification that passed (None otherwise)."""
    if not v.ok:
        return None
    return AlertEvent(
        key=not_effective_key(target),
        kind="control_not_effective",
        state="resolved",
        ts=ts,
        title="",
        message=v.detail,
        cause="load",
    )


# -- HTTP --------------------------------------------------------------------------------


def http_error(exc: httpx.HTTPError, what: str, url: str, hint: str) -> str:
    if isinstance(exc, httpx.ConnectError):
        return f"cannot reach {url} ({why(exc)}): {hint}"
    if isinstance(exc, httpx.TimeoutException):
        return f"{url} did not answer {what} in time: is it overloaded or hung?"
    return f"{what} {url} failed ({type(exc).__name__}: {why(exc)})"


def why(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if "refused" in text.lower():
        return "connection refused"
    return " ".join(text.split())[:200]


def json_body(resp: httpx.Response, what: str) -> Any:
    try:
        return resp.json()
    except ValueError:
        raise ActuatorError(
            f"{what} {resp.request.url} answered with something that is not JSON "
            f"(HTTP {resp.status_code}): is that the right address?"
        ) from None


def error_message(resp: httpx.Response) -> str:
    """The error text of an OpenAI-shaped error body, or the start of the body."""
    try:
        body = resp.json()
        text = body["error"]["message"]
    except (ValueError, KeyError, TypeError):
        text = resp.text
    return " ".join(str(text).split())[:200]
