"""Where alerts go: the sink interface, the command sink and the log sink.

A sink's `send(alert)` returns on success and raises `DeliveryError` on failure; the error's
text is safe to log and store (no secrets) and says whether a retry may help. Sinks never
retry themselves: the manager retries with backoff. The webhook sink lives in `webhook.py`.

Errors seen here:

    DeliveryError            one attempt failed; .retryable, .retry_after_s
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any, Protocol, runtime_checkable

from llm_watchdog.alerts.events import AlertEvent, severity_rank
from llm_watchdog.errors import AlertError

ENV_PREFIX = "LLM_WATCHDOG_"


class DeliveryError(AlertError):
    """One delivery attempt failed. The message is one line, free of secrets."""

    def __init__(
        self, message: str, *, retryable: bool = True, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after_s = retry_after_s


@runtime_checkable
class Sink(Protocol):
    name: str

    def accepts(self, alert: AlertEvent) -> bool: ...

    def send(self, alert: AlertEvent) -> None: ...

    def close(self) -> None: ...


class BaseSink:
    """Name and per-sink filter shared by all sinks (test alerts always pass the filter)."""

    def __init__(
        self,
        name: str,
        *,
        min_severity: str = "info",
        kinds: frozenset[str] | None = None,
    ) -> None:
        severity_rank(min_severity)
        self.name = name
        self.min_severity = min_severity
        self.kinds = kinds

    def accepts(self, alert: AlertEvent) -> bool:
        if alert.state == "test":
            return True
        if self.kinds is not None and alert.kind not in self.kinds:
            return False
        return severity_rank(alert.level) >= severity_rank(self.min_severity)

    def send(self, alert: AlertEvent) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def close(self) -> None:
        return None

    def __enter__(self) -> BaseSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def iso_utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat(timespec="seconds")


def alert_json(alert: AlertEvent, host: str) -> dict[str, Any]:
    """The generic JSON form of an alert: every field, plus where and when in words."""
    return {
        "source": "llm-watchdog",
        "schema": 1,
        "host": host,
        "key": alert.key,
        "kind": alert.kind,
        "state": alert.state,
        "severity": alert.level,
        "ts": alert.ts,
        "time": iso_utc(alert.ts),
        "title": alert.title,
        "message": alert.message,
        "cause": alert.cause,
        "fields": alert.fields,
    }


def dumps(obj: Any) -> str:
    # default=str: figures the lead puts in `fields` may be numpy scalars or datetimes.
    return json.dumps(obj, ensure_ascii=False, default=str, sort_keys=False)


class CommandSink(BaseSink):
    """Runs a command (no shell) with the alert in LLM_WATCHDOG_* environment variables.

    Variables: KIND, STATE, SEVERITY, MESSAGE, TITLE, CAUSE (empty when unknown), TS (unix
    seconds), KEY, HOST and JSON (the generic webhook body). Exit status 0 is success;
    any other status, or running past `timeout_s`, is a failed attempt.
    """

    def __init__(
        self,
        argv: Sequence[str],
        timeout_s: float = 30.0,
        *,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        host: str | None = None,
        min_severity: str = "info",
        kinds: frozenset[str] | None = None,
    ) -> None:
        if not argv or not all(isinstance(a, str) and a for a in argv):
            raise ValueError("argv must be a non-empty list of non-empty strings")
        super().__init__(
            name or f"command {os.path.basename(argv[0])}", min_severity=min_severity, kinds=kinds
        )
        self.argv = list(argv)
        self.timeout_s = timeout_s
        self.base_env = dict(os.environ if env is None else env)
        self.host = host or socket.gethostname()

    def environment(self, alert: AlertEvent) -> dict[str, str]:
        values = {
            "KIND": alert.kind,
            "STATE": alert.state,
            "SEVERITY": alert.level,
            "MESSAGE": alert.message,
            "TITLE": alert.title,
            "CAUSE": alert.cause or "",
            "TS": f"{alert.ts:.3f}",
            "KEY": alert.key,
            "HOST": self.host,
            "JSON": dumps(alert_json(alert, self.host)),
        }
        return {**self.base_env, **{ENV_PREFIX + k: v.replace("\0", "") for k, v in values.items()}}

    def send(self, alert: AlertEvent) -> None:
        program = self.argv[0]
        try:
            # A session of its own, so a timeout kills the command and anything it started;
            # otherwise a grandchild holding the pipes open would keep us waiting.
            proc = subprocess.Popen(
                self.argv,
                env=self.environment(alert),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except FileNotFoundError:
            raise DeliveryError(
                f"command not found: {program}: check argv in the [[alerts.sink]] entry",
                retryable=False,
            ) from None
        except PermissionError:
            raise DeliveryError(
                f"command not executable: {program}: check its permissions (chmod +x)",
                retryable=False,
            ) from None
        except OSError as exc:
            raise DeliveryError(
                f"cannot run {program} ({exc.strerror or exc}): is it a program or a script "
                "with a #! line?",
                retryable=False,
            ) from None
        with proc:
            try:
                _, err = proc.communicate(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                proc.communicate()
                raise DeliveryError(
                    f"command {program} still running after {self.timeout_s:g} s: killed"
                ) from None
        if proc.returncode != 0:
            tail = " ".join(err.decode("utf-8", "replace").split())[-200:]
            raise DeliveryError(
                f"command {program} exited with status {proc.returncode}"
                + (f": {tail}" if tail else "")
            )


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, AttributeError):
        proc.kill()


# Python logging levels by alert severity; under systemd the daemon's journal formatter
# (llm_watchdog.logs) turns them into sd-daemon(3) priorities: critical 2, warning 4, info 6.
_LOG_LEVELS = {"critical": logging.CRITICAL, "warning": logging.WARNING, "info": logging.INFO}


class LogSink(BaseSink):
    """One log line per alert, at a level that follows the severity (resolved: info)."""

    def __init__(
        self,
        logger: logging.Logger | None = None,
        *,
        name: str = "log",
        min_severity: str = "info",
        kinds: frozenset[str] | None = None,
    ) -> None:
        super().__init__(name, min_severity=min_severity, kinds=kinds)
        self.logger = logger or logging.getLogger("llm_watchdog.alerts")

    def line(self, alert: AlertEvent) -> str:
        cause = f" cause={alert.cause}" if alert.cause else ""
        return (
            f"alert {alert.state} {alert.level} {alert.kind}{cause} key={alert.key}: "
            f"{alert.message}"
        )

    def send(self, alert: AlertEvent) -> None:
        level = _LOG_LEVELS[alert.level] if alert.state == "firing" else logging.INFO
        self.logger.log(level, self.line(alert))
