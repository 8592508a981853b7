"""The `[alerts]` configuration: rules, delivery, and the sinks.

Keys (TOML; durations are seconds or text like "30s", "5m", "1h"):

    [alerts]
    enabled = true              # false: nothing is sent
    kinds = ["chat_slowed", "heat_warning", "quality_failed", "cold_start_slow",
             "baseline_invalidated", "telemetry_lost", "probes_failing",
             "control_not_effective", "storage_failing"]   # default: every kind alerts
    min_severity = "info"       # info | warning | critical
    max_per_window = 5          # firing alerts per kind per window; more are held and
    window = "1h"               #   summed up in one message when the window has room
    attempts = 5                # delivery attempts per alert and sink
    backoff = "2s"              # wait before the 2nd attempt; doubles each time ...
    backoff_max = "5m"          # ... up to this (a Retry-After header may ask for longer)
    queue_size = 100            # alerts waiting per sink before new ones are dropped

    [[alerts.sink]]             # one table per sink, any number of them
    type = "webhook"            # webhook | command | log | alertmanager
    name = "ops-slack"          # optional; shown by `llm-watchdog alerts`
    min_severity = "warning"    # optional filter for this sink
    kinds = ["chat_slowed"]     # optional filter for this sink

    # type = "webhook": the URL holds a secret, so give it by file or environment
    url_file = "/etc/llm-watchdog/slack-url"  # or url_env = "SLACK_WEBHOOK", or url = "..."
    shape = "slack"             # generic (JSON, all fields) | slack | discord | ntfy
    timeout = "10s"
    blocks = false              # slack only: add Block Kit blocks beside the text
    headers = { "X-Team" = "ml" }                             # plain header values
    headers_file = { Authorization = "/etc/llm-watchdog/ntfy-auth" }  # value from a file
    headers_env = { Authorization = "NTFY_AUTH" }             # value from the environment

    # type = "command": run without a shell, alert in LLM_WATCHDOG_* variables
    argv = ["/usr/local/bin/page-oncall", "--team", "ml"]
    timeout = "30s"

    # type = "alertmanager": POST /api/v2/alerts; resolved alerts carry endsAt
    url = "http://127.0.0.1:9093"          # Alertmanager's base URL
    labels = { team = "ml" }               # extra labels on every alert
    resend_interval = "1m"                 # firing alerts are posted again this often
    generator_url = "http://box1:9108/status"  # optional link back
    timeout = "10s"                        # headers / headers_file / headers_env as for webhook

    # type = "log": one line per alert on the daemon's log (journald under systemd)
    logger = "llm_watchdog.alerts"  # level follows severity: journald priority crit/warning/info

Every error is an `AlertConfigError` whose text names the key and says what is expected.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from llm_watchdog.alerts.alertmanager import AlertmanagerSink
from llm_watchdog.alerts.events import KINDS, SEVERITIES
from llm_watchdog.alerts.policy import AlertRules
from llm_watchdog.alerts.sinks import BaseSink, CommandSink, LogSink
from llm_watchdog.alerts.webhook import SHAPES, WebhookSink
from llm_watchdog.durations import parse_duration
from llm_watchdog.errors import ConfigError, did_you_mean

SINK_TYPES = ("webhook", "command", "log", "alertmanager")


class AlertConfigError(ConfigError, ValueError):
    """A bad alerts setting; one line naming the key. `.key` holds the key alone."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key = key


@dataclass(frozen=True)
class AlertConfig:
    enabled: bool = True
    kinds: frozenset[str] | None = None
    min_severity: str = "info"
    max_per_window: int = 5
    window_s: float = 3600.0
    max_attempts: int = 5
    backoff_s: float = 2.0
    # 5 min cap: five attempts then span 2+4+8+16 = 30 s; a Retry-After may stretch one wait.
    backoff_max_s: float = 300.0
    queue_size: int = 100
    tick_interval_s: float | None = 30.0  # how often held alerts are checked for a summary

    @property
    def rules(self) -> AlertRules:
        kinds = self.kinds if self.enabled else frozenset()
        return AlertRules(kinds, self.min_severity, self.max_per_window, self.window_s)


_ALERT_KEYS = {
    "enabled", "kinds", "min_severity", "max_per_window", "window", "attempts", "backoff",
    "backoff_max", "queue_size", "sink",
}  # fmt: skip
_COMMON_SINK_KEYS = {"type", "name", "min_severity", "kinds"}
_SINK_KEYS = {
    "webhook": _COMMON_SINK_KEYS
    | {"url", "url_file", "url_env", "url_credential", "shape", "timeout", "blocks", "headers",
       "headers_file", "headers_env"},
    "command": _COMMON_SINK_KEYS | {"argv", "timeout"},
    "log": _COMMON_SINK_KEYS | {"logger"},
    "alertmanager": _COMMON_SINK_KEYS
    | {"url", "labels", "resend_interval", "generator_url", "timeout", "headers",
       "headers_file", "headers_env"},
}  # fmt: skip


def parse_duration_s(value: Any, key: str) -> float:
    try:
        return parse_duration(value)
    except (ValueError, TypeError) as exc:
        raise AlertConfigError(key, str(exc)) from None


def alert_config_from_dict(table: Mapping[str, Any] | None, key: str = "alerts") -> AlertConfig:
    """The `[alerts]` table (its `sink` entries are read by `sinks_from_config`)."""
    table = dict(table or {})
    _check_keys(table, _ALERT_KEYS, key)
    default = AlertConfig()
    return AlertConfig(
        enabled=_bool(table, "enabled", True, key),
        kinds=_kinds(table, key),
        min_severity=_severity(table, key),
        max_per_window=_positive_int(table, "max_per_window", default.max_per_window, key),
        window_s=_duration(table, "window", default.window_s, key, positive=True),
        max_attempts=_positive_int(table, "attempts", default.max_attempts, key),
        backoff_s=_duration(table, "backoff", default.backoff_s, key),
        backoff_max_s=_duration(table, "backoff_max", default.backoff_max_s, key),
        queue_size=_positive_int(table, "queue_size", default.queue_size, key),
    )


def sinks_from_config(
    entries: Sequence[Mapping[str, Any]] | Mapping[str, Any] | None,
    *,
    env: Mapping[str, str] | None = None,
    key: str = "alerts.sink",
    transport: httpx.BaseTransport | None = None,
) -> list[BaseSink]:
    """Sinks from `[[alerts.sink]]` entries. `env` defaults to os.environ."""
    if entries is None:
        return []
    if isinstance(entries, Mapping):  # a single [alerts.sink] table
        entries = [entries]
    if isinstance(entries, (str, bytes)) or not isinstance(entries, Sequence):
        raise AlertConfigError(key, "expected [[alerts.sink]] tables (a list of tables)")
    environ = os.environ if env is None else env
    sinks: list[BaseSink] = []
    names: dict[str, str] = {}
    for i, entry in enumerate(entries, start=1):
        where = f"{key}[{i}]"
        if not isinstance(entry, Mapping):
            raise AlertConfigError(where, "expected a table with type = webhook|command|log")
        sink = _sink(dict(entry), where, environ, transport)
        if sink.name in names:
            if "name" in entry:
                raise AlertConfigError(
                    f"{where}.name",
                    f"{sink.name!r} is already used by {names[sink.name]}: give each sink "
                    "its own name",
                )
            n = 2
            while f"{sink.name} #{n}" in names:
                n += 1
            sink.name = f"{sink.name} #{n}"
        names[sink.name] = where
        sinks.append(sink)
    return sinks


def load_alerts(
    table: Mapping[str, Any] | None,
    *,
    env: Mapping[str, str] | None = None,
    key: str = "alerts",
    transport: httpx.BaseTransport | None = None,
) -> tuple[AlertConfig, list[BaseSink]]:
    """The whole `[alerts]` table: settings and sinks."""
    config = alert_config_from_dict(table, key)
    sinks = sinks_from_config(
        (table or {}).get("sink"), env=env, key=f"{key}.sink", transport=transport
    )
    return config, sinks


def _sink(
    entry: dict[str, Any],
    where: str,
    env: Mapping[str, str],
    transport: httpx.BaseTransport | None,
) -> BaseSink:
    kind = entry.get("type")
    if kind not in SINK_TYPES:
        problem = "missing" if kind is None else f"{kind!r} is not a sink type"
        raise AlertConfigError(
            f"{where}.type", f"{problem}: expected one of {', '.join(SINK_TYPES)}"
        )
    _check_keys(entry, _SINK_KEYS[kind], where)
    common: dict[str, Any] = {
        "min_severity": _severity(entry, where),
        "kinds": _kinds(entry, where),
    }
    name = entry.get("name")
    if name is not None:
        if not isinstance(name, str) or not name.strip():
            raise AlertConfigError(f"{where}.name", "expected a non-empty string")
        common["name"] = name.strip()
    if kind == "webhook":
        shape = entry.get("shape", "generic")
        if shape not in SHAPES:
            raise AlertConfigError(
                f"{where}.shape",
                f"{shape!r} is not a webhook shape: expected one of {', '.join(SHAPES)}",
            )
        url = _secret_url(entry, where, env)
        headers = _headers(entry, where, env)
        timeout_s = _duration(entry, "timeout", 10.0, where, positive=True)
        blocks = _bool(entry, "blocks", False, where)
        try:
            return WebhookSink(url, shape, headers, timeout_s, transport, blocks=blocks, **common)
        except ValueError as exc:
            raise AlertConfigError(f"{where}.url", str(exc)) from None
    if kind == "alertmanager":
        return _alertmanager(entry, where, env, transport, common)
    if kind == "command":
        argv = entry.get("argv")
        if (
            not isinstance(argv, list)
            or not argv
            or not all(isinstance(a, str) and a for a in argv)
        ):
            raise AlertConfigError(
                f"{where}.argv",
                "expected a non-empty list of strings: the program and its arguments (no shell)",
            )
        return CommandSink(argv, _duration(entry, "timeout", 30.0, where, positive=True), **common)
    logger_name = entry.get("logger", "llm_watchdog.alerts")
    if not isinstance(logger_name, str) or not logger_name:
        raise AlertConfigError(
            f"{where}.logger", "expected a logger name such as llm_watchdog.alerts"
        )
    return LogSink(logging.getLogger(logger_name), **common)


def _alertmanager(
    entry: dict[str, Any],
    where: str,
    env: Mapping[str, str],
    transport: httpx.BaseTransport | None,
    common: dict[str, Any],
) -> BaseSink:
    url = entry.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise AlertConfigError(
            f"{where}.url", "expected Alertmanager's base URL, such as http://127.0.0.1:9093"
        )
    labels = entry.get("labels", {})
    if not isinstance(labels, Mapping) or not all(
        isinstance(v, str) and v for v in labels.values()
    ):
        raise AlertConfigError(f"{where}.labels", 'expected a table like { team = "ml" }')
    generator_url = entry.get("generator_url")
    if generator_url is not None and not isinstance(generator_url, str):
        raise AlertConfigError(f"{where}.generator_url", "expected a URL")
    try:
        return AlertmanagerSink(
            url,
            labels={str(k): v for k, v in labels.items()},
            headers=_headers(entry, where, env),
            timeout_s=_duration(entry, "timeout", 10.0, where, positive=True),
            resend_interval_s=_duration(entry, "resend_interval", 60.0, where, positive=True),
            generator_url=generator_url,
            transport=transport,
            **common,
        )
    except ValueError as exc:
        raise AlertConfigError(f"{where}.labels", str(exc)) from None


def _secret_url(entry: Mapping[str, Any], where: str, env: Mapping[str, str]) -> str:
    given = [k for k in ("url", "url_file", "url_env", "url_credential") if k in entry]
    if len(given) != 1:
        raise AlertConfigError(
            where,
            "give the webhook URL as exactly one of url, url_file, url_env or url_credential",
        )
    key = given[0]
    value = _secret(entry[key], f"{where}.{key}", env, kind=key.removeprefix("url").lstrip("_"))
    if not value.startswith(("http://", "https://")):
        raise AlertConfigError(
            f"{where}.{key}", "the webhook URL must start with http:// or https://"
        )
    return value


def _secret(value: Any, key: str, env: Mapping[str, str], *, kind: str) -> str:
    """A value given inline (kind ""), in a file ("file") or in the environment ("env")."""
    if not isinstance(value, str) or not value:
        expected = {"file": "a file path", "env": "an environment variable name"}.get(kind, "text")
        raise AlertConfigError(key, f"expected {expected}")
    if kind == "file":
        try:
            text = Path(value).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise AlertConfigError(
                key,
                f"cannot read {value} ({exc.strerror or exc}): put the secret in that file, "
                "readable by the service user only",
            ) from None
        if not text:
            raise AlertConfigError(key, f"{value} is empty: put the secret in it")
        return text
    if kind == "credential":
        # A systemd credential (LoadCredential=NAME:FILE), handed over in this folder.
        folder = env.get("CREDENTIALS_DIRECTORY", "")
        if not folder or "/" in value:
            raise AlertConfigError(
                key,
                f"credential {value!r} needs $CREDENTIALS_DIRECTORY: run under systemd with "
                f"LoadCredential={value}:FILE in the unit, or use url_file",
            )
        return _secret(str(Path(folder) / value), key, env, kind="file")
    if kind == "env":
        text = env.get(value, "").strip()
        if not text:
            raise AlertConfigError(
                key,
                f"environment variable {value} is not set: set it in the service's environment "
                "(systemd EnvironmentFile=)",
            )
        return text
    return value


def _headers(entry: Mapping[str, Any], where: str, env: Mapping[str, str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for key, kind in (("headers", ""), ("headers_file", "file"), ("headers_env", "env")):
        table = entry.get(key, {})
        if not isinstance(table, Mapping):
            raise AlertConfigError(f"{where}.{key}", 'expected a table like { "Name" = "..." }')
        for header, raw in table.items():
            hkey = f"{where}.{key}.{header}"
            if not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", str(header)):
                raise AlertConfigError(hkey, "not a valid HTTP header name")
            value = _secret(raw, hkey, env, kind=kind)
            if not value.isascii() or not value.isprintable():
                raise AlertConfigError(hkey, "header values must be one line of ASCII text")
            headers[str(header)] = value
    return headers


def _check_keys(table: Mapping[str, Any], allowed: set[str], where: str) -> None:
    for k in table:
        if k not in allowed:
            guess = did_you_mean(k, sorted(allowed))
            raise AlertConfigError(
                f"{where}.{k}",
                f"unknown key: {guess}expected one of {', '.join(sorted(allowed))}",
            )


def _bool(table: Mapping[str, Any], name: str, default: bool, where: str) -> bool:
    value = table.get(name, default)
    if not isinstance(value, bool):
        raise AlertConfigError(f"{where}.{name}", f"expected true or false, got {value!r}")
    return value


def _positive_int(table: Mapping[str, Any], name: str, default: int, where: str) -> int:
    value = table.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise AlertConfigError(f"{where}.{name}", f"expected a whole number ≥ 1, got {value!r}")
    return value


def _duration(
    table: Mapping[str, Any], name: str, default: float, where: str, *, positive: bool = False
) -> float:
    if name not in table:
        return default
    seconds = parse_duration_s(table[name], f"{where}.{name}")
    if positive and seconds <= 0:
        raise AlertConfigError(f"{where}.{name}", "expected a duration above zero")
    return seconds


def _severity(table: Mapping[str, Any], where: str) -> str:
    value = table.get("min_severity", "info")
    if value not in SEVERITIES:
        raise AlertConfigError(
            f"{where}.min_severity",
            f"{value!r} is not a severity: expected one of {', '.join(SEVERITIES)}",
        )
    return str(value)


def _kinds(table: Mapping[str, Any], where: str) -> frozenset[str] | None:
    if "kinds" not in table:
        return None
    value = table["kinds"]
    if not isinstance(value, list) or not all(isinstance(k, str) for k in value):
        raise AlertConfigError(f"{where}.kinds", "expected a list of alert kinds")
    for k in value:
        if k not in KINDS:
            known = ", ".join(k for k in KINDS if k != "test")
            raise AlertConfigError(
                f"{where}.kinds", f"unknown kind {k!r}: expected some of {known}"
            )
    return frozenset(value)
