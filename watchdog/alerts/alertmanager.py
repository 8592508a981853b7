"""The Alertmanager sink: alerts posted to Alertmanager's `POST /api/v2/alerts`.

Each alert becomes one Alertmanager alert with labels `alertname` (the kind in CamelCase,
e.g. `ChatSlowed`), `kind`, `severity`, `cause`, `instance` (this host), `job` and any
configured extra labels; annotations `summary` (the title), `description` (the message)
and the event's scalar figures. A firing alert carries `startsAt` (when the event began)
and an `endsAt` a few resend intervals ahead; a resolved one carries `endsAt` = when the
event ended.

Alertmanager resolves an alert whose `endsAt` has passed, the way it treats a Prometheus
that stopped sending it. So while an alert fires this sink posts it again every
`resend_interval_s` (Prometheus re-sends its firing alerts the same way): a daemon that dies
lets its alerts lapse within `3 × resend_interval_s`, and the shipped `up` rule says why.
"""

from __future__ import annotations

import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

import httpx

from llm_watchdog.alerts.events import AlertEvent
from llm_watchdog.alerts.sinks import BaseSink, DeliveryError, dumps

log = logging.getLogger("llm_watchdog.alerts.alertmanager")

LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# A firing alert stays firing this many resend intervals after the last post.
LAPSE_INTERVALS = 3


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def alert_name(kind: str) -> str:
    """`chat_slowed` -> `ChatSlowed`: Prometheus alert names are CamelCase."""
    return "".join(part.capitalize() for part in kind.split("_")) or "LlmWatchdog"


def v2_alert(
    alert: AlertEvent,
    now: float,
    *,
    host: str,
    labels: Mapping[str, str],
    resend_interval_s: float,
    generator_url: str | None = None,
) -> dict[str, Any]:
    """One element of the `postableAlerts` list of Alertmanager's API v2."""
    out_labels = {
        "alertname": alert_name(alert.kind),
        "kind": alert.kind,
        "severity": alert.level,
        "instance": host,
        "job": "llm-watchdog",
        **labels,
    }
    if alert.cause:
        out_labels["cause"] = alert.cause
    annotations = {"summary": alert.title, "description": alert.message}
    for key, value in alert.fields.items():
        if isinstance(value, (str, int, float, bool)) and LABEL_NAME.fullmatch(key):
            annotations.setdefault(key, str(value))
    body: dict[str, Any] = {
        "labels": out_labels,
        "annotations": annotations,
        "startsAt": rfc3339(alert.ts if alert.state != "test" else now),
    }
    if alert.state == "resolved":
        body["endsAt"] = rfc3339(alert.ts)
    else:
        body["endsAt"] = rfc3339(now + LAPSE_INTERVALS * resend_interval_s)
    if generator_url:
        body["generatorURL"] = generator_url
    return body


class AlertmanagerSink(BaseSink):
    def __init__(
        self,
        url: str,
        *,
        labels: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 10.0,
        resend_interval_s: float = 60.0,
        generator_url: str | None = None,
        transport: httpx.BaseTransport | None = None,
        host: str | None = None,
        clock: Callable[[], float] = time.time,
        name: str | None = None,
        min_severity: str = "info",
        kinds: frozenset[str] | None = None,
    ) -> None:
        base = url.rstrip("/")
        if not base.startswith(("http://", "https://")):
            raise ValueError("the Alertmanager URL must start with http:// or https://")
        for key in labels or {}:
            if not LABEL_NAME.fullmatch(key):
                raise ValueError(f"{key!r} is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)")
        super().__init__(name or f"alertmanager {base}", min_severity=min_severity, kinds=kinds)
        self.endpoint = base + "/api/v2/alerts"
        self.labels = dict(labels or {})
        self.headers = dict(headers or {})
        self.timeout_s = timeout_s
        self.resend_interval_s = resend_interval_s
        self.generator_url = generator_url
        self.host = host or socket.gethostname()
        self.clock = clock
        self._client = httpx.Client(transport=transport, timeout=timeout_s)
        self._firing: dict[str, AlertEvent] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._resender: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"AlertmanagerSink({self.name!r})"

    def body(self, alerts: list[AlertEvent]) -> list[dict[str, Any]]:
        now = self.clock()
        return [
            v2_alert(
                a,
                now,
                host=self.host,
                labels=self.labels,
                resend_interval_s=self.resend_interval_s,
                generator_url=self.generator_url,
            )
            for a in alerts
        ]

    def send(self, alert: AlertEvent) -> None:
        self._post([alert])
        with self._lock:
            if alert.state == "firing":
                self._firing[alert.key] = alert
            elif alert.state == "resolved":
                self._firing.pop(alert.key, None)
        if alert.state == "firing":
            self._start_resender()

    def resend(self) -> int:
        """Post every firing alert again; returns how many. Errors are logged, not raised."""
        with self._lock:
            firing = list(self._firing.values())
        if not firing:
            return 0
        try:
            self._post(firing)
        except DeliveryError as exc:
            log.warning("cannot refresh %d firing alerts at %s: %s", len(firing), self.name, exc)
            return 0
        return len(firing)

    def close(self) -> None:
        self._stop.set()
        if self._resender is not None:
            self._resender.join(timeout=2)
        self._client.close()

    def _start_resender(self) -> None:
        with self._lock:
            if self._resender is not None or self.resend_interval_s <= 0:
                return
            self._resender = threading.Thread(
                target=self._resend_loop, name=f"alerts:{self.name}:resend", daemon=True
            )
            self._resender.start()

    def _resend_loop(self) -> None:
        while not self._stop.wait(self.resend_interval_s):
            self.resend()

    def _post(self, alerts: list[AlertEvent]) -> None:
        content = dumps(self.body(alerts)).encode("utf-8")
        headers = {"Content-Type": "application/json", "User-Agent": "llm-watchdog", **self.headers}
        try:
            response = self._client.post(self.endpoint, content=content, headers=headers)
        except httpx.TimeoutException:
            raise DeliveryError(
                f"no answer from {self.endpoint} within {self.timeout_s:g} s"
            ) from None
        except httpx.HTTPError as exc:
            raise DeliveryError(
                f"cannot reach {self.endpoint} ({type(exc).__name__}): is Alertmanager up?"
            ) from None
        if response.is_success:
            return
        snippet = " ".join(response.text.split())[:200]
        detail = f"{self.endpoint} answered {response.status_code}: {snippet}"
        if response.status_code >= 500 or response.status_code == 429:
            raise DeliveryError(detail)
        raise DeliveryError(detail + " (check the URL and labels)", retryable=False)
