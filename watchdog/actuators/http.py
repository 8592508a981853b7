"""Any HTTP endpoint as an actuator: a method, a URL, a JSON template and headers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from llm_watchdog.actuators.base import (
    ActuatorError,
    ApplyResult,
    ReadBack,
    Verification,
    error_message,
    http_error,
    json_body,
    verify_with,
)


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
            return ApplyResult(False, allowance, http_error(exc, self.method, self.url, hint))
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
                f"{self.name} answered HTTP {resp.status_code}: {error_message(resp)}",
            )
        return ApplyResult(True, allowance, f"{self.name}: allowance {allowance}", lease_s)

    def read_back(self) -> ReadBack:
        if not self.read_url:
            raise ActuatorError(f"{self.name} has no read-back configured (read_url)")
        try:
            resp = self._client.get(self.read_url)
        except httpx.HTTPError as exc:
            hint = "is the service running?"
            raise ActuatorError(http_error(exc, "GET", self.read_url, hint)) from exc
        if resp.status_code != 200:
            raise ActuatorError(f"GET {self.read_url} answered HTTP {resp.status_code}")
        data = json_body(resp, "GET")
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
