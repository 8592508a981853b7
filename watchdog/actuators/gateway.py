"""The project's gateway as an actuator, through its control API; the one client of that API."""

from __future__ import annotations

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


class GatewayActuator:
    """The project's gateway, through its control API (docs/gateway.md, "The control API")."""

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
            return ApplyResult(False, allowance, http_error(exc, "PUT", url, self._hint))
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
                f"{error_message(resp)}",
            )
        try:
            state = json_body(resp, "PUT")
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

    def _get(self, url: str, params: dict[str, str] | None = None) -> Any:
        """GET a control API page's JSON, or an ActuatorError that says what went wrong."""
        try:
            resp = self._client.get(url, params=params)
        except httpx.HTTPError as exc:
            raise ActuatorError(http_error(exc, "GET", url, self._hint)) from exc
        if resp.status_code != 200:
            raise ActuatorError(
                f"GET {url} answered HTTP {resp.status_code}: {error_message(resp)}"
            )
        return json_body(resp, "GET")

    def read_back(self) -> ReadBack:
        url = f"{self.base_url}/control"
        data = self._get(url)
        try:
            c = data["classes"][self.cls]
            return ReadBack(
                allowance=c["allowance"],
                inflight=c.get("inflight"),
                queued=c.get("queued"),
                max_queue_wait_s=c.get("max_queue_wait_s"),
                lease_expires_at=c.get("lease_expires_at"),
                ramp_per_s=c.get("ramp_per_s"),
                slot_line=c.get("slot_line"),
                engine_slots=c.get("engine_slots"),
            )
        except (KeyError, TypeError):
            raise ActuatorError(
                f"GET {url} has no classes.{self.cls}.allowance: is that the project's gateway?"
            ) from None

    def verify(self, expected: int, *, check_inflight: bool = True) -> Verification:
        return verify_with(self, expected, check_inflight)

    def observed(self, since_ts: float) -> dict[str, Any]:
        """What the gateway saw of real traffic since `since_ts` (unix seconds): per class the
        TTFTs, the requests counted and in flight (GET /control/observed). Needs no token."""
        url = f"{self.base_url}/control/observed"
        data = self._get(url, {"since": f"{since_ts:.3f}"})
        if not isinstance(data, dict):
            raise ActuatorError(f"GET {url} did not answer a JSON object")
        return data

    def close(self) -> None:
        self._client.close()
