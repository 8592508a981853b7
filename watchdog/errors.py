"""The project's exceptions and exit codes, defined once.

Every error the project raises on purpose derives from `WatchdogError`, and its str() is one
line that says what happened and what to do. Foreign exceptions (httpx, sqlite3, pynvml,
tomllib, OSError) are mapped at the edge that meets them, with `raise ... from exc`, so the
cause stays on `__cause__` for a log and never reaches a user as a traceback.

    WatchdogError
     ├── ConfigError            a setting, file or argument that cannot be used (exit 78)
     │    ├── ProbeSetError         a probe set that cannot be loaded       (probe.sets)
     │    ├── AlertConfigError      a bad [alerts] entry; `.key` names it   (alerts.config)
     │    ├── ScenarioError         a heat-lab scenario that cannot be used (sim.scenario)
     │    └── ControllerError       a lab controller name or argument      (sim.controllers)
     ├── EngineError            the serving engine did not answer as needed
     │    ├── ModelResolveError     `model = "auto"` found no model         (probe.engine)
     │    └── UpstreamError         the gateway's engine gave no answer     (gateway.upstream)
     ├── TelemetryError         NVML could not be read
     │    └── NvmlTimeout           an NVML call did not return in time     (nvml.reader)
     ├── StorageError           the database could not do what was asked
     │    ├── StoreError            any SQLite failure, mapped               (store.db)
     │    └── MigrationError        the schema cannot be brought up to date (store.migrations)
     ├── ControlError           the serving layer could not be written or read
     │    └── ActuatorError         a write or read-back failed            (actuators.base)
     ├── AlertError             an alert could not be delivered
     │    └── DeliveryError         one delivery attempt failed             (alerts.sinks)
     ├── ReplayError            a trace that cannot be replayed          (drift.replay)
     └── LabError               the heat lab could not start              (sim.server)

The configuration errors also derive from ValueError where they always have, so callers that
catch ValueError around parsing keep working.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

# Exit codes of every command and service (sysexits.h for EX_CONFIG). Start-up failure is 3,
# as in uvicorn: distinct from a crash (1) and from a bad config (78), so systemd's
# RestartPreventExitStatus= can tell them apart.
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_STARTUP_FAILED = 3
EX_CONFIG = 78


# C0 controls (newline and tab included), DEL and C1 controls: an engine's error body or a
# client's reason may hold ANSI escapes or a newline that would fake a log or table line.
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` with every control character written as an escape (`\\x1b`, `\\n`), so that it
    prints as one inert line on a terminal or in the journal."""
    if not _CONTROLS.search(text):
        return text
    return _CONTROLS.sub(_escape, text)


def _escape(m: re.Match[str]) -> str:
    ch = m.group()
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(ch) or f"\\x{ord(ch):02x}"


def did_you_mean(name: str, known: Iterable[str], shown: str = "{!r}") -> str:
    """The start of an unknown key's advice, "did you mean 'url'? ", where `name` is a typo
    away from one of `known`, else "" (`shown` writes the match: "[{}]" for a section)."""
    near = difflib.get_close_matches(name, list(known), n=1)
    return f"did you mean {shown.format(near[0])}? " if near else ""


class WatchdogError(Exception):
    """Base of every error the project raises on purpose. str(err) is one line: a control
    character that came in with a value (a key, a file name, an engine's text) is escaped."""

    def __str__(self) -> str:
        return printable(super().__str__())


class ConfigError(WatchdogError):
    """A setting is wrong. str(err) is one line naming the file and the key."""


class EngineError(WatchdogError):
    """The serving engine did not answer as needed."""


class TelemetryError(WatchdogError):
    """GPU telemetry could not be read."""


class StorageError(WatchdogError):
    """The database could not do what was asked."""


class ControlError(WatchdogError):
    """The serving layer's allowance could not be written or read back."""


class AlertError(WatchdogError):
    """An alert could not be delivered."""
