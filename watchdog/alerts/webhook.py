"""The webhook sink: one HTTP POST per alert, in the shape the receiver expects.

Shapes:
- generic: JSON with every field of the alert (see `sinks.alert_json`).
- slack:   Slack incoming webhook, `{"text": ...}`, with Block Kit blocks when `blocks=True`.
- discord: Discord webhook, `{"content": ...}` cut to Discord's 2000-character limit, with
           mentions disabled so alert text can never ping @everyone.
- ntfy:    ntfy publish: plain-text body, `Title`, `Priority` (1-5) and `Tags` headers.
           Header values must be ASCII on the wire; ntfy decodes RFC 2047 encoded words
           (server/util.go, maybeDecodeHeader), so a title like "86 °C" is sent encoded.

The URL (webhooks carry their token in it; an ntfy topic is its own password) and header
values are secrets: logs and errors show only scheme, host and port.

httpx exceptions are mapped to `DeliveryError` here:

    httpx.TimeoutException   -> DeliveryError "no answer from … within N s" (retryable)
    httpx.TransportError     -> DeliveryError "cannot reach …" (retryable)
    HTTP 408/425/429/5xx     -> DeliveryError (retryable; 429/503 honour Retry-After)
    other HTTP 4xx           -> DeliveryError "check the URL and token" (not retryable)
"""

from __future__ import annotations

import base64
import socket
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx

from llm_watchdog.alerts.events import AlertEvent
from llm_watchdog.alerts.sinks import BaseSink, DeliveryError, alert_json, dumps

SHAPES = ("generic", "slack", "discord", "ntfy")
DISCORD_LIMIT = 2000  # characters in "content" (Discord API, Execute Webhook)
_RETRYABLE_STATUS = {408, 425, 429}

_MARKS = {  # state or firing severity -> leading symbol in chat text
    "critical": "🔴",
    "warning": "⚠️",
    "info": "ℹ️",
    "resolved": "✅",
    "summary": "🔕",
    "test": "🧪",
}
_NTFY_TAGS = {  # ntfy turns known tag names into emoji (docs.ntfy.sh/publish, Tags & emojis)
    "critical": "rotating_light",
    "warning": "warning",
    "info": "information_source",
    "resolved": "white_check_mark",
    "summary": "no_bell",
    "test": "test_tube",
}
# ntfy priorities: 1 min, 2 low, 3 default, 4 high, 5 max/urgent.
_NTFY_PRIORITY = {"critical": 5, "warning": 4, "info": 3}


def redact_url(url: str) -> str:
    """ "https://hooks.slack.com/…": enough to tell receivers apart, no token."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<webhook url>"
    tail = "/…" if (parts.path not in ("", "/") or parts.query) else ""
    return f"{parts.scheme}://{host}{port}{tail}"


def _mark(alert: AlertEvent) -> str:
    return _MARKS[alert.level if alert.state == "firing" else alert.state]


def chat_line(alert: AlertEvent) -> str:
    return f"{_mark(alert)} {alert.message}"


def _slack_escape(text: str) -> str:
    # Slack mrkdwn: &, < and > are control characters (api.slack.com, formatting text).
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_body(alert: AlertEvent, host: str, *, blocks: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"text": _slack_escape(chat_line(alert))}
    if blocks:
        context = f"{alert.kind} · {alert.state} · {alert.level} · {host}"
        if alert.cause:
            context += f" · cause {alert.cause}"
        body["blocks"] = [
            {
                "type": "header",
                "text": {"type": "plain_text", "text": f"{_mark(alert)} {alert.title}"[:150]},
            },
            {"type": "section", "text": {"type": "mrkdwn", "text": _slack_escape(alert.message)}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": _slack_escape(context)}]},
        ]
    return body


def discord_body(alert: AlertEvent) -> dict[str, Any]:
    content = chat_line(alert)
    if len(content) > DISCORD_LIMIT:
        content = content[: DISCORD_LIMIT - 1] + "…"
    return {"content": content, "allowed_mentions": {"parse": []}}


def header_value(text: str) -> str:
    """ASCII text as is; anything else as one RFC 2047 encoded word (UTF-8, base64)."""
    text = " ".join(text.split())
    if text.isascii():
        return text
    encoded = base64.b64encode(text.encode("utf-8")).decode("ascii")
    return f"=?UTF-8?B?{encoded}?="


def ntfy_request(alert: AlertEvent) -> tuple[dict[str, str], bytes]:
    firing = alert.state == "firing"
    priority = _NTFY_PRIORITY[alert.level] if firing else 3
    state_tag = _NTFY_TAGS[alert.level if firing else alert.state]
    headers = {
        "Content-Type": "text/plain; charset=utf-8",
        "Title": header_value(alert.title),
        "Priority": str(priority),
        "Tags": f"{state_tag},{alert.kind}",
    }
    return headers, alert.message.encode("utf-8")


class WebhookSink(BaseSink):
    def __init__(
        self,
        url: str,
        shape: str = "generic",
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,
        *,
        name: str | None = None,
        blocks: bool = False,
        host: str | None = None,
        min_severity: str = "info",
        kinds: frozenset[str] | None = None,
    ) -> None:
        if shape not in SHAPES:
            raise ValueError(
                f"unknown webhook shape {shape!r}: expected one of {', '.join(SHAPES)}"
            )
        scheme = urlsplit(url).scheme
        if scheme not in ("http", "https"):
            raise ValueError(f"webhook URL must start with http:// or https://, got {scheme!r}")
        self.redacted = redact_url(url)
        super().__init__(name or f"{shape} {self.redacted}", min_severity=min_severity, kinds=kinds)
        self.shape = shape
        self.headers = dict(headers or {})
        self.timeout_s = timeout_s
        self.blocks = blocks
        self.host = host or socket.gethostname()
        self._url = url
        self._transport = transport
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()
        parts = urlsplit(url)
        candidates = [url, parts.path + ("?" + parts.query if parts.query else ""), parts.query]
        candidates += list(self.headers.values())
        self._secrets = sorted({s for s in candidates if len(s) >= 4}, key=len, reverse=True)

    def __repr__(self) -> str:
        return f"WebhookSink({self.name!r}, shape={self.shape!r})"

    def request(self, alert: AlertEvent) -> tuple[dict[str, str], bytes]:
        """Headers and body for one alert in this sink's shape (before configured headers)."""
        if self.shape == "ntfy":
            return ntfy_request(alert)
        if self.shape == "slack":
            body = slack_body(alert, self.host, blocks=self.blocks)
        elif self.shape == "discord":
            body = discord_body(alert)
        else:
            body = alert_json(alert, self.host)
        return {"Content-Type": "application/json"}, dumps(body).encode("utf-8")

    def send(self, alert: AlertEvent) -> None:
        shape_headers, content = self.request(alert)
        headers = {**shape_headers, **self.headers, "User-Agent": "llm-watchdog"}
        try:
            response = self._get_client().post(self._url, content=content, headers=headers)
        except httpx.TimeoutException:
            raise DeliveryError(
                f"no answer from {self.redacted} within {self.timeout_s:g} s"
            ) from None
        except httpx.HTTPError as exc:
            raise DeliveryError(
                f"cannot reach {self.redacted} ({self.scrub(str(exc)) or type(exc).__name__}): "
                "is the receiver up and the URL right?"
            ) from None
        if response.is_success:
            return
        status = response.status_code
        snippet = self.scrub(" ".join(response.text.split()))[:200]
        detail = f"{self.redacted} answered {status} {response.reason_phrase}"
        detail += f": {snippet}" if snippet else ""
        if status in _RETRYABLE_STATUS or status >= 500:
            raise DeliveryError(detail, retry_after_s=_retry_after(response))
        raise DeliveryError(detail + " (check the URL and token)", retryable=False)

    def scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "…")
        return text

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def _get_client(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                # No keep-alive: alerts are rare, and an idle pooled connection closed by the
                # far end fails the next request without an answer.
                self._client = httpx.Client(
                    transport=self._transport,
                    timeout=self.timeout_s,
                    limits=httpx.Limits(max_keepalive_connections=0),
                    follow_redirects=False,
                )
            return self._client


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After", "")
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date is rare for webhooks; the backoff applies instead
