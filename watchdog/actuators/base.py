"""How the batch allowance reaches the serving layer, and the read-back that proves it did.

The flag you set is not the behaviour you get: after every write the daemon reads back what
the serving layer reports (`read_back`) and, a drain time later, `verify`s that the allowance
is in force and that batch in-flight is not above it. A mismatch is a `Verification` with
`kind="not_effective"`, which the daemon turns into a "control not effective" event.

    Actuator (protocol): apply(allowance, lease_s, reason) -> ApplyResult
                         read_back() -> ReadBack          (raises ActuatorError)
                         verify(expected) -> Verification (never raises)
    ├── GatewayActuator   the project's gateway: PUT /control/classes/batch, GET /control
    ├── HaproxyActuator   HAProxy's runtime API: set maxconn server, show stat
    ├── HttpActuator      any HTTP endpoint: method, URL, JSON template, headers
    └── CommandActuator   any program: the allowance in its environment

    ActuatorError(Exception): one line that says what happened and what to try.

`apply` never raises for what the network or the serving layer does: a failed write is an
`ApplyResult(ok=False, detail=<one line>)`. Foreign exceptions (httpx, OSError, subprocess)
are mapped here, at the edge.
"""

from __future__ import annotations

import csv
import io
import json
import os
import socket
import subprocess
from collections.abc import Mapping, Sequence
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


def not_effective_event(v: Verification, *, ts: float, target: str) -> AlertEvent | None:
    """The alert for a failed verification (None when it passed or could not be checked)."""
    if v.kind not in ("not_effective", "unreadable"):
        return None
    rb = v.read_back
    return AlertEvent(
        key=f"control:not_effective:{target}",
        kind="control_not_effective",
        state="firing",
        ts=ts,
        title="The batch allowance did not take effect",
        message=v.detail,
        cause="load",
        fields={} if rb is None else {"allowance": rb.allowance, "inflight": rb.inflight},
    )


# -- HTTP --------------------------------------------------------------------------------


def _http_error(exc: httpx.HTTPError, what: str, url: str, hint: str) -> str:
    if isinstance(exc, httpx.ConnectError):
        return f"cannot reach {url} ({_why(exc)}): {hint}"
    if isinstance(exc, httpx.TimeoutException):
        return f"{url} did not answer {what} in time: is it overloaded or hung?"
    return f"{what} {url} failed ({type(exc).__name__}: {_why(exc)})"


def _why(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if "refused" in text.lower():
        return "connection refused"
    return " ".join(text.split())[:200]


def _json(resp: httpx.Response, what: str) -> Any:
    try:
        return resp.json()
    except ValueError:
        raise ActuatorError(
            f"{what} {resp.request.url} answered with something that is not JSON "
            f"(HTTP {resp.status_code}): is that the right address?"
        ) from None


def _message(resp: httpx.Response) -> str:
    """The error text of an OpenAI-shaped error body, or the start of the body."""
    try:
        body = resp.json()
        text = body["error"]["message"]
    except (ValueError, KeyError, TypeError):
        text = resp.text
    return " ".join(str(text).split())[:200]


class GatewayActuator:
    """The project's gateway, through its control API (DESIGN.md, "Control API")."""

    def __init__(
        self,
        base_url: str,
        token: str | None,
        transport: httpx.BaseTransport | None = None,
        *,
        cls: str = "batch",
        timeout_s: float = 5.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.cls = cls
        self.name = f"gateway {self.base_url}"
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(
            transport=transport, timeout=timeout_s, headers=headers, trust_env=False
        )
        self._hint = "is `llm-watchdog gateway` running there?"

    def apply(self, allowance: int, lease_s: float, reason: str) -> ApplyResult:
        url = f"{self.base_url}/control/classes/{self.cls}"
        body = {"allowance": allowance, "lease_s": lease_s, "reason": reason}
        try:
            resp = self._client.put(url, json=body)
        except httpx.HTTPError as exc:
            return ApplyResult(False, allowance, _http_error(exc, "PUT", url, self._hint))
        if resp.status_code == 401:
            return ApplyResult(
                False,
                allowance,
                f"the gateway at {self.base_url} refused the control token (401): give the "
                "daemon the gateway's token (LLM_WATCHDOG_GATEWAY_TOKEN or its token file)",
            )
        if resp.status_code != 200:
            return ApplyResult(
                False,
                allowance,
                f"the gateway refused allowance {allowance} (HTTP {resp.status_code}): "
                f"{_message(resp)}",
            )
        try:
            state = _json(resp, "PUT")
        except ActuatorError as exc:
            return ApplyResult(False, allowance, str(exc))
        got = state.get("allowance") if isinstance(state, dict) else None
        expires = state.get("lease_expires_at") if isinstance(state, dict) else None
        if got != allowance:
            return ApplyResult(
                False,
                allowance,
                f"the gateway accepted the write but reports allowance {got}, not {allowance}",
            )
        return ApplyResult(True, allowance, f"{self.name}: allowance {allowance}", lease_s, expires)

    def read_back(self) -> ReadBack:
        url = f"{self.base_url}/control"
        try:
            resp = self._client.get(url)
        except httpx.HTTPError as exc:
            raise ActuatorError(_http_error(exc, "GET", url, self._hint)) from exc
        if resp.status_code != 200:
            raise ActuatorError(f"GET {url} answered HTTP {resp.status_code}: {_message(resp)}")
        data = _json(resp, "GET")
        try:
            c = data["classes"][self.cls]
            return ReadBack(
                allowance=c["allowance"],
                inflight=c.get("inflight"),
                queued=c.get("queued"),
                max_queue_wait_s=c.get("max_queue_wait_s"),
                lease_expires_at=c.get("lease_expires_at"),
                ramp_per_s=c.get("ramp_per_s"),
            )
        except (KeyError, TypeError):
            raise ActuatorError(
                f"GET {url} has no classes.{self.cls}.allowance: is that the project's gateway?"
            ) from None

    def verify(self, expected: int, *, check_inflight: bool = True) -> Verification:
        return verify_with(self, expected, check_inflight)

    def close(self) -> None:
        self._client.close()


def fill(template: Any, allowance: int, lease_s: float, reason: str) -> Any:
    """Put the values into a JSON template: "{allowance}" alone becomes the number itself."""
    values = {"allowance": allowance, "lease_s": lease_s, "reason": reason}
    if isinstance(template, str):
        for key, value in values.items():
            if template == "{" + key + "}":
                return value
        out = template
        for key, value in values.items():
            out = out.replace("{" + key + "}", str(value))
        return out
    if isinstance(template, Mapping):
        return {k: fill(v, allowance, lease_s, reason) for k, v in template.items()}
    if isinstance(template, list):
        return [fill(v, allowance, lease_s, reason) for v in template]
    return template


def _dig(data: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(data, Mapping) or part not in data:
            raise KeyError(path)
        data = data[part]
    return data


class HttpActuator:
    """Any HTTP endpoint: `method url` with `json_template` filled in, and `headers`.

    Read-back is optional: `read_url` answers JSON, and `read_fields` maps ReadBack fields
    (allowance, inflight, queued) to dotted paths in it. Without it `verify` says so.
    """

    def __init__(
        self,
        method: str,
        url: str,
        json_template: Any,
        headers: Mapping[str, str] | None = None,
        *,
        read_url: str | None = None,
        read_fields: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        self.method = method.upper()
        self.url = url
        self.template = json_template
        self.read_url = read_url
        self.read_fields = dict(read_fields or {"allowance": "allowance"})
        known = {"allowance", "inflight", "queued", "max_queue_wait_s", "lease_expires_at"}
        unknown = sorted(set(self.read_fields) - known)
        if unknown:
            raise ValueError(
                f"read_fields: unknown field {unknown[0]!r} (known: {', '.join(sorted(known))})"
            )
        self.name = f"{self.method} {url}"
        self._client = httpx.Client(
            transport=transport, timeout=timeout_s, headers=dict(headers or {}), trust_env=False
        )

    def apply(self, allowance: int, lease_s: float, reason: str) -> ApplyResult:
        body = fill(self.template, allowance, lease_s, reason)
        try:
            resp = self._client.request(self.method, self.url, json=body)
        except httpx.HTTPError as exc:
            hint = "is the service running?"
            return ApplyResult(False, allowance, _http_error(exc, self.method, self.url, hint))
        if resp.status_code in (401, 403):
            return ApplyResult(
                False,
                allowance,
                f"{self.name} refused the credentials (HTTP {resp.status_code}): check the "
                "headers configured for this actuator",
            )
        if not 200 <= resp.status_code < 300:
            return ApplyResult(
                False,
                allowance,
                f"{self.name} answered HTTP {resp.status_code}: {_message(resp)}",
            )
        return ApplyResult(True, allowance, f"{self.name}: allowance {allowance}", lease_s)

    def read_back(self) -> ReadBack:
        if not self.read_url:
            raise ActuatorError(f"{self.name} has no read-back configured (read_url)")
        try:
            resp = self._client.get(self.read_url)
        except httpx.HTTPError as exc:
            hint = "is the service running?"
            raise ActuatorError(_http_error(exc, "GET", self.read_url, hint)) from exc
        if resp.status_code != 200:
            raise ActuatorError(f"GET {self.read_url} answered HTTP {resp.status_code}")
        data = _json(resp, "GET")
        values: dict[str, Any] = {}
        for field_name, path in self.read_fields.items():
            try:
                values[field_name] = _dig(data, path)
            except KeyError:
                raise ActuatorError(
                    f"GET {self.read_url}: no {path!r} in the answer (read_fields.{field_name})"
                ) from None
        values.setdefault("allowance", None)
        return ReadBack(**values)

    def verify(self, expected: int, *, check_inflight: bool = True) -> Verification:
        if not self.read_url:
            return Verification(True, "unverified", f"{self.name}: no read-back configured")
        return verify_with(self, expected, check_inflight)

    def close(self) -> None:
        self._client.close()


# -- HAProxy -----------------------------------------------------------------------------


class HaproxyActuator:
    """HAProxy's runtime API over its stats socket (`stats socket ... level admin`).

    The allowance is the server's maxconn: `set maxconn server <backend>/<server> <n>`;
    excess requests wait in the backend queue for at most `timeout queue`, then get a 503.
    What HAProxy 2.6 allows at runtime, checked against 2.6.12:
    - maxconn 0 means *no limit* (show stat's `slim` goes empty), so allowance 0 is written
      as `set server <backend>/<server> state maint` instead, and lifted when n > 0;
    - `timeout queue` cannot be changed at runtime ("'set timeout' only supports 'cli'"):
      it belongs in haproxy.cfg, and the read-back cannot report it;
    - there are no leases: a value stays until changed, so the daemon must keep writing.
    Read-back is `show stat`: the server's `slim` (maxconn), `scur` (in flight), `status`,
    and `qcur` (queued) of the server and of its backend.
    """

    def __init__(
        self, socket_path_or_addr: str, backend: str, server: str, *, timeout_s: float = 2.0
    ) -> None:
        self.address = socket_path_or_addr
        self.backend = backend
        self.server = server
        self.timeout_s = timeout_s
        self.name = f"haproxy {backend}/{server}"
        self._maint_by_us = False

    def _connect(self) -> socket.socket:
        addr = self.address
        if addr.startswith("unix@"):
            addr = addr[5:]
        if "/" in addr or ":" not in addr:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            target: Any = addr
        else:
            host, _, port = addr.removeprefix("ipv4@").rpartition(":")
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            target = (host, int(port))
        sock.settimeout(self.timeout_s)
        try:
            sock.connect(target)
        except BaseException:
            sock.close()
            raise
        return sock

    def command(self, line: str) -> str:
        """Send one runtime API command and return HAProxy's answer (raises ActuatorError)."""
        hint = f"is haproxy running with `stats socket {self.address} level admin`?"
        try:
            with self._connect() as sock:
                sock.sendall(line.encode() + b"\n")
                chunks = []
                while True:
                    data = sock.recv(65536)
                    if not data:
                        break
                    chunks.append(data)
        except FileNotFoundError:
            raise ActuatorError(f"no HAProxy stats socket at {self.address}: {hint}") from None
        except ConnectionRefusedError:
            raise ActuatorError(
                f"cannot reach HAProxy at {self.address} (connection refused): {hint}"
            ) from None
        except PermissionError:
            raise ActuatorError(
                f"cannot open {self.address} (permission denied): run the daemon as a user "
                "that may use the stats socket (its `user`/`group`/`mode`)"
            ) from None
        except TimeoutError:
            raise ActuatorError(
                f"HAProxy at {self.address} did not answer `{line.split()[0]}` "
                f"within {self.timeout_s:g} s"
            ) from None
        except OSError as exc:
            raise ActuatorError(f"cannot talk to HAProxy at {self.address}: {exc}") from exc
        return b"".join(chunks).decode("utf-8", "replace")

    def _set(self, line: str) -> None:
        answer = self.command(line).strip()
        if not answer:
            return  # HAProxy answers a successful set with an empty line
        if "permission denied" in answer.lower():
            raise ActuatorError(f"HAProxy refused `{line}`: the stats socket needs `level admin`")
        if "no such" in answer.lower():
            raise ActuatorError(
                f"HAProxy has no server {self.backend}/{self.server} ({answer.splitlines()[0]}): "
                "check the names with `show servers state`"
            )
        raise ActuatorError(f"HAProxy refused `{line}`: {answer.splitlines()[0]}")

    def apply(self, allowance: int, lease_s: float, reason: str) -> ApplyResult:
        srv = f"{self.backend}/{self.server}"
        try:
            if allowance <= 0:
                self._set(f"set server {srv} state maint")
                self._maint_by_us = True
                done = f"{self.name}: in maintenance (allowance 0; maxconn 0 would mean no limit)"
            else:
                self._set(f"set maxconn server {srv} {allowance}")
                if self._maint_by_us:
                    self._set(f"set server {srv} state ready")
                    self._maint_by_us = False
                done = f"{self.name}: maxconn {allowance}"
        except ActuatorError as exc:
            return ApplyResult(False, allowance, str(exc))
        return ApplyResult(True, allowance, f"{done} (no lease: HAProxy keeps it until changed)")

    def read_back(self) -> ReadBack:
        text = self.command("show stat")
        rows = csv.reader(io.StringIO(text.lstrip("# ")))
        header = next(rows, None)
        if not header or "pxname" not in header:
            raise ActuatorError(f"HAProxy's `show stat` gave no CSV header: {text[:80]!r}")
        col = {name: i for i, name in enumerate(header)}
        server: list[str] | None = None
        backend_queued = 0
        for row in rows:
            if len(row) < len(col) - 1 or row[col["pxname"]] != self.backend:
                continue
            if row[col["svname"]] == self.server:
                server = row
            elif row[col["svname"]] == "BACKEND":
                # Requests with no server affinity wait in the backend's queue, not the
                # server's: both count as waiting for this server's slots.
                backend_queued = _int(row[col["qcur"]]) or 0
        if server is None:
            raise ActuatorError(
                f"HAProxy's `show stat` has no server {self.backend}/{self.server}: "
                "check the names with `show servers state`"
            )
        slim, scur, qcur = (_int(server[col[name]]) for name in ("slim", "scur", "qcur"))
        status = server[col["status"]]
        allowance = 0 if status.startswith("MAINT") else slim
        queued = (qcur or 0) + backend_queued
        return ReadBack(allowance, scur, queued, None, None, f"status {status}")

    def verify(self, expected: int, *, check_inflight: bool = True) -> Verification:
        return verify_with(self, expected, check_inflight)

    def close(self) -> None:
        """Nothing is held open: every command is its own connection."""


def _int(text: str) -> int | None:
    return int(text) if text.isdigit() else None


# -- a command ---------------------------------------------------------------------------


class CommandActuator:
    """Run `argv` with the allowance in its environment (LLM_WATCHDOG_ALLOWANCE, _LEASE_S,
    _REASON). Exit 0 is success. Optional `read_argv` prints JSON with at least `allowance`
    (and `inflight`, `queued` if it knows them) for the read-back.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        read_argv: Sequence[str] | None = None,
        timeout_s: float = 10.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if not argv:
            raise ValueError("CommandActuator needs a program to run (argv is empty)")
        self.argv = list(argv)
        self.read_argv = list(read_argv) if read_argv else None
        self.timeout_s = timeout_s
        self.env = dict(os.environ if env is None else env)
        self.name = f"command {self.argv[0]}"

    def _run(self, argv: list[str], extra: Mapping[str, str]) -> str:
        try:
            proc = subprocess.run(
                argv,
                env={**self.env, **extra},
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                check=False,
            )
        except FileNotFoundError:
            raise ActuatorError(f"cannot run {argv[0]}: no such program (check the path)") from None
        except PermissionError:
            raise ActuatorError(f"cannot run {argv[0]}: permission denied (chmod +x?)") from None
        except subprocess.TimeoutExpired:
            raise ActuatorError(
                f"{argv[0]} did not finish within {self.timeout_s:g} s and was stopped"
            ) from None
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
            raise ActuatorError(f"{argv[0]} exited with status {proc.returncode}: {last[:200]}")
        return proc.stdout

    def apply(self, allowance: int, lease_s: float, reason: str) -> ApplyResult:
        env = {ENV_ALLOWANCE: str(allowance), ENV_LEASE_S: f"{lease_s:g}", ENV_REASON: reason}
        try:
            self._run(self.argv, env)
        except ActuatorError as exc:
            return ApplyResult(False, allowance, str(exc))
        return ApplyResult(True, allowance, f"{self.name}: allowance {allowance}", lease_s)

    def read_back(self) -> ReadBack:
        if not self.read_argv:
            raise ActuatorError(f"{self.name} has no read-back command configured")
        out = self._run(self.read_argv, {})
        try:
            data = json.loads(out)
            return ReadBack(data["allowance"], data.get("inflight"), data.get("queued"))
        except (ValueError, KeyError, TypeError):
            raise ActuatorError(
                f'{self.read_argv[0]} must print JSON like {{"allowance": 4, "inflight": 2}}'
                f", got {out.strip()[:80]!r}"
            ) from None

    def verify(self, expected: int, *, check_inflight: bool = True) -> Verification:
        if not self.read_argv:
            return Verification(True, "unverified", f"{self.name}: no read-back configured")
        return verify_with(self, expected, check_inflight)

    def close(self) -> None:
        """Nothing is held open."""
